#!/usr/bin/python3
"""The swap scenario of hack/bench-oom.sh vm (CRIGUARD_OOM_SCENARIO=swap):
the guest's raw records (hack/bench-oom/vm-guest.sh) into runs-swap.csv,
table.md and swap-freed.png.

Per run, from the samples (every CRIGUARD_OOM_SAMPLE_US, CLOCK_MONOTONIC):
- crossing: the first sample after the grower's go where SwapFree is below
  the line (swap_line_mib of meta.txt);
- act: the contender's first action on CLOCK_MONOTONIC: criguard's kill
  (its JSON log), earlyoom's and systemd-oomd's kill (their journal), or,
  for the kernel and limitedswap, the first rise of kubepods' oom_kill;
- freed: the first sample after the act where the grower's swap
  (memory.swap.current) is under a tenth of its peak, or its cgroup gone;
- stalled: PSI's full and some totals over the run (µs, read before and
  after), the time some or all tasks waited on memory;
- lowest swap free; kernel OOM kills (kubepods' oom_kill); collateral
  (steady pods dead); right victim: the first action's victim is the
  grower, the one pod over its swap entitlement (criguard's swap ranking
  and the kubelet's LimitedSwap agree: the steady pods have none).
A win: the contender acted and the kernel killed nothing.

Usage: swap.py RESULTS_DIR
"""

import csv
import glob
import os
import sys

import report
import vm

MI = 1 << 20
FIELDS = ["contender", "rate", "run", "actor", "right", "crossing_to_act_ms",
          "crossing_to_freed_ms", "kernel_kills", "collateral", "lowest_swap_free_mib",
          "stalled_full_ms", "stalled_some_ms", "grower_survived"]


def samples(path):
    """The realtime - monotonic offset and the rows (ints) of a samples file."""
    offset, rows = 0, []
    for line in open(path):
        if line.startswith("#"):
            offset = int(line.split()[-1])
            continue
        r = line.split()
        if len(r) >= 6:
            rows.append([float(x) for x in r])
    return offset, rows


def first_action(c, logs, rec, offset, go_mono, end_mono, oom_rise):
    """(monotonic ns, victim key) of the contender's first action, or None;
    the time is None for a kernel kill before the samples began
    (limitedswap: at the grower's limit, during its prefill)."""
    if c in ("kernel", "limitedswap"):
        if oom_rise is not None:
            return oom_rise, "grower"
        before, after = (int(x) for x in rec["pods_oom_kills"].split())
        return (None, "grower") if after > before and rec["survived"] == "0" else None
    acts, _ = logs.get(c, ([], []))
    for t, key in acts:
        if t is not None and go_mono - 1e9 <= t - offset <= end_mono:
            return t - offset, key
    return None


def analyse(c, rec, path, logs, line_kb):
    offset, rows = samples(path)
    if not rows:
        return None
    go_mono = int(rec["go_realtime_ns"]) - offset
    end_mono = rows[-1][0]
    # Columns: t, SwapFree kB, PSI full avg10, grower current, grower swap,
    # the steady pods' currents, kubepods oom_kill, PSI some avg10.
    oom = [r[-2] for r in rows]
    oom_rise = next((r[0] for r, k in zip(rows, oom) if oom[0] >= 0 and k > oom[0]), None)
    crossing = next((r[0] for r in rows if r[0] >= go_mono and 0 <= r[1] < line_kb), None)
    act = first_action(c, logs, rec, offset, go_mono, end_mono, oom_rise)
    grower = rec["grower"].split(":")
    kernel_kills = int(rec["pods_oom_kills"].split()[1]) - int(rec["pods_oom_kills"].split()[0])
    actor = "none"
    if act is not None and (c in ("kernel", "limitedswap") or oom_rise is None
                            or act[0] <= oom_rise):
        actor = c
    elif oom_rise is not None:
        actor = "kernel"
    right = False
    if act is not None:
        key = str(act[1])
        right = key in ("grower", grower[1], grower[2]) or f"pod{grower[1]}" in key
    peak = max((r[4] for r in rows), default=0)
    freed = None
    at = act[0] if act is not None and act[0] is not None else oom_rise
    if at is not None:
        freed = next((r[0] for r in rows if r[0] >= at and (r[4] < 0 or r[4] < peak / 10)), None)
    psi = [int(x) for x in rec.get("psi_totals_us", "0 0 0 0").split()]
    dead = [s for s in rec["steady"].split() if s.endswith(":0")]
    ms = lambda a, b: None if a is None or b is None else (b - a) / 1e6  # noqa: E731
    return {
        "contender": c, "rate": int(rec["rate"]), "run": int(rec["run"]), "actor": actor,
        "right": right, "crossing_to_act_ms": ms(crossing, act[0] if act else None),
        "crossing_to_freed_ms": ms(crossing, freed), "kernel_kills": kernel_kills,
        "collateral": len(dead),
        "lowest_swap_free_mib": min((r[1] for r in rows if r[1] >= 0), default=-1024) / 1024,
        "stalled_full_ms": (psi[2] - psi[0]) / 1e3 if len(psi) == 4 else None,
        "stalled_some_ms": (psi[3] - psi[1]) / 1e3 if len(psi) == 4 else None,
        "grower_survived": rec["survived"] == "1",
    }


def table(rows, meta):
    physical = int(meta["physical_mib_s"])
    lines = [
        "| rate MiB/s | contender | runs | wins | right victim | crossing → act p50 / p99 ms "
        "| crossing → freed p50 / p99 ms | kernel OOM kills | collateral | lowest swap free MiB "
        "| stalled (PSI full) p50 ms | stalled (PSI some) p50 ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rate in dict.fromkeys(r["rate"] for r in rows):
        for c in dict.fromkeys(r["contender"] for r in rows):
            rs = [r for r in rows if r["rate"] == rate and r["contender"] == c]
            if not rs:
                continue
            wins = sum(1 for r in rs if r["actor"] == c and r["kernel_kills"] == 0
                       and c not in ("kernel", "limitedswap"))
            pair = lambda k: " / ".join(report.fmt(report.pct([r[k] for r in rs if r[k] is not None], p))  # noqa: E731
                                        for p in (0.5, 0.99))
            p50 = lambda k: report.fmt(report.pct([r[k] for r in rs if r[k] is not None], 0.5))  # noqa: E731
            win = "—" if c in ("kernel", "limitedswap") else f"{wins}/{len(rs)}"
            lines.append(
                f"| {report.rate_name(rate, physical)} | {c} | {len(rs)} | {win} "
                f"| {sum(r['right'] for r in rs)}/{len(rs)} | {pair('crossing_to_act_ms')} "
                f"| {pair('crossing_to_freed_ms')} | {sum(r['kernel_kills'] for r in rs)} "
                f"| {sum(r['collateral'] for r in rs)} "
                f"| {report.fmt(min(r['lowest_swap_free_mib'] for r in rs))} "
                f"| {p50('stalled_full_ms')} | {p50('stalled_some_ms')} |")
    return "\n".join(lines)


def plot(rows, meta, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    physical = int(meta["physical_mib_s"])
    fig, ax = plt.subplots(figsize=(7, 4))
    for c in dict.fromkeys(r["contender"] for r in rows):
        pts = sorted((r["rate"] or physical, r["crossing_to_freed_ms"]) for r in rows
                     if r["contender"] == c and r["crossing_to_freed_ms"] is not None)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", label=c, alpha=0.7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("growth into swap, MiB/s")
    ax.set_ylabel("swap line crossed → grower's swap freed, ms")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    out = sys.argv[1]
    meta = vm.kv(f"{out}/meta.txt")
    line_kb = int(meta["swap_line_mib"]) * 1024
    logs = {}
    for c in meta["contenders"].split(","):
        if c.startswith("criguard-"):
            logs[c] = vm.criguard_actions(f"{out}/{c}.log")
    logs["systemd-oomd"] = vm.journal_actions(f"{out}/systemd-oomd.log", r"Killed (\S+) due to")
    logs["earlyoom"] = vm.journal_actions(f"{out}/earlyoom.log", r"sending SIG\w+ to process (\d+)")
    order = {c: i for i, c in enumerate(meta["contenders"].split(","))}
    recs = [vm.kv(p) for p in glob.glob(f"{out}/runs/*.txt")]
    recs.sort(key=lambda r: (int(r["rate"]) or 1 << 30, order.get(r["contender"], 99), int(r["run"])))
    rows = []
    for rec in recs:
        tag = f"{rec['contender']}-{rec['rate']}-{rec['run']}"
        path = f"{out}/samples/{tag}.samples"
        if os.path.exists(path):
            r = analyse(rec["contender"], rec, path, logs, line_kb)
            if r:
                rows.append(r)
    with open(f"{out}/runs-swap.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    head = (f"{meta['date']}, vm tier, swap scenario: kernel {meta['kernel']}, {meta['nproc']} cores, "
            f"{int(meta['capacity_bytes']) // MI} MiB, swap {meta['swap_mib']} MiB, line "
            f"{meta['swap_line_mib']} MiB free, stall line {meta['stall_pct']} %, samples every "
            f"{int(meta['sample_us']) // 1000} ms; physical limit (into swap) {meta['physical_mib_s']} MiB/s")
    text = head + "\n\n" + table(rows, meta) + "\n"
    open(f"{out}/table.md", "w").write(text)
    print(text)
    plot(rows, meta, f"{out}/swap-freed.png")


if __name__ == "__main__":
    main()
