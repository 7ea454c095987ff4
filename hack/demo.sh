#!/usr/bin/env bash
# criguard doing its job for real: a private containerd, criguard in front of
# it, and a demo pod run through criguard the way the kubelet runs one.
#
# Usage: hack/demo.sh [--keep]
#   --keep   leave containerd, criguard and the pod running; the script prints
#            how to talk to them and how to stop them.
# Environment: CRIGUARD_DEMO_DIR (default /tmp/criguard-demo).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ "$(id -u)" -eq 0 ]] || { echo "demo.sh: run as root (containerd needs it)" >&2; exit 1; }

keep=""
[[ "${1:-}" == "--keep" ]] && keep="--keep"
dir="${CRIGUARD_DEMO_DIR:-/tmp/criguard-demo}"

hack/install-deps.sh
cargo build --bin criguard --example demo_pod

criguard_pid=""
cleanup() {
    [[ -n "$criguard_pid" ]] && kill "$criguard_pid" 2>/dev/null && wait "$criguard_pid" 2>/dev/null
    hack/containerd.sh stop "$dir" --purge
    # The demo pod's cgroups (all hierarchies), deepest first.
    for top in /sys/fs/cgroup/*/criguard-demo /sys/fs/cgroup/criguard-demo; do
        [[ -d "$top" ]] && find "$top" -depth -type d -exec rmdir {} + 2>/dev/null
    done
    return 0
}
[[ -z "$keep" ]] && trap cleanup EXIT

hack/containerd.sh stop "$dir" --purge >/dev/null 2>&1 || true   # a previous --keep run
# A filesystem of the demo's own (1 GiB tmpfs) for containerd's root, the
# logs and criguard's state: criguard's imagefs/nodefs signals then read the
# demo's disk, not the host's, so a nearly full host disk (DiskPressure at
# the kubelet's default imagefs.available<15%) does not refuse the demo pod.
# containerd.sh stop unmounts it with everything else under $dir.
mkdir -p "$dir"
mount -t tmpfs -o size=1g,mode=0755 criguard-demo "$dir"
hack/containerd.sh start "$dir" >/dev/null
target/debug/criguard serve --listen "$dir/criguard.sock" --admin-socket "$dir/admin.sock" --metrics-address none \
    --runtime-endpoint "unix://$dir/containerd.sock" --imagefs "$dir/root" --nodefs "$dir" \
    --state-dir "$dir/criguard-state" 2>"$dir/criguard.log" &
criguard_pid=$!
echo "$criguard_pid" >"$dir/criguard.pid"
for _ in $(seq 100); do [[ -S "$dir/criguard.sock" ]] && break; sleep 0.1; done
[[ -S "$dir/criguard.sock" ]] || { cat "$dir/criguard.log" >&2; exit 1; }
echo "criguard (pid $criguard_pid) listens on $dir/criguard.sock, forwarding to $dir/containerd.sock"

target/debug/examples/demo_pod "$dir/criguard.sock" "$dir/pods" --keep
echo
echo "what criguard knows (criguard pods):"
target/debug/criguard pods --admin-socket "$dir/admin.sock"
echo
echo "what each pod uses, read now (criguard usage):"
target/debug/criguard usage --admin-socket "$dir/admin.sock"
echo
echo "who would be evicted first, per signal (criguard rank):"
target/debug/criguard rank --admin-socket "$dir/admin.sock"

if [[ -z "$keep" ]]; then
    echo
    echo "stopping: pod, criguard, containerd"
else
    cat <<MSG

Still running. Point a CRI client at unix://$dir/criguard.sock.
criguard's log: $dir/criguard.log. To stop everything:
  kill \$(cat $dir/criguard.pid); hack/containerd.sh stop $dir --purge
(that also unmounts the demo's tmpfs at $dir)
MSG
fi
