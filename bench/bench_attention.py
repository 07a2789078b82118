#!/usr/bin/env python3
"""bench_attention.py: our fused causal BF16 attention against PyTorch SDPA (cuDNN and
FlashAttention-2 backends), forward and backward timed separately, B*T fixed, H=16, d=128,
T = 1K, 2K, 4K, 8K. TFLOP/s with forward 4*B*H*T^2*d/2 and backward 2.5x that (causal).

Our numbers come from the standalone binary bench/bench_attention.cu (run as a subprocess,
median of CUDA-event-timed runs after warm-up); PyTorch's are timed here the same way.

  python3 bench/bench_attention.py --ours build/bench_attention [--tokens 16384] [--T 1024 2048]
"""
import argparse
import re
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def flops(B, H, T, d):
    fwd = 4.0 * B * H * T * T * d / 2.0
    return fwd, 2.5 * fwd


def time_ms(fn, warmup=5, iters=30):
    """Median milliseconds of fn() over iters runs, each between its own CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    times.sort()
    return times[len(times) // 2]


def bench_torch(backend, B, H, T, d):
    """(fwd_ms, bwd_ms) of SDPA with one backend, q/k/v views of a packed (B, T, 3, H, d) tensor."""
    qkv = (torch.rand(B, T, 3, H, d, device="cuda", dtype=torch.bfloat16) * 4 - 2).requires_grad_(True)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (B, H, T, d) views
    dout = torch.rand(B, H, T, d, device="cuda", dtype=torch.bfloat16) * 4 - 2
    with sdpa_kernel(backend):
        with torch.no_grad():
            fwd = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # autograd.grad returns fresh gradients (no accumulation kernel into .grad)
        bwd = time_ms(lambda: torch.autograd.grad(out, (qkv,), dout, retain_graph=True))
    return fwd, bwd


def run_ours(binary, tokens, H, d, Ts):
    res = {}
    cmd = [binary, str(tokens), str(H), str(d)] + [str(t) for t in Ts]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    for line in text.splitlines():
        m = re.search(r"T=(\d+) .*fwd_ms=([\d.]+) .*bwd_ms=([\d.]+)", line)
        if m:
            res[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", help="path of the bench_attention binary (omit to time PyTorch only)")
    ap.add_argument("--tokens", type=int, default=16384, help="B*T")
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--T", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    a = ap.parse_args()

    ours = run_ours(a.ours, a.tokens, a.H, a.d, a.T) if a.ours else {}
    backends = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)]
    rows = []
    for T in a.T:
        B = max(a.tokens // T, 1)
        ff, fb = flops(B, a.H, T, a.d)
        r = {"T": T, "B": B}
        if T in ours:
            r["ours"] = (ff / ours[T][0] / 1e9, fb / ours[T][1] / 1e9)  # ms -> TFLOP/s
        for name, be in backends:
            try:
                fwd, bwd = bench_torch(be, B, a.H, T, a.d)
                r[name] = (ff / fwd / 1e9, fb / bwd / 1e9)
            except Exception as e:  # a backend PyTorch cannot run here is reported, not fatal
                print(f"# {name} T={T}: {type(e).__name__}: {str(e).splitlines()[0][:120]}", file=sys.stderr)
        rows.append(r)
        torch.cuda.empty_cache()

    def cell(r, name, i):
        return f"{r[name][i]:7.1f}" if name in r else "    n/a"

    def ratio(r, name, i):
        return f"{r['ours'][i] / r[name][i]:5.2f}" if "ours" in r and name in r else "  n/a"

    print(f"causal attention, BF16, H={a.H}, d={a.d}, B*T={a.tokens}; TFLOP/s "
          f"(fwd 4BHT^2d/2, bwd 2.5x); torch {torch.__version__}, "
          f"cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    print("    T    B | ours_f cudnn_f   fa2_f | ours_b cudnn_b   fa2_b | f/cud f/fa2 b/cud b/fa2")
    for r in rows:
        print(f"{r['T']:5d} {r['B']:4d} | {cell(r, 'ours', 0)} {cell(r, 'cudnn', 0)} {cell(r, 'fa2', 0)} | "
              f"{cell(r, 'ours', 1)} {cell(r, 'cudnn', 1)} {cell(r, 'fa2', 1)} | "
              f"{ratio(r, 'cudnn', 0)} {ratio(r, 'fa2', 0)} {ratio(r, 'cudnn', 1)} {ratio(r, 'fa2', 1)}")


if __name__ == "__main__":
    main()
