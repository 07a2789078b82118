#!/usr/bin/env python3
"""compare_bench_summaries.py: one table per measure, a column per run, from the summary.txt
files of dev/bench/bench_attention_fp8.py (scripts/gpu_ab_refs.sh: one run per version of the code;
scripts/gpu_env_sweep.sh: one run per setting of the timing knobs). Reads the API table
("| T | ours f ..."), the bare-kernel table ("| T | quant fwd ms ...") and, when a run has it, the
FP8 forward's loops table.
    usage: python3 scripts/compare_bench_summaries.py LABEL=path/summary.txt [LABEL=... ...]
"""
import sys


def table(lines, head):
    """The rows of the markdown table whose header starts with head: [{column: cell}]."""
    for i, l in enumerate(lines):
        if l.startswith(head):
            cols = [c.strip() for c in l.strip().strip("|").split("|")]
            rows = []
            for r in lines[i + 2:]:
                if not r.startswith("|"):
                    break
                rows.append(dict(zip(cols, [c.strip() for c in r.strip().strip("|").split("|")])))
            return rows
    return []


def cell(rows, T, prefix):
    """The cell of row T in the first column whose name starts with prefix (its first word)."""
    for r in rows:
        if r["T"] == T:
            for k, v in r.items():
                if k.startswith(prefix):
                    return v.split(" ")[0]
    return "n/a"


def main(argv):
    if not argv or any("=" not in a for a in argv):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    runs = [a.split("=", 1) for a in argv]
    bare, api, loops = {}, {}, {}
    for label, path in runs:
        try:
            lines = open(path).read().splitlines()
        except OSError:
            print(f"compare_bench_summaries.py: {label}: no summary at {path} (see that run's log)")
            lines = []
        bare[label] = table(lines, "| T | quant fwd ms")
        api[label] = table(lines, "| T | ours f")
        i = next((i for i, l in enumerate(lines) if l.startswith("| T | default")), None)
        n = 0 if i is None else next((k for k, l in enumerate(lines[i:]) if not l.startswith("|")), len(lines) - i)
        loops[label] = [] if i is None else lines[i:i + n]
    measures = [(api, "ours f"), (api, "ours b"), (api, "dm f"), (bare, "FP8 fwd bare TFLOP/s"),
                (bare, "naive bwd bare"), (bare, "dm bwd bare"), (bare, "dm bwd API"),
                (bare, "delta kernel ms"), (api, "dm f / ours f"), (api, "dm f+b / ours f+b time")]
    labels = [l for l, _ in runs]
    Ts = [r["T"] for r in next((v for v in list(api.values()) + list(bare.values()) if v), [])]
    if not Ts:
        print("no bench summary to compare (see the bench logs)")
        return 0
    print("\nsame GPU, one call, the runs one after the other (TFLOP/s; delta kernel: ms; ratios: "
          "fp8_dm through the API against our BF16)")
    for src, m in measures:
        if all(cell(src[l], T, m) == "n/a" for l in labels for T in Ts):
            continue  # a measure no run has (e.g. the bare kernels of a bf16-only run)
        print(f"\n{m}\n| T | " + " | ".join(labels) + " |\n|---|" + "---|" * len(labels))
        for T in Ts:
            print(f"| {T} | " + " | ".join(cell(src[l], T, m) for l in labels) + " |")
    for l in labels:
        if loops[l]:
            print(f"\n{l}: the FP8 forward's block loops, bare TFLOP/s")
            print("\n".join(loops[l]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
