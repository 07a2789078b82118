#!/usr/bin/env python3
"""attn_timeline.py: where the main backward kernels' time goes, CTA by CTA. Needs a library
built with -DATTN_TIMELINE (scripts/gpu_attn_timeline.sh), whose kernels write per-CTA
timestamps (src/cta_timeline.cuh): entry (0), first operands in (1), end of the two diagonal
query blocks (2), end of the loop (3), last dQ / both consumers done (4), exit (5).

For our BF16 backward and the FP8 main backward (fp8_naive and fp8_dm: the same main kernel,
different D), causal, B*T fixed, H=16, d=128, it runs the mode's backward through the API a few
times, records one call, and splits the SMs' time over the kernel's span into: idle before the
SM's first CTA, each CTA's phases, the gaps between consecutive CTAs on the SM, and idle after
its last. Also the mean phase lengths, per iteration for the loop. Timing instrumentation only:
thread 0's few extra stores per CTA cost nothing measurable, but compare spans only within a run.

  python3 bench/attn_timeline.py --lib /tmp/gpu_tl_build/libattn_fp8.so [--T 2048 8192] [--modes ...]
"""
import argparse
import ctypes
import sys

import torch

from bench_attention_fp8 import MODES, Shim

WHICH = {"bf16": 0, "fp8_naive": 1, "fp8_dm": 1}  # shim_timeline's kernel
N_REC = 1 << 16
PHASES = ("head idle", "prologue", "diagonal", "loop", "last dQ", "epilogue", "gaps", "tail idle")


def analyse(rec):
    """rec: (N, 7) int64 rows t0..t5, smid | work << 32. Returns (summary dict, per-phase SM shares)."""
    rec = rec[(rec[:, 0] != 0) & (rec[:, 5] != 0)]
    t = rec[:, :6].double()
    smid = (rec[:, 6] & 0xffffffff).long()
    work = (rec[:, 6] >> 32).long()
    t0min, t5max = t[:, 0].min(), t[:, 5].max()
    span = float(t5max - t0min)
    sms = torch.unique(smid)
    shares = dict.fromkeys(PHASES, 0.0)
    has2 = t[:, 2] > 0
    loop_end_diag = torch.where(has2, t[:, 2], t[:, 3])
    ph = {
        "prologue": t[:, 1] - t[:, 0],
        "diagonal": loop_end_diag - t[:, 1],
        "loop": torch.where(has2, t[:, 3] - t[:, 2], torch.zeros_like(t[:, 0])),
        "last dQ": t[:, 4] - t[:, 3],
        "epilogue": t[:, 5] - t[:, 4],
    }
    for k, v in ph.items():
        shares[k] = float(v.sum())
    gaps = []
    for s in sms.tolist():
        m = smid == s
        ts = t[m]
        order = torch.argsort(ts[:, 0])
        ts = ts[order]
        shares["head idle"] += float(ts[0, 0] - t0min)
        shares["tail idle"] += float(t5max - ts[-1, 5])
        if len(ts) > 1:
            g = ts[1:, 0] - ts[:-1, 5]
            gaps.append(g)
            shares["gaps"] += float(g.sum())
    g = torch.cat(gaps) if gaps else torch.zeros(1, dtype=torch.float64)
    total = span * len(sms)
    for k in shares:
        shares[k] /= total
    n_loop = (work - 2).clamp(min=0)[has2].double()
    summ = {
        "ctas": len(rec), "sms": len(sms), "span_us": span / 1e3,
        "prologue_us": float(ph["prologue"].mean()) / 1e3,
        "diag_us_per_it": float(ph["diagonal"].sum() / work.clamp(max=2).double().sum()) / 1e3,
        "loop_us_per_it": float(ph["loop"].sum() / n_loop.sum()) / 1e3 if n_loop.sum() > 0 else float("nan"),
        "lastdq_us": float(ph["last dQ"].mean()) / 1e3,
        "epi_us": float(ph["epilogue"].mean()) / 1e3,
        "gap_us": float(g.mean()) / 1e3, "gap_max_us": float(g.max()) / 1e3,
        "min_gap_us": float(g.min()) / 1e3,
        "ctas_per_sm": len(rec) / len(sms),
    }
    return summ, shares


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--T", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--modes", nargs="+", default=["bf16", "fp8_naive", "fp8_dm"])
    a = ap.parse_args()
    shim = Shim(a.lib)
    lib = shim.lib
    lib.shim_timeline.argtypes = [ctypes.c_int, ctypes.c_void_p]
    lib.shim_timeline.restype = ctypes.c_int
    if lib.shim_timeline(1, None) != 0 or lib.shim_timeline(0, None) != 0:
        sys.exit("the library has no timelines: build it with EXTRA_NVF=-DATTN_TIMELINE")
    stream = torch.cuda.current_stream().cuda_stream
    rows = []
    for T in a.T:
        B = max(a.tokens // T, 1)
        H, d = a.H, a.d
        torch.manual_seed(T)
        qkv = torch.rand(B, T, 3, H, d, device="cuda", dtype=torch.bfloat16) * 4 - 2
        dout = torch.rand(B, T, H, d, device="cuda", dtype=torch.bfloat16) * 4 - 2
        if lib.shim_init(qkv.data_ptr(), dout.data_ptr(), B, H, T, d, 0, stream) != 0:
            sys.exit(f"shim_init failed at T={T}")
        for m in a.modes:
            p = MODES[m]
            o = torch.empty(B, T, H, d, device="cuda", dtype=torch.bfloat16)
            lse = torch.empty(B, H, T, device="cuda", dtype=torch.float32)
            dqkv = torch.empty_like(qkv)
            keep = m != "bf16"  # the trainer's default for the FP8 modes: the forward's codes kept
            fwd = lib.shim_fwd_keep if keep else lib.shim_fwd
            bwd = lib.shim_bwd_keep if keep else lib.shim_bwd
            fwd(p, o.data_ptr(), lse.data_ptr())
            for _ in range(3):
                bwd(p, o.data_ptr(), lse.data_ptr(), dqkv.data_ptr())
            rec = torch.zeros(N_REC, 7, dtype=torch.int64, device="cuda")
            torch.cuda.synchronize()
            if lib.shim_timeline(WHICH[m], rec.data_ptr()) != 0:
                sys.exit("shim_timeline failed")
            bwd(p, o.data_ptr(), lse.data_ptr(), dqkv.data_ptr())
            torch.cuda.synchronize()
            lib.shim_timeline(WHICH[m], None)
            summ, shares = analyse(rec.cpu())
            rows.append((T, m, summ, shares))
            print(f"T={T} {m}: {summ}", flush=True)
            print("   SM time: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in shares.items()), flush=True)
    lib.shim_free()
    print("\n| T | kernel | CTAs/SM | span ms | prologue µs | diagonal µs/it | loop µs/it | last dQ µs | epilogue µs "
          "| gap µs (max) | SM time: " + " / ".join(PHASES) + " % |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for T, m, s, sh in rows:
        name = "ours bf16" if m == "bf16" else f"FP8 main ({m})"
        print(f"| {T // 1024}K | {name} | {s['ctas_per_sm']:.1f} | {s['span_us'] / 1e3:.3f} | {s['prologue_us']:.2f} "
              f"| {s['diag_us_per_it']:.2f} | {s['loop_us_per_it']:.2f} | {s['lastdq_us']:.2f} | {s['epi_us']:.2f} "
              f"| {s['gap_us']:.2f} ({s['gap_max_us']:.1f}) | "
              + " / ".join(f"{100 * v:.1f}" for v in sh.values()) + " |")


if __name__ == "__main__":
    main()
