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
#   CRIGUARD_OOM_CONTENDERS (kernel,criguard-events,criguard-tick),
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
cleanup() {
    hack/containerd.sh stop "$dir/ctrd" --purge >&2 || true
    rm -rf "$dir/ctrd" "$dir/tools"
}
trap cleanup EXIT
sock="$(hack/containerd.sh start "$dir/ctrd" | tail -n1)"
uptime_before="$(uptime)"
/usr/bin/python3 hack/bench-oom/host.py "$dir/ctrd" "$sock" "$crictl" "$CRIGUARD_BIN" \
    "$dir/tools" "$out"
echo "load: before: $uptime_before; after: $(uptime)" >"$out/load.txt"
/usr/bin/python3 hack/bench-oom/report.py "$out"
echo "results: $out" >&2
