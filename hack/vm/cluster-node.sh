#!/usr/bin/env bash
# Inside the VM (hack/vm.sh run, started by hack/cluster/vm-node.sh): make
# this machine a node of the cluster tier's cluster on the host, every part
# a systemd unit: containerd 2 from the stack cache (config version 3, the
# systemd cgroup driver, Debian's runc, a loopback-only CNI config), criguard
# in front of it (its Debian package from hack/deb.sh: dpkg -i) and
# the kubelet (hack/vm/kubelet.service) dialling criguard's socket (or
# containerd's, KUBELET_RUNTIME_ENDPOINT: a node before `criguard adopt`),
# its API server reached at 10.0.2.100:6443 through QEMU's guestfwd. Then
# serve the host's requests until it says done.
#
# Usage: cluster-node.sh   (environment: CRIGUARD_VMNODE_DIR, a read-write
# share written by vm-node.sh)
#
# The share (W = $CRIGUARD_VMNODE_DIR):
#   node.env                 settings (read): NODE_NAME, CONTAINERD_BIN,
#                            K8S_BIN, CRIGUARD_BIN, PODS_MEMORY,
#                            CRIGUARD_EVICTION, KUBELET_EVICTION, TRANSITION,
#                            LIFETIME (seconds this script serves at most),
#                            KUBELET_RUNTIME_ENDPOINT (the kubelet's
#                            containerRuntimeEndpoint; criguard's socket
#                            when unset)
#   ca.crt kubelet.kubeconfig criguard.kubeconfig    (read)
#   guest.log                what this script did (written)
#   times                    "MILESTONE UPTIME_S" lines (written)
#   ready | failed           setup finished | the reason it failed (written)
#   requests/N.cmd           a bash script from the host; its output and
#                            exit status come back as N.out, then N.rc
#   done                     the host is finished: stop the kubelet, write
#                            journal.txt and units.txt, exit
set -uo pipefail
export LC_ALL=C PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
W="${CRIGUARD_VMNODE_DIR:?CRIGUARD_VMNODE_DIR is not set}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=/dev/null
source "$W/node.env" || exit 1
API=10.0.2.100:6443
NODE_IP=10.0.2.15
CONTAINERD_SOCK=/run/containerd/containerd.sock

uptime_s() { cut -d' ' -f1 /proc/uptime; }
log() { echo "vm-node [$(uptime_s)]: $*" | tee -a "$W/guest.log"; }
mark() { echo "$1 $(uptime_s)" >>"$W/times"; }
# put FILE: stdin to FILE through a rename, so the host never reads half.
put() { cat >"$1.tmp" && mv -f "$1.tmp" "$1"; }
dump() {
    journalctl -b --no-pager -o short-monotonic >"$W/journal.txt" 2>&1
    systemctl --no-pager --full status containerd criguard.socket criguard kubelet >"$W/units.txt" 2>&1
    sync
}
fail() {
    log "FAILED: $*"
    echo "$*" | put "$W/failed"
    dump
    exit 1
}
# wait_until SECS WHAT CMD...: poll CMD every 0.25 s until it succeeds.
wait_until() {
    local secs="$1" what="$2" end
    shift 2
    end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < end)) || fail "$what: not within ${secs} s"
        sleep 0.25
    done
}
# shellcheck disable=SC2317 # called through wait_until
tcp_open() { timeout 5 bash -c "exec 3<>/dev/tcp/${1%:*}/${1#*:}"; }
# shellcheck disable=SC2317 # called through wait_until
http_ok() { # http_ok HOST:PORT PATH: a 200 from a plain HTTP server
    timeout 5 bash -c "exec 3<>/dev/tcp/${1%:*}/${1#*:}; printf 'GET $2 HTTP/1.0\r\n\r\n' >&3; head -n1 <&3" 2>/dev/null |
        grep -q ' 200 '
}
ctr_() { "$CONTAINERD_BIN/ctr" --address "$CONTAINERD_SOCK" "$@"; }

mark setup-start
log "node $NODE_NAME: containerd from $CONTAINERD_BIN, kubelet from $K8S_BIN, criguard $CRIGUARD_BIN"
wait_until 60 "the API server at $API (guestfwd)" tcp_open "$API"
log "API server reachable at $API"
echo "$NODE_IP $NODE_NAME" >>/etc/hosts

# ---- containerd 2 as containerd.service ---------------------------------------
systemctl stop containerd.service 2>/dev/null
# Debian's containerd 1.6 may have started at boot: its state goes.
rm -rf /var/lib/containerd /run/containerd
mkdir -p /etc/containerd /etc/cni/net.d /etc/systemd/system/containerd.service.d
cat >/etc/containerd/config.toml <<'EOF'
# The cluster tier's VM node (hack/vm/cluster-node.sh): containerd 2, the
# systemd cgroup driver, kubelet-managed pods with hostNetwork only.
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
imports = []
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

# containerd 2's default NRI on /var/run/nri/nri.sock, where the DaemonSet's
# criguard attaches; a plugin may take 10 s to answer instead of 2 s (the
# guest runs under TCG, several times slower than a node).
[plugins."io.containerd.nri.v1.nri"]
  disable = false
  plugin_request_timeout = "10s"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "registry.k8s.io/pause:3.9"

[plugins."io.containerd.cri.v1.runtime"]
  # root here may set the kubelet's negative scores.
  restrict_oom_score_adj = false
  enable_selinux = false

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["/usr/lib/cni"]
  conf_dir = "/etc/cni/net.d"

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  SystemdCgroup = true
  BinaryName = "/usr/sbin/runc"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
# NetworkReady without routing anything: the pods use the host's network.
install -m 0644 "$REPO/hack/cluster/10-loopback.conflist" /etc/cni/net.d/
# Debian's unit, with containerd 2's daemon and its shim first in PATH.
cat >/etc/systemd/system/containerd.service.d/10-criguard-vm-node.conf <<EOF
[Service]
ExecStart=
ExecStart=$CONTAINERD_BIN/containerd --config /etc/containerd/config.toml
Environment=PATH=$CONTAINERD_BIN:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
EOF
systemctl daemon-reload
systemctl restart containerd.service || fail "containerd.service did not start"
wait_until 120 "containerd 2 answering on $CONTAINERD_SOCK" ctr_ version
version="$(ctr_ version 2>/dev/null | awk '/^Server:/ { s = 1 } s && $1 == "Version:" { print $2; exit }')"
log "containerd $version ready"
mark containerd-ready
for t in pause busybox; do
    ctr_ -n k8s.io images import --snapshotter overlayfs "${CRIGUARD_IMAGE_CACHE:-/var/tmp/criguard-images}/$t.tar" >>"$W/guest.log" 2>&1 ||
        fail "importing $t.tar"
done
mark images-imported

# ---- criguard (its Debian package, hack/deb.sh: dpkg enables and starts its
# socket and service; the configuration written first is kept, --force-confold)
mkdir -p /etc/criguard
install -m 0600 "$W/criguard.kubeconfig" /etc/criguard/kubeconfig
cat >/etc/criguard/config.toml <<EOF
# The cluster tier's VM node (hack/vm/cluster-node.sh).
evictionHard = { "allocatableMemory.available" = "$CRIGUARD_EVICTION" }
evictionPressureTransitionPeriod = "$TRANSITION"
kubeconfig = "/etc/criguard/kubeconfig"
nodeName = "$NODE_NAME"
EOF
cat >/etc/default/criguard <<'EOF'
CRIGUARD_OPTS="--kubepods-cgroup kubepods.slice"
EOF
deb="$(cd "$REPO" && TMPDIR=/var/tmp CRIGUARD_BIN="$CRIGUARD_BIN" CRIGUARD_DEB_COMPRESS=none \
    hack/deb.sh /var/tmp/criguard-deb 2>>"$W/guest.log" | tail -n1)" || fail "hack/deb.sh"
dpkg -i --force-confold --force-confdef "$deb" >>"$W/guest.log" 2>&1 || fail "dpkg -i $deb"
wait_until 120 "criguard.service active with its admin socket" \
    bash -c 'systemctl is-active -q criguard.service && test -S /run/criguard/admin.sock'
log "criguard $(criguard --version 2>/dev/null) active"
mark criguard-ready

# ---- the kubelet -------------------------------------------------------------------
mkdir -p /etc/kubernetes
install -m 0644 "$W/ca.crt" /etc/kubernetes/ca.crt
install -m 0600 "$W/kubelet.kubeconfig" /etc/kubernetes/kubelet.kubeconfig
total=$(($(awk '$1 == "MemTotal:" { print $2 }' /proc/meminfo) * 1024))
target="$(numfmt --from=iec-i "$PODS_MEMORY")"
kube_res=$((128 << 20))
sys_res=$((total - target - kube_res))
((sys_res > 0)) || fail "PODS_MEMORY=$PODS_MEMORY does not fit in MemTotal ($total bytes)"
cat >/etc/kubernetes/kubelet.yaml <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: /etc/kubernetes/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: ${KUBELET_RUNTIME_ENDPOINT:-unix:///run/criguard/criguard.sock}
cgroupDriver: systemd
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
kubeReserved: {memory: "$kube_res"}
systemReserved: {memory: "$sys_res"}
evictionHard: {memory.available: "$KUBELET_EVICTION"}
evictionPressureTransitionPeriod: $TRANSITION
failSwapOn: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
imageMinimumGCAge: 24h
serializeImagePulls: false
maxPods: 30
resolvConf: ""
EOF
echo "KUBELET_ARGS=\"--hostname-override=$NODE_NAME --node-ip=$NODE_IP --v=2\"" >/etc/default/kubelet
ln -sf "$K8S_BIN/kubelet" /usr/local/bin/kubelet
install -m 0644 "$REPO/hack/vm/kubelet.service" /etc/systemd/system/kubelet.service
systemctl daemon-reload
systemctl enable --now kubelet.service >>"$W/guest.log" 2>&1 || fail "kubelet.service did not start"
mark kubelet-started
wait_until 300 "the kubelet's /healthz" http_ok 127.0.0.1:10248 /healthz
log "kubelet $(/usr/local/bin/kubelet --version 2>/dev/null) healthy"
mark kubelet-healthy
echo "ok" | put "$W/ready"

# ---- serve the host until it is done -------------------------------------------------
mkdir -p "$W/requests"
end=$((SECONDS + LIFETIME))
shopt -s nullglob
while [[ ! -e "$W/done" ]]; do
    ((SECONDS < end)) || {
        log "LIFETIME ($LIFETIME s) over and the host never said done"
        break
    }
    for f in "$W"/requests/*.cmd; do
        n="${f%.cmd}"
        [[ -e "$n.rc" ]] && continue
        (cd "$REPO" && timeout 300 bash "$f") 2>&1 | put "$n.out"
        echo "${PIPESTATUS[0]}" | put "$n.rc"
    done
    sleep 0.25
done
mark "done"
log "done: stopping the kubelet"
systemctl stop kubelet.service
dump
exit 0
