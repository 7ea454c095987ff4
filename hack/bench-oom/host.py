#!/usr/bin/python3
"""The race against the OOM killer, host tier (cgroup v1), run by
hack/bench-oom.sh, which starts the private containerd and passes its socket.

A kubepods memcg with a limit (node allocatable), the steady pods and the
grower pod created the kubelet's way through crictl (criguard's socket while
criguard runs, containerd's otherwise). Contenders take turns: the kernel
alone (the memcg OOM killer), criguard with memory events, criguard on its
housekeeping tick alone. race.py runs and analyses each run.

Usage: host.py WORKDIR CONTAINERD_SOCK CRICTL CRIGUARD TOOLS_DIR OUT_DIR
"""

import csv
import json
import os
import subprocess
import sys
import time
import uuid

import race
from race import LIMIT, MI, STEADY, THRESHOLD, log, read_int

MEMCG = "/sys/fs/cgroup/memory"
ROOT = "/criguard-oombench"
HOUSEKEEPING = os.environ.get("CRIGUARD_OOM_HOUSEKEEPING", "10s")


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
    """A pod as the kubelet asks for it (test-kit/src/kubelet.rs's requests): labels,
    cgroup parent by QoS, resources and oom_score_adj."""

    def __init__(self, name, qos, request, limit, held, workdir):
        self.name, self.qos, self.request, self.limit, self.held = name, qos, request, limit, held
        self.uid = f"{name}-{uuid.uuid4().hex[:8]}"
        self.pod_name = name
        parent = {"Guaranteed": "", "Burstable": "burstable/", "BestEffort": "besteffort/"}[qos]
        self.cgroup = f"{ROOT}/kubepods/{parent}pod{self.uid}"
        self.logdir = f"{workdir}/logs/default_{name}_{self.uid}"
        self.sandbox = self.container = None
        self.pid = None

    def memcg(self, f):
        return f"{MEMCG}{self.cgroup}/{f}"

    def oom_kills(self):
        # Under v1, oom_kill counts in the victim's own memcg (the
        # container's), not in its ancestors.
        if not self.container:
            return -1
        return read_int(self.memcg(f"{self.container}/memory.oom_control"), "oom_kill")

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

    def container_config(self, command, tools):
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
            "mounts": [{"container_path": "/bench", "host_path": tools, "readonly": True}],
            "linux": {
                "resources": {"cpu_period": 100000, "cpu_quota": cpu_milli * 100,
                              "cpu_shares": max(cpu_milli * 1024 // 1000, 2),
                              "memory_limit_in_bytes": self.limit * MI,
                              "oom_score_adj": oom_score_adj(self.qos, self.request)},
                "security_context": {"namespace_options": {"network": 2, "pid": 1, "ipc": 0}},
            },
        }

    def run(self, cri, tools, command):
        os.makedirs(self.logdir, exist_ok=True)
        sb = cri.write(f"{self.uid}-pod.json", self.sandbox_config())
        cc = cri.write(f"{self.uid}-ctr.json", self.container_config(command, tools))
        deadline = time.monotonic() + 30
        while True:
            try:
                self.sandbox = cri.call("runp", sb)
                break
            except RuntimeError:
                # criguard refuses new pods while the node is under pressure
                # and for the transition period after it.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        self.container = cri.call("create", "--no-pull", self.sandbox, cc, sb)
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


class Criguard:
    """`criguard serve` in front of the private containerd."""

    def __init__(self, binary, workdir, containerd_sock, events, out_dir, name, nri=False):
        self.sock = f"{workdir}/criguard.sock"
        self.logpath = f"{out_dir}/{name}.log"
        # criguard-nri: attached to containerd's NRI, the pods created on
        # containerd's socket (HostNode.use).
        self.nri = nri
        mode = ["--mode=nri", f"--nri-socket={workdir}/nri/nri.sock"] if nri else []
        args = [binary, "serve", *mode, "--listen", self.sock, "--admin-socket", f"{workdir}/admin.sock",
                "--metrics-address", "none", "--state-dir", f"{workdir}/state",
                "--runtime-endpoint", "unix://" + containerd_sock,
                "--kubepods-cgroup", f"{ROOT}/kubepods", "--nodefs", workdir, "--imagefs", workdir,
                f"--housekeeping-interval={HOUSEKEEPING}",
                f"--eviction-hard=allocatableMemory.available<{THRESHOLD}Mi",
                "--eviction-pressure-transition-period=1s",
                f"--memory-events={'true' if events else 'false'}", "--log-format", "json"]
        self.logfile = open(self.logpath, "a")
        self.proc = subprocess.Popen(args, stdout=self.logfile, stderr=subprocess.STDOUT,
                                     env={**os.environ,
                                          "CRIGUARD_LOG": "info,criguard::eviction=debug"})
        deadline = time.monotonic() + 20
        # As an NRI plugin criguard binds no CRI socket: its admin socket.
        serving = f"{workdir}/admin.sock" if nri else self.sock
        while not os.path.exists(serving):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"criguard did not start; see {self.logpath}")
            time.sleep(0.1)
        time.sleep(2)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.logfile.close()


def criguard_evictions(lines):
    """(monotonic ns, pod uid) per eviction in criguard's JSON log lines
    (race.criguard_acts)."""
    records = []
    for l in lines:
        try:
            j = json.loads(l)
        except ValueError:
            continue
        fields = j.get("fields", {})
        stamp = race.wall_to_mono(j.get("timestamp", ""))
        records.append((stamp, fields.get("message", ""), fields.get("uid", "")))
    return race.criguard_acts(records)


class HostNode:
    """The host tier for race.py: a kubepods memcg with a limit, pods made
    with crictl, the contender's log."""

    tier = "host"
    inactive_key = "total_inactive_file"
    psi_path = "/proc/pressure/memory"

    def __init__(self, workdir, containerd_sock, crictl, tools):
        self.workdir, self.crictl, self.containerd_sock = workdir, crictl, containerd_sock
        self.tools, self.tools_in_pod = tools, "/bench"
        self.sampler = f"{tools}/sampler"
        self.cgroup = f"{ROOT}/kubepods"
        self.memcg_dir = f"{MEMCG}{self.cgroup}"
        self.limit_bytes = LIMIT * MI
        self.direct = Cri(crictl, containerd_sock, containerd_sock, workdir)
        self.cri = self.direct
        self.guard = None
        self.steady = []

    def use(self, guard):
        self.guard = guard
        through = guard and not guard.nri
        self.cri = Cri(self.crictl, guard.sock, self.containerd_sock, self.workdir) if through else self.direct

    def steady_pod(self, i):
        name, qos, req, lim, held = STEADY[i]
        p = Pod(name, qos, req, lim, held, self.workdir)
        p.run(self.cri, self.tools, ["/bench/grower", str(held), "0", str(held)])
        return p

    def revive(self):
        """Steady pods that a contender or the kernel killed come back."""
        if not self.steady:
            self.steady = [self.steady_pod(i) for i in range(len(STEADY))]
            time.sleep(1)
        for i, p in enumerate(self.steady):
            if not p.alive():
                p.remove(self.cri)
                self.steady[i] = self.steady_pod(i)

    def start_grower(self, args):
        g = Pod("grower", "BestEffort", 0, 0, 0, self.workdir)
        g.run(self.cri, self.tools, ["/bench/grower", *args])
        return g

    def remove(self, pod):
        pod.remove(self.cri)

    def log_mark(self):
        if not self.guard:
            return 0
        self.guard.logfile.flush()
        return os.path.getsize(self.guard.logpath)

    def evictions_since(self, mark):
        if not self.guard:
            return [], []
        with open(self.guard.logpath) as f:
            f.seek(mark)
            lines = f.read().splitlines()
        return criguard_evictions(lines), lines


def measure_physical(grower):
    """The fastest the grower touches pages, in a memcg of its own under the
    bench's root (no limit): best of three 512 MiB fills."""
    cg = f"{MEMCG}{ROOT}/measure"
    os.makedirs(cg, exist_ok=True)
    best = 0
    for _ in range(3):
        out = subprocess.run(["sh", "-c", f"echo $$ > {cg}/cgroup.procs && exec {grower} --measure 512"],
                             capture_output=True, text=True, check=True).stdout
        best = max(best, int(out.strip()))
    os.rmdir(cg)
    return best


def rates_for(physical):
    env = os.environ.get("CRIGUARD_OOM_RATES")
    if env:
        return [int(x) for x in env.split(",")]
    return [r for r in (8, 32, 128, 512, 1024, 2048) if r < physical * 0.75] + [0]


def main():
    workdir, containerd_sock, crictl, criguard, tools, out_dir = sys.argv[1:7]
    names = os.environ.get("CRIGUARD_OOM_CONTENDERS", "kernel,criguard-events,criguard-tick").split(",")
    builds = dict(b.split("=", 1) for b in os.environ.get("CRIGUARD_OOM_BINS", "").split(",") if b)
    os.makedirs(f"{MEMCG}{ROOT}/kubepods", exist_ok=True)
    with open(f"{MEMCG}{ROOT}/kubepods/memory.limit_in_bytes", "w") as f:
        f.write(str(LIMIT * MI))
    physical = measure_physical(f"{tools}/grower")
    rates = rates_for(physical)
    log(f"physical limit {physical} MiB/s; rates {rates} (0 = as fast as the grower can)")
    with open(f"{out_dir}/meta.json", "w") as f:
        json.dump({"tier": "host", "physical_mib_s": physical, "limit_mib": LIMIT,
                   "threshold_mib": THRESHOLD, "housekeeping": HOUSEKEEPING, "runs": race.RUNS,
                   "rates": rates, "uptime": open("/proc/loadavg").read().strip(),
                   "kernel": os.uname().release, "nproc": os.cpu_count(),
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, f)
    node = HostNode(workdir, containerd_sock, crictl, tools)
    new = not os.path.exists(f"{out_dir}/runs.csv")
    results = open(f"{out_dir}/runs.csv", "a", newline="")
    writer = csv.DictWriter(results, fieldnames=race.FIELDS, extrasaction="ignore")
    if new:
        writer.writeheader()
    losses = open(f"{out_dir}/losses.txt", "a")

    def contender(name):
        if name == "kernel":
            return name, lambda: node.use(None), lambda: None
        # criguard-events: as shipped; criguard-tick: without memory
        # events; criguard-nri: as shipped, attached by NRI (containerd 2
        # with NRI on: bench-oom.sh); criguard-NAME: the build
        # CRIGUARD_OOM_BINS names NAME.
        events = name != "criguard-tick"
        nri = name == "criguard-nri"
        binary = builds.get(name.removeprefix("criguard-"), criguard)
        holder = {}

        def start():
            holder["g"] = Criguard(binary, workdir, containerd_sock, events, out_dir, name, nri)
            node.use(holder["g"])

        def stop():
            node.use(None)
            holder["g"].stop()
        return name, start, stop

    try:
        race.race(node, [contender(n) for n in names], rates, out_dir,
                  _Flush(writer, results), losses)
    finally:
        node.use(None)
        for p in node.steady:
            p.remove(node.direct)
        results.close()
        losses.close()
        for ctl in os.listdir("/sys/fs/cgroup"):
            d = f"/sys/fs/cgroup/{ctl}{ROOT}"
            if os.path.isdir(d) and not os.path.islink(f"/sys/fs/cgroup/{ctl}"):
                subprocess.run(["find", d, "-depth", "-type", "d", "-exec", "rmdir", "{}", ";"],
                               capture_output=True)


class _Flush:
    """A csv writer that flushes each row (a run that dies leaves its rows)."""

    def __init__(self, writer, f):
        self.writer, self.f = writer, f

    def writerow(self, row):
        self.writer.writerow(row)
        self.f.flush()


if __name__ == "__main__":
    main()
