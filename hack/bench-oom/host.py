#!/usr/bin/python3
"""The race against the OOM killer, host tier (cgroup v1): run by
hack/bench-oom.sh, which starts the private containerd and passes its socket.

A kubepods memcg with a limit (node allocatable), steady Guaranteed,
Burstable (one above its request) and BestEffort pods, and one BestEffort
grower pod that touches memory at a fixed rate until something frees it.
Contenders take turns: the kernel alone (the memcg OOM killer), criguard with
memory events, criguard on its housekeeping tick alone. Each run writes one
CSV row; report.py makes the tables and plots.

Everything is measured by the bench itself: a sampler (sampler.c) reads the
kubepods and pod memcgs every 2 ms with CLOCK_MONOTONIC stamps; the crossing
is the first sample where allocatable available = limit - (usage -
total_inactive_file) is below the threshold; "freed" is the first sample
after it where the grower pod holds less than a tenth of its peak (or its
cgroup is gone); kernel OOM kills are kubepods' memory.oom_control oom_kill
and the kernel log's oom-kill lines for this memcg; criguard's action is its
"evicting pod" log line.
"""

import calendar
import csv
import json
import os
import subprocess
import sys
import time
import uuid

MI = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
MEMCG = "/sys/fs/cgroup/memory"


def env(key, default):
    return type(default)(os.environ.get(key, default))


# Sizes (MiB): the pods' memcg limit and the hard threshold, the kubelet's
# default 100Mi as allocatableMemory.available.
LIMIT = env("CRIGUARD_OOM_LIMIT_MIB", 768)
THRESHOLD = env("CRIGUARD_OOM_THRESHOLD_MIB", 100)
RUNS = env("CRIGUARD_OOM_RUNS", 5)
# The grower starts this far (MiB) below the crossing, filled at full speed.
LEAD = env("CRIGUARD_OOM_LEAD_MIB", 24)
SAMPLE_US = 2000
HOUSEKEEPING = os.environ.get("CRIGUARD_OOM_HOUSEKEEPING", "10s")

# name, qos, request MiB, limit MiB, held MiB.
STEADY = [
    ("guaranteed-1", "Guaranteed", 96, 96, 64),
    ("guaranteed-2", "Guaranteed", 96, 96, 64),
    ("burstable-under", "Burstable", 128, 0, 64),
    ("burstable-over", "Burstable", 48, 0, 96),
    ("besteffort", "BestEffort", 0, 0, 32),
]


def log(*a):
    print("bench-oom:", *a, file=sys.stderr, flush=True)


def mem_total():
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal")


CAPACITY = mem_total()


def oom_score_adj(qos, request_mib):
    """pkg/kubelet/qos/policy.go, GetContainerOOMScoreAdjust."""
    if qos == "Guaranteed":
        return -997
    if qos == "BestEffort":
        return 1000
    adj = 1000 - (1000 * request_mib * MI) // CAPACITY
    return min(max(adj, 3), 999)


class Cri:
    """crictl against one endpoint (criguard's socket or containerd's)."""

    def __init__(self, crictl, endpoint, image_endpoint, workdir):
        self.crictl, self.endpoint, self.image_endpoint = crictl, endpoint, image_endpoint
        self.workdir = workdir

    def call(self, *args, check=True):
        cmd = [self.crictl, "--runtime-endpoint", "unix://" + self.endpoint,
               "--image-endpoint", "unix://" + self.image_endpoint, "-t", "30s", *args]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])}: {p.stderr.strip()}")
        return p.stdout.strip() if p.returncode == 0 else None

    def write(self, name, obj):
        path = os.path.join(self.workdir, name)
        with open(path, "w") as f:
            json.dump(obj, f)
        return path


class Pod:
    def __init__(self, name, qos, request, limit, held, root, workdir):
        self.name, self.qos, self.request, self.limit, self.held = name, qos, request, limit, held
        self.uid = f"{name}-{uuid.uuid4().hex[:8]}"
        parent = {"Guaranteed": "", "Burstable": "burstable/", "BestEffort": "besteffort/"}[qos]
        self.cgroup = f"{root}/kubepods/{parent}pod{self.uid}"
        self.logdir = f"{workdir}/logs/default_{name}_{self.uid}"
        self.sandbox = self.container = None
        self.pid = None

    def memcg(self, f):
        return f"{MEMCG}{self.cgroup}/{f}"

    def sandbox_config(self):
        labels = {"io.kubernetes.pod.name": self.name, "io.kubernetes.pod.namespace": "default",
                  "io.kubernetes.pod.uid": self.uid}
        return {
            "metadata": {"name": self.name, "uid": self.uid, "namespace": "default", "attempt": 0},
            "log_directory": self.logdir,
            "labels": labels,
            "linux": {"cgroup_parent": self.cgroup,
                      "security_context": {"namespace_options": {"network": 2, "pid": 0, "ipc": 0}}},
        }

    def container_config(self, command, grower):
        labels = dict(self.sandbox_config()["labels"])
        labels["io.kubernetes.container.name"] = "app"
        cpu_milli = 100 if self.qos == "Guaranteed" else 0
        return {
            "metadata": {"name": "app", "attempt": 0},
            "image": {"image": "docker.io/library/busybox:criguard"},
            "command": command,
            "log_path": "app/0.log",
            "labels": labels,
            "annotations": {"io.kubernetes.container.restartCount": "0",
                            "io.kubernetes.pod.terminationGracePeriod": "30"},
            "mounts": [{"container_path": "/grower", "host_path": grower, "readonly": True}],
            "linux": {
                "resources": {"cpu_period": 100000, "cpu_quota": cpu_milli * 100,
                              "cpu_shares": max(cpu_milli * 1024 // 1000, 2),
                              "memory_limit_in_bytes": self.limit * MI,
                              "oom_score_adj": oom_score_adj(self.qos, self.request)},
                "security_context": {"namespace_options": {"network": 2, "pid": 1, "ipc": 0}},
            },
        }

    def run(self, cri, grower, command, before_start=None):
        os.makedirs(self.logdir, exist_ok=True)
        sb = cri.write(f"{self.uid}-pod.json", self.sandbox_config())
        cc = cri.write(f"{self.uid}-ctr.json", self.container_config(command, grower))
        deadline = time.monotonic() + 30
        while True:
            try:
                self.sandbox = cri.call("runp", sb)
                break
            except RuntimeError as e:
                # criguard refuses new pods while the node is under pressure
                # and for the transition period after it.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        self.container = cri.call("create", "--no-pull", self.sandbox, cc, sb)
        if before_start:
            before_start()
        cri.call("start", self.container)
        info = json.loads(cri.call("inspect", self.container))
        self.pid = info["info"]["pid"]

    def alive(self):
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                return f.read().split(") ", 1)[1][0] != "Z"
        except (OSError, IndexError):
            return False

    def remove(self, cri):
        if self.sandbox:
            cri.call("stopp", self.sandbox, check=False)
            cri.call("rmp", "-f", self.sandbox, check=False)
            self.sandbox = None


def read_int(path, key=None):
    try:
        with open(path) as f:
            if key is None:
                return int(f.read().split()[0])
            for line in f:
                k, v = line.split()[:2]
                if k == key:
                    return int(v)
    except OSError:
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
        """(monotonic ns, task_memcg) of each oom-kill in `root` since the last call."""
        kills = []
        for stamp, text in self.records():
            if text.startswith("oom-kill:") and f"oom_memcg={root}" in text:
                memcg = next((x[len("task_memcg="):] for x in text.split(",")
                              if x.startswith("task_memcg=")), "")
                kills.append((stamp + self.offset, memcg))
        os.close(self.fd)
        return kills


def measure_physical(grower, root):
    """The fastest the grower touches pages, in a memcg of its own under the
    kubepods root (no limit): best of three 512 MiB fills."""
    cg = f"{MEMCG}{root}/measure"
    os.makedirs(cg, exist_ok=True)
    best = 0
    for _ in range(3):
        out = subprocess.run(["sh", "-c", f"echo $$ > {cg}/cgroup.procs && exec {grower} --measure 512"],
                             capture_output=True, text=True, check=True).stdout
        best = max(best, int(out.strip()))
    os.rmdir(cg)
    return best


class Criguard:
    def __init__(self, binary, workdir, containerd_sock, root, events, out_dir):
        self.sock = f"{workdir}/criguard.sock"
        self.logpath = f"{out_dir}/criguard-{'events' if events else 'tick'}.log"
        args = [binary, "serve", "--listen", self.sock, "--admin-socket", f"{workdir}/admin.sock",
                "--metrics-address", "none", "--state-dir", f"{workdir}/state",
                "--runtime-endpoint", "unix://" + containerd_sock,
                "--kubepods-cgroup", f"{root}/kubepods", "--nodefs", workdir, "--imagefs", workdir,
                f"--housekeeping-interval={HOUSEKEEPING}",
                f"--eviction-hard=allocatableMemory.available<{THRESHOLD}Mi",
                "--eviction-pressure-transition-period=1s",
                f"--memory-events={'true' if events else 'false'}", "--log-format", "json"]
        self.logfile = open(self.logpath, "a")
        self.proc = subprocess.Popen(args, stdout=self.logfile, stderr=subprocess.STDOUT,
                                     env={**os.environ,
                                          "CRIGUARD_LOG": "info,criguard::reclaim::evict=debug"})
        deadline = time.monotonic() + 20
        while not os.path.exists(self.sock):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"criguard did not start; see {self.logpath}")
            time.sleep(0.1)

    def log_size(self):
        self.logfile.flush()
        return os.path.getsize(self.logpath)

    def lines_since(self, offset):
        with open(self.logpath) as f:
            f.seek(offset)
            return f.read().splitlines()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.logfile.close()


def wall_to_mono(stamp, offset):
    """An RFC 3339 log stamp (criguard's JSON logs) on CLOCK_MONOTONIC ns."""
    try:
        date, frac = stamp.rstrip("Z").split(".")
        base = calendar.timegm(time.strptime(date, "%Y-%m-%dT%H:%M:%S"))
        return int(base * 1e9 + int(frac.ljust(9, "0")[:9])) - offset
    except ValueError:
        return None


def kubelet_first(pods, usage):
    """The pod the kubelet's memory ranking puts first
    (pkg/kubelet/eviction/helpers.go rankMemoryPressure): usage above request
    first, then priority (all 0 here), then usage minus request."""
    def key(p):
        u = usage.get(p.name, 0)
        return (u > p.request * MI, u - p.request * MI)
    return max(pods, key=key).name


def one_run(tools, cri, root, steady, contender, rate, run, guard, out_dir):
    grower = Pod("grower", "BestEffort", 0, 0, 0, root, tools["workdir"])
    kp = f"{MEMCG}{root}/kubepods"
    ws = read_int(f"{kp}/memory.usage_in_bytes") - read_int(f"{kp}/memory.stat", "total_inactive_file")
    prefill = max((LIMIT - THRESHOLD) * MI - ws - LEAD * MI, 0) // MI
    command = ["/grower", str(prefill), str(rate), str(LIMIT + 64)]
    stop = f"{tools['workdir']}/stop"
    samples = f"{out_dir}/{contender}-{rate}-{run}.samples"
    if os.path.exists(stop):
        os.unlink(stop)
    kmsg = Kmsg()
    log_offset = guard.log_size() if guard else 0
    sampler = []

    def start_sampler():
        specs = [f"{kp}/memory.usage_in_bytes", f"{kp}/memory.stat:total_inactive_file",
                 f"{kp}/memory.oom_control:oom_kill", "/proc/pressure/memory:full",
                 grower.memcg("memory.usage_in_bytes"), grower.memcg("memory.oom_control:oom_kill")]
        specs += [p.memcg("memory.usage_in_bytes") for p in steady]
        sampler.append(subprocess.Popen([tools["sampler"], samples, str(SAMPLE_US), "120", stop, *specs]))

    grower.run(cri, tools["grower_host"], command, before_start=start_sampler)
    t0 = time.monotonic()
    # Long enough for the slowest contender: the grower reaches the limit
    # after LEAD + THRESHOLD MiB; then 12 s (a 10 s tick and its round).
    budget = (LEAD + THRESHOLD + 64) / (rate if rate else 1000) + 12
    while time.monotonic() - t0 < budget and grower.alive():
        time.sleep(0.02)
    # Let late actions and collateral show.
    time.sleep(1.5)
    open(stop, "w").close()
    sampler[0].wait()
    kernel_new = kmsg.oom_kills(root)
    # memory.oom_control's oom_kill counts in the victim's own memcg under
    # v1 (the container's), not its ancestors: read each container's.
    counted = sum(max(read_int(f"{p.memcg(p.container)}/memory.oom_control", "oom_kill"), 0)
                  for p in steady + [grower] if p.container)
    guard_lines = guard.lines_since(log_offset) if guard else []
    grower_alive_after = grower.alive()
    grower.remove(cri)
    dead = [p for p in steady if not p.alive()]
    return analyse(samples, steady, grower, kernel_new, counted, guard_lines, dead, rate,
                   contender, run, grower_alive_after)


def analyse(samples, steady, grower, kernel_kills_seen, counted, guard_lines, dead, rate,
            contender, run, grower_alive_after):
    rows = []
    offset = 0
    with open(samples) as f:
        for line in f:
            if line.startswith("#"):
                offset = int(line.split()[-1])
                continue
            rows.append([int(x) for x in line.split()])
    limit = LIMIT * MI
    thr = THRESHOLD * MI
    avail = [(r[0], limit - (r[1] - max(r[2], 0))) for r in rows]
    crossing = next((i for i, (t, a) in enumerate(avail) if a < thr), None)
    res = {"contender": contender, "rate": rate, "run": run, "crossed": crossing is not None,
           "load1": os.getloadavg()[0]}
    kernel_kills = max(counted, len(kernel_kills_seen))
    res["kernel_kills"] = kernel_kills
    res["psi_full_peak"] = max(r[4] for r in rows) / 100
    res["lowest_avail_mib"] = round(min(a for _, a in avail) / MI, 1)
    evictions = []
    for l in guard_lines:
        try:
            j = json.loads(l)
        except ValueError:
            continue
        msg = j.get("fields", {}).get("message", "")
        stamp = wall_to_mono(j.get("timestamp", ""), offset)
        if msg.startswith("evicting pod"):
            evictions.append([stamp, j["fields"].get("uid", "")])
        elif msg.startswith("pod's processes killed") and evictions and stamp is not None:
            # The SIGKILL through the pod's cgroup: criguard's action.
            evictions[-1][0] = stamp
    res["evictions"] = len(evictions)
    if crossing is None:
        res.update(freed_ms="", actor="none", victim="", right=False, collateral=len(dead))
        return res, guard_lines
    tc = rows[crossing][0]
    peak = 0
    freed = None
    for r in rows[crossing:]:
        g = r[5]
        peak = max(peak, g)
        if peak > 0 and (g < 0 or g < peak / 10):
            freed = r[0]
            break
    usage = {p.name: rows[crossing][7 + i] for i, p in enumerate(steady)}
    usage["grower"] = rows[crossing][5]
    first = kubelet_first(steady + [grower], usage)
    # Who acted first: the earlier of the first kernel kill and criguard's
    # first "evicting pod" line.
    pods = steady + [grower]
    acts = [(t, "kernel", next((p.name for p in pods if f"pod{p.uid}/" in m), m))
            for t, m in kernel_kills_seen]
    acts += [(t, "criguard", next((p.name for p in pods if p.uid == uid), uid))
             for t, uid in evictions if t is not None]
    if kernel_kills and not kernel_kills_seen:
        acts.append((float("inf"), "kernel", "?"))
    acts.sort()
    at, actor, victim = acts[0] if acts else (None, "none", "")
    res["act_ms"] = round((at - tc) / 1e6, 1) if at not in (None, float("inf")) else ""
    collateral = len(dead) + sum(1 for _, uid in evictions if uid != grower.uid)
    res.update(freed_ms=round((freed - tc) / 1e6, 1) if freed else "", actor=actor, victim=victim,
               right=victim == first, collateral=collateral, first=first,
               grower_survived=grower_alive_after)
    return res, guard_lines


def main():
    workdir, containerd_sock, crictl, criguard, tools_dir, out_dir = sys.argv[1:7]
    contenders = os.environ.get("CRIGUARD_OOM_CONTENDERS", "kernel,criguard-events,criguard-tick").split(",")
    root = "/criguard-oombench"
    kp = f"{MEMCG}{root}/kubepods"
    os.makedirs(kp, exist_ok=True)
    with open(f"{kp}/memory.limit_in_bytes", "w") as f:
        f.write(str(LIMIT * MI))
    grower_host = f"{workdir}/grower"
    subprocess.run(["cp", f"{tools_dir}/grower", grower_host], check=True)
    tools = {"workdir": workdir, "grower_host": grower_host, "sampler": f"{tools_dir}/sampler"}
    physical = measure_physical(grower_host, root)
    rates = [r for r in (8, 32, 128, 512, 1024, 2048) if r < physical * 0.75] + [0]
    rates_env = os.environ.get("CRIGUARD_OOM_RATES")
    if rates_env:
        rates = [int(x) for x in rates_env.split(",")]
    log(f"physical limit {physical} MiB/s; rates {rates} (0 = as fast as the grower can)")
    with open(f"{out_dir}/meta.json", "w") as f:
        json.dump({"physical_mib_s": physical, "limit_mib": LIMIT, "threshold_mib": THRESHOLD,
                   "housekeeping": HOUSEKEEPING, "runs": RUNS, "rates": rates,
                   "uptime": open("/proc/loadavg").read().strip(),
                   "kernel": os.uname().release, "nproc": os.cpu_count(),
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, f)
    direct = Cri(crictl, containerd_sock, containerd_sock, workdir)
    steady = []
    for name, qos, req, lim, held in STEADY:
        p = Pod(name, qos, req, lim, held, root, workdir)
        p.run(direct, grower_host, ["/grower", str(held), "0", str(held)])
        steady.append(p)
    time.sleep(1)
    results = open(f"{out_dir}/runs.csv", "w", newline="")
    fields = ["tier", "contender", "rate", "run", "crossed", "act_ms", "freed_ms", "actor", "victim", "first",
              "right", "kernel_kills", "evictions", "collateral", "lowest_avail_mib",
              "psi_full_peak", "grower_survived", "load1"]
    w = csv.DictWriter(results, fieldnames=fields, extrasaction="ignore")
    w.writeheader()
    losses = open(f"{out_dir}/losses.txt", "w")
    try:
        for contender in contenders:
            guard = None
            cri = direct
            if contender.startswith("criguard"):
                guard = Criguard(criguard, workdir, containerd_sock, root, contender.endswith("events"),
                                 out_dir)
                cri = Cri(crictl, guard.sock, containerd_sock, workdir)
                time.sleep(2)
            try:
                for rate in rates:
                    for run in range(RUNS):
                        # Steady pods a contender or the kernel killed come back.
                        for i, p in enumerate(steady):
                            if not p.alive():
                                p.remove(cri)
                                name, qos, req, lim, held = STEADY[i]
                                q = Pod(name, qos, req, lim, held, root, workdir)
                                q.run(cri, grower_host, ["/grower", str(held), "0", str(held)])
                                steady[i] = q
                        res, glines = one_run(tools, cri, root, steady, contender, rate, run, guard,
                                              out_dir)
                        res["tier"] = "host"
                        w.writerow(res)
                        results.flush()
                        log(f"{contender} rate={rate or 'max'} run={run}: actor={res['actor']} "
                            f"victim={res.get('victim')} freed_ms={res['freed_ms']} "
                            f"kernel_kills={res['kernel_kills']} lowest={res['lowest_avail_mib']}Mi")
                        if guard and res["actor"] != "criguard":
                            losses.write(f"== {contender} rate={rate or 'max'} run={run}: "
                                         f"{json.dumps(res)}\n")
                            losses.writelines(l + "\n" for l in glines[-12:])
                            losses.flush()
                        time.sleep(0.5)
            finally:
                if guard:
                    guard.stop()
    finally:
        for p in steady:
            p.remove(direct)
        results.close()
        losses.close()
        subprocess.run(["find", f"{MEMCG}{root}", "-depth", "-type", "d", "-exec", "rmdir", "{}", ";"],
                       capture_output=True)


if __name__ == "__main__":
    main()
