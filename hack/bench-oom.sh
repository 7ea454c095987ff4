#!/usr/bin/env bash
# The race against the OOM killer: a grower of our own touches
# memory at a fixed rate in one BestEffort pod beside steady Guaranteed,
# Burstable (one above its request) and BestEffort pods, until something
# frees it; at 5 rates from 8 MiB/s to the fastest the grower can touch
# pages (measured first: the physical limit), 5 runs each, per contender.
#
# Host tier (cgroup v1): the pods' memcg limited to 768 MiB, the hard
# threshold allocatableMemory.available<100Mi (the kubelet's default amount).
# Contenders:
#   kernel           nothing but the memcg OOM killer;
#   criguard-events  `criguard serve` with memory events (the default);
#   criguard-tick    the same with --memory-events=false: its 10 s
#                    housekeeping tick alone;
#   (both in front of a private containerd, the pods created through them
#   with crictl, the kubelet's requests; hack/bench-oom/host.py)
#   kubelet-memcg    the kubelet v1.37.2 eviction manager with
#                    kernelMemcgNotification: true, on the cluster tier's
#                    node (hack/cluster.sh: pods from the API server, since a
#                    standalone kubelet never evicts its static pods; criguard
#                    there in --dry-run; hack/bench-oom/kubelet.py);
#   kubelet-tick     the same with kernelMemcgNotification: false;
#   kubelet-memcg-settled
#                    kubelet-memcg with the grower pod running 15 s
#                    (CRIGUARD_OOM_SETTLE_S) before it grows, so that
#                    cAdvisor's stats, which the kubelet ranks by, know it.
# Tick contenders start each run at a random phase of their 10 s period.
# The bench measures everything itself (hack/bench-oom/race.py): 2 ms samples
# of the memcgs, memory.oom_control's oom_kill, the kernel log, the
# contender's log.
#
# VM tier (hack/bench-oom.sh vm, or CRIGUARD_OOM_TIER=vm): the VM tier's
# Debian bookworm machine (hack/vm.sh: QEMU TCG, systemd as PID 1, cgroup v2,
# PSI) with CRIGUARD_VM_MEM (1024) MiB; the node is the whole machine (no
# limit on kubepods.slice), memory.available = MemTotal - the root cgroup's
# working set, the hard threshold memory.available<CRIGUARD_OOM_THRESHOLD_MIB
# (200 here: on a 1 GiB machine the kernel's own memory, which the working
# set leaves out, puts the page-cache thrashing at memory.available
# 110-150Mi, so the kubelet's default 100Mi is crossed only once the node is
# out of memory). The guest has no python3: hack/bench-oom/vm-guest.sh (bash)
# runs the races in it and writes what it saw to the results directory (a
# read-write share); hack/bench-oom/vm.py analyses it here. Contenders:
#   criguard-events, criguard-tick  as on the host, in front of the guest's
#                    containerd.service;
#   earlyoom         Debian's (1.7), -M at the threshold (both its SIGTERM
#                    and SIGKILL levels: always SIGKILL, as a hard eviction),
#                    less the difference between memory.available and the
#                    MemAvailable earlyoom reads, measured at its start; as
#                    that difference drifts while the machine fills, its
#                    grower stops 24 MiB above whichever line comes first
#                    and its figures count from its own line (MemAvailable
#                    below -M, sampled);
#   systemd-oomd     Debian's (the guest's systemd's version),
#                    ManagedOOMMemoryPressure=kill on kubepods.slice with
#                    oomd.conf's defaults (60 % for 20 s);
#   kernel           nothing but the global OOM killer.
# systemd-oomd's and earlyoom's packages are fetched here (apt-get download)
# and installed in the guest's copy-on-write root; the image is unchanged.
# Each run waits CRIGUARD_OOM_TAIL_S (35) after the grower would have
# filled the machine (CRIGUARD_OOM_KERNEL_TAIL_S, 120, for the kernel),
# then the bench kills the grower itself: a run no one won. Settings:
# CRIGUARD_OOM_RUNS, CRIGUARD_OOM_KERNEL_RUNS, CRIGUARD_OOM_RUNS_BY
# (contender=N,...), CRIGUARD_OOM_SKIP (contender-rate-run,...: runs left
# out), CRIGUARD_OOM_RATES, CRIGUARD_OOM_CONTENDERS
# (criguard-events,earlyoom,kernel,criguard-tick,systemd-oomd),
# CRIGUARD_OOM_SAMPLE_US (5000), CRIGUARD_OOM_VM_TIMEOUT (3600 s),
# CRIGUARD_OOM_BINS (NAME=PATH,...: other criguard builds, raced as the
# contenders criguard-NAME beside criguard-events; criguard-nice is the
# shipped build at nice -10).
# CRIGUARD_OOM_SCENARIO=swap: a node that swaps (hack/bench-oom/vm-guest.sh
# says how; CRIGUARD_OOM_SWAP_MIB, CRIGUARD_OOM_SWAP_LINE_MIB,
# CRIGUARD_OOM_STALL_PCT), analysed by hack/bench-oom/swap.py into
# runs-swap.csv, table.md and swap-freed.png. On an
# idle 2-core host 5/5/2/3/2 runs per rate (earlyoom, criguard-events,
# kernel, criguard-tick, systemd-oomd) took 37 minutes; the kernel's and
# systemd-oomd's runs are the long ones (up to 90 s of thrashing each).
# Writes runs.csv, table.md, losses.txt, the plots and the guest's raw
# records (runs/, samples/, kmsg.txt, the contenders' logs) to the results
# directory (default a new one under /tmp).
#
# hack/bench-oom.sh cost: what criguard's v2 poll and its ranking kept
# ready cost while the node sits near the line (hack/bench-oom/vm-cost.sh).
#
# Usage: hack/bench-oom.sh [host|vm|cost]   (root; about 10 minutes for the host
#   contenders, 15 for the kubelet's, on 2 cores)
#   CRIGUARD_OOM_RUNS (5), CRIGUARD_OOM_RATES (e.g. 8,128,0; 0 = full speed),
#   CRIGUARD_OOM_CONTENDERS (kernel,criguard-events,criguard-tick, and
#   criguard-nri: criguard attached by NRI, with CRIGUARD_CONTAINERD=2; "" skips
#   the host contenders, then CRIGUARD_OOM_OUT must hold a meta.json),
#   CRIGUARD_OOM_KUBELET (kubelet-memcg,kubelet-tick,kubelet-memcg-settled;
#   "" skips the kubelet), CRIGUARD_OOM_LIMIT_MIB (768),
#   CRIGUARD_OOM_THRESHOLD_MIB (100), CRIGUARD_BIN (a criguard binary
#   instead of building one), CRIGUARD_OOM_BINS (NAME=PATH,...: other
#   builds, the contenders criguard-NAME), CRIGUARD_OOM_OUT (results directory; default
#   a new one under /tmp).
# Prints the table (rate x contender) and writes runs.csv, table.md,
# losses.txt (the contender's log around each run it lost), the samples,
# criguard's and the kubelet's logs, and the plots oom-freed.png and
# oom-lowest.png to the results directory.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ "$(id -u)" -eq 0 ]] || { echo "bench-oom.sh: run as root" >&2; exit 1; }
# The plots: Debian's matplotlib for Debian's python3 (a benchmark's own need,
# not the test suite's, so not in hack/install-deps.sh).
if ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-matplotlib >&2
fi
tier="${1:-${CRIGUARD_OOM_TIER:-host}}"
[[ "$tier" == host || "$tier" == vm || "$tier" == cost ]] ||
    { echo "bench-oom.sh: tier host, vm or cost, not $tier" >&2; exit 2; }
if [[ -z "${CRIGUARD_BIN:-}" ]]; then
    cargo build --release --bin criguard >&2
    CRIGUARD_BIN="$PWD/target/release/criguard"
fi
crictl="$(hack/k8s/build.sh --path cri-tools)/crictl"
if [[ "$tier" == cost ]]; then
    # What the v2 poll and the ranking kept ready cost near the line
    # (hack/bench-oom/vm-cost.sh): CRIGUARD_BIN as "events", and each of
    # CRIGUARD_OOM_BINS by its name.
    tools="$PWD/target/bench-oom-vm/tools"
    out="${CRIGUARD_OOM_OUT:-$(mktemp -d /tmp/criguard-oom-cost.XXXXXX)}"
    mkdir -p "$tools" "$out"
    out="$(readlink -f "$out")"
    gcc -O2 -Wall -static -o "$tools/grower" hack/bench-oom/grower.c
    cp "$CRIGUARD_BIN" "$tools/criguard-events"
    names=(events)
    for b in ${CRIGUARD_OOM_BINS:+${CRIGUARD_OOM_BINS//,/ }}; do
        cp "${b#*=}" "$tools/criguard-${b%%=*}"
        names+=("${b%%=*}")
    done
    CRIGUARD_VM_MEM="${CRIGUARD_VM_MEM:-1024}" hack/vm.sh run --timeout 900 --share-rw "$out" \
        -- hack/bench-oom/vm-cost.sh "$out" "$tools" "${names[@]}" >&2
    cat "$out/cost.txt"
    exit 0
fi
if [[ "$tier" == vm ]]; then
    # The VM tier: everything the guest needs in a directory under the
    # repository (shared read-only with the guest), the results in a
    # read-write share; the guest runs hack/bench-oom/vm-guest.sh.
    tools="$PWD/target/bench-oom-vm/tools"
    out="${CRIGUARD_OOM_OUT:-$(mktemp -d /tmp/criguard-oom-vm.XXXXXX)/results}"
    export CRIGUARD_OOM_THRESHOLD_MIB="${CRIGUARD_OOM_THRESHOLD_MIB:-200}"
    mkdir -p "$tools/debs" "$out"
    out="$(readlink -f "$out")"
    gcc -O2 -Wall -static -o "$tools/grower" hack/bench-oom/grower.c
    gcc -O2 -Wall -static -o "$tools/sampler" hack/bench-oom/sampler.c
    cp "$crictl" "$tools/"
    cp "$CRIGUARD_BIN" "$tools/criguard"
    # Other builds to race side by side (contender criguard-NAME).
    for b in ${CRIGUARD_OOM_BINS:+${CRIGUARD_OOM_BINS//,/ }}; do
        cp "${b#*=}" "$tools/criguard-${b%%=*}"
    done
    # Debian's systemd-oomd (its version must be the guest's systemd's) and
    # earlyoom, installed in the guest's copy-on-write root at run time.
    systemd="$(dpkg-query -W -f '${Version}' systemd)"
    (cd "$tools/debs" && { ls systemd-oomd_*.deb earlyoom_*.deb >/dev/null 2>&1 ||
        apt-get download "systemd-oomd=$systemd" earlyoom >&2; })
    envs=()
    for k in CRIGUARD_OOM_CONTENDERS CRIGUARD_OOM_RATES CRIGUARD_OOM_RUNS CRIGUARD_OOM_THRESHOLD_MIB \
        CRIGUARD_OOM_LEAD_MIB CRIGUARD_OOM_TAIL_S CRIGUARD_OOM_SAMPLE_US CRIGUARD_OOM_PHYSICAL \
        CRIGUARD_OOM_KERNEL_RUNS CRIGUARD_OOM_KERNEL_TAIL_S CRIGUARD_OOM_RUNS_BY CRIGUARD_OOM_SKIP \
        CRIGUARD_OOM_SCENARIO CRIGUARD_OOM_SWAP_MIB CRIGUARD_OOM_SWAP_LINE_MIB CRIGUARD_OOM_STALL_PCT; do
        [[ -z "${!k:-}" ]] || envs+=(--env "$k=${!k}")
    done
    t0=$SECONDS
    CRIGUARD_VM_MEM="${CRIGUARD_VM_MEM:-1024}" hack/vm.sh run --timeout "${CRIGUARD_OOM_VM_TIMEOUT:-3600}" \
        --share-rw "$out" "${envs[@]}" -- hack/bench-oom/vm-guest.sh "$out" "$tools" >&2 || vm_status=$?
    # A VM that timed out leaves the runs it finished: they are analysed.
    echo "vm: $((SECONDS - t0)) s wall time, hack/vm.sh exit status ${vm_status:-0}" >"$out/load.txt"
    export PYTHONDONTWRITEBYTECODE=1
    if [[ "${CRIGUARD_OOM_SCENARIO:-memory}" == swap ]]; then
        /usr/bin/python3 hack/bench-oom/swap.py "$out"
    else
        /usr/bin/python3 hack/bench-oom/vm.py "$out"
        /usr/bin/python3 hack/bench-oom/report.py "$out"
    fi
    echo "results: $out" >&2
    # A VM that timed out (124) still gave its finished runs; any other
    # failure of the guest's script fails the bench.
    [[ "${vm_status:-0}" == 0 || "${vm_status:-0}" == 124 ]] ||
        { echo "bench-oom.sh: the guest's script failed (hack/vm.sh exit status $vm_status)" >&2; exit 1; }
    exit 0
fi
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
if [[ ",${CRIGUARD_OOM_CONTENDERS-}," == *,criguard-nri,* ]]; then
    # criguard-nri: containerd 2 with its NRI on, under the instance's dir.
    [[ "${CRIGUARD_CONTAINERD:-}" == 2 ]] || { echo "bench-oom.sh: criguard-nri needs CRIGUARD_CONTAINERD=2" >&2; exit 2; }
    export CRIGUARD_CONTAINERD_EXTRA_TOML='disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[plugins."io.containerd.nri.v1.nri"]
disable = false
plugin_request_timeout = "10s"
'
fi
if [[ "${CRIGUARD_OOM_CONTENDERS-x}" != "" ]]; then
    sock="$(hack/containerd.sh start "$dir/ctrd" | tail -n1)"
    /usr/bin/python3 hack/bench-oom/host.py "$dir/ctrd" "$sock" "$crictl" "$CRIGUARD_BIN" \
        "$dir/tools" "$out"
    hack/containerd.sh stop "$dir/ctrd" --purge >&2
fi
# The kubelet's eviction manager: the cluster tier's node-a (kubelet v1.37.2
# from hack/k8s/build.sh, pods from the API server), criguard there in
# --dry-run; CRIGUARD_OOM_KUBELET="" skips it.
kubelets="${CRIGUARD_OOM_KUBELET-kubelet-memcg,kubelet-tick,kubelet-memcg-settled}"
if [[ -n "$kubelets" ]]; then
    rates="$(/usr/bin/python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["rates"])))' "$out/meta.json")"
    CRIGUARD_BIN="$CRIGUARD_BIN" CRIGUARD_CLUSTER_DRY_RUN=1 \
        CRIGUARD_CLUSTER_CRIGUARD_ARGS="--dynamic-oom-score-adj=false --memory-events=false" \
        CRIGUARD_CLUSTER_PODS_MEMORY="${CRIGUARD_OOM_LIMIT_MIB:-768}Mi" \
        CRIGUARD_CLUSTER_KUBELET_EVICTION="${CRIGUARD_OOM_THRESHOLD_MIB:-100}Mi" \
        CRIGUARD_CLUSTER_EVICTION="${CRIGUARD_OOM_THRESHOLD_MIB:-100}Mi" \
        CRIGUARD_CLUSTER_TRANSITION=1s hack/cluster.sh up "$dir/cluster" >&2
    CRICTL="$crictl" CRIGUARD_OOM_KUBELET="$kubelets" /usr/bin/python3 hack/bench-oom/kubelet.py \
        "$dir/cluster" "$dir/tools" "$out" "$rates" || status=$?
    cp "$dir/cluster/node-node-a/kubelet.log" "$out/kubelet.log" || true
    hack/cluster.sh down "$dir/cluster" --purge >&2
    ((${status:-0} == 0)) || exit "$status"
fi
echo "load: before: $uptime_before; after: $(uptime)" >"$out/load.txt"
/usr/bin/python3 hack/bench-oom/report.py "$out"
echo "results: $out" >&2
