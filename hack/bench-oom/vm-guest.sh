#!/usr/bin/env bash
# The race against the OOM killer, VM tier: the guest side (hack/bench-oom.sh
# vm boots the VM tier's machine with hack/vm.sh and runs this in it). The
# guest has bash but no python3: this script runs the races and writes what
# it saw, raw, to OUT (a --share-rw directory); the host analyses it
# (hack/bench-oom/vm.py, report.py).
#
# The node is the whole machine: no limit on kubepods.slice, memory.available
# = MemTotal - the root cgroup's working set (anon + file - inactive_file of
# /sys/fs/cgroup/memory.stat, as the kubelet's cAdvisor reads it), the hard
# threshold memory.available<THRESHOLD Mi. containerd.service (Debian's, the
# image's systemd-driver configuration) runs the pods; crictl creates them
# as the kubelet would (QoS slices, requests, limits, oom_score_adj), through
# criguard's socket while criguard runs.
#
# Usage: vm-guest.sh OUT TOOLS
#   TOOLS holds grower, sampler (static), crictl, criguard and debs/ (the
#   systemd-oomd and earlyoom packages, installed here into the VM's
#   copy-on-write root). Settings from the environment (hack/vm.sh --env):
#   CRIGUARD_OOM_CONTENDERS, CRIGUARD_OOM_RATES, CRIGUARD_OOM_RUNS,
#   CRIGUARD_OOM_THRESHOLD_MIB, CRIGUARD_OOM_LEAD_MIB, CRIGUARD_OOM_TAIL_S,
#   CRIGUARD_OOM_SAMPLE_US.
# Writes: OUT/meta.txt, OUT/runs/<contender>-<rate>-<run>.txt (one record
# per run: the pods, their cgroups and processes, the marks), the samples
# (OUT/samples/), OUT/kmsg.txt (the kernel log), the contenders' logs
# (criguard-*.log, systemd-oomd.log, earlyoom.log).
#
# CRIGUARD_OOM_SCENARIO=swap: a node that swaps. A CRIGUARD_OOM_SWAP_MIB
# (384) swap file; the steady pods get no swap (memory.swap.max 0); the
# grower is a Burstable pod (request 16 MiB, limit 64 MiB) whose swap is
# unbounded (memory.swap.max max, far above its LimitedSwap entitlement of
# some 6 MiB), so what it touches past its limit goes to swap:
# memory.available hardly moves and swap fills. It prefills swap to
# CRIGUARD_OOM_LEAD_MIB above the line CRIGUARD_OOM_SWAP_LINE_MIB (128 MiB
# free), then grows at the run's rate. Contenders (CRIGUARD_OOM_CONTENDERS,
# by default all): criguard-swap (swap.available<LINE), criguard-stall
# (memory.pressure.some>CRIGUARD_OOM_STALL_PCT %, 10), earlyoom (-S at the
# line; -m 99, its highest, so that swap alone decides, as earlyoom acts only when both
# memory and swap are low), systemd-oomd (ManagedOOMSwap=kill on
# kubepods.slice, SwapUsedLimit at the line), limitedswap (the grower's
# memory.swap.max set to its LimitedSwap entitlement as the kubelet sets
# it: the kernel's memcg OOM killer acts at the limit; the kubelet's
# eviction manager has no swap signal), kernel (nothing: the memcg OOM
# killer once swap is full). Each run also records PSI's full and some
# totals before and after, and the samples read SwapFree.
set -uo pipefail
out="$1"
tools="$2"
# The bench itself must outlive every kill.
echo -1000 >/proc/self/oom_score_adj

SCENARIO="${CRIGUARD_OOM_SCENARIO:-memory}"
if [[ "$SCENARIO" == swap ]]; then
    CONTENDERS="${CRIGUARD_OOM_CONTENDERS:-criguard-swap,earlyoom,systemd-oomd,criguard-stall,limitedswap,kernel}"
else
    CONTENDERS="${CRIGUARD_OOM_CONTENDERS:-criguard-events,earlyoom,kernel,criguard-tick,systemd-oomd}"
fi
SWAP_MIB="${CRIGUARD_OOM_SWAP_MIB:-384}"
SWAP_LINE="${CRIGUARD_OOM_SWAP_LINE_MIB:-128}"
STALL_PCT="${CRIGUARD_OOM_STALL_PCT:-10}"
# The swap node's grower: a Burstable pod, request and limit in MiB.
GROWER_REQUEST=16
GROWER_LIMIT=64
SWAP_FILE=/var/tmp/oombench-swap
RUNS="${CRIGUARD_OOM_RUNS:-5}"
# The kernel's runs are the longest (the machine thrashes its page cache
# for a minute or more before the OOM killer fires): fewer of them.
KERNEL_RUNS="${CRIGUARD_OOM_KERNEL_RUNS:-$RUNS}"
# 200Mi, not the kubelet's default 100Mi: on this 1 GiB node the kernel's
# own memory (some 90 MiB that the working set does not count, so
# memory.available does) makes the machine thrash its page cache at
# memory.available 110-150Mi; a 100Mi threshold is crossed only when the
# node is already out of memory.
THRESHOLD="${CRIGUARD_OOM_THRESHOLD_MIB:-200}"
LEAD="${CRIGUARD_OOM_LEAD_MIB:-24}"
# Seconds a run waits after the grower would have filled the machine: long
# enough for systemd-oomd's 20 s over its pressure limit; then the bench
# kills the grower itself (no one did). The kernel's runs wait longer.
TAIL="${CRIGUARD_OOM_TAIL_S:-35}"
KERNEL_TAIL="${CRIGUARD_OOM_KERNEL_TAIL_S:-120}"
SAMPLE_US="${CRIGUARD_OOM_SAMPLE_US:-5000}"
HOUSEKEEPING=10
work=/var/tmp/oombench
bench="$work/bench" # bind-mounted into each pod at /bench
mkdir -p "$work" "$bench" "$out/runs" "$out/samples"
echo "debug: false" >"$work/crictl.yaml"
cp "$tools/grower" "$tools/sampler" "$bench/"
crictl="$tools/crictl"
CTRD=/run/containerd/containerd.sock
endpoint="$CTRD"

log() { echo "vm-guest: $*" >&2; }
MI=$((1 << 20))
mem_total_kb() { awk '$1 == "MemTotal:" { print $2 }' /proc/meminfo; }
CAPACITY=$(($(mem_total_kb) * 1024))
# memory.available as the kubelet computes it, in MiB.
available_mib() {
    awk -v cap="$CAPACITY" '$1 == "anon" { a = $2 } $1 == "file" { f = $2 } $1 == "inactive_file" { i = $2 }
        END { printf "%d\n", (cap - (a + f - i)) / 1048576 }' /sys/fs/cgroup/memory.stat
}
rt_ns() { local t="${EPOCHREALTIME/./}"; echo "${t}000"; }

cri() { "$crictl" --config "$work/crictl.yaml" --runtime-endpoint "unix://$endpoint" --image-endpoint "unix://$CTRD" -t 60s "$@"; }

# ---- the node ---------------------------------------------------------------

setup() {
    # The packages' own scripts must not start their daemons: the races do.
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    if ls "$tools"/debs/*.deb >/dev/null 2>&1; then
        # earlyoom's lsb-base is for its SysV script only.
        dpkg -i --force-depends "$tools"/debs/*.deb >"$out/dpkg.log" 2>&1 || log "dpkg: see dpkg.log"
    fi
    rm -f /usr/sbin/policy-rc.d
    systemctl stop earlyoom.service systemd-oomd.service systemd-oomd.socket 2>/dev/null
    mkdir -p /run/systemd/system
    printf '[Unit]\nDescription=the pods (OOM bench)\n\n[Slice]\n' >/run/systemd/system/kubepods.slice
    systemctl daemon-reload
    systemctl start kubepods.slice
    systemctl start containerd.service
    if [[ "$SCENARIO" == swap ]]; then
        swapoff -a 2>/dev/null
        dd if=/dev/zero of="$SWAP_FILE" bs=1M count="$SWAP_MIB" status=none
        chmod 600 "$SWAP_FILE"
        mkswap -q "$SWAP_FILE" && swapon "$SWAP_FILE" || log "swapon $SWAP_FILE failed"
    fi
    local tar
    for tar in $(hack/images.sh "$CRIGUARD_IMAGE_CACHE"); do
        ctr -n k8s.io images import --snapshotter overlayfs "$tar" >/dev/null
    done
}

measure() {
    local best=0 r i
    for i in 1 2 3; do
        # Swap: touching past a 64 MiB limit, as fast as pages go to swap.
        if [[ "$SCENARIO" == swap ]]; then
            r="$(systemd-run --scope -q -p MemoryMax=${GROWER_LIMIT}M -p MemorySwapMax=infinity "$bench/grower" --measure 256)"
        else
            r="$(systemd-run --scope -q -p MemoryAccounting=yes "$bench/grower" --measure 256)"
        fi
        ((r > best)) && best=$r
    done
    echo "$best"
}

# ---- pods -------------------------------------------------------------------

# oom_score_adj QOS REQUEST_MIB: pkg/kubelet/qos/policy.go's.
oom_adj() {
    case "$1" in
        Guaranteed) echo -997 ;;
        BestEffort) echo 1000 ;;
        *)
            local a=$((1000 - 1000 * $2 * MI / CAPACITY))
            ((a < 3)) && a=3
            ((a > 999)) && a=999
            echo "$a"
            ;;
    esac
}

POD_UNIFIED=""
# pod_run NAME QOS REQUEST LIMIT ARGS...: runs a pod of one container
# (/bench/grower ARGS); sets POD_UID POD_SB POD_CTR POD_PID POD_CG.
pod_run() {
    local name="$1" qos="$2" req="$3" lim="$4"
    shift 4
    local uid parent cmd a cpu=0 i
    uid="$(od -An -tx1 -N8 /dev/urandom | tr -d ' \n')"
    case "$qos" in
        Guaranteed) parent="kubepods-pod$uid.slice"; POD_CG="/sys/fs/cgroup/kubepods.slice/$parent"; cpu=100 ;;
        Burstable) parent="kubepods-burstable-pod$uid.slice"
            POD_CG="/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/$parent" ;;
        *) parent="kubepods-besteffort-pod$uid.slice"
            POD_CG="/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/$parent" ;;
    esac
    cmd='"/bench/grower"'
    for a in "$@"; do cmd+=", \"$a\""; done
    local labels="\"io.kubernetes.pod.name\": \"$name\", \"io.kubernetes.pod.namespace\": \"default\", \"io.kubernetes.pod.uid\": \"$uid\""
    mkdir -p "/var/log/pods/default_${name}_$uid"
    cat >"$work/$uid-pod.json" <<EOF
{"metadata": {"name": "$name", "uid": "$uid", "namespace": "default", "attempt": 0},
 "log_directory": "/var/log/pods/default_${name}_$uid", "labels": {$labels},
 "linux": {"cgroup_parent": "$parent",
           "security_context": {"namespace_options": {"network": 2, "pid": 0, "ipc": 0}}}}
EOF
    # POD_UNIFIED: the container's cgroup v2 files, as JSON members.
    local unified=""
    [[ -n "$POD_UNIFIED" ]] && unified=", \"unified\": {$POD_UNIFIED}"
    cat >"$work/$uid-ctr.json" <<EOF
{"metadata": {"name": "app", "attempt": 0}, "image": {"image": "docker.io/library/busybox:criguard"},
 "command": [$cmd], "log_path": "app/0.log",
 "labels": {$labels, "io.kubernetes.container.name": "app"},
 "annotations": {"io.kubernetes.container.restartCount": "0", "io.kubernetes.pod.terminationGracePeriod": "30"},
 "mounts": [{"container_path": "/bench", "host_path": "$bench", "readonly": true}],
 "linux": {"resources": {"cpu_period": 100000, "cpu_quota": $((cpu * 100)), "cpu_shares": $((cpu * 1024 / 1000 > 2 ? cpu * 1024 / 1000 : 2)),
           "memory_limit_in_bytes": $((lim * MI)), "oom_score_adj": $(oom_adj "$qos" "$req")$unified},
           "security_context": {"namespace_options": {"network": 2, "pid": 1, "ipc": 0}}}}
EOF
    POD_UID="$uid"
    POD_SB=""
    # One crictl call (each is a Go program's start under TCG): runp,
    # create and start; the sandbox and the process from the pod's cgroup.
    # criguard refuses new pods under pressure and for its transition
    # period after it.
    for i in $(seq 30); do
        POD_CTR="$(cri run --no-pull "$work/$uid-ctr.json" "$work/$uid-pod.json" 2>>"$work/crictl.err")" && break
        POD_CTR=""
        sleep 1
    done
    [[ -n "$POD_CTR" ]] || { log "run $name failed: $(tail -n 2 "$work/crictl.err")"; return 1; }
    local d
    for d in "$POD_CG"/cri-containerd-*.scope; do
        d="${d##*/cri-containerd-}"
        d="${d%.scope}"
        [[ "$d" == "$POD_CTR" ]] || POD_SB="$d"
    done
    POD_PID="$(head -n1 "$POD_CG/cri-containerd-$POD_CTR.scope/cgroup.procs" 2>/dev/null)"
    [[ -n "$POD_SB" && -n "$POD_PID" ]] || { log "$name: no sandbox or process in $POD_CG"; return 1; }
}

pod_rm() { cri rmp -f "$1" >/dev/null 2>>"$work/crictl.err"; }

alive() { [[ -r /proc/$1/stat ]] && [[ "$(awk '{ print $3 }' /proc/"$1"/stat 2>/dev/null)" != Z ]]; }

# name qos request limit held (race.py's STEADY).
STEADY=("guaranteed-1 Guaranteed 96 96 64" "guaranteed-2 Guaranteed 96 96 64"
    "burstable-under Burstable 128 0 64" "burstable-over Burstable 48 0 96"
    "besteffort BestEffort 0 0 32")
declare -a S_UID S_SB S_PID S_CG

steady_pod() {
    local i="$1" name qos req lim held
    read -r name qos req lim held <<<"${STEADY[$i]}"
    # On the swap node they get none (the kubelet's NoSwap).
    [[ "$SCENARIO" == swap ]] && POD_UNIFIED='"memory.swap.max": "0"'
    pod_run "$name" "$qos" "$req" "$lim" "$held" 0 "$held" || { POD_UNIFIED=""; return 1; }
    POD_UNIFIED=""
    S_UID[i]="$POD_UID" S_SB[i]="$POD_SB" S_PID[i]="$POD_PID" S_CG[i]="$POD_CG"
}

revive() {
    local i
    for i in "${!STEADY[@]}"; do
        if [[ -z "${S_PID[i]:-}" ]] || ! alive "${S_PID[i]}"; then
            [[ -z "${S_SB[i]:-}" ]] || pod_rm "${S_SB[i]}"
            steady_pod "$i"
        fi
    done
    # Until each holds what it should.
    for i in $(seq 100); do
        local ok=1 j
        for j in "${!STEADY[@]}"; do
            local held
            held="$(awk '{ print $5 }' <<<"${STEADY[j]}")"
            (($(cat "${S_CG[j]}/memory.current" 2>/dev/null || echo 0) >= held * MI)) || ok=0
        done
        ((ok)) && return 0
        sleep 0.2
    done
}

# ---- contenders ---------------------------------------------------------------

GUARD_PID=""
EARLYOOM_KIB=0
JOURNAL_PID=""
start_contender() {
    endpoint="$CTRD"
    case "$1" in
        kernel | limitedswap) ;;
        criguard-*)
            # The binary may still be building on the host when the VM
            # starts (tools/criguard.building): until it is there.
            local w
            for w in $(seq 900); do
                [[ -e "$tools/criguard.building" ]] || break
                sleep 1
            done
            # criguard-events: as shipped; criguard-tick: without memory
            # events; criguard-swap and criguard-stall: as shipped, with the
            # swap and the stall signal; criguard-NAME: the build
            # tools/criguard-NAME (CRIGUARD_OOM_BINS), events on. A name
            # ending in -nice runs at nice -10 (criguard-nice: as shipped).
            local ev=true bin="$tools/criguard" prefix=() hard="memory.available<${THRESHOLD}Mi"
            local base="$1"
            if [[ "$base" == *-nice ]]; then
                prefix=(nice -n -10)
                base="${base%-nice}"
            fi
            case "$base" in
                criguard | criguard-events) ;;
                criguard-tick) ev=false ;;
                criguard-swap) hard+=",swap.available<${SWAP_LINE}Mi" ;;
                criguard-stall) hard+=",memory.pressure.some>${STALL_PCT}%" ;;
                *) bin="$tools/$base" ;;
            esac
            rm -rf "$work/criguard"
            mkdir -p "$work/criguard"
            CRIGUARD_LOG="info,criguard::eviction=debug" \
                "${prefix[@]}" "$bin" serve --listen "$work/criguard/criguard.sock" \
                --admin-socket "$work/criguard/admin.sock" --metrics-address none \
                --state-dir "$work/criguard/state" --runtime-endpoint "unix://$CTRD" \
                --nodefs "$work" --imagefs "$work" --housekeeping-interval="${HOUSEKEEPING}s" \
                --eviction-hard="$hard" \
                --eviction-pressure-transition-period=1s --memory-events=$ev --log-format json \
                >>"$out/$1.log" 2>&1 &
            GUARD_PID=$!
            # As a node daemon (containerd's -999).
            echo -999 >/proc/$GUARD_PID/oom_score_adj
            local i
            for i in $(seq 100); do
                [[ -S "$work/criguard/criguard.sock" ]] && break
                sleep 0.2
            done
            endpoint="$work/criguard/criguard.sock"
            sleep 2
            ;;
        systemd-oomd)
            # systemd-oomd.service(8): ManagedOOMMemoryPressure=kill on the
            # unit whose descendants it may kill, oomd.conf's defaults (60 %
            # for 20 s).
            mkdir -p /run/systemd/system/kubepods.slice.d
            printf '[Slice]\nManagedOOMMemoryPressure=kill\n' >/run/systemd/system/kubepods.slice.d/oomd.conf
            if [[ "$SCENARIO" == swap ]]; then
                # Swap: the descendant using the most swap is killed once
                # the swap used passes SwapUsedLimit, set at the line.
                printf '[Slice]\nManagedOOMSwap=kill\n' >/run/systemd/system/kubepods.slice.d/oomd.conf
                mkdir -p /run/systemd/oomd.conf.d
                printf '[OOM]\nSwapUsedLimit=%d%%\n' $((100 - SWAP_LINE * 100 / SWAP_MIB)) \
                    >/run/systemd/oomd.conf.d/bench.conf
            fi
            systemctl daemon-reload
            systemctl start systemd-oomd.service
            journalctl -f -n 20 -u systemd-oomd.service -o short-unix --no-pager >"$out/systemd-oomd.log" &
            JOURNAL_PID=$!
            sleep 2
            oomctl >"$out/oomctl.txt" 2>&1
            ;;
        earlyoom)
            # SIGKILL at once (the same value for both thresholds, as its
            # man page says for always SIGKILL: the kubelet's hard threshold
            # kills without grace) when memory.available is at the node's
            # threshold: earlyoom reads MemAvailable, which runs below
            # memory.available by the kernel's own memory, so -M is the
            # threshold less that difference, measured now.
            local diff
            diff=$(($(available_mib) - $(awk '$1 == "MemAvailable:" { print int($2 / 1024) }' /proc/meminfo)))
            local kib=$(((THRESHOLD - diff) * 1024))
            ((kib < 10240)) && kib=10240
            echo "earlyoom_M_kib=$kib memavailable_offset_mib=$diff" >>"$out/meta.txt"
            EARLYOOM_KIB=$kib
            if [[ "$SCENARIO" == swap ]]; then
                # Swap alone decides: earlyoom acts when both memory and
                # swap are low, so its memory minimum is its highest, 99 %.
                echo "EARLYOOM_ARGS=\"-m 99,99 -S $((SWAP_LINE * 1024)),$((SWAP_LINE * 1024)) -r 60\"" \
                    >/etc/default/earlyoom
            else
                echo "EARLYOOM_ARGS=\"-M $kib,$kib -r 60\"" >/etc/default/earlyoom
            fi
            systemctl start earlyoom.service
            journalctl -f -n 20 -u earlyoom.service -o short-unix --no-pager >"$out/earlyoom.log" &
            JOURNAL_PID=$!
            sleep 2
            ;;
    esac
}

stop_contender() {
    case "$1" in
        criguard-*)
            kill "$GUARD_PID" 2>/dev/null
            wait "$GUARD_PID" 2>/dev/null
            GUARD_PID=""
EARLYOOM_KIB=0
            ;;
        systemd-oomd)
            systemctl stop systemd-oomd.service systemd-oomd.socket
            rm -rf /run/systemd/system/kubepods.slice.d /run/systemd/oomd.conf.d
            systemctl daemon-reload
            kill "$JOURNAL_PID"
            ;;
        earlyoom)
            systemctl stop earlyoom.service
            kill "$JOURNAL_PID"
            ;;
    esac
    endpoint="$CTRD"
}

# ---- one run --------------------------------------------------------------------

# PSI's full and some totals of the machine, microseconds stalled.
psi_totals() { awk '{ for (i = 2; i <= NF; i++) if ($i ~ /^total=/) t[$1] = substr($i, 7) } END { print t["full"], t["some"] }' /proc/pressure/memory; }

pods_oom_kills() { awk '$1 == "oom_kill" { print $2 }' /sys/fs/cgroup/kubepods.slice/memory.events; }

one_run() {
    local c="$1" rate="$2" run="$3" tag prefill avail i t0 budget rec specs
    tag="$c-$rate-$run"
    rec="$out/runs/$tag.txt"
    # CRIGUARD_OOM_SKIP=contender-rate-run,...: runs left out (time).
    [[ ",${CRIGUARD_OOM_SKIP:-}," == *",$tag,"* ]] && { log "$tag: skipped"; return 0; }
    revive
    avail="$(available_mib)"
    prefill=$((avail - THRESHOLD - LEAD))
    ((prefill < 0)) && prefill=0
    local gofile="go-$tag" most=$((CAPACITY / MI + 64)) kills_before
    # Before the grower exists: limitedswap's kill comes during its prefill.
    kills_before="$(pods_oom_kills)"
    rm -f "$bench/$gofile" "$work/stop"
    if [[ "$SCENARIO" == swap ]]; then
        # Its limit, then swap to LEAD above the line; swap unbounded, or
        # LimitedSwap's entitlement: request / node memory x swap.
        local swap_free
        swap_free=$(awk '$1 == "SwapFree:" { print int($2 / 1024) }' /proc/meminfo)
        prefill=$((GROWER_LIMIT + swap_free - SWAP_LINE - LEAD))
        most=$((GROWER_LIMIT + SWAP_MIB + 64))
        POD_UNIFIED='"memory.swap.max": "max"'
        [[ "$c" == limitedswap ]] &&
            POD_UNIFIED="\"memory.swap.max\": \"$((GROWER_REQUEST * MI * SWAP_MIB / (CAPACITY / MI)))\""
        pod_run grower Burstable "$GROWER_REQUEST" "$GROWER_LIMIT" "$prefill" "$rate" "$most" "/bench/$gofile"
        local ran=$?
        POD_UNIFIED=""
        ((ran == 0)) || { log "$tag: no grower pod"; return 0; }
    else
        # earlyoom's line is MemAvailable's, which drifts from
        # memory.available as the machine fills: its grower stops LEAD
        # above whichever line comes first, so that the race starts below
        # neither.
        if [[ "$c" == earlyoom ]]; then
            local own
            own=$(($(awk '$1 == "MemAvailable:" { print int($2 / 1024) }' /proc/meminfo) - EARLYOOM_KIB / 1024 - LEAD))
            ((own < prefill)) && prefill=$own
            ((prefill < 0)) && prefill=0
        fi
        pod_run grower BestEffort 0 0 "$prefill" "$rate" "$most" "/bench/$gofile" ||
            { log "$tag: no grower pod"; return 0; }
    fi
    local g_sb="$POD_SB" g_pid="$POD_PID" g_cg="$POD_CG" g_uid="$POD_UID"
    # Until the grower holds its prefill (in memory and swap), or stops
    # growing (limitedswap: killed at its limit).
    for i in $(seq 600); do
        local held=$(($(cat "$g_cg/memory.current" 2>/dev/null || echo 0) + $(cat "$g_cg/memory.swap.current" 2>/dev/null || echo 0)))
        ((held >= prefill * MI * 9 / 10)) && break
        alive "$g_pid" || break
        sleep 0.1
    done
    if [[ "$SCENARIO" == swap ]]; then
        specs=(/proc/meminfo:SwapFree /proc/pressure/memory:full "$g_cg/memory.current"
            "$g_cg/memory.swap.current")
    else
        specs=(/sys/fs/cgroup/memory.stat:anon /sys/fs/cgroup/memory.stat:inactive_file
            /proc/pressure/memory:full "$g_cg/memory.current")
    fi
    for i in "${!STEADY[@]}"; do specs+=("${S_CG[i]}/memory.current"); done
    # The pods' OOM kills as they happen (the kernel log's stamps drift
    # from CLOCK_MONOTONIC under TCG), then the root's file pages (swap:
    # PSI some).
    specs+=(/sys/fs/cgroup/kubepods.slice/memory.events:oom_kill)
    # (Memory: then MemAvailable, earlyoom's own signal.)
    if [[ "$SCENARIO" == swap ]]; then
        specs+=(/proc/pressure/memory:some)
    else
        specs+=(/sys/fs/cgroup/memory.stat:file /proc/meminfo:MemAvailable)
    fi
    local psi_before
    psi_before="$(psi_totals)"
    "$bench/sampler" "$out/samples/$tag.samples" "$SAMPLE_US" 300 "$work/stop" "${specs[@]}" &
    local sampler=$!
    echo -1000 >/proc/$sampler/oom_score_adj
    local mark
    mark="$(rt_ns)"
    echo "criguard-oombench mark $tag $mark" >/dev/kmsg
    sleep 0.1
    if [[ "$c" == *-tick ]]; then sleep "$((RANDOM % HOUSEKEEPING)).$((RANDOM % 10))"; fi
    : >"$bench/$gofile"
    local go_at
    go_at="$(rt_ns)"
    t0=$SECONDS
    local tail=$TAIL
    [[ "$c" == kernel ]] && tail=$KERNEL_TAIL
    local span=$((LEAD + THRESHOLD))
    [[ "$SCENARIO" == swap ]] && span=$((LEAD + SWAP_LINE))
    if ((rate > 0)); then budget=$((span / rate + tail)); else budget=$tail; fi
    while ((SECONDS - t0 < budget)) && alive "$g_pid"; do sleep 0.05; done
    sleep 1.5
    : >"$work/stop"
    wait "$sampler"
    local survived=0 st=""
    alive "$g_pid" && survived=1
    for i in "${!STEADY[@]}"; do
        local a=0
        alive "${S_PID[i]}" && a=1
        st+="${STEADY[i]%% *}:${S_UID[i]}:${S_PID[i]}:$a "
    done
    {
        echo "contender=$c"
        echo "rate=$rate"
        echo "run=$run"
        echo "mark=$tag $mark"
        echo "go_realtime_ns=$go_at"
        echo "grower=grower:$g_uid:$g_pid"
        echo "steady=$st"
        echo "pods_oom_kills=$kills_before $(pods_oom_kills)"
        echo "survived=$survived"
        echo "budget_s=$budget"
        echo "load1=$(cut -d' ' -f1 /proc/loadavg)"
        echo "prefill_mib=$prefill"
        echo "psi_totals_us=$psi_before $(psi_totals)"
    } >"$rec"
    ((survived)) && kill -KILL "$g_pid"
    pod_rm "$g_sb"
    rm -f "$bench/$gofile"
    log "$tag (${SECONDS}s): grower survived=$survived, kubepods oom_kill $kills_before -> $(pods_oom_kills)," \
        "steady alive: $st"
}

# ---- main -----------------------------------------------------------------------

# The kernel log, all of it, stamped (the marks line it up with realtime).
cat /dev/kmsg >"$out/kmsg.txt" &
KMSG_PID=$!
echo -1000 >/proc/$KMSG_PID/oom_score_adj
setup
physical="${CRIGUARD_OOM_PHYSICAL:-$(measure)}"
if [[ -n "${CRIGUARD_OOM_RATES:-}" ]]; then
    rates="${CRIGUARD_OOM_RATES//,/ }"
else
    # Four rates log-spaced from 8 MiB/s to half the physical limit, then
    # the physical limit itself (0: as fast as the grower can).
    rates="$(awk -v p="$physical" 'BEGIN { hi = p / 2; if (hi < 16) hi = 16
        for (i = 0; i < 4; i++) printf "%d ", 8 * (hi / 8) ^ (i / 3); print 0 }')"
fi
{
    echo "physical_mib_s=$physical"
    echo "rates=$rates"
    echo "capacity_bytes=$CAPACITY"
    echo "threshold_mib=$THRESHOLD"
    echo "scenario=$SCENARIO"
    echo "swap_mib=$SWAP_MIB"
    echo "swap_line_mib=$SWAP_LINE"
    echo "stall_pct=$STALL_PCT"
    echo "grower_request_mib=$GROWER_REQUEST"
    echo "grower_limit_mib=$GROWER_LIMIT"
    echo "runs=$RUNS"
    echo "kernel_runs=$KERNEL_RUNS"
    echo "tail_s=$TAIL"
    echo "kernel_tail_s=$KERNEL_TAIL"
    echo "contenders=$CONTENDERS"
    echo "kernel=$(uname -r)"
    echo "nproc=$(nproc)"
    echo "systemd=$(systemctl --version | awk 'NR == 1 { print $2 }')"
    echo "sample_us=$SAMPLE_US"
    echo "cgroup_subtree_control=$(cat /sys/fs/cgroup/cgroup.subtree_control)"
    echo "idle_available_mib=$(available_mib)"
    echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
} >"$out/meta.txt"
log "physical limit $physical MiB/s; rates $rates; available $(available_mib) MiB of $((CAPACITY / MI))"
for c in ${CONTENDERS//,/ }; do
    start_contender "$c"
    for rate in $rates; do
        n=$RUNS
        [[ "$c" == kernel ]] && n=$KERNEL_RUNS
        # CRIGUARD_OOM_RUNS_BY=contender=N,...: fewer runs for some.
        for kv in ${CRIGUARD_OOM_RUNS_BY:+${CRIGUARD_OOM_RUNS_BY//,/ }}; do
            [[ "${kv%%=*}" == "$c" ]] && n="${kv#*=}"
        done
        for ((run = 0; run < n; run++)); do
            one_run "$c" "$rate" "$run"
            sleep 0.5
        done
    done
    stop_contender "$c"
    echo "$c $(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/contenders-done.txt"
done
for i in "${!STEADY[@]}"; do pod_rm "${S_SB[i]}"; done
{
    free -m
    echo
    journalctl -k -o short-monotonic --no-pager | grep -i -E 'oom|killed' | tail -n 200
} >"$out/guest-end.txt" 2>&1
kill "$KMSG_PID"
sync
