#!/usr/bin/env python3
"""bench_e2e.py: the PyTorch baseline for train_gpt's end-to-end speed: the same GPT (core/model.h)
built from one of our JSON configs, trained with the standard PyTorch recipe, timed step by step.

Recipe (the usual "fast PyTorch" single-GPU setup, what our trainer is compared against):
  - FP32 parameters, BF16 autocast for the forward (matmuls and attention in BF16), FP32 loss;
  - torch.compile(model) in the default mode (Inductor fuses RMSNorm, RoPE, SwiGLU, residual adds
    and the cross-entropy; GEMMs go to cuBLAS);
  - scaled_dot_product_attention(is_causal=True) with the fastest backend for this shape: cuDNN,
    FlashAttention-2 and memory-efficient are timed forward + backward on the step's shapes first,
    and only the winner is enabled when the model is compiled (so Inductor bakes in that backend);
  - global gradient-norm clipping (our trainer computes the norm every step too) and
    torch.optim.AdamW(fused=True), weight decay on the 2-D tensors only;
  - --accum micro-batches per optimizer step (gradient accumulation: scripts/gpu.sh gives both this
    and train_gpt the same count), random tokens (the data pipeline is not what is compared).
The architecture: pre-norm, no biases, RMSNorm (eps from the config) with gains, fused qkv
[q | k | v], optional QK-RMSNorm per head, RoPE rotate-half (pairs (i, i + hd/2)) or none,
SwiGLU with fc rows [gate | up], LM head over the vocabulary padded to a multiple of 128 (tied to
the embedding when tied_embeddings), cross-entropy over the real columns only.

Timing: `--warmup` steps (compilation, autotuning, allocator warm-up) are excluded; then each of
`--steps` steps is timed alone between torch.cuda.synchronize() calls, and the median is taken.
tokens/s = accum * micro_batch * seq_len / median step time; MFU = tokens/s * FLOPs/token / peak, with our
trainer's FLOP count (core/model.c model_flops_per_token: 6 * matmul params incl. the LM head at the
padded vocabulary + 6 * n_layer * d_model * seq_len) and the H100/H200 dense BF16 peak of 989
TFLOP/s (gpu/gpu_info.cu).

Memory: the allocator's peak allocated and reserved bytes, and the device's used memory after the
timed steps (cudaMemGetInfo: the CUDA context and the reserved pool, what nvidia-smi shows).

Prints one human line per config ("torch-e2e ...") and one JSON line ("torch-e2e-json {...}") for
scripts/gpu.sh's bench e2e (dev/bench/e2e_table.py reads it). --wait-for FILE: after compiling and warming up a config, wait (at most
--wait-max seconds) until FILE exists before timing, so a build running beside us does not share
the CPU with the timed steps.

  python3 dev/bench/bench_e2e.py --config configs/small_125m.json --micro-batch 16 [--seq-len 1024]
  python3 dev/bench/bench_e2e.py --config configs/paper_569m.json --micro-batch 4 --config ... (repeatable)
      [--accum 8 ...] (one per --config)
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PEAK_BF16_TFLOPS = 989.0  # gpu/gpu_info.cu: H100 SXM / H200 dense BF16

# Defaults of core/config.c for the model keys a config may leave out.
MODEL_DEFAULTS = {"vocab_size": 50257, "position": "rope", "rope_theta": 10000.0, "qk_norm": False,
                  "tied_embeddings": False, "norm_eps": 1e-5, "init_std": 0.02}


def read_model_config(path):
    with open(path) as f:
        cfg = json.load(f)
    m = dict(MODEL_DEFAULTS)
    m.update(cfg.get("model", {}))
    for key in ("d_model", "n_layer", "n_head", "ffn_hidden", "seq_len"):
        if key not in m:
            raise SystemExit(f"{path}: model.{key} is required")
    m["padded_vocab_size"] = (m["vocab_size"] + 127) // 128 * 128
    m["head_dim"] = m["d_model"] // m["n_head"]
    return m, cfg.get("train", {})


def flops_per_token(m, T):
    """core/model.c model_flops_per_token, for sequence length T."""
    C, F_, L = m["d_model"], m["ffn_hidden"], m["n_layer"]
    matmul = L * (3 * C * C + C * C + 2 * F_ * C + F_ * C) + m["padded_vocab_size"] * C
    return 6.0 * matmul + 6.0 * L * C * T


def rmsnorm(x, gain, eps):
    # in FP32 whatever x is, the result back in x's dtype (what a fused kernel does)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * gain).to(x.dtype)


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        C, F_, hd = m["d_model"], m["ffn_hidden"], m["head_dim"]
        self.C, self.H, self.hd, self.F = C, m["n_head"], hd, F_
        self.eps, self.qk_norm = m["norm_eps"], m["qk_norm"]
        self.attn_norm = nn.Parameter(torch.ones(C))
        self.qkv = nn.Linear(C, 3 * C, bias=False)        # rows [q | k | v]
        if self.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(hd))
            self.k_norm = nn.Parameter(torch.ones(hd))
        self.proj = nn.Linear(C, C, bias=False)
        self.mlp_norm = nn.Parameter(torch.ones(C))
        self.fc = nn.Linear(C, 2 * F_, bias=False)        # rows [gate | up]
        self.mlp_proj = nn.Linear(F_, C, bias=False)

    def forward(self, x, cos, sin):  # x (B, T, C); cos, sin (T, hd/2) or None
        B, T, C = x.shape
        h = rmsnorm(x, self.attn_norm, self.eps)
        q, k, v = self.qkv(h).split(C, dim=-1)            # (B, T, C) each
        q, k, v = (t.view(B, T, self.H, self.hd) for t in (q, k, v))
        if self.qk_norm:
            q, k = rmsnorm(q, self.q_norm, self.eps), rmsnorm(k, self.k_norm, self.eps)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        if cos is not None:
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, hd)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, C))
        h = rmsnorm(x, self.mlp_norm, self.eps)
        gate, up = self.fc(h).split(self.F, dim=-1)       # (B, T, F) each
        return x + self.mlp_proj(F.silu(gate) * up)


def rope(x, cos, sin):  # x (B, H, T, hd), pairs (i, i + hd/2) rotated by pos * theta^(-2i/hd)
    half = x.shape[-1] // 2
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


class GPT(nn.Module):
    def __init__(self, m):
        super().__init__()
        C, Vp, L, hd = m["d_model"], m["padded_vocab_size"], m["n_layer"], m["head_dim"]
        self.V, self.eps, self.tied = m["vocab_size"], m["norm_eps"], m["tied_embeddings"]
        self.wte = nn.Embedding(Vp, C)
        self.blocks = nn.ModuleList(Block(m) for _ in range(L))
        self.final_norm = nn.Parameter(torch.ones(C))
        self.lm_head = None if self.tied else nn.Linear(C, Vp, bias=False)
        if m["position"] == "rope":
            idx = torch.arange(hd // 2, dtype=torch.float64)
            freq = float(m["rope_theta"]) ** (-2.0 * idx / hd)
            ang = torch.arange(m["seq_len"], dtype=torch.float64)[:, None] * freq[None, :]
            self.register_buffer("cos", torch.cos(ang).float(), persistent=False)
            self.register_buffer("sin", torch.sin(ang).float(), persistent=False)
        else:
            self.cos = self.sin = None
        std = m["init_std"]
        for name, p in self.named_parameters():
            if p.dim() == 2:  # residual outputs scaled as core/model.c's INIT_NORMAL_RESID
                s = std / math.sqrt(2 * L) if name.endswith(("proj.weight", "mlp_proj.weight")) else std
                nn.init.normal_(p, 0.0, s)

    def forward(self, tokens, targets):  # (B, T) int64 each
        T = tokens.shape[1]
        cos = self.cos[:T] if self.cos is not None else None
        sin = self.sin[:T] if self.sin is not None else None
        x = self.wte(tokens)                              # (B, T, C) FP32 (the residual stream)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        h = rmsnorm(x, self.final_norm, self.eps)
        w = self.wte.weight if self.tied else self.lm_head.weight
        logits = F.linear(h, w)[..., : self.V].float()    # (B, T, V): padded columns are no classes
        return F.cross_entropy(logits.reshape(-1, self.V), targets.reshape(-1))


SDPA_BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")


def pick_sdpa_backend(B, H, T, hd, dev):
    """Times SDPA forward + backward (causal, BF16) per backend at the step's shape; returns the
    fastest backend's name and a dict name -> ms (None where the backend refused the shape)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (torch.randn(B, H, T, hd, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(B, H, T, hd, device=dev, dtype=torch.bfloat16)
    times = {}
    for name in SDPA_BACKENDS:
        try:
            with sdpa_kernel(getattr(SDPBackend, name)):
                for _ in range(2):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)
                torch.cuda.synchronize()
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
                ev[0].record()
                for _ in range(5):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)
                ev[1].record()
                torch.cuda.synchronize()
                times[name] = ev[0].elapsed_time(ev[1]) / 5
        except Exception as ex:  # a backend that does not support the shape / build
            times[name] = None
            print(f"  sdpa {name}: unavailable ({type(ex).__name__}: {str(ex).splitlines()[0][:120]})")
    ok = {n: t for n, t in times.items() if t is not None}
    best = min(ok, key=ok.get) if ok else None
    return best, times


def enable_only(backend):
    """Leaves only `backend` enabled for SDPA ("default": all of them, PyTorch's own choice)."""
    b, all_on = torch.backends.cuda, backend == "default"
    b.enable_cudnn_sdp(all_on or backend == "CUDNN_ATTENTION")
    b.enable_flash_sdp(all_on or backend == "FLASH_ATTENTION")
    b.enable_mem_efficient_sdp(all_on or backend == "EFFICIENT_ATTENTION")
    b.enable_math_sdp(all_on)


def build_and_warm(args, m, train, B, T, accum, backend, dev):
    """The model, its optimizer and a compiled training step with `backend` for SDPA, run
    args.warmup times (compilation included). Returns (step, state, model, n_params, warmup s)."""
    enable_only(backend)
    torch.manual_seed(1234)
    model = GPT(m).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": train.get("weight_decay", 0.1)},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=train.get("lr", 6e-4), betas=(train.get("beta1", 0.9), train.get("beta2", 0.95)),
                            eps=train.get("eps", 1e-8), fused=True)
    clip = train.get("grad_clip", 1.0)
    cmodel = torch.compile(model)
    gen = torch.Generator(device=dev).manual_seed(1)
    batches = [(torch.randint(0, m["vocab_size"], (B, T), device=dev, generator=gen),
                torch.randint(0, m["vocab_size"], (B, T), device=dev, generator=gen)) for _ in range(4)]
    state = {"i": 0, "loss": None}

    def step():  # accum micro-batches, then one optimizer step (the loss their mean)
        for _ in range(accum):
            x, y = batches[state["i"] % len(batches)]
            state["i"] += 1
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = cmodel(x, y)
            (loss / accum).backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["loss"] = loss

    t0 = time.time()
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    return step, state, model, n_params, time.time() - t0


def wait_for(path, max_s):
    if not path:
        return 0.0
    t0 = time.time()
    while not os.path.exists(path) and time.time() - t0 < max_s:
        time.sleep(0.5)
    return time.time() - t0


def top_kernels(step_fn, n=10):
    """CUDA kernels of one step by total time (profiler), for the gap analysis."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step_fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = getattr(e, "cuda_time_total", 0)
        if t > 0:
            rows.append((t, e.count, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    return total, rows[:n]


def bench(args, config_path, micro_batch, accum, dev):
    m, train = read_model_config(config_path)
    B = micro_batch or train.get("micro_batch", 8)
    T = args.seq_len or m["seq_len"]
    m["seq_len"] = max(m["seq_len"], T)
    name = os.path.basename(config_path).removesuffix(".json")
    fpt = flops_per_token(m, T)
    print(f"== {name}: d_model {m['d_model']}, {m['n_layer']} layers, {m['n_head']} heads of {m['head_dim']}, "
          f"F {m['ffn_hidden']}, Vp {m['padded_vocab_size']}, tied {m['tied_embeddings']}, {m['position']}, "
          f"B {B} x T {T}, {fpt:.4g} FLOPs/token", flush=True)

    best, sdpa_ms = pick_sdpa_backend(B, m["n_head"], T, m["head_dim"], dev)
    print("  sdpa fwd+bwd ms: " + ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} n/a"
                                             for k, v in sdpa_ms.items()) + f" -> {best}", flush=True)
    # the fastest backend first; should compiling with it fail, the next one (then PyTorch's pick)
    candidates = sorted((k for k, v in sdpa_ms.items() if v is not None), key=sdpa_ms.get) + ["default"]
    for backend in candidates:
        try:
            run = build_and_warm(args, m, train, B, T, accum, backend, dev)
            break
        except Exception as ex:
            print(f"  compiling with sdpa {backend} failed: {type(ex).__name__}: {str(ex)[:300]}", flush=True)
            torch._dynamo.reset()
            torch.cuda.empty_cache()
    else:
        raise RuntimeError("no SDPA backend compiled")
    step, state, model, n_params, t_warm = run
    waited = wait_for(args.wait_for, args.wait_max)
    quiet = (not args.wait_for) or os.path.exists(args.wait_for)

    times = []
    for _ in range(args.steps):
        torch.cuda.synchronize()
        a = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - a)
    med = statistics.median(times)
    tok_s = accum * B * T / med
    mfu = tok_s * fpt / (PEAK_BF16_TFLOPS * 1e12)
    mem = torch.cuda.max_memory_allocated() / 2**30
    reserved = torch.cuda.max_memory_reserved() / 2**30
    free_b, total_b = torch.cuda.mem_get_info()
    used = (total_b - free_b) / 2**30
    loss = float(state["loss"].detach())
    print(f"torch-e2e {name}: B {B} T {T} x {accum} micro-batches a step | median step {med * 1e3:.2f} ms "
          f"(min {min(times) * 1e3:.2f}, max {max(times) * 1e3:.2f}, {len(times)} steps) | {tok_s:.0f} tok/s | "
          f"MFU {100 * mfu:.1f}% | sdpa {backend} | peak mem {mem:.1f} GiB allocated, {reserved:.1f} reserved, "
          f"{used:.1f} used on the device | {n_params / 1e6:.1f}M params | warmup {t_warm:.0f} s "
          f"| loss {loss:.3f} | cpu quiet while timed: {'yes' if quiet else 'NO (build still running)'}", flush=True)
    if args.profile:
        total, rows = top_kernels(step)
        print(f"  profile of one step: {total / 1e3:.2f} ms of kernels; top {len(rows)}:")
        for t, cnt, key in rows:
            print(f"    {t / 1e3:8.2f} ms {100 * t / total:5.1f}%  x{cnt:<4d} {key[:110]}")
    print("torch-e2e-json " + json.dumps({"config": name, "B": B, "T": T, "accum": accum, "median_ms": med * 1e3,
                                          "tokens_per_s": tok_s, "mfu": mfu, "sdpa": backend, "sdpa_ms": sdpa_ms,
                                          "peak_mem_gib": mem, "reserved_gib": reserved, "device_used_gib": used,
                                          "params": n_params, "quiet": quiet, "waited_s": waited}), flush=True)
    del step, state, model, run
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", required=True, help="our JSON config (repeatable)")
    ap.add_argument("--micro-batch", type=int, action="append", default=None,
                    help="sequences per step, one per --config (default: the config's train.micro_batch)")
    ap.add_argument("--seq-len", type=int, default=0, help="default: the config's model.seq_len")
    ap.add_argument("--accum", type=int, action="append", default=None,
                    help="micro-batches per optimizer step (gradient accumulation), one per --config (default 1)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--profile", action="store_true", help="print the top CUDA kernels of one step")
    ap.add_argument("--wait-for", default="", help="file whose existence means the CPU is free to time")
    ap.add_argument("--wait-max", type=float, default=300.0)
    args = ap.parse_args()
    accs = args.accum or []
    if any(a < 1 for a in accs):
        ap.error(f"--accum {accs}: at least 1 micro-batch per step")
    if not torch.cuda.is_available():
        print("bench_e2e: no CUDA device")
        return 1
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, cuDNN {torch.backends.cudnn.version()}",
          flush=True)
    mbs = args.micro_batch or []
    rc = 0
    for i, path in enumerate(args.config):
        try:
            bench(args, path, mbs[i] if i < len(mbs) else 0, accs[i] if i < len(accs) else 1, dev)
        except Exception as ex:  # report and go on with the next config
            rc = 1
            print(f"torch-e2e {os.path.basename(path)}: FAILED: {type(ex).__name__}: {str(ex)[:400]}", flush=True)
            torch._dynamo.reset()
            torch.cuda.empty_cache()
    return rc


if __name__ == "__main__":
    sys.exit(main())
