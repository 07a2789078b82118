#!/usr/bin/env python3
"""paper_scale_plan.py: tables and the costed reproduction plan from scripts/paper_scale.sh's
runs.tsv (one line per run: name, config, mode, gpus, zero1, exit, tok_s, mfu, plan_gib,
peak_mib, loss_first, loss_last, seconds).

Throughput table: tokens/s, MFU, per-GPU plan and peak memory, scaling efficiency
tok_s(n) / (n * tok_s(1)) per config, precision and ZeRO-1 setting. Plan: for each config and
precision, tokens = 20 per parameter, GPU-hours = tokens / (tokens/s per GPU) / 3600 with the
best measured per-GPU rate on the largest GPU count, and wall time on 8 and 64 GPUs. 64 GPUs
(8 nodes) are not measured: the plan assumes the 8-GPU per-GPU rate times the measured 1 -> 8
efficiency once more (inter-node links are slower than NVLink), and says so.

    python3 scripts/paper_scale_plan.py runs.tsv [more.tsv ...]   (several files: one table)
"""
import argparse  # command line
import csv  # the tab-separated runs files
import math  # nan for missing numbers
import sys  # exit with a message

PARAMS = {"paper_569m": 570407424, "paper_1p67b": 1673385984, "paper_5p29b": 5292174336}


def num(x):
    try:
        return float(x)
    except ValueError:
        return math.nan


COLUMNS = ("name", "config", "mode", "gpus", "zero1", "exit", "tok_s", "mfu", "plan_gib", "peak_mib",
           "loss_first", "loss_last", "seconds")


def read_runs(paths):
    """Every row of every runs.tsv; exits with a message naming the file on a bad one."""
    out = []
    for path in paths:
        try:
            with open(path, newline="") as f:
                reader = csv.DictReader(f, delimiter="\t")
                missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
                if missing:
                    sys.exit(f"paper_scale_plan.py: {path}: header lacks column(s) {', '.join(missing)} "
                             f"(expected paper_scale.sh's runs.tsv: {' '.join(COLUMNS)})")
                for n, r in enumerate(reader, 2):
                    if None in r or any(r[c] is None for c in COLUMNS):
                        sys.exit(f"paper_scale_plan.py: {path}:{n}: expected {len(COLUMNS)} tab-separated fields")
                    if not r["gpus"].isdigit() or int(r["gpus"]) < 1:
                        sys.exit(f"paper_scale_plan.py: {path}:{n}: gpus: expected a positive integer, got '{r['gpus']}'")
                    out.append(r)
        except OSError as e:
            sys.exit(f"paper_scale_plan.py: {path}: {e.strerror}")
    return out


def main(paths):
    runs = read_runs(paths)
    rows = [r for r in runs if "_long" not in r["name"]]
    longs = [r for r in runs if "_long" in r["name"]]
    print("| config | precision | GPUs | ZeRO-1 | tokens/s | MFU | plan GiB/GPU | peak MiB/GPU | scaling vs 1 GPU |")
    print("|---|---|---|---|---|---|---|---|---|")
    one = {}
    for r in rows:
        if r["gpus"] == "1" and r["exit"] == "0":
            one[(r["config"], r["mode"])] = num(r["tok_s"])
    best = {}
    for r in rows:
        key = (r["config"], r["mode"])
        g, tps = int(r["gpus"]), num(r["tok_s"])
        ok = r["exit"] == "0" and tps == tps
        eff = tps / (g * one[key]) if ok and key in one and one[key] > 0 else math.nan
        status = "" if ok else " (exit %s: did not run or did not fit)" % r["exit"]
        print("| %s | %s | %d | %s | %s | %s | %s | %s | %s%s |" % (
            r["config"], r["mode"], g, "on" if r["zero1"] == "true" else "off",
            "%.0f" % tps if ok else "-", "%.1f%%" % (100 * num(r["mfu"])) if ok else "-", r["plan_gib"],
            r["peak_mib"], "%.3f" % eff if eff == eff else "-", status))
        if ok and (key not in best or g > best[key][0] or (g == best[key][0] and tps > best[key][1])):
            best[key] = (g, tps, eff)
    if longs:
        print()
        print("| long run | GPUs | steps | tokens/s | first loss | last loss |")
        print("|---|---|---|---|---|---|")
        for r in longs:  # named CONFIG_MODE_<g>g_long<steps> by paper_scale.sh
            steps = r["name"].rsplit("_long", 1)[1] or "?"
            print("| %s | %s | %s | %s | %s | %s |" % (r["name"], r["gpus"], steps, r["tok_s"], r["loss_first"],
                                                       r["loss_last"]))
    print()
    print("Costed plan (20 tokens per parameter; per-GPU rate of the largest measured GPU count; 64 GPUs "
          "assume that rate times the measured efficiency once more):")
    print()
    print("| config | precision | tokens | measured on | tokens/s per GPU | GPU-hours | wall on 8 GPUs | wall on 64 GPUs |")
    print("|---|---|---|---|---|---|---|---|")
    for (cfg, mode), (g, tps, eff) in sorted(best.items()):
        tokens = 20 * PARAMS.get(cfg, math.nan)
        per_gpu = tps / g
        gpu_h = tokens / per_gpu / 3600
        e64 = eff if eff == eff else 1.0
        wall8 = tokens / (per_gpu * 8) / 3600
        wall64 = tokens / (per_gpu * e64 * 64) / 3600
        print("| %s | %s | %.2e | %d GPU%s | %.0f | %.0f | %.1f h | %.1f h |" % (
            cfg, mode, tokens, g, "s" if g > 1 else "", per_gpu, gpu_h, wall8, wall64))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="tables and the costed plan from paper_scale.sh's runs.tsv")
    ap.add_argument("runs", nargs="*", default=["runs.tsv"], help="runs.tsv file(s) (default: runs.tsv)")
    main(ap.parse_args().runs)
