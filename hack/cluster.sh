#!/usr/bin/env bash
# The cluster tier: a real Kubernetes control plane on loopback and host
# nodes whose kubelets reach containerd through criguard, all under one
# directory. Built from hack/k8s/build.sh (kubernetes v1.37.2, etcd, a
# v1.34.4 kubelet, containerd 2).
#
# Usage:
#   hack/cluster.sh up [DIR]      start the control plane and the nodes; wait
#                                 until every node is Ready
#   hack/cluster.sh down [DIR] [--purge]
#                                 stop everything up started (by PID), unmount
#                                 what the kubelets mounted, remove the nodes'
#                                 cgroups; --purge also removes DIR
#   hack/cluster.sh restart-criguard DIR NAME
#                                 SIGKILL node NAME's criguard (by its pid
#                                 file), wait until it is gone, start it
#                                 again with the command line up used
#                                 (node-NAME/criguard.cmd: the same sockets,
#                                 state dir and kubeconfig) and wait until
#                                 its CRI and admin sockets answer; the
#                                 kubelet keeps running. Prints the ms taken
#   hack/cluster.sh logs [DIR]    the last lines of every component's log
#   hack/cluster.sh test [DIR]    cargo test --test it -- cluster:: (which runs up and
#                                 down itself, in DIR if given)
# DIR defaults to /tmp/criguard-cluster. After up, DIR/kubectl is kubectl with
# the admin kubeconfig, and DIR/cluster.env describes the cluster.
#
# Layout of DIR:
#   pki/            CA, serving and client certificates, SA key (hack/cluster/pki.sh)
#   etcd/           etcd's data
#   logs/NAME.log   etcd, kube-apiserver, kube-controller-manager, kube-scheduler
#   pids/NAME.pid   every process up started (kill by these only)
#   registry/       the private registry (CRIGUARD_CLUSTER_REGISTRY=1)
#   audit.log       the API server's audit log (hack/cluster/audit-policy.yaml)
#   node-NAME/      containerd/ (hack/containerd.sh), criguard.sock, admin.sock,
#                   criguard-state/, criguard.log, criguard.kubeconfig,
#                   criguard.cmd (its command line, NUL-separated),
#                   kubelet/ (--root-dir), kubelet.yaml, kubelet.log,
#                   manifests/ (static pods), pod-logs/, metrics-address,
#                   kubepods (the pods' cgroup), imagefs.img (the loop file
#                   of CRIGUARD_CLUSTER_IMAGEFS_MIB)
#
# Environment:
#   CRIGUARD_CLUSTER_OLD_NODE=1         also a node-b with the v1.34.4 kubelet,
#                                       dialling criguard by a bare socket path
#   CRIGUARD_CLUSTER_PODS_MEMORY=640Mi  the kubepods memory limit (MemTotal
#                                       minus kubeReserved and systemReserved)
#   CRIGUARD_CLUSTER_EVICTION=250Mi     criguard's allocatableMemory.available
#                                       hard threshold
#   CRIGUARD_CLUSTER_KUBELET_EVICTION=100Mi
#                                       the kubelet's memory.available hard
#                                       threshold (with enforceNodeAllocatable
#                                       pods the kubelet derives
#                                       allocatableMemory.available from it)
#   CRIGUARD_CLUSTER_TRANSITION=30s     evictionPressureTransitionPeriod (both)
#   CRIGUARD_CLUSTER_IMAGEFS_MIB        node-a's imagefs (its containerd root:
#                                       content store and snapshots) on an
#                                       ext4 filesystem of that size, a loop
#                                       file node-a/imagefs.img mounted on
#                                       node-a/containerd/root (unset: the
#                                       root stays on DIR's filesystem)
#   CRIGUARD_CLUSTER_IMAGEFS_EVICTION   criguard's imagefs.available hard
#                                       threshold, e.g. 128Mi (unset: none)
#   CRIGUARD_CLUSTER_KUBELET_IMAGEFS_EVICTION
#                                       the kubelet's imagefs.available hard
#                                       threshold (unset: none)
#   CRIGUARD_CLUSTER_IMAGE_MIN_AGE      minimum age of an unused image before
#                                       it is collected, for criguard
#                                       (--minimum-image-ttl-duration) and
#                                       the kubelet (imageMinimumGCAge)
#                                       alike (unset: criguard's default 2m,
#                                       the kubelet 24h); not 0s: the kubelet
#                                       takes 0 for unset (2m)
#   CRIGUARD_CLUSTER_KUBELET_IMAGE_GC_HIGH=100
#                                       the kubelet's imageGCHighThresholdPercent
#                                       (its low threshold 5 below); 100, the
#                                       default here, disables the kubelet's
#                                       image GC altogether, its reclaim under
#                                       disk pressure included (criguard
#                                       collects); 85 is the kubelet's default
#   CRIGUARD_CLUSTER_REGISTRY=1         a private registry (hack/registry.sh)
#                                       in DIR/registry that every node's
#                                       containerd pulls from over plain
#                                       HTTP; REGISTRY in cluster.env is its
#                                       address
#   CRIGUARD_CLUSTER_PUSH="ARCHIVE=REF ..."
#                                       OCI archives (hack/images.sh) pushed
#                                       to that registry as REF (name:tag)
#   CRIGUARD_CLUSTER_PREPULL="REF ..."  images of that registry node-a's
#                                       containerd pulls before its criguard
#                                       and kubelet start (crictl, straight
#                                       to containerd): a node's old images,
#                                       which the kubelet's image manager
#                                       has detected from its start on
#   CRIGUARD_CLUSTER_DRY_RUN=1          criguard with --dry-run (the kubelet acts)
#   CRIGUARD_CLUSTER_CRIGUARD_ARGS      more `criguard serve` flags
#   CRIGUARD_CLUSTER_TIMEOUT=180        seconds to wait for each readiness
#   CRIGUARD_BIN                        criguard binary (default target/debug/criguard)
#
# Outside DIR: the nodes' cgroups /criguard-<hash of DIR>-<node> in every
# hierarchy (removed by down); containerd's shim sockets in /run/containerd/s
# (hack/containerd.sh removes them); links in /var/log/containers (removed);
# and what the kubelet hard-codes and every kubelet on the host shares, left
# in place: /var/lib/kubelet/device-plugins/kubelet.sock and
# /usr/libexec/kubernetes/kubelet-plugins.
#
# Networking: every address is 127.0.0.1; the nodes' containerds load a CNI
# config whose only plugin is loopback, so the runtime reports NetworkReady,
# and pods run with hostNetwork: true. No packet leaves the machine.
set -euo pipefail
export LC_ALL=C

SELF="$(readlink -f "${BASH_SOURCE[0]}")"
REPO_ROOT="$(cd "$(dirname "$SELF")/.." && pwd)"
HERE="$REPO_ROOT/hack/cluster"
TIMEOUT="${CRIGUARD_CLUSTER_TIMEOUT:-180}"

# log, die, usage and the helpers both cluster scripts use.
# shellcheck source=hack/cluster/lib.sh
source "$HERE/lib.sh"
# shellcheck source=hack/lib/mounts.sh
source "$REPO_ROOT/hack/lib/mounts.sh"

set_paths() {
    set_dir "${1:-/tmp/criguard-cluster}"
    PKI_DIR="$DIR/pki"
    # A short tag of DIR keeps the cgroup roots of two clusters apart.
    TAG="$(printf '%s' "$DIR" | sha256sum | cut -c1-8)"
}

# Is PID alive with an argument under DIR (so that it is ours)?
ours() {
    alive "$1" && tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$DIR/"
}

# free_port VAR: set VAR to a TCP port no socket on this machine uses (ss,
# iproute2) and not handed out before by this run, from 20000-32767 (below
# the kernel's ephemeral range).
USED_PORTS=" "
free_port() {
    local p
    for _ in $(seq 200); do
        p=$((20000 + (RANDOM * 32768 + RANDOM) % 12768))
        [[ "$USED_PORTS" == *" $p "* ]] && continue
        [[ -z "$(ss -Htan "sport = :$p" 2>/dev/null)" ]] || continue
        USED_PORTS+="$p "
        printf -v "$1" '%s' "$p"
        return 0
    done
    die "no free TCP port found"
}

# spawn NAME LOG CMD...: start CMD in its own session, output to LOG, pid
# to DIR/pids/NAME.pid.
spawn() {
    local name="$1" out="$2"
    shift 2
    mkdir -p "$DIR/pids"
    echo "=== $(date -u '+%Y-%m-%dT%H:%M:%SZ') $*" >>"$out"
    setsid "$@" </dev/null >>"$out" 2>&1 &
    echo $! >"$DIR/pids/$name.pid"
}

# wait_for WHAT PIDNAME CMD...: poll CMD until it succeeds, failing early
# when the process PIDNAME is gone.
wait_for() {
    local what="$1" name="$2" pid end
    shift 2
    pid="$(read_pid "$DIR/pids/$name.pid")"
    end=$((SECONDS + TIMEOUT))
    until "$@" >/dev/null 2>&1; do
        [[ -z "$pid" ]] || alive "$pid" || die "$name (pid $pid) exited while waiting for $what"
        ((SECONDS < end)) || die "$what not within ${TIMEOUT}s"
        sleep 0.2
    done
}

# stop_pid NAME: TERM the process in DIR/pids/NAME.pid if it is ours, KILL
# after 15 s.
stop_pid() {
    local f="$DIR/pids/$1.pid" pid
    pid="$(read_pid "$f")"
    if [[ -n "$pid" ]] && ours "$pid"; then
        log "stopping $1 (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        if ! wait_exit "$pid" 15; then
            log "$1 did not exit on TERM; killing"
            kill -KILL "$pid" 2>/dev/null || true
            wait_exit "$pid" 5 || true
        fi
    fi
    rm -f "$f"
}

cert_user() { # cert_user NAME: the user lines for a client certificate
    printf '    client-certificate: %s\n    client-key: %s' "$PKI_DIR/$1.crt" "$PKI_DIR/$1.key"
}

kubectl_() { "$K8S_BIN/kubectl" --kubeconfig "$DIR/admin.kubeconfig" "$@"; }

bins() {
    K8S_BIN="$("$REPO_ROOT/hack/k8s/build.sh" --path kubernetes)"
    ETCD_BIN="$("$REPO_ROOT/hack/k8s/build.sh" --path etcd)"
    CRIGUARD="${CRIGUARD_BIN:-$REPO_ROOT/target/debug/criguard}"
    [[ -x "$CRIGUARD" ]] || die "no criguard binary at $CRIGUARD (cargo build --bin criguard)"
}

# ---- control plane ------------------------------------------------------------

control_plane_up() {
    local etcd_port peer_port cm_port sched_port
    free_port etcd_port
    free_port peer_port
    free_port API_PORT
    free_port cm_port
    free_port sched_port
    mkdir -p "$DIR/logs" "$DIR/etcd"
    chmod 0700 "$DIR/etcd"

    # shellcheck source=hack/cluster/pki.sh
    source "$HERE/pki.sh"
    pki_control_plane

    spawn etcd "$DIR/logs/etcd.log" "$ETCD_BIN/etcd" --name default --data-dir "$DIR/etcd" \
        --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
        --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
        --initial-cluster "default=http://127.0.0.1:$peer_port" --unsafe-no-fsync --log-level warn
    wait_for "etcd health" etcd curl -sf "http://127.0.0.1:$etcd_port/health"

    spawn kube-apiserver "$DIR/logs/kube-apiserver.log" "$K8S_BIN/kube-apiserver" \
        --etcd-servers "http://127.0.0.1:$etcd_port" \
        --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
        --endpoint-reconciler-type none \
        --tls-cert-file "$PKI_DIR/apiserver.crt" --tls-private-key-file "$PKI_DIR/apiserver.key" \
        --client-ca-file "$PKI_DIR/ca.crt" \
        --kubelet-client-certificate "$PKI_DIR/apiserver-kubelet.crt" \
        --kubelet-client-key "$PKI_DIR/apiserver-kubelet.key" \
        --kubelet-certificate-authority "$PKI_DIR/ca.crt" \
        --kubelet-preferred-address-types InternalIP \
        --service-account-issuer "https://127.0.0.1:$API_PORT" \
        --service-account-key-file "$PKI_DIR/sa.pub" \
        --service-account-signing-key-file "$PKI_DIR/sa.key" \
        --service-cluster-ip-range 10.96.0.0/24 \
        --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
        --allow-privileged=true \
        --audit-policy-file "$HERE/audit-policy.yaml" --audit-log-path "$DIR/audit.log" \
        --audit-log-mode blocking --profiling=false --v=1
    wait_for "kube-apiserver /readyz" kube-apiserver curl -sf --cacert "$PKI_DIR/ca.crt" \
        --cert "$PKI_DIR/admin.crt" --key "$PKI_DIR/admin.key" "https://127.0.0.1:$API_PORT/readyz"

    # The cluster: mapping's lines of every kubeconfig on this host.
    API_CLUSTER="$(printf '    server: https://127.0.0.1:%s\n    certificate-authority: %s' "$API_PORT" "$PKI_DIR/ca.crt")"
    kubeconfig "$DIR/admin.kubeconfig" "$API_CLUSTER" "$(cert_user admin)"
    kubeconfig "$DIR/controller-manager.kubeconfig" "$API_CLUSTER" "$(cert_user controller-manager)"
    kubeconfig "$DIR/scheduler.kubeconfig" "$API_CLUSTER" "$(cert_user scheduler)"
    cat >"$DIR/kubectl" <<EOF
#!/bin/sh
exec "$K8S_BIN/kubectl" --kubeconfig "$DIR/admin.kubeconfig" "\$@"
EOF
    chmod +x "$DIR/kubectl"

    spawn kube-controller-manager "$DIR/logs/kube-controller-manager.log" "$K8S_BIN/kube-controller-manager" \
        --kubeconfig "$DIR/controller-manager.kubeconfig" \
        --authentication-kubeconfig "$DIR/controller-manager.kubeconfig" \
        --authorization-kubeconfig "$DIR/controller-manager.kubeconfig" \
        --bind-address 127.0.0.1 --secure-port "$cm_port" --leader-elect=false \
        --use-service-account-credentials \
        --service-account-private-key-file "$PKI_DIR/sa.key" --root-ca-file "$PKI_DIR/ca.crt" \
        --controllers '*' --v=1
    spawn kube-scheduler "$DIR/logs/kube-scheduler.log" "$K8S_BIN/kube-scheduler" \
        --kubeconfig "$DIR/scheduler.kubeconfig" \
        --authentication-kubeconfig "$DIR/scheduler.kubeconfig" \
        --authorization-kubeconfig "$DIR/scheduler.kubeconfig" \
        --bind-address 127.0.0.1 --secure-port "$sched_port" --leader-elect=false --v=1
    wait_for "kube-controller-manager /healthz" kube-controller-manager curl -sfk "https://127.0.0.1:$cm_port/healthz"
    wait_for "kube-scheduler /healthz" kube-scheduler curl -sfk "https://127.0.0.1:$sched_port/healthz"
    # The default ServiceAccount appears once the serviceaccount controller runs.
    wait_for "the default ServiceAccount" kube-controller-manager kubectl_ -n default get serviceaccount default

    # criguard's RBAC, and a token for its kubeconfigs.
    kubectl_ apply -f "$REPO_ROOT/deploy/rbac.yaml" >&2
    criguard_token CRIGUARD_TOKEN
}

# ---- nodes --------------------------------------------------------------------

# cgroup hierarchies of this host (v1 controllers, named, and the v2 tree).
cgroup_mounts() {
    awk '{ for (i = 7; i <= NF; i++) if ($i == "-") break; if ($(i + 1) == "cgroup" || $(i + 1) == "cgroup2") print $5 }' /proc/self/mountinfo
}

# make_cgroup_root PATH: PATH in every hierarchy (the kubelet refuses a
# cgroupRoot that does not exist), cpuset filled from its parent.
make_cgroup_root() {
    local m
    while read -r m; do
        mkdir -p "$m$1"
        if [[ -f "$m$1/cpuset.cpus" ]]; then
            [[ -n "$(cat "$m$1/cpuset.cpus")" ]] || cat "$m/cpuset.cpus" >"$m$1/cpuset.cpus"
            [[ -n "$(cat "$m$1/cpuset.mems")" ]] || cat "$m/cpuset.mems" >"$m$1/cpuset.mems"
        fi
    done < <(cgroup_mounts)
}

# remove_cgroup_root PATH: kill what is left in it, then remove its tree,
# deepest first, in every hierarchy.
remove_cgroup_root() {
    local m d p
    [[ "$1" == /criguard-* ]] || return 0
    for _ in 1 2 3; do
        while read -r m; do
            [[ -d "$m$1" ]] || continue
            while read -r d; do
                while read -r p; do
                    [[ "$p" =~ ^[0-9]+$ ]] && kill -KILL "$p" 2>/dev/null
                done <"$d/cgroup.procs" 2>/dev/null || true
            done < <(find "$m$1" -type d)
        done < <(cgroup_mounts)
        while read -r m; do
            [[ -d "$m$1" ]] && find "$m$1" -depth -type d -exec rmdir {} + 2>/dev/null
        done < <(cgroup_mounts)
        local left=0
        while read -r m; do [[ -d "$m$1" ]] && left=1; done < <(cgroup_mounts)
        ((left)) || return 0
        sleep 0.5
    done
    log "warning: cgroups remain under $1"
}

# criguard_up NAME CG_ROOT: write node NAME's criguard command line to
# DIR/node-NAME/criguard.cmd (NUL-separated, so restart-criguard runs exactly
# the same one), then start it.
criguard_up() {
    local name="$1" cg_root="$2" nd="$DIR/node-$1" mport extra_args=()
    free_port mport
    echo "127.0.0.1:$mport" >"$nd/metrics-address"
    echo "$cg_root/kubepods" >"$nd/kubepods"
    make_cgroup_root "$cg_root"
    ((${CRIGUARD_CLUSTER_DRY_RUN:-0})) && extra_args+=(--dry-run)
    [[ -z "${CRIGUARD_CLUSTER_IMAGE_MIN_AGE:-}" ]] ||
        extra_args+=(--minimum-image-ttl-duration "$CRIGUARD_CLUSTER_IMAGE_MIN_AGE")
    # shellcheck disable=SC2206
    extra_args+=(${CRIGUARD_CLUSTER_CRIGUARD_ARGS:-})
    printf '%s\0' env CRIGUARD_LOG="${CRIGUARD_LOG:-info}" "$CRIGUARD" serve \
        --listen "$nd/criguard.sock" --admin-socket "$nd/admin.sock" \
        --metrics-address "127.0.0.1:$mport" \
        --runtime-endpoint "unix://$nd/containerd/containerd.sock" \
        --state-dir "$nd/criguard-state" \
        --kubepods-cgroup "$cg_root/kubepods" \
        --nodefs "$nd/kubelet" --imagefs "$nd/containerd/root" \
        --eviction-hard "$(criguard_eviction_hard)" \
        --eviction-pressure-transition-period "${CRIGUARD_CLUSTER_TRANSITION:-30s}" \
        --kubeconfig "$nd/criguard.kubeconfig" --node-name "$name" \
        "${extra_args[@]}" >"$nd/criguard.cmd"
    criguard_spawn "$name"
    wait_for "criguard's socket ($name)" "criguard-$name" test -S "$nd/criguard.sock"
}

# criguard_eviction_hard: criguard's --eviction-hard (memory, and imagefs when
# CRIGUARD_CLUSTER_IMAGEFS_EVICTION is set).
criguard_eviction_hard() {
    local t="allocatableMemory.available<${CRIGUARD_CLUSTER_EVICTION:-250Mi}"
    [[ -z "${CRIGUARD_CLUSTER_IMAGEFS_EVICTION:-}" ]] || t+=",imagefs.available<$CRIGUARD_CLUSTER_IMAGEFS_EVICTION"
    echo "$t"
}

# kubelet_eviction_hard: the kubelet's evictionHard, as a flow mapping.
kubelet_eviction_hard() {
    local t="memory.available: \"${CRIGUARD_CLUSTER_KUBELET_EVICTION:-100Mi}\""
    [[ -z "${CRIGUARD_CLUSTER_KUBELET_IMAGEFS_EVICTION:-}" ]] ||
        t+=", imagefs.available: \"$CRIGUARD_CLUSTER_KUBELET_IMAGEFS_EVICTION\""
    echo "{$t}"
}

# containerd_toml: CRIGUARD_CONTAINERD_EXTRA_TOML for the nodes' containerds:
# the caller's, and the private registry's hosts directory when there is one.
containerd_toml() {
    local section='plugins."io.containerd.cri.v1.images".registry'
    [[ "${CRIGUARD_CONTAINERD:-2}" == 2 ]] || section='plugins."io.containerd.grpc.v1.cri".registry'
    printf '%s\n' "${CRIGUARD_CONTAINERD_EXTRA_TOML:-}"
    if [[ -d "$DIR/registry/certs.d" ]]; then
        printf '[%s]\nconfig_path = "%s"\n' "$section" "$DIR/registry/certs.d"
    fi
}

# registry_up: the private registry in DIR/registry (CRIGUARD_CLUSTER_REGISTRY=1).
registry_up() {
    REGISTRY="$("$REPO_ROOT/hack/registry.sh" start "$DIR/registry" | tail -n 1)"
    [[ -n "$REGISTRY" ]] || die "hack/registry.sh start gave no address"
    log "registry on $REGISTRY (hack/registry.sh push $DIR/registry ARCHIVE REF)"
}

# push_images: CRIGUARD_CLUSTER_PUSH's archives into the registry.
push_images() {
    local item
    for item in ${CRIGUARD_CLUSTER_PUSH:-}; do
        [[ "$item" == *=* ]] || die "CRIGUARD_CLUSTER_PUSH: '$item' is not ARCHIVE=REF"
        "$REPO_ROOT/hack/registry.sh" push "$DIR/registry" "${item%%=*}" "${item#*=}" ||
            die "pushing ${item%%=*} as ${item#*=} failed"
    done
}

# prepull ND: CRIGUARD_CLUSTER_PREPULL's images pulled from the registry by
# the containerd of node directory ND.
prepull() {
    local nd="$1" ref crictl
    [[ -n "${CRIGUARD_CLUSTER_PREPULL:-}" ]] || return 0
    [[ -n "$REGISTRY" ]] || die "CRIGUARD_CLUSTER_PREPULL needs CRIGUARD_CLUSTER_REGISTRY=1"
    crictl="$("$REPO_ROOT/hack/k8s/build.sh" --path cri-tools)/crictl"
    for ref in $CRIGUARD_CLUSTER_PREPULL; do
        "$crictl" --image-endpoint "unix://$nd/containerd/containerd.sock" --timeout 60s \
            pull "$REGISTRY/$ref" >&2 || die "pulling $REGISTRY/$ref failed"
    done
}

# small_imagefs ND MIB: an ext4 filesystem of MIB MiB in the loop file
# ND/imagefs.img (sparse, no journal, no reserved blocks), mounted on
# ND/containerd/root before containerd starts there; the loop device goes
# with the unmount (mount -o loop sets autoclear), which down does.
small_imagefs() {
    local nd="$1" mib="$2"
    [[ "$mib" =~ ^[1-9][0-9]*$ ]] || die "CRIGUARD_CLUSTER_IMAGEFS_MIB must be a number of MiB, got '$mib'"
    mkdir -p "$nd/containerd/root"
    rm -f "$nd/imagefs.img"
    truncate -s "${mib}M" "$nd/imagefs.img"
    mkfs.ext4 -q -F -m 0 -O ^has_journal -b 4096 "$nd/imagefs.img" >&2 || die "mkfs.ext4 on $nd/imagefs.img failed"
    mount -t ext4 -o loop,noatime "$nd/imagefs.img" "$nd/containerd/root" || die "mounting $nd/imagefs.img failed"
    log "$(basename "$nd"): imagefs on a ${mib} MiB ext4 ($(findmnt -no SOURCE "$nd/containerd/root"))"
}

# criguard_spawn NAME: start node NAME's criguard by DIR/node-NAME/criguard.cmd.
criguard_spawn() {
    local nd="$DIR/node-$1" argv=()
    [[ -s "$nd/criguard.cmd" ]] || die "no criguard command line in $nd/criguard.cmd (was node $1 started by up?)"
    mapfile -d '' -t argv <"$nd/criguard.cmd"
    spawn "criguard-$1" "$nd/criguard.log" "${argv[@]}"
}

# node_up NAME KUBELET_BIN ENDPOINT_STYLE(url|path)
node_up() {
    local name="$1" kubelet="$2" style="$3" nd cg_root total target reserved kube_res sys_res
    local kport hport endpoint
    nd="$DIR/node-$name"
    cg_root="/criguard-$TAG-$name"
    mkdir -p "$nd"/{manifests,kubelet,pod-logs,volume-plugins}
    pki_node "$name"
    kubeconfig "$nd/kubelet.kubeconfig" "$API_CLUSTER" "$(cert_user "node-$name")"
    kubeconfig "$nd/criguard.kubeconfig" "$API_CLUSTER" "    token: $CRIGUARD_TOKEN"

    # containerd 2, a CNI config with only the loopback plugin (NetworkReady,
    # nothing routed), the pause and busybox images.
    mkdir -p "$nd/containerd/cni/net.d"
    cp "$HERE/10-loopback.conflist" "$nd/containerd/cni/net.d/"
    if [[ "$name" == node-a && -n "${CRIGUARD_CLUSTER_IMAGEFS_MIB:-}" ]]; then
        small_imagefs "$nd" "$CRIGUARD_CLUSTER_IMAGEFS_MIB"
    fi
    CRIGUARD_CONTAINERD="${CRIGUARD_CONTAINERD:-2}" CRIGUARD_CONTAINERD_EXTRA_TOML="$(containerd_toml)" \
        "$REPO_ROOT/hack/containerd.sh" start "$nd/containerd" >/dev/null
    [[ "$name" != node-a ]] || prepull "$nd"

    # criguard in front of it.
    criguard_up "$name" "$cg_root"

    # The kubelet: kubepods limited to CRIGUARD_CLUSTER_PODS_MEMORY by
    # reserving the rest of MemTotal.
    total=$(($(awk '$1 == "MemTotal:" { print $2 }' /proc/meminfo) * 1024))
    target="$(numfmt --from=iec-i "${CRIGUARD_CLUSTER_PODS_MEMORY:-640Mi}")"
    reserved=$((total - target))
    kube_res=$((256 << 20))
    sys_res=$((reserved - kube_res))
    ((sys_res > 0)) || die "CRIGUARD_CLUSTER_PODS_MEMORY too large for this machine"
    free_port kport
    free_port hport
    local image_gc_high="${CRIGUARD_CLUSTER_KUBELET_IMAGE_GC_HIGH:-100}"
    if [[ ! "$image_gc_high" =~ ^[0-9]+$ ]] || ((image_gc_high < 6 || image_gc_high > 100)); then
        die "CRIGUARD_CLUSTER_KUBELET_IMAGE_GC_HIGH must be 6 to 100, got '$image_gc_high'"
    fi
    if [[ "$style" == path ]]; then
        endpoint="$nd/criguard.sock"
    else
        endpoint="unix://$nd/criguard.sock"
    fi
    cat >"$nd/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $kport
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $hport
tlsCertFile: $PKI_DIR/node-$name-serving.crt
tlsPrivateKeyFile: $PKI_DIR/node-$name-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI_DIR/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: $endpoint
cgroupDriver: cgroupfs
cgroupRoot: $cg_root
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
kubeReserved: {memory: "$kube_res"}
systemReserved: {memory: "$sys_res"}
evictionHard: $(kubelet_eviction_hard)
evictionPressureTransitionPeriod: ${CRIGUARD_CLUSTER_TRANSITION:-30s}
failCgroupV1: false
failSwapOn: false
staticPodPath: $nd/manifests
fileCheckFrequency: 5s
podLogsDir: $nd/pod-logs
volumePluginDir: $nd/volume-plugins
imageGCHighThresholdPercent: $image_gc_high
imageGCLowThresholdPercent: $((image_gc_high == 100 ? 99 : image_gc_high - 5))
imageMinimumGCAge: ${CRIGUARD_CLUSTER_IMAGE_MIN_AGE:-24h}
serializeImagePulls: false
makeIPTablesUtilChains: false
maxPods: 30
resolvConf: /etc/resolv.conf
EOF
    spawn "kubelet-$name" "$nd/kubelet.log" "$kubelet" --config "$nd/kubelet.yaml" \
        --kubeconfig "$nd/kubelet.kubeconfig" --root-dir "$nd/kubelet" \
        --hostname-override "$name" --node-ip 127.0.0.1 --v=2
    echo "$name" >>"$DIR/nodes"
}

node_down() { # node_down NAME (kubelet, criguard, containerd, mounts, cgroups)
    local name="$1" nd="$DIR/node-$1"
    stop_pid "kubelet-$name"
    stop_pid "criguard-$name"
    if [[ -d "$nd/containerd" ]]; then
        "$REPO_ROOT/hack/containerd.sh" stop "$nd/containerd" --purge >&2 || log "warning: containerd stop failed for $name"
    fi
    unmount_under "$nd" || true
    remove_cgroup_root "/criguard-$TAG-$name"
    # The kubelet links container logs into /var/log/containers whatever
    # its podLogsDir; remove the links into this node.
    local l
    for l in /var/log/containers/*.log; do
        [[ -L "$l" && "$(readlink "$l")" == "$nd/"* ]] && rm -f "$l"
    done
    return 0
}

# ---- commands -----------------------------------------------------------------

do_up() {
    local t0 t_cp name
    [[ "$(id -u)" -eq 0 ]] || die "run as root (containerd and the kubelet need it)"
    if [[ -e "$DIR/pids" ]] && compgen -G "$DIR/pids/*.pid" >/dev/null; then
        die "$DIR already has a cluster (hack/cluster.sh down $DIR first)"
    fi
    bins
    t0="$(now_ms)"
    mkdir -p "$DIR"
    rm -f "$DIR/nodes"
    trap 'log "up failed; stopping what started"; do_down || true' EXIT
    trap 'exit 130' INT TERM HUP

    control_plane_up
    t_cp="$(now_ms)"
    log "control plane ready in $((t_cp - t0)) ms (API https://127.0.0.1:$API_PORT)"
    REGISTRY=""
    if ((${CRIGUARD_CLUSTER_REGISTRY:-0})); then
        registry_up
        push_images
        log "registry up, $(wc -w <<<"${CRIGUARD_CLUSTER_PUSH:-}") images pushed in $(($(now_ms) - t_cp)) ms"
    fi

    node_up node-a "$K8S_BIN/kubelet" url
    if ((${CRIGUARD_CLUSTER_OLD_NODE:-0})); then
        node_up node-b "$("$REPO_ROOT/hack/k8s/build.sh" --path kubelet-1.34)/kubelet" path
    fi
    while read -r name; do
        wait_for "node $name Ready" "kubelet-$name" node_ready "$name"
    done <"$DIR/nodes"
    t_nodes="$(now_ms)"
    log "nodes Ready in $((t_nodes - t_cp)) ms; up took $((t_nodes - t0)) ms"

    cat >"$DIR/cluster.env" <<EOF
CRIGUARD_CLUSTER_DIR=$DIR
KUBECONFIG=$DIR/admin.kubeconfig
KUBECTL=$K8S_BIN/kubectl
API_SERVER=https://127.0.0.1:$API_PORT
NODES="$(tr '\n' ' ' <"$DIR/nodes" | sed 's/ $//')"
REGISTRY=$REGISTRY
UP_CONTROL_PLANE_MS=$((t_cp - t0))
UP_NODES_MS=$((t_nodes - t_cp))
UP_TOTAL_MS=$((t_nodes - t0))
EOF
    trap - EXIT INT TERM HUP
    echo "$DIR"
}

do_down() {
    local name
    [[ -d "$DIR" ]] || {
        log "$DIR does not exist; nothing to stop"
        return 0
    }
    # The VM node (hack/cluster/vm-node.sh) first: its shares live under DIR.
    if [[ -e "$DIR/vm-node/vm.pid" ]]; then
        "$REPO_ROOT/hack/cluster/vm-node.sh" down "$DIR" || log "warning: vm-node.sh down failed"
    fi
    if [[ -r "$DIR/nodes" ]]; then
        # Kubelets first, so none restarts a pod while the rest goes.
        while read -r name; do stop_pid "kubelet-$name"; done <"$DIR/nodes"
        while read -r name; do node_down "$name"; done <"$DIR/nodes"
    fi
    # A node whose up failed before it was listed.
    for nd in "$DIR"/node-*; do
        [[ -d "$nd" ]] || continue
        name="${nd##*/node-}"
        grep -qxF "$name" "$DIR/nodes" 2>/dev/null || node_down "$name"
    done
    stop_pid kube-scheduler
    stop_pid kube-controller-manager
    stop_pid kube-apiserver
    stop_pid etcd
    [[ ! -d "$DIR/registry" ]] || "$REPO_ROOT/hack/registry.sh" stop "$DIR/registry" || log "warning: registry stop failed"
    unmount_under "$DIR" || true
    log "stopped $DIR"
}

do_restart_criguard() { # do_restart_criguard NAME
    local name="$1" nd="$DIR/node-$1" pid t0 t1 crictl
    [[ "$(id -u)" -eq 0 ]] || die "run as root"
    [[ -d "$nd" ]] || die "no node $name in $DIR ($nd does not exist)"
    bins
    crictl="$("$REPO_ROOT/hack/k8s/build.sh" --path cri-tools)/crictl"
    t0="$(now_ms)"
    pid="$(read_pid "$DIR/pids/criguard-$name.pid")"
    if [[ -n "$pid" ]] && alive "$pid"; then
        ours "$pid" || die "pid $pid of $DIR/pids/criguard-$name.pid is not this cluster's criguard"
        log "killing criguard-$name (pid $pid, SIGKILL)"
        kill -KILL "$pid"
        wait_exit "$pid" 15 || die "criguard-$name (pid $pid) still there 15 s after SIGKILL"
    else
        log "criguard-$name was not running; starting it"
    fi
    criguard_spawn "$name"
    # Its CRI socket answers (Version, relayed to containerd), then its
    # admin socket; the stale sockets the killed one left are criguard's to
    # replace.
    wait_for "criguard's CRI socket ($name) answering" "criguard-$name" \
        "$crictl" --runtime-endpoint "unix://$nd/criguard.sock" --timeout 2s version
    wait_for "criguard's admin socket ($name) answering" "criguard-$name" \
        "$CRIGUARD" evictions --admin-socket "$nd/admin.sock"
    t1="$(now_ms)"
    log "criguard-$name restarted (pid $(read_pid "$DIR/pids/criguard-$name.pid")) in $((t1 - t0)) ms"
    echo "$((t1 - t0))"
}

do_logs() {
    tail_logs "${CRIGUARD_CLUSTER_LOG_LINES:-60}" "$DIR"/logs/*.log "$DIR"/node-*/criguard.log \
        "$DIR"/node-*/kubelet.log "$DIR"/node-*/containerd/containerd.log
}

[[ $# -ge 1 ]] || usage
cmd="$1"
shift
case "$cmd" in
    up)
        [[ $# -le 1 ]] || usage
        set_paths "${1:-}"
        do_up
        ;;
    down)
        purge=0
        [[ "${2:-}" == --purge ]] && purge=1
        [[ "${1:-}" == --purge ]] && { purge=1; shift; }
        set_paths "${1:-}"
        do_down
        if ((purge)); then
            [[ -z "$(mounts_under "$DIR")" ]] || die "mounts remain under $DIR; not removing it"
            rm -rf --one-file-system "$DIR"
        fi
        ;;
    restart-criguard)
        [[ $# -eq 2 ]] || usage
        set_paths "$1"
        do_restart_criguard "$2"
        ;;
    logs)
        set_paths "${1:-}"
        do_logs
        ;;
    test)
        set_paths "${1:-}"
        cd "$REPO_ROOT"
        CRIGUARD_CLUSTER_DIR="${1:-}" exec cargo test --test it -- --nocapture --test-threads 1 cluster::
        ;;
    *) usage ;;
esac
