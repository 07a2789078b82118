#!/usr/bin/env python3
"""compare_modes.py: train one config once per attention precision and compare the runs.

The Delta-Matching comparison (README.md, docs/fp8-attention.md) is BF16 attention against
fp8_naive, fp8_hybrid and fp8_dm on the same model, data and seed. This script runs
`train_gpt` once per mode with everything else identical (the mode differs only in
`precision.attention`; each run writes its own run directory OUT/MODE), then reads every
OUT/MODE/metrics.jsonl and writes

    OUT/summary.md   one row per mode: final train loss (mean of the last 10% of steps), last
                     validation loss, both as a difference to bf16, tokens/s; and, when the
                     runs had diagnostics on (docs/diagnostics.md), the last gradient-bias ratio
                     and the row-sum cancellation residual per mode
    OUT/curves.png   smoothed train loss, validation loss and the smoothed train loss minus
                     bf16's against the step, one line per mode (needs matplotlib)

usage:
    scripts/compare_modes.py --config configs/tiny.json --set diagnostics.interval=100
    scripts/compare_modes.py --config configs/paper_569m.json --out runs/cmp_569m \\
        --launcher "scripts/launch_mpirun_node.sh 8"
    scripts/compare_modes.py --config configs/tiny.json --plot-only     # re-read, re-plot

Existing run directories are never overwritten: a complete run (its metrics reach
train.steps) is skipped, an incomplete one (stopped, preempted) is continued with
`train_gpt --resume`. Each run's output goes to OUT/MODE.log (appended on resume).

--launcher prefixes the command. The project's launch scripts (scripts/launch_*.sh) start
./train_gpt themselves and take the config in its place (`launch_mpirun_node.sh NGPUS CONFIG
[options]`), so for them the binary is left out; any other launcher (`mpirun -np 8`, `srun`,
`env OMP_NUM_THREADS=8`) is put in front of the binary.

Only the standard library is needed to run and summarize; matplotlib only for the plot
(--no-plot skips it).
"""

import argparse  # command line
import json  # metrics.jsonl and the resolved config.json
import math  # isfinite, sqrt
import os  # paths
import shlex  # splitting --launcher like a shell would
import statistics  # median tokens/s
import subprocess  # running train_gpt
import sys  # exit codes, stderr
import time  # run wall time, the summary's date

KNOWN_MODES = ("bf16", "fp8_naive", "fp8_hybrid", "fp8_dm", "fp8_dm_approx", "fp32")
DEFAULT_MODES = "bf16,fp8_naive,fp8_hybrid,fp8_dm"
BASELINE_MODE = "bf16"


class UserError(Exception):
    """A problem with the user's input or a run: printed as one message, exit status 1."""


# ---------------------------------------------------------------------------------------------
# command line


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Train one config once per attention precision (same seed and data) and "
        "compare losses, throughput and attention diagnostics.",
        epilog="Example: scripts/compare_modes.py --config configs/tiny.json "
        "--set diagnostics.interval=100 --out runs/compare_tiny",
    )
    p.add_argument("--config", required=True, help="JSON run configuration, e.g. configs/tiny.json")
    p.add_argument("--modes", default=DEFAULT_MODES,
                   help="comma-separated precision.attention values (default %(default)s); "
                   "known: " + ", ".join(KNOWN_MODES))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                   help="config override passed to every run (repeatable), e.g. train.steps=600")
    p.add_argument("--out", help="comparison directory; runs go to OUT/MODE "
                   "(default runs/compare_<config name>)")
    p.add_argument("--binary", default="./train_gpt", help="train_gpt binary (default %(default)s)")
    p.add_argument("--launcher", default="",
                   help='command prefix, e.g. "scripts/launch_mpirun_node.sh 8" or "mpirun -np 8"')
    p.add_argument("--plot-only", action="store_true",
                   help="run nothing: summarize and plot the runs already in OUT")
    p.add_argument("--no-plot", action="store_true", help="write summary.md only (no matplotlib)")
    p.add_argument("--extra", action="append", default=[], metavar="LABEL=DIR",
                   help="also summarize and plot the run in DIR as LABEL without running it, e.g. "
                   "bf16_seed7=runs/seed7/bf16: a rerun with another seed shows the noise level "
                   "(repeatable; excluded from the same-config check)")
    p.add_argument("--smooth", type=int, default=0,
                   help="train-loss moving-average window in steps (default: steps/30, at least 1)")
    a = p.parse_args(argv)

    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not modes:
        raise UserError("--modes: expected a comma-separated list of attention modes, got '%s'" % a.modes)
    for m in modes:
        if m not in KNOWN_MODES:
            raise UserError("--modes: unknown attention mode '%s' (expected one of: %s)"
                            % (m, ", ".join(KNOWN_MODES)))
    if len(set(modes)) != len(modes):
        raise UserError("--modes: '%s' names a mode twice" % a.modes)
    a.modes = modes
    for s in a.sets:
        key = s.split("=", 1)[0]
        if "=" not in s or "." not in key:
            raise UserError("--set '%s': expected section.key=value, e.g. train.steps=600" % s)
        if key in ("precision.attention", "log.dir"):
            raise UserError("--set %s: this script sets %s itself (use --modes / --out)" % (key, key))
    extras = []
    for e in a.extra:
        label, _, path = e.partition("=")
        if not label or not path:
            raise UserError("--extra '%s': expected LABEL=DIR, e.g. bf16_seed7=runs/seed7/bf16" % e)
        if not os.path.isfile(os.path.join(path, "metrics.jsonl")):
            raise UserError("--extra %s: no metrics.jsonl in %s" % (e, path))
        extras.append((label, path))
    a.extra = extras
    if a.smooth < 0:
        raise UserError("--smooth: expected a window of 0 (automatic) or more steps, got %d" % a.smooth)
    if not os.path.isfile(a.config):
        raise UserError("--config %s: no such file" % a.config)
    if a.out is None:
        a.out = os.path.join("runs", "compare_" + os.path.splitext(os.path.basename(a.config))[0])
    return a


# ---------------------------------------------------------------------------------------------
# reading a run directory


def read_metrics(path):
    """metrics.jsonl -> (train rows, val rows, diagnostics rows), each sorted by step.

    Lines that do not parse (a run killed mid-write) are skipped: the trainer trims them on
    resume anyway."""
    train, val, diag = {}, {}, {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if not isinstance(row, dict) or "step" not in row:
                continue
            if "diagnostics" in row:
                diag[row["step"]] = row["diagnostics"]
            elif "val_loss" in row:
                val[row["step"]] = row["val_loss"]
            elif "loss" in row:
                train[row["step"]] = row
    return ([train[s] for s in sorted(train)], [(s, val[s]) for s in sorted(val)],
            [(s, diag[s]) for s in sorted(diag)])


def read_resolved_config(run_dir):
    path = os.path.join(run_dir, "config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except ValueError as e:
        raise UserError("%s: not valid JSON (%s)" % (path, e))


def run_state(run_dir):
    """'absent', 'complete' or 'incomplete' (with the last step reached) for one run dir."""
    if not os.path.exists(run_dir):
        return "absent", 0
    cfg = read_resolved_config(run_dir)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if cfg is None or not os.path.isfile(metrics):
        return "incomplete", 0
    train, _, _ = read_metrics(metrics)
    last = train[-1]["step"] if train else 0
    return ("complete" if last >= cfg["train"]["steps"] else "incomplete"), last


def has_checkpoint(run_dir):
    ck = os.path.join(run_dir, "checkpoints")
    return os.path.isdir(ck) and any(not n.startswith(".") for n in os.listdir(ck))


# ---------------------------------------------------------------------------------------------
# running


def build_command(a, mode, run_dir, resume):
    opts = ["--set", "precision.attention=" + mode, "--set", "log.dir=" + run_dir]
    for s in a.sets:
        opts += ["--set", s]
    if resume:
        opts.append("--resume")
    launcher = shlex.split(a.launcher)
    # The project's launch scripts run ./train_gpt themselves: CONFIG takes the binary's place.
    # They cd to the repository root first, so paths are made absolute for them.
    if launcher and os.path.basename(launcher[0]).startswith("launch_"):
        opts[3] = "log.dir=" + os.path.abspath(run_dir)
        return launcher + [os.path.abspath(a.config)] + opts
    return launcher + [a.binary, "--config", a.config] + opts


def run_mode(a, mode):
    run_dir = os.path.join(a.out, mode)
    state, last = run_state(run_dir)
    if state == "complete":
        print("[%s] complete in %s: skipped" % (mode, run_dir), flush=True)
        return
    resume = state == "incomplete"
    if resume and not has_checkpoint(run_dir):
        raise UserError("[%s] %s holds an unfinished run (last step %d) without a checkpoint to "
                        "resume from; remove it or pick another --out (it is never overwritten)"
                        % (mode, run_dir, last))
    cmd = build_command(a, mode, run_dir, resume)
    log_path = os.path.join(a.out, mode + ".log")
    print("[%s] %s%s -> %s" % (mode, "resuming after step %d: " % last if resume else "",
                               " ".join(shlex.quote(c) for c in cmd), log_path), flush=True)
    t0 = time.time()
    with open(log_path, "a") as log:
        log.write("# %s %s\n" % (time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                                 " ".join(shlex.quote(c) for c in cmd)))
        log.flush()
        try:
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
        except OSError as e:
            raise UserError("[%s] could not start '%s': %s" % (mode, cmd[0], e))
    if rc != 0:
        tail = ""
        with open(log_path, errors="replace") as f:
            tail = "".join(f.readlines()[-8:])
        raise UserError("[%s] train_gpt failed (exit status %d); its output is in %s. Last lines:\n%s"
                        % (mode, rc, log_path, tail))
    state, last = run_state(run_dir)
    if state != "complete":
        raise UserError("[%s] train_gpt exited 0 but %s/metrics.jsonl stops at step %d before "
                        "train.steps; see %s" % (mode, run_dir, last, log_path))
    print("[%s] done in %.0f s" % (mode, time.time() - t0), flush=True)


# ---------------------------------------------------------------------------------------------
# summarizing


def finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def summarize_run(mode, run_dir):
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(metrics):
        return None
    train, val, diag = read_metrics(metrics)
    cfg = read_resolved_config(run_dir) or {}
    s = {"mode": mode, "run_dir": run_dir, "config": cfg, "train": train, "val": val,
         "diag": diag, "steps": train[-1]["step"] if train else 0,
         "target_steps": cfg.get("train", {}).get("steps")}
    tail = train[len(train) - max(1, len(train) // 10):] if train else []
    s["final_train"] = (sum(r["loss"] for r in tail) / len(tail)) if tail else None
    s["final_train_steps"] = (tail[0]["step"], tail[-1]["step"]) if tail else None
    s["final_val"] = val[-1][1] if val else None
    s["final_val_step"] = val[-1][0] if val else None
    # Throughput: median over the steps after the first 10% (start-up and warm caches excluded).
    tps = [r["tokens_per_s"] for r in train[len(train) // 10:] if finite(r.get("tokens_per_s"))]
    s["tokens_per_s"] = statistics.median(tps) if tps else None
    if diag:
        step, d = diag[-1]
        layers = d.get("layers") or []
        cancels = [l.get("resid_cancel_max") for l in layers]
        all_cancels = [l.get("resid_cancel_max") for _, dd in diag for l in (dd.get("layers") or [])]
        loc = [l.get("local_err_qkv") for l in layers]
        s["diag_last"] = {
            "step": step,
            "reference": d.get("reference"),
            "bias_ratio": d.get("bias_ratio"),
            "bias_n": d.get("bias_n"),
            "bias_random_level": d.get("bias_random_level"),
            "cancel_last": max((c for c in cancels if finite(c)), default=None),
            "cancel_all": max((c for c in all_cancels if finite(c)), default=None),
            "loc_err_qkv": max((x for x in loc if finite(x)), default=None),
            "sat_frac": max((l.get("saturated_fraction") for l in layers
                             if finite(l.get("saturated_fraction"))), default=None),
            "loss_mode": d.get("loss_mode"),
            "loss_ref": d.get("loss_ref"),
        }
    return s


def config_differences(runs):
    """Keys (other than the attention mode and log dir) whose values differ between runs."""
    def flat(cfg, prefix=""):
        out = {}
        for k, v in cfg.items():
            key = prefix + k
            if isinstance(v, dict):
                out.update(flat(v, key + "."))
            else:
                out[key] = v
        return out
    # The mode itself, and the paths that follow from each run's own directory.
    ignore = {"precision.attention", "log.dir", "checkpoint.dir"}
    flats = [(r["mode"], flat(r["config"])) for r in runs if r["config"]]
    diffs = []
    keys = sorted(set().union(*[f.keys() for _, f in flats])) if flats else []
    for k in keys:
        if k in ignore:
            continue
        vals = {m: f.get(k) for m, f in flats}
        if len(set(json.dumps(v, sort_keys=True) for v in vals.values())) > 1:
            diffs.append("%s: %s" % (k, ", ".join("%s=%s" % (m, json.dumps(v)) for m, v in vals.items())))
    return diffs


def fmt(x, spec="%.4f"):
    return spec % x if finite(x) else "–"


def fmt_delta(x, base):
    return "%+.4f" % (x - base) if finite(x) and finite(base) else "–"


def write_summary(a, runs, missing, plot_path):
    base = next((r for r in runs if r["mode"] == BASELINE_MODE), None)
    bt = base["final_train"] if base else None
    bv = base["final_val"] if base else None
    L = []
    L.append("# Attention-mode comparison: %s" % os.path.basename(a.config))
    L.append("")
    L.append("Written %s by `scripts/compare_modes.py`." %
             time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    L.append("Config `%s`%s; every run has the same seed, data order and config except "
             "`precision.attention`." % (a.config, "".join(" `--set %s`" % s for s in a.sets)))
    L.append("")
    L.append("| mode | steps | final train loss | Δ train vs bf16 | final val loss | Δ val vs bf16 | tokens/s |")
    L.append("|---|---|---|---|---|---|---|")
    for r in runs:
        steps = "%d" % r["steps"]
        if r["target_steps"] is not None and r["steps"] < r["target_steps"]:
            steps += " of %d (incomplete)" % r["target_steps"]
        L.append("| `%s` | %s | %s | %s | %s | %s | %s |" % (
            r["mode"], steps, fmt(r["final_train"]), fmt_delta(r["final_train"], bt),
            fmt(r["final_val"]), fmt_delta(r["final_val"], bv), fmt(r["tokens_per_s"], "%.0f")))
    for m in missing:
        L.append("| `%s` | no run in %s | | | | | |" % (m, os.path.join(a.out, m)))
    L.append("")
    if runs and runs[0]["final_train_steps"]:
        lo, hi = runs[0]["final_train_steps"]
        L.append("Final train loss: mean over steps %d–%d (the last 10%%); final val loss: the last "
                 "evaluation (step %s); tokens/s: median after the first 10%% of steps."
                 % (lo, hi, runs[0]["final_val_step"]))
        L.append("")
    with_diag = [r for r in runs if "diag_last" in r]
    if with_diag:
        L.append("## Attention diagnostics (last event)")
        L.append("")
        L.append("Columns as in docs/diagnostics.md. `cancel`: max over layers of the row-sum residual "
                 "`|Σ_j dS_ij| / Σ_j P_ij(|dP_ij| + |D_i|)`; *all events*: max over every event of the run. "
                 "`loc_qkv`: max over layers of the local relative error of the attention input gradients.")
        L.append("")
        L.append("| mode | step | reference | bias ratio | 1/√N | cancel (last) | cancel (all events) | loc_qkv | saturated fraction |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        for r in with_diag:
            d = r["diag_last"]
            L.append("| `%s` | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                r["mode"], d["step"], d["reference"],
                fmt(d["bias_ratio"], "%.3f") + (" (N=%s)" % d["bias_n"] if d["bias_n"] else ""),
                fmt(d["bias_random_level"], "%.3f"), fmt(d["cancel_last"], "%.2e"),
                fmt(d["cancel_all"], "%.2e"), fmt(d["loc_err_qkv"], "%.2e"), fmt(d["sat_frac"], "%.1e")))
        L.append("")
    extras = [r for r in runs if r.get("extra")]
    if extras:
        L.append("Extra runs (not run by this script, Δ still against `%s`): %s." % (BASELINE_MODE, "; ".join(
            "`%s` = `%s`" % (r["mode"], r["run_dir"]) for r in extras)))
        L.append("")
    diffs = config_differences([r for r in runs if not r.get("extra")])
    if diffs:
        L.append("**Warning: the runs differ in more than the attention mode**, so the comparison is not "
                 "like for like:")
        L.append("")
        L += ["- " + d for d in diffs]
        L.append("")
    if plot_path:
        L.append("![loss curves](%s)" % os.path.basename(plot_path))
        L.append("")
    L.append("Run directories: " + ", ".join("`%s`" % r["run_dir"] for r in runs) + ".")
    text = "\n".join(L) + "\n"
    path = os.path.join(a.out, "summary.md")
    with open(path + ".tmp", "w") as f:  # written whole, then renamed: never half a file
        f.write(text)
    os.replace(path + ".tmp", path)
    return path, text


# ---------------------------------------------------------------------------------------------
# plotting


def moving_average(xs, window):
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= window:
            acc -= xs[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot(a, runs):
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display on the training machines
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed: no curves.png (pass --no-plot to silence this; "
              "Debian: apt-get install python3-matplotlib)", file=sys.stderr)
        return None
    runs = [r for r in runs if r["train"]]
    if not runs:
        return None
    longest = max(len(r["train"]) for r in runs)
    window = a.smooth or max(1, longest // 30)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    base = next((r for r in runs if r["mode"] == BASELINE_MODE), None)
    base_by_step = {}
    if base:
        bsm = moving_average([t["loss"] for t in base["train"]], window)
        base_by_step = {t["step"]: v for t, v in zip(base["train"], bsm)}
    for r in runs:
        steps = [t["step"] for t in r["train"]]
        sm = moving_average([t["loss"] for t in r["train"]], window)
        style = "--" if r.get("extra") else "-"
        axes[0].plot(steps, sm, style, label=r["mode"], lw=1.2)
        if r["val"]:
            axes[1].plot([s for s, _ in r["val"]], [v for _, v in r["val"]], style, marker="o", ms=3,
                         label=r["mode"], lw=1.2)
        if base_by_step:
            pts = [(s, v - base_by_step[s]) for s, v in zip(steps, sm) if s in base_by_step]
            axes[2].plot([p[0] for p in pts], [p[1] for p in pts], style, label=r["mode"], lw=1.2)
    axes[0].set_title("train loss (moving average, window %d steps)" % window)
    axes[1].set_title("validation loss")
    axes[2].set_title("smoothed train loss minus %s's" % BASELINE_MODE)
    axes[2].axhline(0.0, color="grey", lw=0.6)
    # Start the loss axes after the first 5% of steps: the initial drop would flatten the rest.
    skip = max(1, longest // 20)
    tails = [v for r in runs for v in moving_average([t["loss"] for t in r["train"]], window)[skip:]]
    if tails:
        lo, hi = min(tails), max(tails)
        axes[0].set_ylim(lo - 0.05 * (hi - lo + 1e-3), hi + 0.05 * (hi - lo + 1e-3))
    # Likewise the validation axis leaves out the evaluations of the first 5% (step 0's ~ln(vocab)).
    vtail = [v for r in runs for st, v in r["val"] if st >= skip and finite(v)]
    if vtail:
        lo, hi = min(vtail), max(vtail)
        axes[1].set_ylim(lo - 0.05 * (hi - lo + 1e-3), hi + 0.05 * (hi - lo + 1e-3))
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("%s: attention precision comparison" % os.path.basename(a.config), fontsize=11)
    fig.tight_layout()
    path = os.path.join(a.out, "curves.png")
    fig.savefig(path + ".tmp.png", dpi=90)
    os.replace(path + ".tmp.png", path)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------


def main(argv):
    a = parse_args(argv)
    if not a.plot_only:
        launcher = shlex.split(a.launcher)
        uses_binary = not (launcher and os.path.basename(launcher[0]).startswith("launch_"))
        if uses_binary and not (os.path.isfile(a.binary) and os.access(a.binary, os.X_OK)):
            raise UserError("--binary %s: no such executable (build it with `make`, or pass --binary)"
                            % a.binary)
        if launcher and "/" in launcher[0] and not os.access(launcher[0], os.X_OK):
            raise UserError("--launcher: %s is not an executable file" % launcher[0])
        os.makedirs(a.out, exist_ok=True)
        for mode in a.modes:
            run_mode(a, mode)
    elif not os.path.isdir(a.out):
        raise UserError("--plot-only: %s does not exist (nothing to summarize)" % a.out)
    runs, missing = [], []
    for mode in a.modes:
        s = summarize_run(mode, os.path.join(a.out, mode))
        (runs.append(s) if s else missing.append(mode))
    if not runs:
        raise UserError("no metrics.jsonl under %s for any of: %s" % (a.out, ", ".join(a.modes)))
    for label, path in a.extra:
        s = summarize_run(label, path)
        s["extra"] = True
        runs.append(s)
    plot_path = None if a.no_plot else plot(a, runs)
    path, text = write_summary(a, runs, missing, plot_path)
    print(text)
    print("wrote %s%s" % (path, " and " + plot_path if plot_path else ""))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UserError as e:
        print("compare_modes: error: %s" % e, file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("compare_modes: interrupted; rerun the same command to continue (complete runs are "
              "skipped, stopped ones resumed from their last checkpoint)", file=sys.stderr)
        sys.exit(130)
