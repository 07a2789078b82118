#!/usr/bin/env python3
"""fwd_fp8_series.py: where the spread of the bare FP8 forward's time between launches comes from.

At T = 8K the same kernel on the same codes takes anywhere in ~0.58-0.64 ms from one launch to the
next within one benchmark run (bench_attention_fp8.py's [min, max]), our BF16 forward ~0.77-0.81.
This times single launches in series, each with its own CUDA events, in four arrangements:
  dyn        the FP8 forward back to back, tiles from the counter (the default schedule)
  static     the same with the fixed snake order (gpu_test_hooks.fwd_fp8_static_order)
  alt_ours   FP8 forward and our BF16 forward alternating (as the benchmark's rounds do)
  alt_sleep  FP8 forward after ~1 ms of GPU spin each time (an idle-ish GPU before every launch)
and prints, per arrangement, the min / median / max, the share of launches more than 4% above the
min, and the first launches' times in order (a drift over the series shows there). The SM clock is
sampled by nvidia-smi every 20 ms meanwhile (its min / median / max per arrangement).

  python3 dev/bench/fwd_fp8_series.py --lib build/gpu_sh/attn/libattn_fp8.so [--T 8192] [--n 60]
"""
import argparse
import ctypes
import time

import torch

from bench_attention import GpuSampler, Ours, time_each
from bench_attention_fp8 import Shim


class AttentionHooks(ctypes.Structure):
    """The attention section of GpuTestHooks (gpu/test_hooks.h), which starts the struct: enough of
    it to reach those fields of the library's gpu_test_hooks."""
    _fields_ = [("fwd_bf16_no_o_tma", ctypes.c_int), ("fwd_fp8_no_o_tma", ctypes.c_int),
                ("fwd_fp8_max_ctas", ctypes.c_int), ("fwd_fp8_static_order", ctypes.c_int)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--n-long", type=int, default=0,
                    help="also run the FP8 forward and ours this many times each back to back (seconds of load: "
                         "does the time drift as the board heats or reaches its power cap?)")
    a = ap.parse_args()
    T, H, d = a.T, a.H, 128
    B = max(a.tokens // T, 1)
    shim = Shim(a.lib)
    lib = shim.lib
    hooks = AttentionHooks.in_dll(lib, "gpu_test_hooks")
    ours = Ours(a.lib)
    torch.manual_seed(T)
    qkv = torch.rand(B, T, 3, H, d, device="cuda", dtype=torch.bfloat16) * 4 - 2
    dout = torch.rand(B, T, H, d, device="cuda", dtype=torch.bfloat16) * 4 - 2
    ours_fwd, _, _ = ours.setup(qkv, dout, B, H, T, d)
    if lib.shim_init(qkv.data_ptr(), dout.data_ptr(), B, H, T, d, 0, torch.cuda.current_stream().cuda_stream):
        raise SystemExit("shim_init failed")
    o8 = torch.empty(B, T, H, d, device="cuda", dtype=torch.bfloat16)
    lse8 = torch.empty(B, H, T, device="cuda", dtype=torch.float32)
    lib.shim_quant(0)
    fp8 = lambda: lib.shim_fp8_fwd(o8.data_ptr(), lse8.data_ptr())
    flop = 4 * B * H * T * T * d / 2
    for _ in range(5):
        fp8(), ours_fwd()
    torch.cuda.synchronize()
    smi = GpuSampler()
    time.sleep(0.5)
    marks, res = [], {}
    arr = [("dyn", fp8, None, 0), ("static", fp8, None, 1), ("alt_ours", fp8, ours_fwd, 0),
           ("alt_sleep", fp8, lambda: torch.cuda._sleep(2_000_000), 0), ("ours", ours_fwd, None, 0)]
    if a.n_long:
        arr += [("fp8_long", fp8, None, 0), ("ours_long", ours_fwd, None, 0)]
    for name, fn, before, static_order in arr:
        hooks.fwd_fp8_static_order = static_order
        t0 = time.time()
        res[name] = time_each(fn, a.n_long if name.endswith("_long") else a.n, before)
        marks.append((name, t0, time.time()))
        hooks.fwd_fp8_static_order = 0
        time.sleep(0.2)
    smi.stop()
    print(f"# T={T} B={B} H={H} d={d}, {a.n} launches per arrangement; {torch.cuda.get_device_name()}")
    print("| arrangement | min ms | median ms | max ms | TFLOP/s at median | > 1.04 min | SM MHz min/med/max | W max | first 12 launches (ms) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, t0, t1 in marks:
        t = sorted(res[name])
        med = t[len(t) // 2]
        slow = sum(x > 1.04 * t[0] for x in t) / len(t)
        clk = sorted(sp[1] for sp in smi.between(t0, t1))
        pw = [sp[2] for sp in smi.between(t0, t1)]
        clks = f"{clk[0]:.0f}/{clk[len(clk) // 2]:.0f}/{clk[-1]:.0f}" if clk else "-"
        print(f"| {name} | {t[0]:.3f} | {med:.3f} | {t[-1]:.3f} | {flop / med / 1e9:.1f} | {slow:.0%} | {clks} | "
              f"{max(pw) if pw else 0:.0f} | " + " ".join(f"{x:.3f}" for x in res[name][:12]) + " |")
    for name, t0, t1 in marks:
        if not name.endswith("_long"):
            continue
        # the long series in tenths: median ms, and the clock, power and clock-event reasons sampled meanwhile
        x, n = res[name], len(res[name])
        print(f"# {name}: {n} launches back to back in {t1 - t0:.1f} s; per tenth of the series: median ms | SM MHz "
              "median | W median | reasons seen")
        for k in range(10):
            part = sorted(x[k * n // 10:(k + 1) * n // 10])
            ta, tb = t0 + (t1 - t0) * k / 10, t0 + (t1 - t0) * (k + 1) / 10
            sm = smi.between(ta, tb)
            clk = sorted(sp[1] for sp in sm)
            pw = sorted(sp[2] for sp in sm)
            rs = sorted(set(sp[3] for sp in sm))
            print(f"#   {k}: {part[len(part) // 2]:.3f} | {clk[len(clk) // 2] if clk else 0:.0f} | "
                  f"{pw[len(pw) // 2] if pw else 0:.0f} | {' '.join(rs)}")
    lib.shim_free()


if __name__ == "__main__":
    main()
