"""What every tier of hack/bench-oom.sh shares: one run of the race, its
analysis, the kernel log, the CSV.

A run: the grower pod is created (its process waits for a go file), the
sampler (sampler.c) starts reading the pods' memcgs every 2 ms with
CLOCK_MONOTONIC stamps, the go file appears and the grower fills at full
speed to LEAD MiB below the crossing, then grows at the run's rate until
something frees it. Then:
- crossing: the first sample where available = limit - (usage -
  inactive_file) of the pods' cgroup is below the threshold;
- freed: the first sample after it where the grower pod holds less than a
  tenth of its peak (or its cgroup is gone);
- kernel OOM kills: the kernel log's oom-kill lines for the pods' cgroup
  (stamped on CLOCK_MONOTONIC through a marker) and the containers'
  memory.oom_control / memory.events oom_kill;
- the contender's action: its own log line (criguard's "evicting pod" and
  "pod's processes killed", the kubelet's "must evict pod(s)"), on
  CLOCK_MONOTONIC;
- who acted first: the earlier of the first kernel kill and that action;
- right victim: the first victim is the pod the kubelet's memory ranking
  puts first at the crossing (usage above request, then priority, then
  usage minus request);
- collateral: steady pods whose process died, and pods other than the
  grower that the contender evicted.
"""

import calendar
import os
import random
import subprocess
import time
import uuid

MI = 1 << 20


def env(key, default):
    return type(default)(os.environ.get(key, default))


LIMIT = env("CRIGUARD_OOM_LIMIT_MIB", 768)
THRESHOLD = env("CRIGUARD_OOM_THRESHOLD_MIB", 100)
RUNS = env("CRIGUARD_OOM_RUNS", 5)
# The grower starts this far (MiB) below the crossing, filled at full speed.
LEAD = env("CRIGUARD_OOM_LEAD_MIB", 24)
SAMPLE_US = 2000
# Seconds a run waits after the grower reached the limit: a 10 s
# housekeeping tick and its round.
TAIL_S = env("CRIGUARD_OOM_TAIL_S", 12.0)
# The housekeeping period of the tick-only contenders (criguard's and the
# kubelet's default, 10 s).
TICK_S = 10.0
# Seconds the grower pod runs, holding its prefill, before it grows, for a
# contender named *-settled: the kubelet ranks pods by cAdvisor's stats,
# which a pod only a few seconds old does not have yet.
SETTLE_S = env("CRIGUARD_OOM_SETTLE_S", 15.0)

# name, qos, request MiB, limit MiB, held MiB.
STEADY = [
    ("guaranteed-1", "Guaranteed", 96, 96, 64),
    ("guaranteed-2", "Guaranteed", 96, 96, 64),
    ("burstable-under", "Burstable", 128, 0, 64),
    ("burstable-over", "Burstable", 48, 0, 96),
    ("besteffort", "BestEffort", 0, 0, 32),
]

FIELDS = ["tier", "contender", "rate", "run", "crossed", "act_ms", "freed_ms", "actor", "victim",
          "first", "right", "kernel_kills", "evictions", "collateral", "lowest_avail_mib",
          "psi_full_peak", "grower_survived", "load1"]

# CLOCK_REALTIME - CLOCK_MONOTONIC, for wall-clock log stamps.
REAL_MINUS_MONO = time.time_ns() - time.monotonic_ns()


def log(*a):
    import sys
    print("bench-oom:", *a, file=sys.stderr, flush=True)


def read_int(path, key=None):
    try:
        with open(path) as f:
            if key is None:
                return int(f.read().split()[0])
            for line in f:
                k, v = line.split()[:2]
                if k == key:
                    return int(v)
    except (OSError, ValueError, IndexError):
        pass
    return -1


class Kmsg:
    """The kernel log from now on (/dev/kmsg), with each record's stamp put on
    CLOCK_MONOTONIC through a marker the bench writes and reads back."""

    def __init__(self):
        self.fd = os.open("/dev/kmsg", os.O_RDWR | os.O_NONBLOCK)
        os.lseek(self.fd, 0, os.SEEK_END)
        mark = f"criguard-oombench mark {uuid.uuid4().hex}"
        at = time.monotonic_ns()
        os.write(self.fd, mark.encode())
        self.offset = 0
        for stamp, text in self.records():
            if text == mark:
                self.offset = at - stamp

    def records(self):
        out = []
        while True:
            try:
                rec = os.read(self.fd, 8192).decode(errors="replace")
            except BlockingIOError:
                return out
            except OSError:  # EPIPE: records overwritten; go on
                continue
            head, _, text = rec.partition(";")
            out.append((int(head.split(",")[2]) * 1000, text.split("\n")[0]))

    def oom_kills(self, root):
        """(monotonic ns, task_memcg) of each oom-kill under `root` since the start."""
        kills = []
        for stamp, text in self.records():
            if text.startswith("oom-kill:") and root in text:
                memcg = next((x[len("task_memcg="):] for x in text.split(",")
                              if x.startswith("task_memcg=")), "")
                if memcg.startswith(root):
                    kills.append((stamp + self.offset, memcg))
        os.close(self.fd)
        return kills


def wall_to_mono(stamp):
    """An RFC 3339 UTC stamp (criguard's JSON logs) on CLOCK_MONOTONIC ns."""
    try:
        date, frac = stamp.rstrip("Z").split(".")
        base = calendar.timegm(time.strptime(date, "%Y-%m-%dT%H:%M:%S"))
        return int(base * 1e9 + int(frac.ljust(9, "0")[:9])) - REAL_MINUS_MONO
    except ValueError:
        return None


def criguard_acts(records):
    """[stamp, pod uid] per eviction from criguard's log records (stamp,
    message, uid), in order: the SIGKILL through the pod's cgroup when it
    is logged ("pod's processes killed"), else the decision ("evicting
    pod"). A pod killed the moment a memory event read the line crossed
    ("pod killed as a memory event read ...", before 2026-11-28 17:00 UTC
    "pod killed as the poll saw ...") is logged before its "evicting pod":
    that kill is its act."""
    out, kill, crossing = [], None, None
    for stamp, msg, uid in records:
        if msg.startswith("pod's processes killed"):
            if out and not out[-1][2]:
                out[-1][0], out[-1][2] = stamp, True
            else:
                kill = stamp
        elif msg.startswith(("pod killed as a memory event", "pod killed as the poll saw")):
            crossing = kill if kill is not None else stamp
        elif msg.startswith("evicting pod"):
            out.append([crossing if crossing is not None else stamp, uid, crossing is not None])
            kill = crossing = None
    return [[stamp, uid] for stamp, uid, _ in out]


def kubelet_first(pods, usage):
    """The pod the kubelet's memory ranking puts first
    (pkg/kubelet/eviction/helpers.go rankMemoryPressure): usage above request
    first, then priority (all 0 here), then usage minus request."""
    def key(p):
        u = usage.get(p.name, 0)
        return (u > p.request * MI, u - p.request * MI)
    return max(pods, key=key).name


def grower_args(node, rate, gofile):
    """The grower's command line: prefill to LEAD MiB below the crossing
    (from the pods' working set now), then `rate` MiB/s up to past the limit."""
    kp = node.memcg_dir
    ws = read_int(f"{kp}/memory.usage_in_bytes") - max(read_int(f"{kp}/memory.stat", node.inactive_key), 0)
    prefill = max((LIMIT - THRESHOLD) * MI - ws - LEAD * MI, 0) // MI
    return [str(prefill), str(rate), str(LIMIT + 64), gofile]


def one_run(node, steady, contender, rate, run, out_dir):
    """One run against `node` (a tier: its pods' memcg, how a grower pod is
    made and removed, the contender's log); the analysed row and the
    contender's log lines of the run. Against a contender on a periodic tick
    the growth starts at a random point of the period (runs of equal length
    would otherwise lock on to one phase of it)."""
    tag = uuid.uuid4().hex[:8]
    gofile = f"go-{tag}"
    stop = f"{node.tools}/stop-{tag}"
    samples = f"{out_dir}/{contender}-{rate}-{run}.samples"
    kmsg = Kmsg()
    mark = node.log_mark()
    grower = node.start_grower(grower_args(node, rate, f"{node.tools_in_pod}/{gofile}"))
    kp = node.memcg_dir
    specs = [f"{kp}/memory.usage_in_bytes", f"{kp}/memory.stat:{node.inactive_key}",
             "/proc/pressure/memory:full",
             grower.memcg("memory.usage_in_bytes")]
    specs += [p.memcg("memory.usage_in_bytes") for p in steady]
    if node.psi_path:
        specs[2] = f"{node.psi_path}:full"
    sampler = subprocess.Popen([node.sampler, samples, str(SAMPLE_US), "300", stop, *specs])
    kills_before = {p.uid: p.oom_kills() for p in steady}
    settle = SETTLE_S if contender.endswith("-settled") else 0
    time.sleep(0.1 + settle + (random.uniform(0, TICK_S) if contender.endswith("-tick") else 0))
    open(f"{node.tools}/{gofile}", "w").close()
    t0 = time.monotonic()
    budget = (LEAD + THRESHOLD + 64) / (rate if rate else 1000) + TAIL_S + 5
    while time.monotonic() - t0 < budget and grower.alive():
        time.sleep(0.02)
    # Let late actions and collateral show.
    time.sleep(1.5)
    open(stop, "w").close()
    sampler.wait()
    os.unlink(stop)
    os.unlink(f"{node.tools}/{gofile}")
    kernel = kmsg.oom_kills(node.cgroup)
    counted = max(grower.oom_kills(), 0) + sum(max(p.oom_kills() - max(kills_before[p.uid], 0), 0)
                                               for p in steady)
    evictions, lines = node.evictions_since(mark)
    survived = grower.alive()
    node.remove(grower)
    dead = [p for p in steady if not p.alive()]
    res = analyse(samples, steady, grower, kernel, counted, evictions, dead, node.limit_bytes)
    res.update(tier=node.tier, contender=contender, rate=rate, run=run, grower_survived=survived,
               load1=round(os.getloadavg()[0], 2))
    return res, lines


def analyse(samples, steady, grower, kernel_kills_seen, counted, evictions, dead, limit,
            since=None, own_crossing=None):
    """One run's row from its samples (see the module's doc); `since`
    (CLOCK_MONOTONIC ns): actions from then on count, instead of from 100 ms
    before the crossing (the VM tier, where each run has its own window);
    `own_crossing` (CLOCK_MONOTONIC ns): the contender's own line crossed,
    its figures counted from there (earlyoom's MemAvailable line)."""
    rows = []
    with open(samples) as f:
        for line in f:
            if not line.startswith("#"):
                rows.append([int(x) for x in line.split()])
    thr = THRESHOLD * MI
    avail = [(r[0], limit - (r[1] - max(r[2], 0))) for r in rows]
    crossing = next((i for i, (t, a) in enumerate(avail) if a < thr), None)
    if own_crossing is not None:
        crossing = next((i for i, r in enumerate(rows) if r[0] >= own_crossing), None)
    kernel_kills = max(counted, len(kernel_kills_seen))
    res = {"crossed": crossing is not None, "kernel_kills": kernel_kills,
           "psi_full_peak": max(r[2 + 1] for r in rows) / 100,
           "lowest_avail_mib": round(min(a for _, a in avail) / MI, 1),
           "evictions": len(evictions)}
    pods = steady + [grower]

    def name_of(key):
        return next((p.name for p in pods if key in (p.uid, p.pod_name) or f"pod{p.uid}/" in key
                     or f"pod{p.uid.replace('-', '_')}" in key), key)

    # Each pod once: an evicted pod's process is dead too.
    collateral = len({p.name for p in dead} | {name_of(k) for _, k in evictions} - {"grower"})
    if crossing is None:
        # No sample below the line: nothing acted, or a contender acted
        # within a sample period of its crossing (its kill stopped the
        # grower before the next sample). Ranked at the last sample before
        # (the VM tier, `since`, judges these runs itself: vm.py).
        acts = sorted((t, name_of(k)) for t, k in evictions if t is not None)
        actor, victim, first = "none", "", ""
        if acts and not kernel_kills and since is None:
            at, victim = acts[0]
            before = [r for r in rows if r[0] <= at] or rows[:1]
            usage = {p.name: before[-1][5 + i] for i, p in enumerate(steady)}
            usage["grower"] = before[-1][4]
            actor, first = "contender", kubelet_first(pods, usage)
        res.update(act_ms="", freed_ms="", actor=actor, victim=victim, right=bool(victim) and victim == first,
                   collateral=collateral, first=first)
        return res
    tc = rows[crossing][0]
    peak = 0
    freed = None
    for r in rows[crossing:]:
        g = r[4]
        peak = max(peak, g)
        if peak > 0 and (g < 0 or g < peak / 10):
            freed = r[0]
            break
    usage = {p.name: rows[crossing][5 + i] for i, p in enumerate(steady)}
    usage["grower"] = rows[crossing][4]
    first = kubelet_first(pods, usage)
    # Actions from before the crossing (less the sampling period and the
    # event's own lead) belong to the pressure of the run before.
    early = tc - 100_000_000 if since is None else since
    acts = [(t, "kernel", name_of(m)) for t, m in kernel_kills_seen if t >= early]
    acts += [(t, "contender", name_of(k)) for t, k in evictions if t is not None and t >= early]
    if kernel_kills and not kernel_kills_seen:
        acts.append((float("inf"), "kernel", "?"))
    acts.sort()
    at, actor, victim = acts[0] if acts else (None, "none", "")
    res.update(act_ms=round((at - tc) / 1e6, 1) if at not in (None, float("inf")) else "",
               freed_ms=round((freed - tc) / 1e6, 1) if freed else "", actor=actor,
               victim=victim, right=victim == first, collateral=collateral, first=first)
    return res


def race(node, contenders, rates, out_dir, writer, losses):
    """Every contender × rate × run against `node`: contenders is a list of
    (name, start, stop) where start() returns nothing and makes the node's
    contender act, stop() ends it."""
    for name, start, stop in contenders:
        start()
        try:
            for rate in rates:
                for run in range(RUNS):
                    node.revive()
                    res, lines = one_run(node, node.steady, name, rate, run, out_dir)
                    if res["actor"] == "contender":
                        res["actor"] = name
                    writer.writerow(res)
                    log(f"{name} rate={rate or 'max'} run={run}: actor={res['actor']} "
                        f"victim={res.get('victim')} act_ms={res['act_ms']} "
                        f"freed_ms={res['freed_ms']} kernel_kills={res['kernel_kills']} "
                        f"lowest={res['lowest_avail_mib']}Mi")
                    if name != "kernel" and res["actor"] != name:
                        losses.write(f"== {name} rate={rate or 'max'} run={run}: {res}\n")
                        losses.writelines(l + "\n" for l in lines[-15:])
                        losses.flush()
                    time.sleep(0.5)
        finally:
            stop()
