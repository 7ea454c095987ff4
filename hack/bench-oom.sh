#!/usr/bin/env bash
# The race against the OOM killer (issue #24): a grower of our own touches
# memory at a fixed rate in one BestEffort pod beside steady Guaranteed,
# Burstable (one above its request) and BestEffort pods, until something
# frees it; at 5-6 rates from 8 MiB/s to the fastest the grower can touch
# pages (measured first: the physical limit), 5 runs each, per contender.
#
# Host tier (cgroup v1): a kubepods memcg limited to 768 MiB, the hard
# threshold allocatableMemory.available<100Mi (the kubelet's default amount).
# Contenders: the kernel alone (the memcg OOM killer), criguard with memory
# events, criguard on its 10 s housekeeping tick alone (both through
# `criguard serve` in front of a private containerd; the pods are created
# through it with crictl, the kubelet's requests). The bench measures
# everything itself (hack/bench-oom/host.py): 2 ms samples of the memcgs,
# memory.oom_control's oom_kill, the kernel log, criguard's log.
#
# Usage: hack/bench-oom.sh   (root; about 10 minutes on 2 cores)
#   CRIGUARD_OOM_RUNS (5), CRIGUARD_OOM_RATES (e.g. 8,128,0; 0 = full speed),
#   CRIGUARD_OOM_CONTENDERS (kernel,criguard-events,criguard-tick; "" skips
#   the host contenders, then CRIGUARD_OOM_OUT must hold a meta.json),
#   CRIGUARD_OOM_KUBELET (kubelet-memcg,kubelet-tick; "" skips the kubelet),
#   CRIGUARD_OOM_LIMIT_MIB (768), CRIGUARD_OOM_THRESHOLD_MIB (100),
#   CRIGUARD_BIN (a criguard binary instead of building one),
#   CRIGUARD_OOM_OUT (results directory; default a new one under /tmp).
# Prints the table (rate x contender) and writes runs.csv, table.md,
# losses.txt (criguard's log around each run it lost) and the plots
# oom-freed.png and oom-lowest.png to the results directory.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ "$(id -u)" -eq 0 ]] || { echo "bench-oom.sh: run as root" >&2; exit 1; }
# The plots: Debian's matplotlib for Debian's python3 (a benchmark's own need,
# not the test suite's, so not in hack/install-deps.sh).
if ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-matplotlib >&2
fi
if [[ -z "${CRIGUARD_BIN:-}" ]]; then
    cargo build --release --bin criguard >&2
    CRIGUARD_BIN="$PWD/target/release/criguard"
fi
crictl="$(hack/k8s/build.sh --path cri-tools)/crictl"
dir="$(mktemp -d /tmp/criguard-oom.XXXXXX)"
out="${CRIGUARD_OOM_OUT:-$dir/results}"
mkdir -p "$out" "$dir/tools"
gcc -O2 -Wall -static -o "$dir/tools/grower" hack/bench-oom/grower.c
gcc -O2 -Wall -static -o "$dir/tools/sampler" hack/bench-oom/sampler.c
export PYTHONDONTWRITEBYTECODE=1
cleanup() {
    [[ ! -d "$dir/cluster" ]] || hack/cluster.sh down "$dir/cluster" --purge >&2 || true
    hack/containerd.sh stop "$dir/ctrd" --purge >&2 || true
    rm -rf "$dir/ctrd" "$dir/tools"
}
trap cleanup EXIT
uptime_before="$(uptime)"
if [[ "${CRIGUARD_OOM_CONTENDERS-x}" != "" ]]; then
    sock="$(hack/containerd.sh start "$dir/ctrd" | tail -n1)"
    /usr/bin/python3 hack/bench-oom/host.py "$dir/ctrd" "$sock" "$crictl" "$CRIGUARD_BIN" \
        "$dir/tools" "$out"
    hack/containerd.sh stop "$dir/ctrd" --purge >&2
fi
# The kubelet's eviction manager: the cluster tier's node-a (kubelet v1.37.2
# from hack/k8s/build.sh, pods from the API server), criguard there in
# --dry-run; CRIGUARD_OOM_KUBELET="" skips it.
if [[ "${CRIGUARD_OOM_KUBELET-kubelet-memcg,kubelet-tick}" != "" ]]; then
    rates="$(/usr/bin/python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["rates"])))' "$out/meta.json")"
    CRIGUARD_BIN="$CRIGUARD_BIN" CRIGUARD_CLUSTER_DRY_RUN=1 \
        CRIGUARD_CLUSTER_CRIGUARD_ARGS="--dynamic-oom-score-adj=false --memory-events=false" \
        CRIGUARD_CLUSTER_PODS_MEMORY="${CRIGUARD_OOM_LIMIT_MIB:-768}Mi" \
        CRIGUARD_CLUSTER_KUBELET_EVICTION="${CRIGUARD_OOM_THRESHOLD_MIB:-100}Mi" \
        CRIGUARD_CLUSTER_EVICTION="${CRIGUARD_OOM_THRESHOLD_MIB:-100}Mi" \
        CRIGUARD_CLUSTER_TRANSITION=1s hack/cluster.sh up "$dir/cluster" >&2
    CRICTL="$crictl" /usr/bin/python3 hack/bench-oom/kubelet.py "$dir/cluster" "$dir/tools" "$out" "$rates"
    hack/cluster.sh down "$dir/cluster" --purge >&2
fi
echo "load: before: $uptime_before; after: $(uptime)" >"$out/load.txt"
/usr/bin/python3 hack/bench-oom/report.py "$out"
echo "results: $out" >&2
