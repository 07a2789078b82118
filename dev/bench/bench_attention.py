#!/usr/bin/env python3
"""bench_attention.py: our fused causal BF16 attention (attention/kernels_bf16.h) against PyTorch SDPA's
cuDNN and FlashAttention-2 backends, forward and backward timed separately, B*T fixed, H=16,
d=128, T = 1K, 2K, 4K, 8K. TFLOP/s with forward 4*B*H*T^2*d/2 and backward 2.5x that (causal;
dev/bench/peer_tables.py).

cuDNN is called every way cudnn_variants knows (the packed qkv's strided views; separate
contiguous q, k, v, dO in (B, H, T, d) or (B, T, H, d), through autograd or the aten ops
directly) and its column is the fastest of them per direction: the peer at its best. With
--nvidia-shape it runs only cuDNN BF16, at cudnn-frontend's published training shape (batch 1,
64 heads of 128, T 4K and 8K; their runs use 8 KV heads), and sets the result beside NVIDIA's
published H200 figures.

Our kernels are called in this process through ctypes from the attention library (the kernels, the
dispatcher and dev/bench's shims; `bash scripts/gpu.sh bench attention` builds it as
build/gpu_sh/attn/libattn_fp8.so), so every implementation runs on the same tensors and the timings
interleave: each round times one call of every implementation, in a rotating order, between its own
CUDA events; the table gives the median over the rounds. Interleaving spreads clock and thermal
drift evenly over the implementations instead of letting the one timed last run on a hotter, slower
chip.

"ours" is the library's forward and backward. Other forms of the forward (mma.sync, cp.async
loads) are lab versions in dev/cuda/, each timed against the library's by its own program.

  python3 dev/bench/bench_attention.py --lib build/gpu_sh/attn/libattn_fp8.so [--tokens 16384]
                                   [--T 1024 2048] [--rounds 30] [--nvidia-shape]
"""
import argparse
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from peer_tables import CUDNN_PREFIX, PUBLISHED, PUBLISHED_SOURCE, best_of
from peer_tables import attn_flops as flops


class Ours:
    """The attention library's BF16 forward and backward, from a copy of the library of its own."""

    def __init__(self, lib_path):
        tmp = tempfile.mkdtemp(prefix="attn_bench_")
        path = os.path.join(tmp, "libattn_ours.so")
        shutil.copy(lib_path, path)  # a separate copy: static state apart from the other users of lib_path
        self.lib = ctypes.CDLL(path)
        self.lib.attn_gpu_backward_workspace_bytes.restype = ctypes.c_size_t
        P, I = ctypes.c_void_p, ctypes.c_int
        self.lib.attn_gpu_forward.argtypes = [P, P, P, I, P, I, P, I, I, I, I, P]
        self.lib.attn_gpu_backward.argtypes = [P, P, P, I, P, P, I, P, P, P, P, I, P, I, I, I, I, P]
        self.lib.attn_gpu_backward_workspace_bytes.argtypes = [I, I, I, I]

    def setup(self, qkv, dout, B, H, T, d):
        """Closures (fwd, bwd) over packed qkv (B, T, 3, H, d) and dout (B, T, H, d), and the
        forward's output tensors (o, lse)."""
        C = H * d
        o = torch.empty(B, T, H, d, device="cuda", dtype=torch.bfloat16)
        lse = torch.empty(B, H, T, device="cuda", dtype=torch.float32)
        dqkv = torch.empty_like(qkv)
        ws = torch.empty(self.lib.attn_gpu_backward_workspace_bytes(B, H, T, d), device="cuda",
                         dtype=torch.uint8)
        q, k, v = (qkv.data_ptr() + i * C * 2 for i in range(3))
        dq, dk, dv = (dqkv.data_ptr() + i * C * 2 for i in range(3))
        stream = torch.cuda.current_stream().cuda_stream
        lib = self.lib

        def fwd():
            lib.attn_gpu_forward(q, k, v, 3 * C, o.data_ptr(), C, lse.data_ptr(), B, H, T, d, stream)

        def bwd():
            lib.attn_gpu_backward(q, k, v, 3 * C, o.data_ptr(), dout.data_ptr(), C, lse.data_ptr(),
                                  dq, dk, dv, 3 * C, ws.data_ptr(), B, H, T, d, stream)

        fwd()  # the backward needs this forward's o and lse
        return fwd, bwd, (o, lse)


def torch_setup(backend, qkv, dout_bhtd):
    """Closures (fwd, bwd) of SDPA with one backend on (B, H, T, d) views of the packed qkv. The
    timed forward is a training one (the inputs require grad: the backend writes the LSE the
    backward reads, as our forward does)."""
    leaf = qkv.detach().requires_grad_(True)
    q, k, v = (leaf[:, :, i].transpose(1, 2) for i in range(3))

    def fwd():
        with sdpa_kernel(backend):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def bwd():
        # autograd.grad returns fresh gradients (no accumulation into .grad)
        with sdpa_kernel(backend):
            torch.autograd.grad(out, (leaf,), dout_bhtd, retain_graph=True)

    fwd()
    bwd()  # fails here, not mid-timing, if the backend cannot run this shape
    return fwd, bwd


def _cudnn_autograd(q, k, v, dout_like):
    """Closures (fwd, bwd) of SDPA with only cuDNN enabled, through autograd, on leaves q, k, v
    (B, H, T, d) of any strides, and the forward's outputs; dO gets the output's strides (a dO of
    other strides is copied first by the backward). The timed forward is a training one: the
    inputs require grad, so cuDNN writes the LSE too."""
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    dout = torch.empty_like(out)  # the output's strides
    dout.copy_(dout_like)

    def fwd():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def bwd():  # autograd.grad: fresh gradients each call, nothing accumulated
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    return fwd, bwd, out


def _cudnn_ops(q, k, v, dout_like):
    """Closures (fwd, bwd) of the aten cuDNN attention ops called directly (no autograd), and the
    forward's output; raises where this PyTorch's ops take other arguments."""
    fwd_op = torch.ops.aten._scaled_dot_product_cudnn_attention
    bwd_op = torch.ops.aten._scaled_dot_product_cudnn_attention_backward
    res = fwd_op(q, k, v, None, True, 0.0, True, False)  # attn_bias, LSE, dropout, causal, debug mask
    out, lse, cum_q, cum_k, max_q, max_k, seed, offset = res[:8]
    dout = torch.empty_like(out)
    dout.copy_(dout_like)

    def fwd():
        fwd_op(q, k, v, None, True, 0.0, True, False)

    def bwd():
        return bwd_op(dout, q, k, v, out, lse, seed, offset, None, cum_q, cum_k, max_q, max_k, 0.0, True)

    return fwd, bwd, out


def cudnn_variants(qkv, dout_bthd, B, H, T, d):
    """cuDNN's BF16 SDPA (causal) on the values of qkv (B, T, 3, H, d) and dO (B, T, H, d), every
    way it can be called: 'packed' (strided (B, H, T, d) views of the packed qkv through autograd:
    torch_setup), 'bhtd' / 'bthd' (separate contiguous q, k, v in
    (B, H, T, d) or (B, T, H, d), through autograd) and 'bhtd_op' / 'bthd_op' (the same through
    the aten ops directly). name -> (fwd, bwd); each variant is run once and its dQ, dK, dV checked
    against the first one's (the same kernels: within BF16 rounding); one that fails to run or
    disagrees is reported on stderr and left out."""
    variants = {}
    try:
        variants["packed"] = torch_setup(SDPBackend.CUDNN_ATTENTION, qkv, dout_bthd.transpose(1, 2))
    except Exception as ex:
        print(f"# cudnn packed T={T}: {type(ex).__name__}: {str(ex).splitlines()[0][:120]}", file=sys.stderr)
    ref = None
    for layout in ("bhtd", "bthd"):
        parts = []
        for i in range(3):
            x = qkv[:, :, i]  # (B, T, H, d)
            x = x.transpose(1, 2).contiguous() if layout == "bhtd" else x.contiguous().transpose(1, 2)
            parts.append(x.detach().requires_grad_(True))  # (B, H, T, d) views of either layout
        for how, setup in (("", _cudnn_autograd), ("_op", _cudnn_ops)):
            name = layout + how
            try:
                fwd, bwd, _ = setup(*parts, dout_bthd.transpose(1, 2))
                fwd()
                grads = bwd()[:3]
                torch.cuda.synchronize()
                if ref is None:
                    ref = [g.float() for g in grads]
                else:
                    err = max(((g.float() - r).norm() / r.norm().clamp_min(1e-30)).item() for g, r in zip(grads, ref))
                    if not err < 1e-2:
                        raise RuntimeError(f"its dQ, dK, dV differ from the first variant's (rel L2 {err:.2e})")
                variants[name] = (fwd, bwd)
            except Exception as ex:  # an entry point this PyTorch lacks, or a layout cuDNN refuses
                print(f"# cudnn {name} T={T}: {type(ex).__name__}: {str(ex).splitlines()[0][:160]}", file=sys.stderr)
    return variants


def time_each(fn, n, before=None):
    """ms of each of n launches of fn, each between its own CUDA events; before() runs first each
    time (untimed). Back to back unless before() makes a gap."""
    ev = []
    for _ in range(n):
        if before:
            before()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        ev.append((e0, e1))
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in ev]


class GpuSampler:
    """nvidia-smi every 20 ms in the background while a benchmark runs: samples (time, SM MHz, W,
    clock-event reasons), each stamped with nvidia-smi's own timestamp (not the time its line reached
    us through the pipe), for the clock a kernel ran at (bench_attention_sustained.py,
    fwd_fp8_series.py). between(t0, t1): the samples taken within host times t0 .. t1 (time.time())."""

    def __init__(self):
        self.samples = []
        self.p = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active",
                                   "--format=csv,noheader,nounits", "-lms", "20"], stdout=subprocess.PIPE, text=True)
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            parts = [x.strip() for x in line.split(",")]
            try:  # "2026/12/02 03:30:01.123, 1980, 690.12, 0x0000000000000004" (local time)
                day, frac = parts[0].split(".")
                ts = time.mktime(time.strptime(day, "%Y/%m/%d %H:%M:%S")) + float("0." + frac)
                self.samples.append((ts, float(parts[1]), float(parts[2]), parts[3] if len(parts) > 3 else ""))
            except (ValueError, IndexError):
                pass  # a header or a field nvidia-smi could not read ("[N/A]")

    def between(self, t0, t1):
        return [x for x in self.samples if t0 <= x[0] <= t1]

    def stop(self):
        self.p.terminate()
        self.t.join(timeout=2)


def time_interleaved(fns, rounds, warmup=3):
    """Median ms of each fn in fns (dict name -> fn): every round runs each once, rotating order."""
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    torch.cuda.synchronize()
    times = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        torch.cuda._sleep(1_000_000)  # ~0.5 ms of GPU spin: the queue stays ahead of the host
        ev = []
        for n in order:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fns[n]()
            e1.record()
            ev.append((n, e0, e1))
        torch.cuda.synchronize()
        for n, e0, e1 in ev:
            times[n].append(e0.elapsed_time(e1))
    out = {}
    for n in names:
        t = sorted(times[n])
        out[n] = (t[len(t) // 2], t[0], t[-1])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="shared library with attention/kernels_bf16.h's functions")
    ap.add_argument("--tokens", type=int, default=16384, help="B*T")
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--T", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--default-status", default="", help="the default kernel's test result, for the header")
    ap.add_argument("--nvidia-shape", action="store_true",
                    help="only cuDNN BF16 at cudnn-frontend's published shape (B 1, H 64, T 4K and 8K), against "
                         "NVIDIA's published figures")
    a = ap.parse_args()
    if a.nvidia_shape:
        return nvidia_shape(a.rounds)

    ours = Ours(a.lib)
    rows = []
    for T in a.T:
        B = max(a.tokens // T, 1)
        ff, fb = flops(B, a.H, T, a.d)
        qkv = torch.rand(B, T, 3, a.H, a.d, device="cuda", dtype=torch.bfloat16) * 4 - 2
        dout = torch.rand(B, T, a.H, a.d, device="cuda", dtype=torch.bfloat16) * 4 - 2
        fwds, bwds = {}, {}
        outs = {}
        fwds["ours"], bwds["ours"], outs["ours"] = ours.setup(qkv, dout, B, a.H, T, a.d)
        for name, (f, b) in cudnn_variants(qkv, dout, B, a.H, T, a.d).items():
            fwds[CUDNN_PREFIX + name], bwds[CUDNN_PREFIX + name] = f, b
        try:
            fwds["fa2"], bwds["fa2"] = torch_setup(SDPBackend.FLASH_ATTENTION, qkv, dout.transpose(1, 2))
        except Exception as ex:  # a backend PyTorch cannot run here is reported, not fatal
            print(f"# fa2 T={T}: {type(ex).__name__}: {str(ex).splitlines()[0][:120]}", file=sys.stderr)
        tf = time_interleaved(fwds, a.rounds)
        tb = time_interleaved(bwds, a.rounds)
        r = {"T": T, "B": B, "f": {n: ff / v[0] / 1e9 for n, v in tf.items()},
             "b": {n: fb / v[0] / 1e9 for n, v in tb.items()}, "tf": tf, "tb": tb}
        # the cuDNN column: its fastest call per direction
        for key, times, flop in (("f", tf, ff), ("b", tb, fb)):
            name, ms = best_of({n: v[0] for n, v in times.items()}, CUDNN_PREFIX)
            if name:
                r[key]["cudnn"] = flop / ms / 1e9
                r["cudnn_" + key] = name
        rows.append(r)
        print(f"# T={T} B={B} ms median [min, max] over {a.rounds} rounds: fwd "
              + ", ".join(f"{n} {v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]" for n, v in tf.items())
              + "; bwd " + ", ".join(f"{n} {v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]" for n, v in tb.items()),
              flush=True)
        # a check at the timed sizes: every |O| <= max |V| = 2 (O rows are convex combinations of
        # V rows)
        o0 = outs["ours"][0].float()
        bad = int((o0.abs() > 2.02).sum().item())
        print(f"# T={T}: ours: {bad} elements with |O| > max |V|", flush=True)
        del fwds, bwds, outs, qkv, dout
        torch.cuda.empty_cache()

    def cell(d, n):
        return f"{d[n]:7.1f}" if n in d else "    n/a"

    def ratio(d, n):
        return f"{d['ours'] / d[n]:5.2f}" if n in d and "ours" in d else "  n/a"

    print(f"causal attention, BF16, H={a.H}, d={a.d}, B*T={a.tokens}; TFLOP/s (fwd 4BHT^2d/2, "
          f"bwd 2.5x), medians of {a.rounds} interleaved rounds; torch {torch.__version__}, "
          f"cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    status = f"; {a.default_status}" if a.default_status else ""
    print(f"ours = attention/fwd_bf16.cu and attention/bwd_bf16.cu{status}")
    print(f"    T    B |  ours_f cudnn_f   fa2_f |  ours_b cudnn_b   fa2_b |"
          f" f/cud f/fa2 b/cud b/fa2")
    for r in rows:
        f, b = r["f"], r["b"]
        print(f"{r['T']:5d} {r['B']:4d} | {cell(f, 'ours')} {cell(f, 'cudnn')} {cell(f, 'fa2')} | "
              f"{cell(b, 'ours')} {cell(b, 'cudnn')} {cell(b, 'fa2')} | "
              f"{ratio(f, 'cudnn')} {ratio(f, 'fa2')} {ratio(b, 'cudnn')} {ratio(b, 'fa2')}")
    print("cuDNN = its fastest call per direction (f / b): "
          + ", ".join(f"T={r['T']}: {r.get('cudnn_f', 'n/a')} / {r.get('cudnn_b', 'n/a')}" for r in rows))
    for r in rows:
        print(f"   T={r['T']} cuDNN calls, TFLOP/s f / b: "
              + ", ".join(f"{n[len(CUDNN_PREFIX):]} {r['f'][n]:.1f} / {r['b'].get(n, 0):.1f}"
                          for n in r["f"] if n.startswith(CUDNN_PREFIX)))


def nvidia_shape(rounds):
    """cuDNN BF16 (every call of cudnn_variants) at cudnn-frontend's training benchmark shape, batch
    1, 64 heads of 128 (theirs: 8 KV heads), T 4K and 8K, against NVIDIA's published figures."""
    B, H, d = 1, 64, 128
    print(f"cuDNN BF16 at cudnn-frontend's published shape: B {B}, H {H} (MHA; their runs: 8 KV heads), d {d}, "
          f"causal; TFLOP/s, medians of {rounds} interleaved rounds; torch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    for T in (4096, 8192):
        ff, fb = flops(B, H, T, d)
        qkv = torch.rand(B, T, 3, H, d, device="cuda", dtype=torch.bfloat16) * 4 - 2
        dout = torch.rand(B, T, H, d, device="cuda", dtype=torch.bfloat16) * 4 - 2
        var = cudnn_variants(qkv, dout, B, H, T, d)
        if not var:
            print(f"T={T}: no cuDNN call ran")
            continue
        tf = time_interleaved({n: v[0] for n, v in var.items()}, rounds)
        tb = time_interleaved({n: v[1] for n, v in var.items()}, rounds)
        fn, fms = best_of({n: v[0] for n, v in tf.items()}, "")
        bn, bms = best_of({n: v[0] for n, v in tb.items()}, "")
        line = (f"T={T}: fwd {ff / fms / 1e9:.1f} ({fn}), bwd {fb / bms / 1e9:.1f} ({bn}), fwd+bwd "
                f"{(ff + fb) / (fms + bms) / 1e9:.1f}")
        pub = PUBLISHED.get(("bf16", "bwd", T))
        if pub:
            line += f"; bwd / published {pub:.0f}: {fb / bms / 1e9 / pub:.2f}"
        print(line + "; every call f / b: " + ", ".join(f"{n} {ff / tf[n][0] / 1e9:.1f} / {fb / tb[n][0] / 1e9:.1f}"
                                                         for n in tf if n in tb), flush=True)
        del var, qkv, dout
        torch.cuda.empty_cache()
    print(f"published: {PUBLISHED_SOURCE}: " + ", ".join(f"{p.upper()} {d} {T // 1024}K {v:.0f}"
                                                        for (p, d, T), v in sorted(PUBLISHED.items())))


if __name__ == "__main__":
    main()
