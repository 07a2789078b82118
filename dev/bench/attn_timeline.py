#!/usr/bin/env python3
"""attn_timeline.py: where the attention kernels' time goes, CTA by CTA (tile by tile for the
persistent FP8 forward). Needs a library built with -DATTN_TIMELINE (scripts/gpu_attn_timeline.sh),
whose kernels write timestamps at six marks (attention/cta_timeline.cuh) and the SM's clock:
  backward (our BF16, the FP8 main pass): entry (0), first operands in (1), end of the two
  diagonal query blocks (2), end of the loop (3), last dQ reduction / both consumers done (4), exit (5);
  forward (our BF16 per CTA, the FP8 forward per tile): start (0), key block 0 in (1), its softmax
  done (2), the block loop done (3), the last PV done (4), the epilogue done (5).

Causal, B*T fixed, H=16, d=128; for each mode (bf16 = our kernels; fp8_naive, fp8_dm with kept
codes: the same FP8 kernels, D differs) it runs the call a few times, records one, and splits the
SMs' time over the kernel's span into: idle before the SM's first record, each record's phases,
the gaps between consecutive records on the SM (CTA turnover, or the persistent forward's tile
switch), and idle after its last. Also the mean phase lengths, per iteration for the loop, and
the SM clock rate the kernel ran at (clock64 over %globaltimer). Timing instrumentation only: one
thread's few extra stores per record cost little, but compare spans only within a run.

  python3 dev/bench/attn_timeline.py --lib /tmp/gpu_tl_build/libattn_fp8.so [--T 2048 8192] [--modes ...] [--dirs fwd bwd]
"""
import argparse
import ctypes
import sys

import torch

from bench_attention_fp8 import MODES, Shim

# the kernels shim_timeline records: (which, key, mode's direction)
KERNELS = {("bf16", "bwd"): 0, ("fp8", "bwd"): 1, ("bf16", "fwd"): 2, ("fp8", "fwd"): 3}
N_REC = 1 << 16
# phases between marks (cta_timeline.cuh records 0..5), per direction; "loop" is per iteration
PHASES = {
    "bwd": (("prologue", 0, 1), ("diagonal", 1, 2), ("loop", 2, 3), ("last dQ", 3, 4), ("epilogue", 4, 5)),
    "fwd": (("wait K0", 0, 1), ("block 0", 1, 2), ("loop", 2, 3), ("last PV", 3, 4), ("epilogue", 4, 5)),
}
HEAD = {"bwd": 2, "fwd": 1}  # work items before the loop phase: the 2 diagonal query blocks, key block 0


def analyse(rec, direction):
    """rec: (N, 9) int64 rows t0..t5, clk0, clk1, smid | work << 32 (one per CTA, or per tile of a
    persistent kernel). Returns (summary dict, SM-time share per phase, incl. idle and gaps)."""
    rec = rec[(rec[:, 0] != 0) & (rec[:, 5] != 0)]
    t = rec[:, :6].double()
    clk = (rec[:, 7] - rec[:, 6]).double()
    smid = (rec[:, 8] & 0xffffffff).long()
    work = (rec[:, 8] >> 32).long()
    t0min, t5max = t[:, 0].min(), t[:, 5].max()
    span = float(t5max - t0min)
    sms = torch.unique(smid)
    head = HEAD[direction]
    # a record without the loop's start mark (work <= head, or a loop form that records none):
    # its marks 1..4 count as the phase before the first missing one
    for i in range(4, 0, -1):
        miss = t[:, i] == 0
        t[miss, i] = t[miss, i + 1]
    ph = {name: t[:, b] - t[:, a] for name, a, b in PHASES[direction]}
    shares = {"head idle": 0.0, **{name: float(v.sum()) for name, v in ph.items()}, "gaps": 0.0, "tail idle": 0.0}
    gaps = []
    for sm in sms.tolist():
        ts = t[smid == sm]
        ts = ts[torch.argsort(ts[:, 0])]
        shares["head idle"] += float(ts[0, 0] - t0min)
        shares["tail idle"] += float(t5max - ts[-1, 5])
        if len(ts) > 1:
            g = ts[1:, 0] - ts[:-1, 5]
            gaps.append(g)
            shares["gaps"] += float(g.sum())
    g = torch.cat(gaps) if gaps else torch.zeros(1, dtype=torch.float64)
    for k in shares:
        shares[k] /= span * len(sms)
    names = [name for name, _, _ in PHASES[direction]]
    n_loop = (work - head).clamp(min=0).double().sum()
    summ = {
        "items": len(rec), "sms": len(sms), "span_us": span / 1e3, "items_per_sm": len(rec) / len(sms),
        names[0]: float(ph[names[0]].mean()) / 1e3,
        names[1] + " per it": float(ph[names[1]].sum() / work.clamp(max=head).double().sum()) / 1e3,
        "loop per it": float(ph["loop"].sum() / n_loop) / 1e3 if n_loop > 0 else float("nan"),
        names[3]: float(ph[names[3]].mean()) / 1e3, names[4]: float(ph[names[4]].mean()) / 1e3,
        "gap": float(g.mean()) / 1e3, "gap max": float(g.max()) / 1e3,
        "clock_ghz": float(clk.sum() / (t[:, 5] - t[:, 0]).sum()),
    }
    return summ, shares


def print_epilogue_split(rec, T, mode):
    """-DATTN_TIMELINE_EPI: the FP8 forward's marks 1, 2 lie in the epilogue (after the warpgroup's
    barrier, after the O store's issue): mean µs per tile from the last PV to each, and to the end."""
    rec = rec[(rec[:, 0] != 0) & (rec[:, 5] != 0) & (rec[:, 1] != 0)]
    t = rec[:, :6].double()
    parts = {"last PV added -> barrier passed": (4, 1), "-> O staged, store issued": (1, 2),
             "-> LSE stored (end)": (2, 5), "whole epilogue": (4, 5), "last PV": (3, 4)}
    cells = " | ".join(f"{k} {float((t[:, b] - t[:, a]).mean()) / 1e3:.3f}" for k, (a, b) in parts.items())
    print(f"T {T // 1024}K {mode} FP8 forward epilogue, µs per tile ({len(rec)} tiles): {cells}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--T", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--modes", nargs="+", default=["bf16", "fp8_naive", "fp8_dm"])
    ap.add_argument("--dirs", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    ap.add_argument("--epi", action="store_true",
                    help="the library was built with -DATTN_TIMELINE_EPI: split the FP8 forward's epilogue")
    a = ap.parse_args()
    shim = Shim(a.lib)
    lib = shim.lib
    lib.shim_timeline.argtypes = [ctypes.c_int, ctypes.c_void_p]
    lib.shim_timeline.restype = ctypes.c_int
    if any(lib.shim_timeline(w, None) != 0 for w in KERNELS.values()):
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
            calls = {"fwd": lambda: fwd(p, o.data_ptr(), lse.data_ptr()),
                     "bwd": lambda: bwd(p, o.data_ptr(), lse.data_ptr(), dqkv.data_ptr())}
            for direction in a.dirs:
                if direction == "fwd" and m == "fp8_naive":
                    continue  # the same forward kernel as fp8_dm's
                which = KERNELS[("bf16" if m == "bf16" else "fp8", direction)]
                calls["fwd"]()
                for _ in range(3):
                    calls[direction]()
                rec = torch.zeros(N_REC, 9, dtype=torch.int64, device="cuda")
                torch.cuda.synchronize()
                if lib.shim_timeline(which, rec.data_ptr()) != 0:
                    sys.exit("shim_timeline failed")
                calls[direction]()
                torch.cuda.synchronize()
                lib.shim_timeline(which, None)
                if a.epi and which == KERNELS[("fp8", "fwd")]:
                    print_epilogue_split(rec.cpu(), T, m)
                    continue
                summ, shares = analyse(rec.cpu(), direction)
                rows.append((T, m, direction, summ, shares))
                print(f"T={T} {m} {direction}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                          for k, v in summ.items()), flush=True)
                print("   SM time: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in shares.items()), flush=True)
    lib.shim_free()
    for direction in a.dirs:
        names = [n for n, _, _ in PHASES[direction]]
        sel = [r for r in rows if r[2] == direction]
        if not sel:
            continue
        unit = "CTA" if direction == "bwd" else "CTA or tile"
        print(f"\n{direction}: one record per {unit}; µs per {unit} unless 'per it' (per iteration); SM time in %")
        print(f"| T | kernel | per SM | span ms | {names[0]} | {names[1]} per it | loop per it | {names[3]} | {names[4]} "
              f"| gap (max) | SM clock GHz | SM time: " + " / ".join(sel[0][4].keys()) + " |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for T, m, _, s_, sh in sel:
            name = ("ours bf16" if m == "bf16" else f"FP8 ({m})")
            print(f"| {T // 1024}K | {name} | {s_['items_per_sm']:.1f} | {s_['span_us'] / 1e3:.3f} | {s_[names[0]]:.2f} "
                  f"| {s_[names[1] + ' per it']:.2f} | {s_['loop per it']:.2f} | {s_[names[3]]:.2f} | {s_[names[4]]:.2f} "
                  f"| {s_['gap']:.2f} ({s_['gap max']:.1f}) | {s_['clock_ghz']:.2f} | "
                  + " / ".join(f"{100 * v:.1f}" for v in sh.values()) + " |")


if __name__ == "__main__":
    main()
