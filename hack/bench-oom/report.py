#!/usr/bin/python3
"""Tables and plots of hack/bench-oom.sh's runs.

Usage: report.py RESULTS_DIR   (reads runs.csv and meta.json; writes
table.md, oom-freed.png and oom-lowest.png there and prints the table)

Per rate x contender: win rate (the contender acted first and the kernel
killed nothing), right-victim rate (the first action's victim is the pod the
kubelet's ranking put first at the crossing), p50/p99 crossing -> action and
crossing -> victim's memory freed (nearest rank; of 5 runs p99 is the
slowest), kernel OOM kills, collateral (other pods killed or evicted),
lowest allocatable memory available.
"""

import csv
import json
import math
import os
import sys


def pct(xs, p):
    s = sorted(xs)
    if not s:
        return None
    return s[max(min(math.ceil(p * len(s)), len(s)), 1) - 1]


def fmt(x):
    return "—" if x is None else (f"{x:.0f}" if x >= 10 else f"{x:.1f}")


def rate_name(r, physical):
    return f"max (≈{physical})" if r == 0 else str(r)


def main():
    out = sys.argv[1]
    meta = json.load(open(f"{out}/meta.json"))
    physical = meta["physical_mib_s"]
    rows = list(csv.DictReader(open(f"{out}/runs.csv")))
    contenders = list(dict.fromkeys(r["contender"] for r in rows))
    vm = meta.get("tier") == "vm"
    rates = list(dict.fromkeys(int(r["rate"]) for r in rows))
    lines = [
        f"| rate MiB/s | contender | runs | wins | right victim | crossing → act p50 / p99 ms "
        f"| crossing → freed p50 / p99 ms | kernel OOM kills | collateral | lowest available MiB |"
        + (" PSI full avg10 peak % |" if vm else ""),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if vm else ""),
    ]
    series = {}
    for rate in rates:
        for c in contenders:
            rs = [r for r in rows if int(r["rate"]) == rate and r["contender"] == c]
            if not rs:
                continue
            n = len(rs)
            wins = sum(1 for r in rs if r["actor"] in (c, c.split("-")[0]) and c != "kernel"
                       and int(r["kernel_kills"]) == 0)
            right = sum(1 for r in rs if r["right"] == "True")
            act = [float(r["act_ms"]) for r in rs if r["act_ms"]]
            freed = [float(r["freed_ms"]) for r in rs if r["freed_ms"]]
            kills = sum(int(r["kernel_kills"]) for r in rs)
            coll = sum(int(r["collateral"]) for r in rs)
            low = [float(r["lowest_avail_mib"]) for r in rs]
            win = "—" if c == "kernel" else f"{wins}/{n}"
            # Acted before memory.available crossed (earlyoom reads another
            # figure): no crossing → act or → freed for these runs.
            pre = sum(1 for r in rs if r["crossed"] == "False" and r["actor"] not in ("none", "kernel"))
            if pre and c != "kernel":
                win += f" ({pre} before the crossing)"
            lines.append(
                f"| {rate_name(rate, physical)} | {c} | {n} | {win} | {right}/{n} "
                f"| {fmt(pct(act, .5))} / {fmt(pct(act, .99))} "
                f"| {fmt(pct(freed, .5))} / {fmt(pct(freed, .99))} | {kills} | {coll} "
                f"| {fmt(min(low))} |"
                + (f" {fmt(max(float(r['psi_full_peak']) for r in rs))} |" if vm else ""))
            series.setdefault(c, []).append((rate or physical, pct(freed, .5), pct(freed, .99),
                                             min(low), sum(low) / n))
    if meta.get("tier") == "vm":
        node = (f"the VM's memory {meta['limit_mib']} MiB (MemTotal), "
                f"memory.available<{meta['threshold_mib']}Mi, systemd {meta.get('systemd', '?')}, "
                f"samples every {meta.get('sample_us', 0) / 1000:g} ms")
    else:
        node = (f"kubepods limit {meta['limit_mib']} MiB, "
                f"allocatableMemory.available<{meta['threshold_mib']}Mi")
    head = (f"{meta['date']}, {meta.get('tier', 'host')} tier, kernel {meta['kernel']}, "
            f"{meta['nproc']} cores; {node}, "
            f"housekeeping {meta['housekeeping']}; physical limit {physical} MiB/s; "
            f"{open(f'{out}/load.txt').read().strip() if os.path.exists(f'{out}/load.txt') else meta['uptime']}")
    table = head + "\n\n" + "\n".join(lines) + "\n"
    open(f"{out}/table.md", "w").write(table)
    print(table)
    plot(out, series, meta)


def plot(out, series, meta):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tier = meta.get("tier", "host")
    fig, ax = plt.subplots(figsize=(6.4, 4), dpi=90)
    for c, pts in series.items():
        xs = [p[0] for p in pts if p[1] is not None]
        ax.plot(xs, [p[1] for p in pts if p[1] is not None], marker="o", label=f"{c} p50")
        ax.plot(xs, [p[2] for p in pts if p[1] is not None], linestyle=":",
                color=ax.lines[-1].get_color(), label=f"{c} p99")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("growth rate, MiB/s (last point: the physical limit)")
    ax.set_ylabel("threshold crossing → victim's memory freed, ms")
    ax.set_title(f"OOM race, {tier} tier: crossing → freed")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(f"{out}/oom-freed.png")
    fig, ax = plt.subplots(figsize=(6.4, 4), dpi=90)
    for c, pts in series.items():
        ax.plot([p[0] for p in pts], [p[3] for p in pts], marker="o", label=c)
    ax.axhline(meta["threshold_mib"], color="grey", linestyle="--", label="threshold")
    ax.set_xscale("log")
    ax.set_xlabel("growth rate, MiB/s (last point: the physical limit)")
    ax.set_ylabel("lowest memory available, MiB" if tier == "vm"
                  else "lowest allocatable memory available, MiB")
    ax.set_title(f"OOM race, {tier} tier: lowest available (min of runs)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(f"{out}/oom-lowest.png")


if __name__ == "__main__":
    main()
