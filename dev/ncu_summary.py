#!/usr/bin/env python3
"""ncu_summary.py: the lines of one Nsight Compute report that say where a kernel's time goes.

  python3 dev/ncu_summary.py DETAILS.csv RAW.csv SASS.csv

The three CSVs are `ncu --import R.ncu-rep --csv` with `--page details`, `--page raw` and
`--page source --print-source sass` (`bash scripts/gpu.sh profile AREA` writes them). Prints:
the headline metrics (duration, clocks, issue activity, occupancy), every pipe's utilization
from the raw page (tensor, FMA, ALU, XU = special functions and conversions, LSU), the warp-stall
breakdown summed over all SASS lines, the same per code region (regions = runs of lines with the
same execution count: prologue, main loop, tails, producer), and the most-stalled SASS lines.
Any file that is missing or unreadable is skipped with a note.
"""
import collections
import csv
import re
import sys

HEADLINE = ("Duration", "SM Frequency", "Compute (SM) Throughput", "Issue Slots Busy", "Issued Ipc Active",
            "Registers Per Thread", "Achieved Occupancy", "Warp Cycles Per Issued Instruction",
            "L2 Hit Rate", "DRAM Throughput", "Eligible Warps Per Scheduler", "No Eligible")


def read_csv(path):
    try:
        with open(path, errors="replace") as f:
            return list(csv.reader(f))
    except OSError as e:
        print(f"   ({path}: {e})")
        return []


def headline(path):
    rows = read_csv(path)
    if not rows or "Metric Name" not in rows[0]:
        print("   (no details page)")
        return
    h = rows[0]
    i_n, i_u, i_v = h.index("Metric Name"), h.index("Metric Unit"), h.index("Metric Value")
    seen = set()
    for r in rows[1:]:
        if len(r) > i_v and r[i_n] in HEADLINE and r[i_n] not in seen:
            seen.add(r[i_n])
            print(f"   {r[i_n]:<44s} {r[i_v]:>14s} {r[i_u]}")


def pipes(path):
    """raw page: one header row of metric names, one of units, then one row per kernel launch"""
    rows = read_csv(path)
    if len(rows) < 3:
        print("   (no raw page)")
        return
    names, vals = rows[0], rows[2]
    want = re.compile(r"^sm__(inst_executed_pipe_\w+|pipe_\w+_cycles_active)\.avg\.pct_of_peak_sustained_active$")
    found = [(n, v) for n, v in zip(names, vals) if want.match(n)]
    found = [(n, float(v.replace(",", ""))) for n, v in found if re.match(r"^[\d.,]+$", v)]
    print("   pipe utilization (% of peak, active cycles; > 0.5 shown):")
    for n, v in sorted(found, key=lambda x: -x[1]):
        if v > 0.5:
            print(f"     {v:6.1f}%  {n.split('.')[0][4:]}")


def stalls(path, top=15):
    rows = read_csv(path)
    # row 0 names the kernel; the header is the first row that has "Source"
    hi = next((i for i, r in enumerate(rows[:5]) if "Source" in r), None)
    if hi is None:
        print("   (no per-line SASS page)")
        return
    h = rows[hi]
    body = [r for r in rows[hi + 1:] if len(r) == len(h)]
    i_s, i_t = h.index("Warp Stall Sampling (All Samples)"), h.index("Source")
    i_e = h.index("Instructions Executed")
    cols = [i for i, c in enumerate(h) if c.startswith("stall_") and "Not Issued" not in c]
    num = lambda x: float(x.replace(",", "") or 0)
    tot = sum(num(r[i_s]) for r in body) or 1.0

    def breakdown(rs):
        c = collections.Counter()
        for r in rs:
            for i in cols:
                c[h[i][6:]] += num(r[i])
        s = sum(c.values()) or 1.0
        return ", ".join(f"{k} {100 * v / s:.0f}%" for k, v in c.most_common(8) if v > 0)

    print(f"   warp-stall samples, whole kernel ({int(tot)}): {breakdown(body)}")
    print("   by region (a run of SASS lines executed equally often), regions with >= 2% of the samples:")
    start = 0
    for n in range(1, len(body) + 1):
        if n == len(body) or body[n][i_e] != body[start][i_e]:
            share = sum(num(r[i_s]) for r in body[start:n]) / tot
            if share >= 0.02:
                print(f"     lines {start:5d}-{n - 1:5d} ({n - start:4d} instr, executed {body[start][i_e]:>9s}x): "
                      f"{100 * share:5.1f}%  {breakdown(body[start:n])}")
            start = n
    print("   most-stalled SASS lines:")
    for n, r in sorted(enumerate(body), key=lambda x: -num(x[1][i_s]))[:top]:
        why = max(cols, key=lambda i: num(r[i]))
        print(f"     {100 * num(r[i_s]) / tot:5.1f}%  line {n:5d}  {h[why][6:]:<12s} {r[i_t].strip()[:70]}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    headline(sys.argv[1])
    pipes(sys.argv[2])
    stalls(sys.argv[3])
