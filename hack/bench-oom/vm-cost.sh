#!/usr/bin/env bash
# What criguard's v2 memory poll and its ranking kept ready cost while the
# node sits near a hard memory threshold, in the VM tier's guest
# (hack/bench-oom.sh cost boots the VM and runs this). For each criguard
# build given: 20 s with memory.available far from the line
# (memory.available<200Mi, the node idle), then 20 s held LEVEL MiB above
# it (a process in a scope of kubepods.slice holding the memory; no pod, so
# the ranking has no pod to read); criguard's CPU time (utime + stime of
# /proc/PID/stat) over each, in ms per second.
#
# Usage: vm-cost.sh OUT TOOLS NAME...   (TOOLS/criguard-NAME for each NAME;
#   TOOLS/grower; CRIGUARD_OOM_COST_NEAR_MIB, 10: how far above the line)
# Writes OUT/cost.txt: "NAME phase cpu_ms_per_s".
set -uo pipefail
out="$1"
tools="$2"
shift 2
echo -1000 >/proc/self/oom_score_adj
NEAR="${CRIGUARD_OOM_COST_NEAR_MIB:-10}"
THRESHOLD=200
work=/var/tmp/oomcost
mkdir -p "$work"
CAPACITY=$(($(awk '$1 == "MemTotal:" { print $2 }' /proc/meminfo) * 1024))
available_mib() {
    awk -v cap="$CAPACITY" '$1 == "anon" { a = $2 } $1 == "file" { f = $2 } $1 == "inactive_file" { i = $2 }
        END { printf "%d\n", (cap - (a + f - i)) / 1048576 }' /sys/fs/cgroup/memory.stat
}
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
mkdir -p /run/systemd/system
printf '[Unit]\nDescription=the pods (cost bench)\n\n[Slice]\n' >/run/systemd/system/kubepods.slice
systemctl daemon-reload
systemctl start kubepods.slice containerd.service
: >"$out/cost.txt"
# CPU ms per second of PID over SECS seconds.
cpu_rate() {
    local pid="$1" secs="$2" a b
    a=$(ticks "$pid")
    sleep "$secs"
    b=$(ticks "$pid")
    echo $(((b - a) * 1000 * 1000 / hz / (secs * 1000)))
}
for name in "$@"; do
    rm -rf "$work/criguard"
    mkdir -p "$work/criguard"
    "$tools/criguard-$name" serve --listen "$work/criguard/criguard.sock" \
        --admin-socket "$work/criguard/admin.sock" --metrics-address none \
        --state-dir "$work/criguard/state" --runtime-endpoint unix:///run/containerd/containerd.sock \
        --nodefs "$work" --imagefs "$work" --eviction-hard="memory.available<${THRESHOLD}Mi" \
        --log-format json >"$out/cost-$name.log" 2>&1 &
    pid=$!
    echo -999 >/proc/$pid/oom_score_adj
    for _ in $(seq 100); do [[ -S "$work/criguard/criguard.sock" ]] && break; sleep 0.2; done
    sleep 5
    echo "$name far $(cpu_rate "$pid" 20)" >>"$out/cost.txt"
    # Hold memory.available NEAR MiB above the line.
    hold=$(($(available_mib) - THRESHOLD - NEAR))
    systemd-run --scope -q --slice kubepods.slice "$tools/grower" "$hold" 0 "$hold" &
    holder=$!
    for _ in $(seq 300); do (($(available_mib) <= THRESHOLD + NEAR + 4)) && break; sleep 0.1; done
    sleep 3
    echo "$name near $(cpu_rate "$pid" 20) available_mib=$(available_mib)" >>"$out/cost.txt"
    kill "$holder"
    wait "$holder" 2>/dev/null
    kill "$pid"
    wait "$pid" 2>/dev/null
done
cat "$out/cost.txt"
