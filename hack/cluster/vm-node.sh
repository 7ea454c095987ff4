#!/usr/bin/env bash
# The cluster tier's VM node: a second node, in the VM tier's machine
# (hack/vm.sh: systemd as PID 1, cgroup v2), joined to a cluster that
# `hack/cluster.sh up DIR` started on this host. In the guest everything is a
# systemd unit (hack/vm/cluster-node.sh): containerd 2 from the stack cache
# with the systemd cgroup driver, criguard from its Debian package (hack/deb.sh, dpkg -i), and
# the kubelet dialling criguard's socket (or, with
# CRIGUARD_VMNODE_KUBELET_RUNTIME=containerd, containerd's: a node that
# `criguard adopt` has yet to adopt). The guest reaches the API server
# only through QEMU's user network with restrict=on: 10.0.2.100:6443 in the
# guest is relayed to the API server's loopback port here (guestfwd), so no
# packet leaves QEMU and nothing outside reaches the guest.
#
# Usage:
#   hack/cluster/vm-node.sh up DIR
#       Make the node's credentials, boot the VM in the background and wait
#       until the node is Ready in the API. Prints DIR/vm-node.
#   hack/cluster/vm-node.sh exec DIR CMD...
#       Run CMD (bash, in the repository) in the guest as root; its output
#       and exit status (a request file in the share the guest polls).
#   hack/cluster/vm-node.sh down DIR
#       Tell the guest to stop (kubelet first, then its journal is written to
#       DIR/vm-node/share/journal.txt) and wait for the VM to power off;
#       stop it if it does not.
#   hack/cluster/vm-node.sh logs DIR
#       The VM's and the guest's logs and the guest's journal (once written).
#
# Layout of DIR/vm-node/:
#   vm.pid vm.log     hack/vm.sh run in the background, and its output
#   times.env         VMNODE_SETUP_MS (start to the guest's "ready"),
#                     VMNODE_READY_MS (start to the node Ready in the API)
#   share/            the guest's read-write share (see hack/vm/cluster-node.sh)
#
# Environment:
#   CRIGUARD_VMNODE_NAME=vm-node           the node's name
#   CRIGUARD_VMNODE_PODS_MEMORY=512Mi      kubepods.slice's memory.max
#   CRIGUARD_VMNODE_EVICTION=250Mi         criguard's allocatableMemory.available
#   CRIGUARD_VMNODE_KUBELET_EVICTION=100Mi the kubelet's memory.available
#   CRIGUARD_VMNODE_TRANSITION=30s         evictionPressureTransitionPeriod (both)
#   CRIGUARD_VMNODE_KUBELET_RUNTIME=criguard  the socket the kubelet's config
#                                          names: criguard's, or containerd's
#   CRIGUARD_VMNODE_TIMEOUT=900            seconds `up` waits for the node Ready
#   CRIGUARD_VMNODE_LIFETIME=3600          seconds the VM serves at most
#   CRIGUARD_BIN                           criguard (default target/debug/criguard)
#   CRIGUARD_VM_MEM, CRIGUARD_VM_CPUS      the VM's size (hack/vm.sh)
set -euo pipefail
export LC_ALL=C

SELF="$(readlink -f "${BASH_SOURCE[0]}")"
REPO_ROOT="$(cd "$(dirname "$SELF")/../.." && pwd)"
NAME="${CRIGUARD_VMNODE_NAME:-vm-node}"
TIMEOUT="${CRIGUARD_VMNODE_TIMEOUT:-900}"
LIFETIME="${CRIGUARD_VMNODE_LIFETIME:-3600}"
# Where the guest finds the API server (vm.sh --forward).
GUEST_API=10.0.2.100:6443

# log, die, usage and the helpers both cluster scripts use.
# shellcheck source=hack/cluster/lib.sh
source "$REPO_ROOT/hack/cluster/lib.sh"

set_paths() {
    set_dir "$1"
    V="$DIR/vm-node"
    W="$V/share"
    [[ "$NAME" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] ||
        die "CRIGUARD_VMNODE_NAME must be a DNS label, got '$NAME'"
}

# The pid of our hack/vm.sh run, if it is alive and ours.
vm_pid() {
    local p
    p="$(read_pid "$V/vm.pid")"
    [[ -n "$p" ]] && alive "$p" &&
        tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | grep -qxF -- "CRIGUARD_VMNODE_DIR=$W" &&
        echo "$p"
    return 0
}

kubectl_() { "$DIR/kubectl" "$@"; }

# The cluster: mapping's lines of the guest's kubeconfigs, everything
# inline. The API server's certificate names 127.0.0.1 and localhost, not
# the guestfwd address: hence tls-server-name.
guest_cluster() {
    printf '    server: https://%s\n    tls-server-name: localhost\n    certificate-authority-data: %s' \
        "$GUEST_API" "$(base64 -w0 "$DIR/pki/ca.crt")"
}

do_up() {
    local api_port token cluster containerd_bin k8s_bin criguard endpoint t0 t_ready t_node pid
    [[ "$(id -u)" -eq 0 ]] || die "run as root (hack/vm.sh builds its image as root)"
    [[ -r "$DIR/cluster.env" && -x "$DIR/kubectl" ]] || die "no cluster in $DIR (hack/cluster.sh up $DIR first)"
    api_port="$(sed -n 's|^API_SERVER=https://127\.0\.0\.1:\([0-9]*\)$|\1|p' "$DIR/cluster.env")"
    [[ -n "$api_port" ]] || die "no API_SERVER=https://127.0.0.1:PORT in $DIR/cluster.env"
    [[ -z "$(vm_pid)" ]] || die "a VM node already runs for $DIR (pid $(vm_pid)); hack/cluster/vm-node.sh down $DIR"
    containerd_bin="$("$REPO_ROOT/hack/k8s/build.sh" --path containerd | tail -n1)"
    k8s_bin="$("$REPO_ROOT/hack/k8s/build.sh" --path kubernetes | tail -n1)"
    criguard="$(readlink -f "${CRIGUARD_BIN:-$REPO_ROOT/target/debug/criguard}")"
    [[ -x "$criguard" ]] || die "no criguard binary at $criguard (cargo build --bin criguard)"
    case "${CRIGUARD_VMNODE_KUBELET_RUNTIME:-criguard}" in
        criguard) endpoint=unix:///run/criguard/criguard.sock ;;
        containerd) endpoint=unix:///run/containerd/containerd.sock ;;
        *) die "CRIGUARD_VMNODE_KUBELET_RUNTIME must be criguard or containerd, got '$CRIGUARD_VMNODE_KUBELET_RUNTIME'" ;;
    esac
    t0="$(now_ms)"

    rm -rf --one-file-system "$V"
    mkdir -p "$W/requests"
    chmod 0700 "$V"
    # A copy without debug info (half the bytes) where objcopy is: the
    # package built from it, and each upgrade's repack in the guest, move
    # that much less.
    if command -v objcopy >/dev/null && mkdir -p "$V/bin" &&
        objcopy --strip-debug "$criguard" "$V/bin/criguard"; then
        criguard="$V/bin/criguard"
    fi
    # The kubelet's client certificate, by the cluster's own PKI functions.
    # shellcheck disable=SC2034 # read by pki.sh's functions
    PKI_DIR="$DIR/pki"
    # shellcheck source=hack/cluster/pki.sh
    source "$REPO_ROOT/hack/cluster/pki.sh"
    pki_cert "node-$NAME" "/O=system:nodes/CN=system:node:$NAME"
    cluster="$(guest_cluster)"
    kubeconfig "$W/kubelet.kubeconfig" "$cluster" "$(printf '    client-certificate-data: %s\n    client-key-data: %s' \
        "$(base64 -w0 "$DIR/pki/node-$NAME.crt")" "$(base64 -w0 "$DIR/pki/node-$NAME.key")")"
    criguard_token token
    kubeconfig "$W/criguard.kubeconfig" "$cluster" "    token: $token"
    cp "$DIR/pki/ca.crt" "$W/ca.crt"
    cat >"$W/node.env" <<EOF
NODE_NAME=$NAME
CONTAINERD_BIN=$containerd_bin
K8S_BIN=$k8s_bin
CRIGUARD_BIN=$criguard
PODS_MEMORY=${CRIGUARD_VMNODE_PODS_MEMORY:-512Mi}
CRIGUARD_EVICTION=${CRIGUARD_VMNODE_EVICTION:-250Mi}
KUBELET_EVICTION=${CRIGUARD_VMNODE_KUBELET_EVICTION:-100Mi}
TRANSITION=${CRIGUARD_VMNODE_TRANSITION:-30s}
KUBELET_RUNTIME_ENDPOINT=$endpoint
LIFETIME=$LIFETIME
EOF

    log "booting the VM node $NAME (API 127.0.0.1:$api_port as $GUEST_API in the guest)"
    setsid "$REPO_ROOT/hack/vm.sh" run --timeout $((LIFETIME + 300)) \
        --forward "$GUEST_API=127.0.0.1:$api_port" \
        --share "$containerd_bin" --share "$k8s_bin" --share /usr/lib/cni \
        --share "$(dirname "$criguard")" --share-rw "$W" \
        --env "CRIGUARD_VMNODE_DIR=$W" -- hack/vm/cluster-node.sh \
        </dev/null >"$V/vm.log" 2>&1 &
    echo $! >"$V/vm.pid"
    pid=$!

    local end=$((SECONDS + TIMEOUT))
    until [[ -e "$W/ready" ]]; do
        if [[ -e "$W/failed" ]]; then
            log "the guest's setup failed: $(cat "$W/failed")"
            do_logs >&2
            do_down
            exit 1
        fi
        if ! alive "$pid"; then
            log "the VM stopped before the node was set up"
            do_logs >&2
            exit 1
        fi
        if ((SECONDS >= end)); then
            log "the guest was not set up within ${TIMEOUT} s"
            do_logs >&2
            do_down
            exit 1
        fi
        sleep 0.5
    done
    t_ready="$(now_ms)"
    log "guest set up in $((t_ready - t0)) ms; waiting for node $NAME Ready"
    until node_ready "$NAME"; do
        if ! alive "$pid" || ((SECONDS >= end)); then
            log "node $NAME not Ready within ${TIMEOUT} s"
            kubectl_ get node "$NAME" -o yaml >&2 || true
            do_logs >&2
            do_down
            exit 1
        fi
        sleep 0.5
    done
    t_node="$(now_ms)"
    cat >"$V/times.env" <<EOF
VMNODE_SETUP_MS=$((t_ready - t0))
VMNODE_READY_MS=$((t_node - t0))
EOF
    log "node $NAME Ready $((t_node - t0)) ms after start (guest milestones, seconds since boot: $(tr '\n' ' ' <"$W/times"))"
    echo "$V"
}

do_exec() {
    local id pid end rc
    (($#)) || usage
    pid="$(vm_pid)"
    [[ -n "$pid" ]] || die "no VM node runs for $DIR"
    id="$(date +%s%N)-$$"
    printf '%s\n' "$*" >"$W/requests/.$id.tmp"
    mv "$W/requests/.$id.tmp" "$W/requests/$id.cmd"
    end=$((SECONDS + ${CRIGUARD_VMNODE_EXEC_TIMEOUT:-330}))
    until [[ -e "$W/requests/$id.rc" ]]; do
        alive "$pid" || die "the VM stopped before answering: $*"
        ((SECONDS < end)) || die "the guest did not answer within ${CRIGUARD_VMNODE_EXEC_TIMEOUT:-330} s: $*"
        sleep 0.2
    done
    cat "$W/requests/$id.out"
    rc="$(cat "$W/requests/$id.rc")"
    return "${rc:-1}"
}

do_down() {
    local pid c
    pid="$(vm_pid)"
    if [[ -z "$pid" ]]; then
        log "no VM node runs for $DIR"
        return 0
    fi
    log "stopping the VM node (hack/vm.sh pid $pid)"
    touch "$W/done"
    if ! wait_exit "$pid" "${CRIGUARD_VMNODE_STOP_TIMEOUT:-180}"; then
        log "the VM did not power off within ${CRIGUARD_VMNODE_STOP_TIMEOUT:-180} s; stopping QEMU"
        kill -TERM "$pid" 2>/dev/null || true
        if ! wait_exit "$pid" 20; then
            # hack/vm.sh's own children (QEMU, its tail), then it.
            local -a kids=()
            read -r -a kids <<<"$(cat /proc/"$pid"/task/*/children 2>/dev/null | tr '\n' ' ')"
            for c in "${kids[@]+"${kids[@]}"}"; do kill -KILL "$c" 2>/dev/null || true; done
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$V/vm.pid"
    log "VM node stopped"
}

do_logs() {
    tail_logs "${CRIGUARD_VMNODE_LOG_LINES:-80}" "$V/vm.log" "$W/guest.log" "$W/failed" "$W/units.txt" "$W/journal.txt"
}

[[ $# -ge 2 ]] || usage
cmd="$1"
set_paths "$2"
shift 2
case "$cmd" in
    up) [[ $# -eq 0 ]] || usage; do_up ;;
    exec) do_exec "$@" ;;
    down) [[ $# -eq 0 ]] || usage; do_down ;;
    logs) [[ $# -eq 0 ]] || usage; do_logs ;;
    *) usage ;;
esac
