#!/usr/bin/env python3
"""plot_runs.py: loss curves of a few runs' metrics.jsonl files in one PNG.
Left: each run's train loss, smoothed (moving mean over --window steps), and its validation
losses as dots; middle: each run's smoothed train loss minus the first run's (the baseline), the
view in which a precision's effect shows; right (when the runs logged it): each run's last
validation loss per position bucket (where in the context the token is predicted), one line per
run, so modes can be told apart by position. The runs must log the same steps.
usage:
    scripts/plot_runs.py --out docs/img/paper_569m_300steps.png --title "paper_569m, 2 x H200" \\
        bf16=docs/data/paper_569m_2xh200_300steps_bf16.metrics.jsonl \\
        fp8=docs/data/paper_569m_2xh200_300steps_fp8.metrics.jsonl
Reads with compare_modes.py's reader (standard library); matplotlib draws (Debian: apt-get
install python3-matplotlib).
"""
import argparse  # command line
import os  # this script's folder, to import compare_modes beside it
import sys  # exit with a message

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_modes import read_metrics  # the mode comparison's reader  # noqa: E402
from compare_stats import moving_average  # its smoothing  # noqa: E402


def read_run(path):
    """(train {step: loss}, val {step: val_loss}, last val_pos or None) of one metrics.jsonl."""
    try:
        train, val, _, _ = read_metrics(path)
    except OSError as e:
        sys.exit(f"plot_runs.py: {path}: {e.strerror}")
    if not train:
        sys.exit(f"plot_runs.py: {path}: no line with a train loss")
    pos = next((v["val_pos"] for _, v in reversed(val) if v.get("val_pos")), None)
    return {t["step"]: t["loss"] for t in train}, {s: v["val_loss"] for s, v in val}, pos


def main():
    ap = argparse.ArgumentParser(description="loss curves of runs' metrics.jsonl in one PNG")
    ap.add_argument("runs", nargs="+", metavar="LABEL=METRICS_JSONL", help="the first is the baseline")
    ap.add_argument("--out", required=True, help="PNG to write")
    ap.add_argument("--title", default="", help="figure title")
    ap.add_argument("--window", type=int, default=20, help="smoothing window in steps (default 20)")
    a = ap.parse_args()
    runs = []
    for spec in a.runs:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            sys.exit(f"plot_runs.py: '{spec}': expected LABEL=METRICS_JSONL")
        runs.append((label, *read_run(path)))
    base_steps = sorted(runs[0][1])
    for label, train, _, _ in runs[1:]:
        if sorted(train) != base_steps:
            sys.exit(f"plot_runs.py: run '{label}' logs other steps than '{runs[0][0]}'")
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_runs.py: matplotlib is not installed (Debian: apt-get install python3-matplotlib)")
    with_pos = any(pos for _, _, _, pos in runs)
    fig, axes = plt.subplots(1, 3 if with_pos else 2, figsize=(16 if with_pos else 11, 4))
    ax_loss, ax_diff = axes[0], axes[1]
    steps = base_steps
    base = moving_average([runs[0][1][s] for s in steps], a.window)
    for label, train, val, pos in runs:
        sm = moving_average([train[s] for s in steps], a.window)
        line, = ax_loss.plot(steps, sm, label=f"{label} train (mean of {a.window})")
        if val:
            vs = sorted(val)
            ax_loss.plot(vs, [val[s] for s in vs], "o", color=line.get_color(), label=f"{label} val")
        ax_diff.plot(steps, [x - b for x, b in zip(sm, base)], color=line.get_color(), label=label)
        if with_pos and pos:
            mids = [(s + e) / 2 for s, e in zip(pos["start"], pos["end"])]
            axes[2].plot(mids, pos["mean"], marker="o", color=line.get_color(), label=label)
    ax_loss.set_xlabel("step"); ax_loss.set_ylabel("loss"); ax_loss.set_yscale("log"); ax_loss.legend()
    ax_diff.axhline(0, color="gray", lw=0.5)
    ax_diff.set_xlabel("step"); ax_diff.set_ylabel(f"smoothed train loss - {runs[0][0]}'s"); ax_diff.legend()
    if with_pos:
        axes[2].set_xscale("log", base=2)
        axes[2].set_xlabel("position in the context (bucket middle)")
        axes[2].set_ylabel("last validation loss")
        axes[2].legend()
    if a.title:
        fig.suptitle(a.title)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
