#!/usr/bin/env python3
"""compare_modes.py: train one config per (attention mode, seed), then compare the modes with
paired statistics over the seeds and a verdict per comparison.

The Delta-Matching comparison (README.md, docs/fp8-attention.md) is BF16 attention against
fp8_naive, fp8_hybrid and fp8_dm on the same model and data. For every mode M and seed S this
script runs `train_gpt` into OUT/M/seed_S with precision.attention = M and train.seed =
data.seed = S (the same init and data order for every mode of a seed), then reads every
OUT/M/seed_S/metrics.jsonl and writes

    OUT/summary.json  everything below, machine-readable
    OUT/summary.md    per mode: mean and sd over seeds of the final validation loss, the passkey
                      accuracy (mean over distances, and per distance) and tokens/s; the mean
                      loss per position bucket; per comparison (fp8_naive - fp8_dm,
                      fp8_hybrid - fp8_dm, fp8_dm - bf16 by default) the per-seed differences,
                      their mean with a 95% t-interval and the verdict of the rule in
                      docs/results.md ("gap seen", "ruled out above X", "undecided"); the last
                      diagnostics event per mode when the runs had diagnostics on
    OUT/curves.png    smoothed train loss and validation loss per mode (seed mean), and the
                      smoothed train-loss difference of each comparison, per seed and mean
    OUT/positions.png the final validation loss per position bucket, per mode (seed mean)
                      (the PNGs need matplotlib; the summaries do not)

usage:
    scripts/compare_modes.py --config configs/tiny.json --modes bf16,fp8_dm --seeds 1,2
    scripts/compare_modes.py --config configs/reduced_125m_t8k_amplified.json \\
        --out docs/data/reduced_amplified --summarize-only      # runs brought back from the GPU
    scripts/compare_modes.py --config configs/paper_569m.json --out runs/cmp_569m \\
        --launcher "scripts/launch_mpirun_node.sh 8"

Existing run directories are never overwritten: a complete run (its metrics reach train.steps)
is skipped, an incomplete one (stopped, preempted) is continued with `train_gpt --resume`.
Each run's output goes to OUT/M/seed_S.log (appended on resume).

--launcher prefixes the command. The project's launch scripts (scripts/launch_*.sh) start
./train_gpt themselves and take the config in its place, so for them the binary is left out;
any other launcher (`mpirun -np 8`, `srun`, `env OMP_NUM_THREADS=8`) is put in front of it.

Only the standard library is needed (scripts/compare_stats.py holds the statistics);
matplotlib only for the PNGs (--no-plot skips them).
"""

import argparse  # command line
import json  # metrics.jsonl, config.json, summary.json
import os  # paths
import shlex  # splitting --launcher like a shell would
import statistics  # median tokens/s
import subprocess  # running train_gpt
import sys  # exit codes, stderr, this script's folder
import time  # run wall time, the summary's date

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_stats import finite, mean_sd, moving_average, paired, verdict  # noqa: E402

KNOWN_MODES = ("bf16", "fp8_naive", "fp8_hybrid", "fp8_dm", "fp8_dm_approx", "fp8_hybrid_dm", "fp32")
DEFAULT_MODES = "bf16,fp8_naive,fp8_hybrid,fp8_dm"
DEFAULT_PAIRS = "fp8_naive-fp8_dm,fp8_hybrid-fp8_dm,fp8_dm-bf16"
# The thresholds of the decision rule (docs/results.md, "Reduced-scale plan"): the smallest
# differences that matter, in nats of final validation loss and in passkey accuracy.
LOSS_THRESHOLD = 0.02
PASSKEY_THRESHOLD = 0.10


class UserError(Exception):
    """A problem with the user's input or a run: printed as one message, exit status 1."""


# ---------------------------------------------------------------------------------------------
# command line


def parse_list(text, what, convert=str):
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise UserError("%s: expected a comma-separated list, got '%s'" % (what, text))
    try:
        items = [convert(x) for x in items]
    except ValueError:
        raise UserError("%s: '%s' is not a list of %s" % (what, text, "integers" if convert is int else "names"))
    if len(set(items)) != len(items):
        raise UserError("%s: '%s' names an entry twice" % (what, text))
    return items


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Train one config per (attention mode, seed) and compare the modes: per-mode mean and "
        "sd over seeds, paired per-seed differences with t-intervals, and a verdict per comparison.",
        epilog="Example: scripts/compare_modes.py --config configs/tiny.json --modes bf16,fp8_dm --seeds 1,2")
    p.add_argument("--config", required=True, help="JSON run configuration, e.g. configs/tiny.json")
    p.add_argument("--modes", default=DEFAULT_MODES,
                   help="comma-separated precision.attention values (default %(default)s); known: "
                   + ", ".join(KNOWN_MODES))
    p.add_argument("--seeds", default="1,2,3",
                   help="comma-separated seeds (default %(default)s); seed S sets train.seed and data.seed to S")
    p.add_argument("--pairs", default=DEFAULT_PAIRS,
                   help="comparisons A-B (A minus B), comma-separated; those whose modes were not run are "
                   "left out (default %(default)s)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                   help="config override passed to every run (repeatable), e.g. train.steps=600")
    p.add_argument("--out", help="comparison directory; runs go to OUT/MODE/seed_S "
                   "(default runs/compare_<config name>)")
    p.add_argument("--binary", default="./train_gpt", help="train_gpt binary (default %(default)s)")
    p.add_argument("--launcher", default="",
                   help='command prefix, e.g. "scripts/launch_mpirun_node.sh 8" or "mpirun -np 8"')
    p.add_argument("--summarize-only", "--plot-only", action="store_true", dest="summarize_only",
                   help="run nothing: summarize and plot the runs already in OUT")
    p.add_argument("--no-plot", action="store_true", help="write the summaries only (no matplotlib)")
    p.add_argument("--smooth", type=int, default=0,
                   help="train-loss moving-average window in steps (default: steps/30, at least 1)")
    p.add_argument("--loss-threshold", type=float, default=LOSS_THRESHOLD,
                   help="the rule's threshold for final validation loss, nats (default %(default)s)")
    p.add_argument("--passkey-threshold", type=float, default=PASSKEY_THRESHOLD,
                   help="the rule's threshold for passkey accuracy (default %(default)s)")
    a = p.parse_args(argv)
    a.modes = parse_list(a.modes, "--modes")
    for m in a.modes:
        if m not in KNOWN_MODES:
            raise UserError("--modes: unknown attention mode '%s' (expected one of: %s)" % (m, ", ".join(KNOWN_MODES)))
    a.seeds = parse_list(a.seeds, "--seeds", int)
    if any(s < 0 for s in a.seeds):
        raise UserError("--seeds: seeds are non-negative integers, got '%s'" % ",".join(map(str, a.seeds)))
    pairs = []
    for item in parse_list(a.pairs, "--pairs"):
        x, sep, y = item.partition("-")
        if not sep or x not in KNOWN_MODES or y not in KNOWN_MODES or x == y:
            raise UserError("--pairs: '%s' is not A-B with two different known modes, e.g. fp8_naive-fp8_dm" % item)
        if x in a.modes and y in a.modes:
            pairs.append((x, y))
    a.pairs = pairs
    for s in a.sets:
        key = s.split("=", 1)[0]
        if "=" not in s or "." not in key:
            raise UserError("--set '%s': expected section.key=value, e.g. train.steps=600" % s)
        if key in ("precision.attention", "log.dir", "train.seed", "data.seed"):
            raise UserError("--set %s: this script sets %s itself (use --modes / --seeds / --out)" % (key, key))
    for name in ("smooth",):
        if getattr(a, name) < 0:
            raise UserError("--smooth: expected a window of 0 (automatic) or more steps, got %d" % a.smooth)
    if not (a.loss_threshold > 0 and a.passkey_threshold > 0):
        raise UserError("--loss-threshold and --passkey-threshold must be positive")
    if not os.path.isfile(a.config):
        raise UserError("--config %s: no such file" % a.config)
    if a.out is None:
        a.out = os.path.join("runs", "compare_" + os.path.splitext(os.path.basename(a.config))[0])
    return a


# ---------------------------------------------------------------------------------------------
# reading a run directory


def read_metrics(path):
    """metrics.jsonl -> (train rows, val rows, diagnostics rows, passkey rows), each a list sorted by
    step: train rows are the dicts, val rows (step, dict), diagnostics (step, dict), passkey
    (step, dict). Lines that do not parse (a run killed mid-write) are skipped."""
    train, val, diag, pk = {}, {}, {}, {}
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
            elif "passkey" in row:
                pk[row["step"]] = row["passkey"]
            elif "val_loss" in row:
                val[row["step"]] = row
            elif "loss" in row:
                train[row["step"]] = row
    return ([train[s] for s in sorted(train)], [(s, val[s]) for s in sorted(val)],
            [(s, diag[s]) for s in sorted(diag)], [(s, pk[s]) for s in sorted(pk)])


def read_resolved_config(run_dir):
    path = os.path.join(run_dir, "config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except ValueError as e:
        raise UserError("%s: not valid JSON (%s)" % (path, e))


def run_dir_of(a, mode, seed):
    return os.path.join(a.out, mode, "seed_%d" % seed)


def run_state(run_dir):
    """'absent', 'complete' or 'incomplete' (with the last step reached) for one run dir."""
    if not os.path.exists(run_dir):
        return "absent", 0
    cfg = read_resolved_config(run_dir)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if cfg is None or not os.path.isfile(metrics):
        return "incomplete", 0
    train = read_metrics(metrics)[0]
    last = train[-1]["step"] if train else 0
    return ("complete" if last >= cfg["train"]["steps"] else "incomplete"), last


def has_checkpoint(run_dir):
    ck = os.path.join(run_dir, "checkpoints")
    return os.path.isdir(ck) and any(not n.startswith(".") for n in os.listdir(ck))


# ---------------------------------------------------------------------------------------------
# running


def build_command(a, mode, seed, run_dir, resume):
    opts = ["--set", "precision.attention=" + mode, "--set", "log.dir=" + run_dir,
            "--set", "train.seed=%d" % seed, "--set", "data.seed=%d" % seed]
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


def run_one(a, mode, seed):
    name = "%s seed %d" % (mode, seed)
    run_dir = run_dir_of(a, mode, seed)
    state, last = run_state(run_dir)
    if state == "complete":
        print("[%s] complete in %s: skipped" % (name, run_dir), flush=True)
        return
    resume = state == "incomplete"
    if resume and not has_checkpoint(run_dir):
        raise UserError("[%s] %s holds an unfinished run (last step %d) without a checkpoint to resume from; "
                        "remove it or pick another --out (it is never overwritten)" % (name, run_dir, last))
    cmd = build_command(a, mode, seed, run_dir, resume)
    log_path = run_dir + ".log"
    os.makedirs(os.path.dirname(run_dir), exist_ok=True)
    print("[%s] %s%s -> %s" % (name, "resuming after step %d: " % last if resume else "",
                               " ".join(shlex.quote(c) for c in cmd), log_path), flush=True)
    t0 = time.time()
    with open(log_path, "a") as log:
        log.write("# %s %s\n" % (time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                                 " ".join(shlex.quote(c) for c in cmd)))
        log.flush()
        try:
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
        except OSError as e:
            raise UserError("[%s] could not start '%s': %s" % (name, cmd[0], e))
    if rc != 0:
        with open(log_path, errors="replace") as f:
            tail = "".join(f.readlines()[-8:])
        raise UserError("[%s] train_gpt failed (exit status %d); its output is in %s. Last lines:\n%s"
                        % (name, rc, log_path, tail))
    state, last = run_state(run_dir)
    if state != "complete":
        raise UserError("[%s] train_gpt exited 0 but %s/metrics.jsonl stops at step %d before train.steps; see %s"
                        % (name, run_dir, last, log_path))
    print("[%s] done in %.0f s" % (name, time.time() - t0), flush=True)


# ---------------------------------------------------------------------------------------------
# summarizing one run


def summarize_run(mode, seed, run_dir):
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(metrics):
        return None
    train, val, diag, pk = read_metrics(metrics)
    cfg = read_resolved_config(run_dir) or {}
    r = {"mode": mode, "seed": seed, "run_dir": run_dir, "config": cfg, "train": train,
         "steps": train[-1]["step"] if train else 0, "target_steps": cfg.get("train", {}).get("steps")}
    r["complete"] = r["target_steps"] is not None and r["steps"] >= r["target_steps"]
    r["val_curve"] = [(s, v.get("val_loss")) for s, v in val]
    last_val = val[-1][1] if val else {}
    r["final_val"] = last_val.get("val_loss")
    r["final_val_step"] = val[-1][0] if val else None
    r["val_tokens"] = last_val.get("val_tokens")
    r["val_pos"] = last_val.get("val_pos")
    r["val_source"] = last_val.get("val_source")
    tail = train[len(train) - max(1, len(train) // 10):] if train else []
    r["final_train"] = (sum(t["loss"] for t in tail) / len(tail)) if tail else None
    tps = [t["tokens_per_s"] for t in train[len(train) // 10:] if finite(t.get("tokens_per_s"))]
    r["tokens_per_s"] = statistics.median(tps) if tps else None
    r["passkey"] = pk[-1][1] if pk else None
    r["passkey_step"] = pk[-1][0] if pk else None
    accs = [x for x in (r["passkey"] or {}).get("accuracy", []) if finite(x)]
    r["passkey_accuracy"] = sum(accs) / len(accs) if accs else None
    lps = [x for x in (r["passkey"] or {}).get("logp_answer", []) if finite(x)]
    r["passkey_logp"] = sum(lps) / len(lps) if lps else None  # descriptive: not in the rule
    r["passkey_curve"] = [(s, sum(x for x in p.get("accuracy", []) if finite(x)) / max(1, len(p.get("accuracy", []))))
                          for s, p in pk]
    if diag:
        step, d = diag[-1]
        layers = d.get("layers") or []

        def layer_max(key):
            return max((l.get(key) for l in layers if finite(l.get(key))), default=None)
        r["diag_last"] = {"step": step, "bias_ratio": d.get("bias_ratio"),
                          "cancel": layer_max("resid_cancel_max"), "loc_err_qkv": layer_max("local_err_qkv"),
                          "sat_frac": layer_max("saturated_fraction")}
    return r


def config_differences(runs):
    """Keys (other than the mode, the seeds and the run's own paths) whose values differ between runs."""
    def flat(cfg, prefix=""):
        out = {}
        for k, v in cfg.items():
            if isinstance(v, dict):
                out.update(flat(v, prefix + k + "."))
            else:
                out[prefix + k] = v
        return out
    ignore = {"precision.attention", "log.dir", "checkpoint.dir", "train.seed", "data.seed"}
    flats = [("%s/seed_%d" % (r["mode"], r["seed"]), flat(r["config"])) for r in runs if r["config"]]
    diffs = []
    for k in sorted(set().union(*[f.keys() for _, f in flats])) if flats else []:
        if k in ignore:
            continue
        vals = {name: f.get(k) for name, f in flats}
        if len(set(json.dumps(v, sort_keys=True) for v in vals.values())) > 1:
            diffs.append("%s: %s" % (k, ", ".join("%s=%s" % (n, json.dumps(v)) for n, v in vals.items())))
    return diffs


# ---------------------------------------------------------------------------------------------
# the comparison


def seed_map(runs, mode, key):
    return {r["seed"]: r[key] for r in runs if r["mode"] == mode and r["complete"] and finite(r.get(key))}


def shared_seeds(runs, modes):
    """The seeds every mode with a complete run has: profiles (passkey per distance, loss per
    position and per source) compare modes on these alone, else a seed's offset reads as a mode's."""
    sets = [set(r["seed"] for r in runs if r["mode"] == m and r["complete"]) for m in modes]
    sets = [x for x in sets if x]
    return sorted(set.intersection(*sets)) if sets else []


def per_mode(runs, modes):
    out = {}
    shared = shared_seeds(runs, modes)
    for m in modes:
        mine = [r for r in runs if r["mode"] == m and r["complete"]]
        entry = {"seeds": [r["seed"] for r in mine], "profile_seeds": shared}
        for key in ("final_val", "final_train", "passkey_accuracy", "tokens_per_s"):
            mean, sd = mean_sd([r.get(key) for r in mine])
            entry[key] = {"mean": mean, "sd": sd, "n": len([r for r in mine if finite(r.get(key))])}
        # Passkey accuracy per distance, loss per position bucket and per source: means over the
        # shared seeds.
        profile = [r for r in mine if r["seed"] in shared] if shared else mine
        dist = {}
        for r in profile:
            p = r.get("passkey") or {}
            for d, acc in zip(p.get("distance", []), p.get("accuracy", [])):
                dist.setdefault(d, []).append(acc)
        entry["passkey_by_distance"] = {str(d): dict(zip(("mean", "sd"), mean_sd(v))) for d, v in sorted(dist.items())}
        buckets = {}
        for r in profile:
            vp = r.get("val_pos") or {}
            for s, e, l in zip(vp.get("start", []), vp.get("end", []), vp.get("mean", [])):
                buckets.setdefault((s, e), []).append(l)
        entry["val_by_position"] = [{"start": s, "end": e, "mean": mean_sd(v)[0], "sd": mean_sd(v)[1]}
                                    for (s, e), v in sorted(buckets.items())]
        sources = {}
        for r in profile:
            for name, v in (r.get("val_source") or {}).items():
                sources.setdefault(name, []).append(v.get("mean") if isinstance(v, dict) else v)
        entry["val_by_source"] = {n: mean_sd(v)[0] for n, v in sorted(sources.items())}
        out[m] = entry
    return out


def train_diff_curves(runs, x, y, window):
    """Per seed, the smoothed train loss of x minus y's at the steps both logged; and their mean."""
    per_seed = {}
    for rx in (r for r in runs if r["mode"] == x):
        ry = next((r for r in runs if r["mode"] == y and r["seed"] == rx["seed"]), None)
        if not ry or not rx["train"] or not ry["train"]:
            continue
        sx = dict(zip([t["step"] for t in rx["train"]], moving_average([t["loss"] for t in rx["train"]], window)))
        sy = dict(zip([t["step"] for t in ry["train"]], moving_average([t["loss"] for t in ry["train"]], window)))
        steps = sorted(set(sx) & set(sy))
        per_seed[rx["seed"]] = [(s, sx[s] - sy[s]) for s in steps]
    mean = []
    if per_seed:
        common = sorted(set.intersection(*[set(s for s, _ in c) for c in per_seed.values()]))
        lookup = {seed: dict(c) for seed, c in per_seed.items()}
        mean = [(s, sum(lookup[seed][s] for seed in lookup) / len(lookup)) for s in common]
    return per_seed, mean


def thin(points, n=200):
    """At most about n points of a curve, evenly spaced, the last kept."""
    if len(points) <= n:
        return points
    stride = (len(points) + n - 1) // n
    out = points[::stride]
    return out if out[-1] == points[-1] else out + [points[-1]]


def compare(a, runs):
    longest = max((len(r["train"]) for r in runs), default=1)
    window = a.smooth or max(1, longest // 30)
    comps = []
    for x, y in a.pairs:
        c = {"a": x, "b": y, "metrics": {}}
        for key, threshold in (("final_val", a.loss_threshold), ("passkey_accuracy", a.passkey_threshold)):
            mx, my = seed_map(runs, x, key), seed_map(runs, y, key)
            p = paired(mx, my)
            text, code = verdict(p, threshold)
            if key == "passkey_accuracy" and p["n"] and not any(mx.get(s) or my.get(s) for s in p["seeds"]):
                text, code = "undecided (both at accuracy 0: no retrieval learned, nothing to compare)", "undecided"
            p.update(verdict=text, verdict_code=code, threshold=threshold)
            c["metrics"][key] = p
        # the answer's log-probability: reported beside the rule, never judged by it (it moves
        # before accuracy does, so it says which way retrieval is heading while accuracy is 0)
        c["passkey_logp"] = paired(seed_map(runs, x, "passkey_logp"), seed_map(runs, y, "passkey_logp"))
        per_seed, mean = train_diff_curves(runs, x, y, window)
        c["train_diff"] = {"window": window, "per_seed": {str(s): thin(v) for s, v in per_seed.items()},
                           "mean": thin(mean)}
        c["train_diff_full"] = (per_seed, mean)  # for the plot; not written
        comps.append(c)
    return comps, window


# ---------------------------------------------------------------------------------------------
# writing


def fmt(x, spec="%.4f"):
    return spec % x if finite(x) else "–"


def fmt_ms(e, spec="%.4f"):
    if not e or not finite(e.get("mean")):
        return "–"
    return (spec % e["mean"]) + (" ± " + spec % e["sd"] if finite(e.get("sd")) else "")


def fmt_paired(p, spec):
    """A paired comparison's per-seed differences, mean and interval as table cells."""
    diffs = ", ".join(("s%d: " + spec) % (s, d) for s, d in zip(p["seeds"], p["diffs"])) or "–"
    interval = ("[" + spec + ", " + spec + "]") % (p["lo"], p["hi"]) if p["lo"] is not None else "–"
    return diffs, fmt(p["mean"], spec), interval


def write_atomic(path, text):
    with open(path + ".tmp", "w") as f:  # written whole, then renamed: never half a file
        f.write(text)
    os.replace(path + ".tmp", path)


def write_summary(a, runs, missing, modes_summary, comps, window, plots):
    L = ["# Attention-mode comparison: %s" % os.path.basename(a.config), ""]
    L.append("Written %s by `scripts/compare_modes.py`. Config `%s`%s; seeds %s (seed S: train.seed = data.seed = S, "
             "the same for every mode). Runs in `%s/MODE/seed_S`." % (
                 time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), a.config,
                 "".join(" `--set %s`" % s for s in a.sets), ", ".join(map(str, a.seeds)), a.out))
    L.append("")
    shared = next((e.get("profile_seeds") for e in modes_summary.values() if e.get("seeds")), [])
    all_same = all(sorted(e["seeds"]) == shared for e in modes_summary.values() if e["seeds"])
    profile_note = "seed mean" if all_same else (
        "mean over seed%s %s, the seeds every mode ran" % ("s" if len(shared) > 1 else "", ", ".join(map(str, shared))))
    L.append("## Per mode (mean ± sd over seeds)")
    L.append("")
    L.append("| mode | seeds | final val loss | final train loss | passkey accuracy | tokens/s |")
    L.append("|---|---|---|---|---|---|")
    for m in a.modes:
        e = modes_summary[m]
        L.append("| `%s` | %s | %s | %s | %s | %s |" % (
            m, ",".join(map(str, e["seeds"])) or "none", fmt_ms(e["final_val"]), fmt_ms(e["final_train"]),
            fmt_ms(e["passkey_accuracy"], "%.3f"), fmt_ms(e["tokens_per_s"], "%.0f")))
    L.append("")
    L.append("Final val loss: the last evaluation (step = train.steps); final train loss: mean over the last 10% of "
             "steps; passkey accuracy: exact match, the mean over distances of the last passkey evaluation; "
             "tokens/s: median after the first 10% of steps. Incomplete runs are left out of every statistic.")
    L.append("")
    dists = sorted({int(d) for m in a.modes for d in modes_summary[m]["passkey_by_distance"]})
    if dists:
        L.append("Passkey accuracy per distance (tokens between the key and the question; %s):" % profile_note)
        L.append("")
        L.append("| mode | " + " | ".join(str(d) for d in dists) + " |")
        L.append("|---|" + "---|" * len(dists))
        for m in a.modes:
            byd = modes_summary[m]["passkey_by_distance"]
            L.append("| `%s` | " % m + " | ".join(fmt_ms(byd.get(str(d)), "%.3f") for d in dists) + " |")
        L.append("")
    buckets = sorted({(b["start"], b["end"]) for m in a.modes for b in modes_summary[m]["val_by_position"]})
    if buckets:
        L.append("Final validation loss per position bucket (%s):" % profile_note)
        L.append("")
        L.append("| mode | " + " | ".join("%d–%d" % (s, e - 1) for s, e in buckets) + " |")
        L.append("|---|" + "---|" * len(buckets))
        for m in a.modes:
            byb = {(b["start"], b["end"]): b["mean"] for b in modes_summary[m]["val_by_position"]}
            L.append("| `%s` | " % m + " | ".join(fmt(byb.get(k)) for k in buckets) + " |")
        L.append("")
    sources = sorted({s for m in a.modes for s in modes_summary[m]["val_by_source"]})
    if len(sources) > 1:
        L.append("Final validation loss per source (%s):" % profile_note)
        L.append("")
        L.append("| mode | " + " | ".join(sources) + " |")
        L.append("|---|" + "---|" * len(sources))
        for m in a.modes:
            bys = modes_summary[m]["val_by_source"]
            L.append("| `%s` | " % m + " | ".join(fmt(bys.get(s)) for s in sources) + " |")
        L.append("")
    L.append("## Comparisons (paired by seed)")
    L.append("")
    L.append("Rule (docs/results.md, \"Reduced-scale plan\"): the 95%% t-interval of the mean per-seed difference "
             "A − B; **gap seen** if it excludes 0; **ruled out above X** if it holds 0 and lies within ± the "
             "threshold (X = its farther end); else **undecided** (also with fewer than 2 paired seeds, and for "
             "passkey accuracy when both modes score 0 on every seed). Thresholds: %g nats of final val loss, %g of "
             "passkey accuracy." % (a.loss_threshold, a.passkey_threshold))
    L.append("")
    L.append("| A − B | metric | per-seed differences | mean | 95% interval | verdict |")
    L.append("|---|---|---|---|---|---|")
    for c in comps:
        for key, label in (("final_val", "final val loss"), ("passkey_accuracy", "passkey accuracy")):
            p = c["metrics"][key]
            L.append("| `%s` − `%s` | %s | %s | %s | %s | %s |" % ((c["a"], c["b"], label) + fmt_paired(p, "%+.4f") +
                                                                 (p["verdict"],)))
    if not comps:
        L.append("| (no comparison: --pairs names no two modes that ran) | | | | | |")
    L.append("")
    logp = [c for c in comps if c["passkey_logp"]["n"]]
    if logp:
        L.append("Passkey answer log-probability (teacher-forced, mean over distances, last evaluation), A − B: "
                 "descriptive, not judged by the rule.")
        L.append("")
        L.append("| A − B | per-seed differences (nats) | mean | 95% interval |")
        L.append("|---|---|---|---|")
        for c in logp:
            L.append("| `%s` − `%s` | %s | %s | %s |" % ((c["a"], c["b"]) + fmt_paired(c["passkey_logp"], "%+.2f")))
        L.append("")
    L.append("Train-loss difference curves: moving mean over %d steps, A − B per seed (see curves.png)." % window)
    for c in comps:
        mean = c["train_diff"]["mean"]
        if mean:
            q = [mean[int(i * (len(mean) - 1) / 4)] for i in range(5)]
            L.append("- `%s` − `%s`, seed mean at steps %s: %s" % (
                c["a"], c["b"], ", ".join(str(s) for s, _ in q), ", ".join("%+.4f" % v for _, v in q)))
    L.append("")
    with_diag = [r for r in runs if "diag_last" in r]
    if with_diag:
        L.append("## Attention diagnostics (last event of each run)")
        L.append("")
        L.append("| run | step | bias ratio | cancel (max over layers) | loc_qkv | saturated fraction |")
        L.append("|---|---|---|---|---|---|")
        for r in with_diag:
            d = r["diag_last"]
            L.append("| `%s` seed %d | %s | %s | %s | %s | %s |" % (
                r["mode"], r["seed"], d["step"], fmt(d["bias_ratio"], "%.3f"), fmt(d["cancel"], "%.2e"),
                fmt(d["loc_err_qkv"], "%.2e"), fmt(d["sat_frac"], "%.1e")))
        L.append("")
    incomplete = [r for r in runs if not r["complete"]]
    if incomplete or missing:
        L.append("Not in the statistics: " + "; ".join(
            ["`%s` seed %d stops at step %d of %s" % (r["mode"], r["seed"], r["steps"], r["target_steps"])
             for r in incomplete] + ["`%s` seed %d has no run" % m for m in missing]) + ".")
        L.append("")
    diffs = config_differences(runs)
    if diffs:
        L.append("**Warning: the runs differ in more than the mode and the seeds**, so the comparison is not like "
                 "for like:")
        L.append("")
        L += ["- " + d for d in diffs]
        L.append("")
    for p in plots:
        L.append("![%s](%s)" % (os.path.splitext(os.path.basename(p))[0], os.path.basename(p)))
        L.append("")
    text = "\n".join(L) + "\n"
    md = os.path.join(a.out, "summary.md")
    write_atomic(md, text)
    data = {"config": a.config, "sets": a.sets, "modes": a.modes, "seeds": a.seeds,
            "rule": {"level": 0.95, "loss_threshold": a.loss_threshold, "passkey_threshold": a.passkey_threshold},
            "per_mode": modes_summary,
            "comparisons": [{k: v for k, v in c.items() if k != "train_diff_full"} for c in comps],
            "runs": [{k: r.get(k) for k in ("mode", "seed", "run_dir", "steps", "target_steps", "complete",
                                             "final_val", "final_val_step", "val_tokens", "final_train",
                                             "passkey_accuracy", "passkey_logp", "passkey_step", "tokens_per_s")}
                     for r in runs],
            "missing": ["%s/seed_%d" % m for m in missing]}
    js = os.path.join(a.out, "summary.json")
    write_atomic(js, json.dumps(data, indent=1, sort_keys=True) + "\n")
    return md, js, text


# ---------------------------------------------------------------------------------------------
# plotting


def save_figure(plt, fig, path):
    """Writes fig to path whole (a temporary file, then renamed) and closes it; returns path."""
    fig.tight_layout()
    fig.savefig(path + ".tmp.png", dpi=90)
    os.replace(path + ".tmp.png", path)
    plt.close(fig)
    return path


def plot(a, runs, comps, window, modes_summary):
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display on the training machines
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed: no PNGs (pass --no-plot to silence this; Debian: apt-get install "
              "python3-matplotlib)", file=sys.stderr)
        return []
    paths = []
    shared = shared_seeds(runs, a.modes)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    colors = {}
    for m in a.modes:
        mine = [r for r in runs if r["mode"] == m and r["train"]]
        if not mine:
            continue
        for i, r in enumerate(mine):
            steps = [t["step"] for t in r["train"]]
            line, = axes[0].plot(steps, moving_average([t["loss"] for t in r["train"]], window), lw=1.0,
                                 color=colors.get(m), label=m if i == 0 else None, alpha=0.8)
            colors[m] = line.get_color()
            vc = [(s, v) for s, v in r["val_curve"] if finite(v)]
            if vc:
                axes[1].plot([s for s, _ in vc], [v for _, v in vc], marker="o", ms=2.5, lw=0.8, color=colors[m],
                             label=m if i == 0 else None, alpha=0.8)
    for c in comps:
        per_seed, mean = c["train_diff_full"]
        label = "%s − %s" % (c["a"], c["b"])
        line = None
        for seed, pts in sorted(per_seed.items()):
            line, = axes[2].plot([s for s, _ in pts], [v for _, v in pts], lw=0.6, alpha=0.45,
                                 color=line.get_color() if line else None)
        if mean:
            axes[2].plot([s for s, _ in mean], [v for _, v in mean], lw=1.8, label=label + " (seed mean)",
                         color=line.get_color() if line else None)
    axes[0].set_title("train loss (moving mean of %d steps), every seed" % window)
    axes[1].set_title("validation loss, every seed")
    axes[2].set_title("smoothed train-loss difference A − B (thin: per seed)")
    axes[2].axhline(0.0, color="grey", lw=0.6)
    longest = max((len(r["train"]) for r in runs), default=1)
    skip = max(1, longest // 20)  # the initial drop would flatten the rest
    tails = [v for r in runs if r["train"] for v in moving_average([t["loss"] for t in r["train"]], window)[skip:]]
    if tails:
        lo, hi = min(tails), max(tails)
        axes[0].set_ylim(lo - 0.05 * (hi - lo + 1e-3), hi + 0.05 * (hi - lo + 1e-3))
    vtail = [v for r in runs for s, v in r["val_curve"] if s >= skip and finite(v)]
    if vtail:
        lo, hi = min(vtail), max(vtail)
        axes[1].set_ylim(lo - 0.05 * (hi - lo + 1e-3), hi + 0.05 * (hi - lo + 1e-3))
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("%s: attention modes over seeds %s" % (os.path.basename(a.config), ",".join(map(str, a.seeds))))
    paths.append(save_figure(plt, fig, os.path.join(a.out, "curves.png")))
    if any(modes_summary[m]["val_by_position"] for m in a.modes):
        fig, ax = plt.subplots(figsize=(7, 4.4))
        for m in a.modes:  # per_mode's means over the seeds every mode ran
            pos = [b for b in modes_summary[m]["val_by_position"] if finite(b["mean"])]
            if pos:
                ax.plot([(b["start"] + b["end"]) / 2 for b in pos], [b["mean"] for b in pos], marker="o", label=m,
                        color=colors.get(m))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("position in the context (bucket middle)")
        ax.set_ylabel("final validation loss (mean over seeds %s)" % ",".join(map(str, shared)))
        ax.set_title("loss per position bucket")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        paths.append(save_figure(plt, fig, os.path.join(a.out, "positions.png")))
    return paths


# ---------------------------------------------------------------------------------------------


def main(argv):
    a = parse_args(argv)
    if not a.summarize_only:
        launcher = shlex.split(a.launcher)
        uses_binary = not (launcher and os.path.basename(launcher[0]).startswith("launch_"))
        if uses_binary and not (os.path.isfile(a.binary) and os.access(a.binary, os.X_OK)):
            raise UserError("--binary %s: no such executable (build it with `make`, or pass --binary)" % a.binary)
        if launcher and "/" in launcher[0] and not os.access(launcher[0], os.X_OK):
            raise UserError("--launcher: %s is not an executable file" % launcher[0])
        os.makedirs(a.out, exist_ok=True)
        for seed in a.seeds:  # seed-major: a stopped comparison has whole pairs first
            for mode in a.modes:
                run_one(a, mode, seed)
    elif not os.path.isdir(a.out):
        raise UserError("--summarize-only: %s does not exist (nothing to summarize)" % a.out)
    runs, missing = [], []
    for mode in a.modes:
        for seed in a.seeds:
            r = summarize_run(mode, seed, run_dir_of(a, mode, seed))
            (runs.append(r) if r else missing.append((mode, seed)))
    if not runs:
        raise UserError("no metrics.jsonl under %s/MODE/seed_S for any of the modes %s and seeds %s"
                        % (a.out, ",".join(a.modes), ",".join(map(str, a.seeds))))
    modes_summary = per_mode(runs, a.modes)
    comps, window = compare(a, runs)
    plots = [] if a.no_plot else plot(a, runs, comps, window, modes_summary)
    md, js, text = write_summary(a, runs, missing, modes_summary, comps, window, plots)
    print(text)
    print("wrote %s, %s%s" % (md, js, "".join(", " + p for p in plots)))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UserError as e:
        print("compare_modes: error: %s" % e, file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("compare_modes: interrupted; rerun the same command to continue (complete runs are skipped, stopped "
              "ones resumed from their last checkpoint)", file=sys.stderr)
        sys.exit(130)
