#!/usr/bin/env python3
"""e2e_table.py: the end-to-end table of scripts/gpu.sh's bench e2e: train_gpt's runs against the
PyTorch peer (dev/bench/bench_e2e.py) at the same micro-batch and gradient accumulation, with
tokens/s, MFU and peak memory, and the issue's end-to-end targets. Plain Python (no torch):
test/cli_bench_peers.sh checks it on made-up inputs.

  python3 dev/bench/e2e_table.py OURS.tsv TORCH.log

OURS.tsv: one run a line, tab-separated: config, attention, linear, settings ("-": none;
"KEY=VALUE,..." as gpu.sh's RUNS give them), tok/s, MFU ("52.0%" or "n/a"), final train loss,
nvidia-smi's peak memory.used (MiB, 0: not sampled), the --dry-run plan's total (GiB, "n/a"),
micro-batches per step. TORCH.log: bench_e2e.py's output; its "torch-e2e-json {...}" lines.
"""
import json
import sys

MIB_PER_GIB = 1024.0


def read_ours(path):
    runs = []
    for line in open(path):
        f = line.rstrip("\n").split("\t")
        if len(f) < 10:
            continue
        cfg, attn, lin, extra, tok, mfu, loss, peak_mib, plan, accum = f[:10]
        runs.append({"config": cfg, "attention": attn, "linear": lin, "settings": extra, "tok_s": float(tok or 0),
                     "mfu": mfu, "loss": loss, "peak_gib": float(peak_mib or 0) / MIB_PER_GIB, "plan": plan,
                     "accum": accum})
    return runs


def read_torch(path):
    torch = {}
    for line in open(path, errors="replace"):
        if line.startswith("torch-e2e-json "):
            r = json.loads(line[len("torch-e2e-json "):])
            torch[r["config"]] = r
    return torch


def run_name(r):
    """'fp8 recipe', 'bf16', or the precisions and settings of a run."""
    if "precision.recipe=fp8" in r["settings"].split(","):
        return "ours, fp8 recipe"
    if r["attention"] == "bf16" and r["linear"] == "bf16" and r["settings"] in ("-", "", "precision.recipe=bf16"):
        return "ours, BF16"
    extra = "" if r["settings"] in ("-", "") else ", " + r["settings"]
    return f"ours, attention {r['attention']}, linear {r['linear']}{extra}"


def _ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "n/a"


def table(runs, torch):
    out = ["| config | run | micro-batches a step | tok/s | MFU | peak memory GiB (plan) | vs PyTorch BF16 | "
           "vs ours BF16 | final train loss |", "|---|---|---|---|---|---|---|---|---|"]
    configs = []
    for r in runs:
        if r["config"] not in configs:
            configs.append(r["config"])
    for c in torch:
        if c not in configs:
            configs.append(c)
    for c in configs:
        t = torch.get(c, {})
        t_tok = t.get("tokens_per_s")
        base = next((r["tok_s"] for r in runs if r["config"] == c and run_name(r) == "ours, BF16"), None)
        for r in (r for r in runs if r["config"] == c):
            peak = f"{r['peak_gib']:.1f}" if r["peak_gib"] > 0 else "n/a"
            out.append(f"| {c} | {run_name(r)} | {r['accum']} | {r['tok_s']:.0f} | {r['mfu']} | {peak} ({r['plan']}) | "
                       f"{_ratio(r['tok_s'], t_tok)} | {_ratio(r['tok_s'], base)} | {r['loss'] or 'n/a'} |")
        if t:
            mfu = f"{100 * t['mfu']:.1f}%" if t.get("mfu") else "n/a"
            used = t.get("device_used_gib")
            mem = f"{used:.1f} (reserved {t.get('reserved_gib', 0):.1f})" if used else f"{t.get('peak_mem_gib', 0):.1f}"
            out.append(f"| {c} | PyTorch BF16 (torch.compile, sdpa {t.get('sdpa', '?')}) | {t.get('accum', 1)} | "
                       f"{t_tok:.0f} | {mfu} | {mem} | 1.00x | {_ratio(t_tok, base)} | |")
    out.append("tok/s: train_gpt, median over the steps after the warm-up; PyTorch, median of its timed steps; both at "
               "the config's micro-batch, with the micro-batches a step shown (gradient accumulation). MFU: 6 x matmul "
               "params + 6 L C T FLOPs per token against the BF16 peak. Peak memory: ours, nvidia-smi's memory.used "
               "during the run (the --dry-run plan in parentheses); PyTorch, the device's used memory after its timed "
               "steps (its allocator's reserved pool in parentheses)")
    return out


def targets(runs, torch):
    """The issue's end-to-end targets, each line MET / NOT MET / not measured."""
    out = []
    fp8 = {r["config"]: r for r in runs if run_name(r) == "ours, fp8 recipe"}
    bf16 = {r["config"]: r for r in runs if run_name(r) == "ours, BF16"}
    t = torch.get("paper_569m", {}).get("tokens_per_s")
    if "paper_569m" in fp8 and t:
        x = fp8["paper_569m"]["tok_s"] / t
        out.append(f"target fp8 recipe >= 1.5x PyTorch BF16 on paper_569m: {'MET' if x >= 1.5 else 'NOT MET'} ({x:.2f}x)")
    else:
        out.append("target fp8 recipe >= 1.5x PyTorch BF16 on paper_569m: not measured")
    for c in sorted(set(fp8) & set(bf16)):
        a, b = fp8[c]["peak_gib"], bf16[c]["peak_gib"]
        if a > 0 and b > 0:
            out.append(f"target fp8 peak memory <= BF16's on {c}: {'MET' if a <= b else 'NOT MET'} "
                       f"({a:.1f} against {b:.1f} GiB)")
        else:
            out.append(f"target fp8 peak memory <= BF16's on {c}: not measured (no nvidia-smi samples)")
    return out


def main(argv):
    if len(argv) != 3:
        sys.stderr.write("usage: e2e_table.py OURS.tsv TORCH.log\n")
        return 2
    runs, torch = read_ours(argv[1]), read_torch(argv[2])
    print("\n".join(table(runs, torch) + targets(runs, torch)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
