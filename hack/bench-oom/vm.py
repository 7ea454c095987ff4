#!/usr/bin/python3
"""The race against the OOM killer, VM tier: the host's half. The guest
(hack/bench-oom/vm-guest.sh, bash only) wrote per run a record, the samples,
the kernel log and the contenders' logs to OUT; this turns them into the
tiers' common runs.csv, meta.json and losses.txt (race.analyse does the
analysis, as for the host tier), then report.py makes the table and plots.

Clocks: the samples are on the guest's CLOCK_MONOTONIC, with the guest's
realtime - monotonic in their header; criguard's and the journal's stamps
are realtime; the kernel log's stamps are put on realtime through the mark
the guest writes to /dev/kmsg at the start of each run.

earlyoom acts on MemAvailable, not on memory.available: its runs are
judged from its own line (the first sample with MemAvailable below its -M),
each other contender's from the kubelet's.

Usage: vm.py OUT   (then: report.py OUT)
"""

import calendar
import csv
import glob
import json
import os
import re
import sys
import time

import race

MI = 1 << 20


class Pod:
    """What race.analyse needs of a pod: its name, uid and pod name."""

    def __init__(self, name, uid, pid):
        self.name, self.uid, self.pod_name, self.pid = name, uid, name, pid
        self.request = next((s[2] for s in race.STEADY if s[0] == name), 0)


def kv(path):
    out = {}
    for line in open(path):
        k, _, v = line.rstrip("\n").partition("=")
        out[k] = v
    return out


def kmsg_records(path):
    """(stamp ns since boot, text) of each /dev/kmsg record."""
    recs = []
    for line in open(path, errors="replace"):
        head, sep, text = line.partition(";")
        if not sep:
            continue
        try:
            recs.append((int(head.split(",")[2]) * 1000, text.rstrip("\n")))
        except (IndexError, ValueError):
            pass
    return recs


def rfc3339_ns(stamp):
    try:
        date, frac = stamp.rstrip("Z").split(".")
        base = calendar.timegm(time.strptime(date, "%Y-%m-%dT%H:%M:%S"))
        return int(base * 1e9 + int(frac.ljust(9, "0")[:9]))
    except ValueError:
        return None


def criguard_actions(path):
    """(realtime ns, pod uid) per eviction in criguard's JSON log
    (race.criguard_acts), and all its lines."""
    records, lines = [], []
    if not os.path.exists(path):
        return [], lines
    for l in open(path, errors="replace"):
        l = l.rstrip("\n")
        try:
            j = json.loads(l)
        except ValueError:
            continue
        stamp = rfc3339_ns(j.get("timestamp", ""))
        lines.append((stamp, l))
        fields = j.get("fields", {})
        records.append((stamp, fields.get("message", ""), fields.get("uid", "")))
    return race.criguard_acts(records), lines


def journal_actions(path, pattern):
    """(realtime ns, what it killed) per match of `pattern` in a
    `journalctl -o short-unix` file, and all its lines."""
    out, lines = [], []
    if not os.path.exists(path):
        return out, lines
    for l in open(path, errors="replace"):
        l = l.rstrip("\n")
        try:
            stamp = int(float(l.split(" ", 1)[0]) * 1e9)
        except ValueError:
            continue
        lines.append((stamp, l))
        m = re.search(pattern, l)
        if m:
            out.append([stamp, m.group(1)])
    return out, lines


def samples_with_node_usage(src, dst):
    """The samples as race.analyse reads them: column 1 the root cgroup's
    usage (anon + file), without the last three columns (kubepods'
    oom_kill, file, MemAvailable). Returns the guest's realtime - monotonic
    (ns), the CLOCK_MONOTONIC stamps at which kubepods' oom_kill rose, one
    per kill, and (stamp, MemAvailable kB) per sample."""
    offset, rises, last, memavail = 0, [], None, []
    with open(src) as f, open(dst, "w") as o:
        for line in f:
            if line.startswith("#"):
                offset = int(line.split()[-1])
                continue
            r = line.split()
            if len(r) < 5:
                continue
            r[1] = str(int(r[1]) + int(r[-2]))
            kills = int(r[-3])
            if last is not None and kills > last:
                rises += [int(r[0])] * (kills - last)
            if kills >= 0:
                last = kills
            memavail.append((int(r[0]), int(r[-1])))
            o.write(" ".join(r[:-3]) + "\n")
    return offset, rises, memavail


def main():
    out = sys.argv[1]
    meta = kv(f"{out}/meta.txt")
    cap = int(meta["capacity_bytes"])
    # race.analyse's threshold: the guest's.
    race.THRESHOLD = int(meta["threshold_mib"])
    kmsg = kmsg_records(f"{out}/kmsg.txt")
    logs = {}
    for c in meta["contenders"].split(","):
        if c.startswith("criguard-"):
            logs[c] = criguard_actions(f"{out}/{c}.log")
    logs["systemd-oomd"] = journal_actions(f"{out}/systemd-oomd.log", r"Killed (\S+) due to")
    logs["earlyoom"] = journal_actions(f"{out}/earlyoom.log", r"sending SIG\w+ to process (\d+)")
    rows = []
    losses = open(f"{out}/losses.txt", "w")
    order = {c: i for i, c in enumerate(meta["contenders"].split(","))}
    recs = [kv(p) for p in glob.glob(f"{out}/runs/*.txt")]
    recs.sort(key=lambda r: (order.get(r["contender"], 99), int(r["rate"]) or 1 << 30, int(r["run"])))
    for rec in recs:
        c, rate, run = rec["contender"], int(rec["rate"]), int(rec["run"])
        tag = f"{c}-{rate}-{run}"
        src = f"{out}/samples/{tag}.samples"
        if not os.path.exists(src):
            continue
        tmp = f"{out}/samples/{tag}.node"
        offset, rises, memavail = samples_with_node_usage(src, tmp)  # realtime - monotonic
        name, uid, pid = rec["grower"].split(":")
        grower = Pod(name, uid, int(pid))
        steady, dead = [], []
        for s in rec["steady"].split():
            n, u, p, a = s.split(":")
            pod = Pod(n, u, int(p))
            steady.append(pod)
            if a == "0":
                dead.append(pod)
        by_pid = {p.pid: p.uid for p in steady + [grower]}
        go_mono = int(rec["go_realtime_ns"]) - offset
        with open(tmp) as f:
            last = [l for l in f if l.strip()][-1]
        end_mono = int(last.split()[0])
        # The kernel log: the run's mark gives realtime - kmsg stamp.
        mark_text = "criguard-oombench mark " + rec["mark"]
        mark_rt = int(rec["mark"].split()[-1])
        # The run's kernel records: those between its mark and the next run's
        # (the kernel log's stamps drift from CLOCK_MONOTONIC under TCG, so
        # they only place a record that no sample places).
        at = next((i for i, (_, text) in enumerate(kmsg) if text == mark_text), None)
        kills, klines = [], []
        if at is not None:
            kmark = kmsg[at][0]
            for t, text in kmsg[at:]:
                if text.startswith("criguard-oombench mark") and text != mark_text:
                    break
                mono = t + (mark_rt - kmark) - offset
                if "oom" in text.lower() or "killed" in text.lower():
                    klines.append(f"[kernel {t / 1e9:.3f}] {text}")
                if text.startswith("oom-kill:"):
                    memcg = next((x[len("task_memcg="):] for x in text.split(",")
                                  if x.startswith("task_memcg=")), "?")
                    # A pod's kill: when kubepods' oom_kill rose (sampled).
                    if memcg.startswith("/kubepods.slice") and rises:
                        mono = rises.pop(0)
                    kills.append((mono, memcg))
        before, after = (int(x) for x in rec["pods_oom_kills"].split())
        acts, lines = logs.get(c, ([], []))
        evictions = []
        for t, key in acts:
            if t is None:
                continue
            mono = t - offset
            if go_mono - 1e9 <= mono <= end_mono:
                if c == "earlyoom":
                    key = by_pid.get(int(key), f"pid {key}")
                evictions.append((mono, key))
        with open(tmp) as f:
            first = f.readline().split()
        if int(first[4]) < int(rec.get("prefill_mib", 0)) * MI // 2:
            # The grower was gone before the race began (a contender killed
            # it during its full-speed prefill): not a run of the race.
            losses.write(f"== {c} rate={rate or 'max'} run={run}: void, the grower was killed "
                         f"during its prefill, before the race ({first[4]} bytes at the start)\n")
            os.unlink(tmp)
            continue
        # earlyoom is judged from its own line: MemAvailable below its -M.
        own = None
        if c == "earlyoom" and "earlyoom_M_kib" in meta:
            line_kb = int(meta["earlyoom_M_kib"].split()[0])
            own = next((t for t, kb in memavail if t >= go_mono and 0 <= kb < line_kb), None)
        res = race.analyse(tmp, steady, grower, kills, after - before, evictions, dead, cap,
                           since=go_mono - 1_000_000_000, own_crossing=own)
        if res["actor"] == "none" and evictions:
            # Acted before the kubelet's memory.available crossed (earlyoom
            # reads MemAvailable, another figure): the right victim is the
            # kubelet's first at the lowest memory.available of the run.
            key = evictions[0][1]
            rows_ = [[int(x) for x in l.split()] for l in open(tmp) if l.strip()]
            low = min(rows_, key=lambda r: cap - (r[1] - max(r[2], 0)))
            usage = {p.name: low[5 + i] for i, p in enumerate(steady)}
            usage["grower"] = low[4]
            victim = next((p.name for p in steady + [grower] if p.uid == key or f"pod{p.uid}" in key), key)
            first_ = race.kubelet_first(steady + [grower], usage)
            res.update(actor="contender", victim=victim, first=first_, right=victim == first_)
        os.unlink(tmp)
        if res["actor"] == "contender":
            res["actor"] = c
        res.update(tier="vm", contender=c, rate=rate, run=run,
                   grower_survived=rec["survived"] == "1", load1=rec["load1"])
        rows.append(res)
        won = res["actor"] == c and res["kernel_kills"] == 0
        if c != "kernel" and not won:
            losses.write(f"== {c} rate={rate or 'max'} run={run}: "
                         + json.dumps({k: res.get(k) for k in race.FIELDS}) + "\n")
            window = [l for t, l in lines if t is not None and go_mono - 2e9 <= t - offset <= end_mono + 1e9]
            losses.writelines(f"  {l}\n" for l in window[-25:])
            losses.writelines(f"  {l}\n" for l in klines[-12:])
    losses.close()
    with open(f"{out}/runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=race.FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    rates = [int(x) for x in meta["rates"].split()]
    json.dump({"tier": "vm", "physical_mib_s": int(meta["physical_mib_s"]),
               "limit_mib": cap // MI, "threshold_mib": int(meta["threshold_mib"]),
               "housekeeping": "10s", "runs": int(meta["runs"]), "rates": rates,
               "uptime": "", "kernel": meta["kernel"], "nproc": int(meta["nproc"]),
               "systemd": meta["systemd"], "sample_us": int(meta["sample_us"]),
               "idle_available_mib": int(meta["idle_available_mib"]),
               "date": meta["date"]}, open(f"{out}/meta.json", "w"))


if __name__ == "__main__":
    main()
