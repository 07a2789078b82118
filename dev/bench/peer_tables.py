"""peer_tables.py: the attention benchmarks' counts and the judging tables against the peers, in
plain Python (no torch: test/cli_bench_peers.sh checks them on made-up timings).

FLOP counts (causal, the convention of FlashAttention's and cudnn-frontend's benchmarks): forward
4*B*H*T^2*d/2 (S = QK^T and O = PV over the lower triangle), backward 2.5x the forward;
TFLOP/s = FLOPs / time. A forward + backward rate is (forward + backward FLOPs) / (forward +
backward time).

The rows the benchmarks pass in: dicts with T, B, ff, fb (FLOPs of the forward and backward) and
tf, tb (name -> median ms of the forward, backward of each implementation timed at that T).
"""

# NVIDIA's cudnn-frontend SDPA training benchmark on an H200 (cuDNN 9.19, causal, head dim 128),
# TFLOP/s: (precision, direction, T) -> value. Their runs time cuDNN alone with CUPTI at their own
# shapes (batch 1-2, 64 query heads), so a same-run peer at ours is compared, not equated.
PUBLISHED = {("bf16", "bwd", 4096): 474.0,
             ("fp8", "fwd", 4096): 854.0, ("fp8", "fwd", 8192): 964.0,
             ("fp8", "bwd", 4096): 470.0, ("fp8", "bwd", 8192): 470.0}
PUBLISHED_SOURCE = "NVIDIA cudnn-frontend benchmark, H200, cuDNN 9.19, causal, head dim 128"

# the cuDNN peer's calls (bench_attention.py's cudnn_variants) are timed as "cudnn:<variant>"
CUDNN_PREFIX = "cudnn:"


def attn_flops(B, H, T, d):
    """(forward, backward) FLOPs of causal attention."""
    fwd = 4.0 * B * H * T * T * d / 2.0
    return fwd, 2.5 * fwd


def tflops(flop, ms):
    """TFLOP/s of `flop` FLOPs in `ms` milliseconds; None without a time."""
    return flop / ms / 1e9 if ms else None


def label(T):
    return f"{T // 1024}K" if T % 1024 == 0 else str(T)


def best_of(times, prefix):
    """(name, ms) of the fastest entry of `times` (name -> ms) whose name starts with prefix, the
    prefix taken off the name; (None, None) when there is none."""
    cand = {n[len(prefix):]: t for n, t in times.items() if n.startswith(prefix) and t}
    if not cand:
        return None, None
    name = min(cand, key=cand.get)
    return name, cand[name]


def fp8_name(row):
    """The fp8_dm entry to judge: the trainer's (kept codes) when timed, else plain fp8_dm."""
    return "fp8_dm_keep" if "fp8_dm_keep" in row["tf"] else "fp8_dm"


def peers_of(row):
    """name -> (forward ms, backward ms) of ours BF16, fp8_dm and cuDNN BF16 at its best (each
    direction its fastest call), with the cuDNN calls chosen; missing times are None."""
    tf, tb = row["tf"], row["tb"]
    fp8 = fp8_name(row)
    cf_name, cf = best_of(tf, CUDNN_PREFIX)
    cb_name, cb = best_of(tb, CUDNN_PREFIX)
    return {"ours": (tf.get("ours"), tb.get("ours")), "fp8_dm": (tf.get(fp8), tb.get(fp8)),
            "cudnn": (cf, cb)}, (cf_name, cb_name)


def _cell(x, fmt="{:.1f}"):
    return fmt.format(x) if x is not None else "n/a"


def _ratio(a, b):
    return a / b if a is not None and b else None


def judging_table(rows):
    """The issue's attention table: forward, backward and forward + backward TFLOP/s of ours BF16,
    ours fp8_dm and cuDNN BF16 at its best call, per T, with fp8_dm's ratios to both; lines."""
    out = ["| T | B | ours BF16 f | fp8_dm f | cuDNN BF16 f | ours BF16 b | fp8_dm b | cuDNN BF16 b | "
           "ours BF16 f+b | fp8_dm f+b | cuDNN BF16 f+b | fp8_dm / ours f+b | fp8_dm / cuDNN f+b | cuDNN call f / b |",
           "|---" * 14 + "|"]
    for r in rows:
        p, (cf_name, cb_name) = peers_of(r)
        f = {n: tflops(r["ff"], v[0]) for n, v in p.items()}
        b = {n: tflops(r["fb"], v[1]) for n, v in p.items()}
        fb = {n: tflops(r["ff"] + r["fb"], v[0] + v[1]) if v[0] and v[1] else None for n, v in p.items()}
        names = ("ours", "fp8_dm", "cudnn")
        out.append(f"| {label(r['T'])} | {r['B']} | " + " | ".join(_cell(f[n]) for n in names) + " | "
                   + " | ".join(_cell(b[n]) for n in names) + " | " + " | ".join(_cell(fb[n]) for n in names)
                   + f" | {_cell(_ratio(fb['fp8_dm'], fb['ours']), '{:.2f}')} | "
                   f"{_cell(_ratio(fb['fp8_dm'], fb['cudnn']), '{:.2f}')} | {cf_name or 'n/a'} / {cb_name or 'n/a'} |")
    fp8 = {fp8_name(r) for r in rows} or {"fp8_dm"}
    out.append(f"TFLOP/s (fwd 4BHT^2d/2, bwd 2.5x; f+b: both FLOPs over both times); fp8_dm = "
               f"{' / '.join(sorted(fp8))} ('_keep': kept Q, K, V codes, the trainer's default); cuDNN BF16 = the "
               f"fastest of its calls per direction (cuDNN call: the layout of q, k, v, dO and the entry point)")
    return out


def published_lines(rows):
    """The same-run TFLOP/s against NVIDIA's published cuDNN figures: cuDNN BF16 (how close the
    peer comes), ours BF16 against cuDNN BF16's, ours fp8_dm against cuDNN FP8's; lines."""
    out = [f"against the published cuDNN figures ({PUBLISHED_SOURCE}); same run / published:"]
    for r in rows:
        p, _ = peers_of(r)
        for (prec, d, T), pub in sorted(PUBLISHED.items()):
            if T != r["T"]:
                continue
            i, flop = (0, r["ff"]) if d == "fwd" else (1, r["fb"])
            who = ["cudnn", "ours"] if prec == "bf16" else ["fp8_dm"]
            cells = []
            for n in who:
                x = tflops(flop, p[n][i])
                shown = {"cudnn": "cuDNN BF16 (same run)", "ours": "ours BF16", "fp8_dm": "ours fp8_dm"}[n]
                cells.append(f"{shown} {_cell(x)} ({_cell(_ratio(x, pub), '{:.2f}')}x)")
            out.append(f"  {label(T)} {d}: published cuDNN {prec.upper()} {pub:.0f}; " + ", ".join(cells))
    if len(out) == 1:
        out.append("  (no T with a published figure was timed)")
    return out


def target_lines(rows):
    """The issue's attention targets at T = 4K-8K: fp8_dm forward + backward >= 1.3x ours BF16's,
    and fp8_dm backward >= 1.4x ours BF16's; lines, each naming the T met and missed."""
    out = []
    for what, want, pick in (("fwd+bwd", 1.3, lambda v: v[0] + v[1] if v[0] and v[1] else None),
                             ("bwd", 1.4, lambda v: v[1])):
        got = []
        for r in rows:
            if not 4096 <= r["T"] <= 8192:
                continue
            p, _ = peers_of(r)
            x = _ratio(pick(p["ours"]), pick(p["fp8_dm"]))  # time ratio = speed ratio
            if x is not None:
                got.append((r["T"], x))
        if not got:
            out.append(f"target fp8_dm {what} >= {want}x ours BF16 at T 4K-8K: not measured")
            continue
        met = [f"{label(T)} {x:.2f}" for T, x in got if x >= want]
        missed = [f"{label(T)} {x:.2f}" for T, x in got if x < want]
        verdict = "MET" if not missed else "NOT MET"
        out.append(f"target fp8_dm {what} >= {want}x ours BF16 at T 4K-8K: {verdict}"
                   + (f"; met at {', '.join(met)}" if met else "") + (f"; missed at {', '.join(missed)}" if missed else ""))
    return out
