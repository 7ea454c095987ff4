#!/usr/bin/python3
"""The race against the OOM killer, the kubelet's eviction manager as the
contender (host, cgroup v1), run by hack/bench-oom.sh on the cluster tier's
node (hack/cluster.sh up: kube-apiserver, etcd, a kubelet v1.37.2).

A standalone kubelet will not do: its pods are all static, and the eviction
manager never evicts a static pod (pkg/kubelet/types IsCriticalPod:
"cannot evict a critical pod"), so the pods here come from the API server.
node-a's criguard runs with --dry-run (it only relays; the kubelet acts),
its kubepods cgroup is limited to the bench's limit through kubeReserved and
systemReserved, and its evictionHard is memory.available<THRESHOLD (with
enforceNodeAllocatable pods the kubelet derives allocatableMemory.available
from it). Contenders: kubelet-memcg (kernelMemcgNotification: true) and
kubelet-tick (false; the 10 s housekeeping alone); the kubelet is restarted
with the same command line between the two.

Usage: kubelet.py CLUSTER_DIR TOOLS_DIR OUT_DIR RATES (comma-separated)
"""

import calendar
import csv
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import race
from race import MI, STEADY, log, read_int

MEMCG = "/sys/fs/cgroup/memory"


class KubePod:
    def __init__(self, node, name, qos, request, limit, held, args, restart):
        self.node = node
        self.name, self.qos, self.request = name, qos, request
        self.pod_name = f"{name}-{uuid.uuid4().hex[:6]}"
        res = {}
        if qos == "Guaranteed":
            res = {"requests": {"memory": f"{limit}Mi", "cpu": "100m"},
                   "limits": {"memory": f"{limit}Mi", "cpu": "100m"}}
        elif qos == "Burstable":
            res = {"requests": {"memory": f"{request}Mi"}}
        manifest = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": self.pod_name, "namespace": "default"},
            "spec": {
                "nodeName": "node-a", "hostNetwork": True, "restartPolicy": restart,
                "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "app", "image": "docker.io/library/busybox:criguard",
                                "imagePullPolicy": "Never", "command": ["/bench/grower", *args],
                                "resources": res,
                                "volumeMounts": [{"name": "bench", "mountPath": "/bench",
                                                  "readOnly": True}]}],
                "volumes": [{"name": "bench", "hostPath": {"path": node.tools}}],
            },
        }
        node.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
        self.uid = self.container = self.pid = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            p = json.loads(node.kubectl("get", "pod", self.pod_name, "-o", "json"))
            self.uid = p["metadata"]["uid"]
            st = p.get("status", {})
            cs = (st.get("containerStatuses") or [{}])[0]
            if st.get("phase") == "Failed":
                raise Rejected(st.get("message", ""))
            if "running" in cs.get("state", {}) and cs.get("containerID"):
                self.container = cs["containerID"].split("://")[1]
                info = json.loads(node.crictl("inspect", self.container))
                self.pid = info["info"]["pid"]
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"pod {self.pod_name} not running in 60 s")
        parent = {"Guaranteed": "", "Burstable": "burstable/", "BestEffort": "besteffort/"}[qos]
        self.cgroup = f"{node.cgroup}/{parent}pod{self.uid}"

    def memcg(self, f):
        return f"{MEMCG}{self.cgroup}/{f}"

    def oom_kills(self):
        return read_int(self.memcg(f"{self.container}/memory.oom_control"), "oom_kill")

    def alive(self):
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                return f.read().split(") ", 1)[1][0] != "Z"
        except (OSError, IndexError):
            return False


class Rejected(Exception):
    """The kubelet's admission refused the pod (the node under pressure)."""


def klog_mono(line, year):
    """A klog line's stamp (I1126 00:30:01.123456, UTC) on CLOCK_MONOTONIC ns."""
    try:
        mmdd, hms = line[1:5], line[6:21]
        base = calendar.timegm(time.strptime(f"{year}{mmdd} {hms[:8]}", "%Y%m%d %H:%M:%S"))
        return int(base * 1e9 + int(hms[9:15]) * 1000) - race.REAL_MINUS_MONO
    except (ValueError, IndexError):
        return None


def kubelet_evictions(lines):
    """(monotonic ns of the decision, pod name) per eviction in the kubelet's
    log: the first "must evict" of a round and the pod ranked first after it
    (the one the kubelet then evicts; its "evicted successfully" comes only
    when the runtime has stopped it, seconds later)."""
    year = time.gmtime().tm_year
    out, decided = [], None
    for l in lines:
        if "Eviction manager: must evict pod(s) to reclaim" in l:
            if decided is None:
                decided = klog_mono(l, year)
        elif "Eviction manager: pods ranked for eviction" in l and decided is not None:
            ranked = l.split("pods=[", 1)[1].split("]")[0].replace('"', "").split(",")
            pod = ranked[0].split("/")[-1] if ranked and ranked[0] else "?"
            if all(p != pod for _, p in out):
                out.append((decided, pod))
        elif ("Eviction manager: pod is evicted successfully" in l
              or "Eviction manager: pod failed to evict" in l):
            decided = None
    return out


class KubeletNode:
    tier = "host"
    inactive_key = "total_inactive_file"
    psi_path = "/proc/pressure/memory"

    def __init__(self, cluster, tools):
        self.dir, self.tools, self.tools_in_pod = cluster, tools, "/bench"
        env = dict(l.strip().split("=", 1) for l in open(f"{cluster}/cluster.env") if "=" in l)
        self.kubectl_bin, self.kubeconfig = env["KUBECTL"], env["KUBECONFIG"]
        self.nd = f"{cluster}/node-node-a"
        self.cgroup = open(f"{self.nd}/kubepods").read().strip()
        self.memcg_dir = f"{MEMCG}{self.cgroup}"
        self.limit_bytes = read_int(f"{self.memcg_dir}/memory.limit_in_bytes")
        self.sampler = f"{tools}/sampler"
        self.crictl_bin = os.environ["CRICTL"]
        self.steady = []

    def kubectl(self, *args, stdin=None):
        p = subprocess.run([self.kubectl_bin, "--kubeconfig", self.kubeconfig, *args],
                           input=stdin, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args[:3])}: {p.stderr.strip()}")
        return p.stdout

    def crictl(self, *args):
        sock = f"unix://{self.nd}/containerd/containerd.sock"
        return subprocess.run([self.crictl_bin, "--runtime-endpoint", sock, *args],
                              capture_output=True, text=True, check=True).stdout

    def pod(self, name, qos, req, lim, held, args, restart):
        deadline = time.monotonic() + 60
        while True:
            try:
                return KubePod(self, name, qos, req, lim, held, args, restart)
            except Rejected:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

    def revive(self):
        if not self.steady:
            self.steady = [self.pod(n, q, r, l, h, [str(h), "0", str(h)], "Never")
                           for n, q, r, l, h in STEADY]
            time.sleep(1)
        for i, p in enumerate(self.steady):
            if not p.alive():
                self.remove(p)
                n, q, r, l, h = STEADY[i]
                self.steady[i] = self.pod(n, q, r, l, h, [str(h), "0", str(h)], "Never")

    def start_grower(self, args):
        # Under MemoryPressure (the transition period) the kubelet rejects
        # BestEffort pods: retried.
        for _ in range(30):
            try:
                return KubePod(self, "grower", "BestEffort", 0, 0, 0, args, "Never")
            except Rejected:
                time.sleep(1)
        raise RuntimeError("the grower pod was rejected for 30 s")

    def remove(self, pod):
        self.kubectl("delete", "pod", pod.pod_name, "--grace-period=0", "--force", "--wait=false")

    def log_mark(self):
        return os.path.getsize(f"{self.nd}/kubelet.log")

    def evictions_since(self, mark):
        with open(f"{self.nd}/kubelet.log", errors="replace") as f:
            f.seek(mark)
            lines = f.read().splitlines()
        lines = [l for l in lines if "viction" in l or "OOM" in l or "Killing" in l]
        return kubelet_evictions(lines), lines

    def restart_kubelet(self, memcg_notification):
        """The kubelet again with kernelMemcgNotification set as asked."""
        cfg = f"{self.nd}/kubelet.yaml"
        lines = [l for l in open(cfg) if not l.startswith("kernelMemcgNotification:")]
        lines.append(f"kernelMemcgNotification: {'true' if memcg_notification else 'false'}\n")
        open(cfg, "w").writelines(lines)
        pidfile = f"{self.dir}/pids/kubelet-node-a.pid"
        pid = int(open(pidfile).read())
        cmd = [l for l in open(f"{self.nd}/kubelet.log") if l.startswith("=== ")][0].split()[2:]
        os.kill(pid, signal.SIGTERM)
        for _ in range(150):
            if not os.path.exists(f"/proc/{pid}"):
                break
            time.sleep(0.1)
        logf = open(f"{self.nd}/kubelet.log", "a")
        logf.write(f"=== {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {' '.join(cmd)}\n")
        logf.flush()
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                             start_new_session=True)
        open(pidfile, "w").write(f"{p.pid}\n")
        # Ready again, and its eviction manager started.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ok = subprocess.run(["grep", "-c", "Eviction manager: starting control loop",
                                 f"{self.nd}/kubelet.log"], capture_output=True, text=True)
            if int(ok.stdout.strip() or 0) >= self.restarts + 2:
                break
            time.sleep(0.5)
        self.restarts += 1
        time.sleep(5)

    restarts = 0


def main():
    cluster, tools, out_dir, rates = sys.argv[1:5]
    rates = [int(x) for x in rates.split(",")]
    node = KubeletNode(cluster, tools)
    log(f"kubelet node: kubepods {node.cgroup}, limit {node.limit_bytes // MI} MiB")
    new = not os.path.exists(f"{out_dir}/runs.csv")
    results = open(f"{out_dir}/runs.csv", "a", newline="")
    writer = csv.DictWriter(results, fieldnames=race.FIELDS, extrasaction="ignore")
    if new:
        writer.writeheader()
    losses = open(f"{out_dir}/losses.txt", "a")

    class Flush:
        def writerow(self, row):
            writer.writerow(row)
            results.flush()

    names = os.environ.get("CRIGUARD_OOM_KUBELET", "kubelet-memcg,kubelet-tick").split(",")
    contenders = [(n, (lambda on: lambda: node.restart_kubelet(on))(n.startswith("kubelet-memcg")),
                   lambda: None) for n in names]
    try:
        race.race(node, contenders, rates, out_dir, Flush(), losses)
    finally:
        for p in node.steady:
            try:
                node.remove(p)
            except RuntimeError:
                pass
        results.close()
        losses.close()


if __name__ == "__main__":
    main()
