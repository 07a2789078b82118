#!/usr/bin/env python3
"""torch_parity.py: an independent check of train_gpt's GPU backend against PyTorch.

Builds the GPT of core/model.h in PyTorch from its definition (not from our code): RMSNorm
y = x * rsqrt(mean(x^2) + eps) * g; QK-RMSNorm per head (gains of size head_dim) when qk_norm;
RoPE rotate-half (pairs (i, i + hd/2) rotated by pos * theta^(-2i/hd), the cos/sin table in
float64 rounded to float32, as cpu/layers_cpu.c and gpu/layers.cu do); causal softmax
attention with scale 1/sqrt(hd); SwiGLU with fc rows [gate | up]; no biases; untied or tied
LM head over the padded vocabulary with the padded columns left out of the cross-entropy;
targets < 0 ignored. It loads a dump written by `test_model_gpu --dump PREFIX` (initial FP32
weights, the batches, our GPU's loss, gradients and 10-step losses), computes the loss and
every gradient in FP32 (TF32 off) and under BF16 autocast, prints a table per tensor and
PASS/FAIL, then runs 10 AdamW steps (torch.optim.AdamW, decay on 2-D tensors only, constant
LR, global-norm clipping as optimizer.c: factor min(1, clip / norm)) on the same batches and
compares the loss curve with ours.

Dump format (little endian): b"TGPTDMP1", uint32 n_entries, then per entry: uint32 name_len,
the name (UTF-8), uint32 dtype (0 f32, 1 i32, 2 text), uint32 ndim, int64 dims[ndim], the data
(row-major). Entries: "meta" (key=value lines), "tokens", "targets" (steps, B, T) i32,
"param.<name>", "grad.<name>" (GPU), "cpu_grad.<name>" (CPU reference), "gpu_losses",
"cpu_losses", "gpu_grad_norms" (steps) f32.

usage: python3 test/torch_parity.py DUMP [DUMP ...]   (exit 0 when every dump passes)
Tolerances: loss rel 1e-2; gradients rel L2 < 3e-2 per tensor (our GPU is BF16 throughout);
each step's loss of the 10-step run rel 2e-2.
"""
import math
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

GRAD_TOL, LOSS_TOL, CURVE_TOL = 3e-2, 1e-2, 2e-2


def read_dump(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"TGPTDMP1":
        raise SystemExit(f"{path}: not a train_gpt dump (magic {data[:8]!r})")
    (n,) = struct.unpack_from("<I", data, 8)
    off, out = 12, {}
    for _ in range(n):
        (ln,) = struct.unpack_from("<I", data, off)
        off += 4
        name = data[off:off + ln].decode()
        off += ln
        dtype, nd = struct.unpack_from("<II", data, off)
        off += 8
        dims = struct.unpack_from(f"<{nd}q", data, off)
        off += 8 * nd
        count = int(np.prod(dims)) if nd else 1
        if dtype == 2:
            out[name] = data[off:off + count].decode()
            off += count
        else:
            dt = np.float32 if dtype == 0 else np.int32
            out[name] = np.frombuffer(data, dtype=dt, count=count, offset=off).reshape(dims).copy()
            off += 4 * count
    meta = {}
    for line in out.pop("meta").splitlines():
        k, v = line.split("=", 1)
        meta[k] = v
    return meta, out


class GPT:
    """The architecture of core/model.h as plain functions of a dict of parameter tensors."""

    def __init__(self, meta, device):
        i = lambda k: int(meta[k])
        self.V, self.Vp, self.C, self.L = i("vocab_size"), i("padded_vocab_size"), i("d_model"), i("n_layer")
        self.H, self.Fh, self.qk_norm, self.tied = i("n_head"), i("ffn_hidden"), i("qk_norm"), i("tied_embeddings")
        self.hd = self.C // self.H
        self.eps = float(meta["norm_eps"])
        self.rope = meta["position"] == "rope"
        T = i("T")
        half = self.hd // 2
        idx = torch.arange(half, dtype=torch.float64)
        freq = float(meta["rope_theta"]) ** (-2.0 * idx / self.hd)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * freq[None, :]  # (T, hd/2)
        self.cos = torch.cos(ang).float().to(device)
        self.sin = torch.sin(ang).float().to(device)

    def rmsnorm(self, x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * g

    def rotate(self, x):  # x (B, H, T, hd): pairs (i, i + hd/2)
        half = self.hd // 2
        T = x.shape[2]
        c, s = self.cos[:T], self.sin[:T]
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1)

    def loss(self, P, tokens, targets):
        B, T = tokens.shape
        C, H, hd, Fh = self.C, self.H, self.hd, self.Fh
        x = P["wte.weight"][tokens.long()]  # (B, T, C)
        for l in range(self.L):
            p = lambda s: P[f"layers.{l}.{s}"]
            h = self.rmsnorm(x, p("attn_norm.weight"))
            qkv = h @ p("attn.qkv.weight").t()  # (B, T, 3C) = [q | k | v]
            q, k, v = (t.reshape(B, T, H, hd) for t in qkv.split(C, dim=-1))
            if self.qk_norm:
                q = self.rmsnorm(q, p("attn.q_norm.weight"))
                k = self.rmsnorm(k, p("attn.k_norm.weight"))
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
            if self.rope:
                q, k = self.rotate(q), self.rotate(k)
            s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            s = s.float().masked_fill(~mask, float("-inf"))
            a = torch.softmax(s, dim=-1).to(v.dtype) @ v
            a = a.transpose(1, 2).reshape(B, T, C)
            x = x + a @ p("attn.proj.weight").t()
            h = self.rmsnorm(x, p("mlp_norm.weight"))
            gate, up = (h @ p("mlp.fc.weight").t()).split(Fh, dim=-1)
            x = x + (F.silu(gate) * up) @ p("mlp.proj.weight").t()
        hf = self.rmsnorm(x, P["final_norm.weight"])
        head = P["wte.weight"] if self.tied else P["lm_head.weight"]
        logits = (hf @ head.t()).float()[..., : self.V]  # padded columns are not classes
        return F.cross_entropy(logits.reshape(-1, self.V), targets.reshape(-1).long(), ignore_index=-1)


def rel_l2(a, ref):
    a, ref = a.double(), ref.double()
    den = ref.norm().item()
    return (a - ref).norm().item() / den if den > 0 else (a - ref).norm().item()


def check(path, device):
    meta, d = read_dump(path)
    model = GPT(meta, device)
    names = [k[len("param."):] for k in d if k.startswith("param.")]
    tokens = torch.from_numpy(d["tokens"]).to(device)
    targets = torch.from_numpy(d["targets"]).to(device)
    steps = int(meta["steps"])
    label = meta["variant"]
    print(f"== {path}: variant {label}, {len(names)} tensors, B {meta['B']} T {meta['T']}, {steps} steps")

    def fresh_params():
        return {n: torch.from_numpy(d["param." + n]).to(device).requires_grad_(True) for n in names}

    # loss and gradients of batch 0: FP32 and BF16 autocast
    P = fresh_params()
    loss32 = model.loss(P, tokens[0], targets[0])
    loss32.backward()
    g32 = {n: P[n].grad.detach() for n in names}
    P16 = fresh_params()
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        loss16 = model.loss(P16, tokens[0], targets[0])
    loss16.backward()
    g16 = {n: P16[n].grad.detach() for n in names}
    ours = float(d["gpu_losses"][0]) if steps > 0 else float("nan")
    ok = True
    lrel = abs(ours - loss32.item()) / abs(loss32.item())
    print(f"loss: torch fp32 {loss32.item():.6f}  torch bf16-autocast {loss16.item():.6f}  "
          f"ours (GPU) {ours:.6f}  CPU {float(d['cpu_losses'][0]):.6f}  rel(ours, fp32) {lrel:.2e}")
    ok &= lrel < LOSS_TOL
    print(f"{'tensor':34s} {'|g| fp32':>10s} {'GPU vs fp32':>12s} {'CPU vs fp32':>12s} {'bf16ac vs fp32':>15s}")
    worst = 0.0
    for n in names:
        gpu = torch.from_numpy(d["grad." + n]).to(device)
        cpu = torch.from_numpy(d["cpu_grad." + n]).to(device)
        r_gpu, r_cpu, r_16 = rel_l2(gpu, g32[n]), rel_l2(cpu, g32[n]), rel_l2(g16[n].float(), g32[n])
        worst = max(worst, r_gpu)
        flag = "" if r_gpu < GRAD_TOL else "  <-- FAIL"
        ok &= r_gpu < GRAD_TOL
        print(f"{n:34s} {g32[n].norm().item():10.4e} {r_gpu:12.3e} {r_cpu:12.3e} {r_16:15.3e}{flag}")
    print(f"worst gradient rel L2 (GPU vs torch fp32): {worst:.3e} (tolerance {GRAD_TOL})")

    # 10 AdamW steps in FP32 with the same batches, constant LR, clipping as optimizer.c
    curve_ok = True
    if steps > 0:
        P = fresh_params()
        wd = float(meta["weight_decay"])
        groups = [{"params": [P[n] for n in names if P[n].dim() == 2], "weight_decay": wd},
                  {"params": [P[n] for n in names if P[n].dim() != 2], "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=float(meta["lr"]), betas=(float(meta["beta1"]), float(meta["beta2"])),
                                eps=float(meta["eps"]), foreach=False)
        clip = float(meta["grad_clip"])
        print(f"{'step':>4s} {'torch fp32':>11s} {'ours (GPU)':>11s} {'CPU':>11s} {'rel':>9s} {'norm torch':>11s} {'norm GPU':>9s}")
        for k in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = model.loss(P, tokens[k], targets[k])
            loss.backward()
            norm = math.sqrt(sum(float(P[n].grad.double().pow(2).sum()) for n in names))
            if clip > 0 and norm > clip:
                for n in names:
                    P[n].grad.mul_(clip / norm)
            opt.step()
            ours_k = float(d["gpu_losses"][k])
            r = abs(ours_k - loss.item()) / abs(loss.item())
            curve_ok &= r < CURVE_TOL
            print(f"{k:4d} {loss.item():11.5f} {ours_k:11.5f} {float(d['cpu_losses'][k]):11.5f} {r:9.2e} "
                  f"{norm:11.4f} {float(d['gpu_grad_norms'][k]):9.4f}")
    verdict = ok and curve_ok
    print(f"{'PASS' if verdict else 'FAIL'}: {label}: loss {'ok' if lrel < LOSS_TOL else 'off'}, "
          f"gradients worst rel L2 {worst:.2e}, {steps}-step loss curve {'tracks' if curve_ok else 'DIVERGES'}")
    return verdict


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"torch {torch.__version__} on {device}")
    results = [check(p, device) for p in sys.argv[1:]]
    print(f"torch_parity: {sum(results)} of {len(results)} dumps PASS")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
