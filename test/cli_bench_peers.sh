#!/bin/sh
# cli_bench_peers.sh: the benchmarks against the peers, as far as a machine without torch or a GPU
# can run them: every dev/bench/*.py compiles; dev/bench/peer_tables.py's FLOP counts, best-call
# choice, judging table, published comparison and targets on made-up timings; dev/bench/
# e2e_table.py's end-to-end table and targets on a made-up run list and PyTorch log; scripts/gpu.sh
# plans the attention and e2e benchmarks and refuses a bad ACCUM.
# Runs from the repo root; needs python3.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. test/cli_lib.sh

for f in dev/bench/*.py; do
  check "py_compile $f" "$(python3 -m py_compile "$f" 2>&1 | tail -2)" python3 -m py_compile "$f"
done

# --- peer_tables.py ---
python3 - <<'EOF'
import sys
sys.path.insert(0, "dev/bench")
import peer_tables as pt

def check(name, cond, detail=""):
    print(("ok - " if cond else "FAIL - ") + name + ("" if cond else ": " + str(detail)))

B, H, T, d = 4, 16, 4096, 128
ff, fb = pt.attn_flops(B, H, T, d)
# causal: S = QK^T and O = PV, 2 FLOPs a multiply-add, over half the T x T scores
want = 2 * 2 * B * H * (T * T / 2) * d
check("peer_tables: causal forward FLOPs 4BHT^2d/2, backward 2.5x", ff == want and fb == 2.5 * want, (ff, fb, want))
check("peer_tables: TFLOP/s = FLOPs / ms / 1e9", abs(pt.tflops(1e12, 2.0) - 500.0) < 1e-9 and pt.tflops(1e12, None) is None,
      pt.tflops(1e12, 2.0))
name, ms = pt.best_of({"cudnn:packed": 3.0, "cudnn:bhtd": 2.0, "cudnn:bthd_op": 2.5, "ours": 1.0}, "cudnn:")
check("peer_tables: the fastest cuDNN call, named without the prefix", (name, ms) == ("bhtd", 2.0), (name, ms))
check("peer_tables: no cuDNN call timed", pt.best_of({"ours": 1.0}, "cudnn:") == (None, None))

# times chosen so the rates are round: ours f 1.0 ms, fp8_dm_keep f 0.8, cuDNN best f 0.9 (bthd);
# ours b 4.0, fp8_dm_keep b 2.5, cuDNN best b 3.0 (bhtd_op)
ms_of = lambda flop, rate: flop / rate / 1e9
row = {"T": T, "B": B, "ff": ff, "fb": fb,
       "tf": {"ours": 1.0, "fp8_dm": 0.9, "fp8_dm_keep": 0.8, "cudnn:packed": 1.2, "cudnn:bthd": 0.9, "cudnn": 0.9},
       "tb": {"ours": 4.0, "fp8_dm": 2.7, "fp8_dm_keep": 2.5, "cudnn:packed": 3.5, "cudnn:bhtd_op": 3.0, "cudnn": 3.0}}
row1k = {"T": 1024, "B": 16, "ff": pt.attn_flops(16, H, 1024, d)[0], "fb": pt.attn_flops(16, H, 1024, d)[1],
         "tf": {"ours": 0.5}, "tb": {"ours": 1.5}}
lines = pt.judging_table([row1k, row])
r4 = [l for l in lines if l.startswith("| 4K |")]
cells = [c.strip() for c in r4[0].strip("|").split("|")] if r4 else []
f = lambda t: "%.1f" % (ff / t / 1e9)
b = lambda t: "%.1f" % (fb / t / 1e9)
fbr = lambda t1, t2: "%.1f" % ((ff + fb) / (t1 + t2) / 1e9)
want = ["4K", "4", f(1.0), f(0.8), f(0.9), b(4.0), b(2.5), b(3.0), fbr(1.0, 4.0), fbr(0.8, 2.5), fbr(0.9, 3.0),
        "%.2f" % ((1.0 + 4.0) / (0.8 + 2.5)), "%.2f" % ((0.9 + 3.0) / (0.8 + 2.5)), "bthd / bhtd_op"]
check("peer_tables: the judging row: f, b, f+b of ours, fp8_dm (kept codes), cuDNN's best, the ratios, the calls",
      cells == want, "\n  got  %s\n  want %s" % (cells, want))
r1 = [l for l in lines if l.startswith("| 1K |")]
check("peer_tables: a T without fp8_dm or cuDNN shows n/a", r1 and r1[0].count("n/a") >= 8, r1)
check("peer_tables: the footnote names the fp8_dm timing judged", "fp8_dm_keep" in lines[-1], lines[-1])

pub = pt.published_lines([row1k, row])
bwd = [l for l in pub if "4K bwd" in l and "BF16 474" in l]
want_c = "cuDNN BF16 (same run) %s (%.2fx)" % (b(3.0), fb / 3.0 / 1e9 / 474)
want_o = "ours BF16 %s (%.2fx)" % (b(4.0), fb / 4.0 / 1e9 / 474)
check("peer_tables: cuDNN BF16 and ours against the published BF16 backward at 4K",
      bwd and want_c in bwd[0] and want_o in bwd[0], (bwd, want_c, want_o))
fwd8 = [l for l in pub if "4K fwd" in l and "FP8 854" in l]
check("peer_tables: ours fp8_dm against cuDNN's published FP8 forward at 4K",
      fwd8 and ("ours fp8_dm %s (%.2fx)" % (f(0.8), ff / 0.8 / 1e9 / 854)) in fwd8[0], fwd8)
check("peer_tables: no line for T without a published figure", not any("1K" in l for l in pub), pub)

tl = pt.target_lines([row1k, row])
x_fb, x_b = (1.0 + 4.0) / (0.8 + 2.5), 4.0 / 2.5
check("peer_tables: fp8_dm f+b >= 1.3x ours at 4K-8K: MET with the ratio",
      tl[0].startswith("target fp8_dm fwd+bwd >= 1.3x") and ": MET; met at 4K %.2f" % x_fb in tl[0], tl)
check("peer_tables: fp8_dm bwd >= 1.4x ours: MET at 4K (1.60)", ": MET; met at 4K %.2f" % x_b in tl[1], tl)
slow = dict(row, tb=dict(row["tb"], fp8_dm_keep=3.5))
tl = pt.target_lines([slow])
check("peer_tables: a missed target says NOT MET and where", "NOT MET" in tl[1] and "missed at 4K 1.14" in tl[1], tl)
check("peer_tables: T outside 4K-8K is not judged", "not measured" in pt.target_lines([row1k])[0])
EOF

# --- e2e_table.py ---
printf 'paper_569m\tbf16\tbf16\t-\t140000\t50.0%%\t7.10\t23000\t22.224\t8\n' >"$tmp/ours.tsv"
printf 'paper_569m\tfp8_dm\tfp8_tensor\tprecision.recipe=fp8\t200000\t71.4%%\t7.12\t22500\t21.508\t8\n' >>"$tmp/ours.tsv"
printf 'paper_1p67b\tbf16\tbf16\t-\t47000\t52.0%%\t7.30\t45500\t43.955\t8\n' >>"$tmp/ours.tsv"
printf 'paper_1p67b\tfp8_dm\tfp8_tensor\tprecision.recipe=fp8\t60000\t66.4%%\t7.31\t46000\t43.566\t8\n' >>"$tmp/ours.tsv"
cat >"$tmp/torch.log" <<'EOF'
torch 2.9.0, NVIDIA H200, cuDNN 91900
torch-e2e paper_569m: B 4 T 4096 ...
torch-e2e-json {"config": "paper_569m", "B": 4, "T": 4096, "accum": 8, "tokens_per_s": 125000.0, "mfu": 0.445, "sdpa": "CUDNN_ATTENTION", "peak_mem_gib": 21.0, "reserved_gib": 23.5, "device_used_gib": 24.1}
EOF
python3 dev/bench/e2e_table.py "$tmp/ours.tsv" "$tmp/torch.log" >"$tmp/out" 2>&1
rc=$?
check "e2e_table: exits 0" "rc $rc: $(head -3 "$tmp/out")" [ "$rc" -eq 0 ]
check "e2e_table: our fp8 recipe row: tok/s, MFU, peak GiB (plan), vs PyTorch, vs ours BF16" "$(cat "$tmp/out")" \
  grep -qxF '| paper_569m | ours, fp8 recipe | 8 | 200000 | 71.4% | 22.0 (21.508) | 1.60x | 1.43x | 7.12 |' "$tmp/out"
check "e2e_table: the PyTorch row: its device memory and reserved pool, its accumulation" "$(cat "$tmp/out")" \
  grep -qxF '| paper_569m | PyTorch BF16 (torch.compile, sdpa CUDNN_ATTENTION) | 8 | 125000 | 44.5% | 24.1 (reserved 23.5) | 1.00x | 0.89x | |' "$tmp/out"
check "e2e_table: a config without a PyTorch run: n/a against it" "$(grep paper_1p67b "$tmp/out")" \
  grep -qxF '| paper_1p67b | ours, BF16 | 8 | 47000 | 52.0% | 44.4 (43.955) | n/a | 1.00x | 7.30 |' "$tmp/out"
check "e2e_table: the speed target on paper_569m (1.60x): MET" "$(grep target "$tmp/out")" \
  grep -qxF 'target fp8 recipe >= 1.5x PyTorch BF16 on paper_569m: MET (1.60x)' "$tmp/out"
check "e2e_table: the memory target per config, met and missed" "$(grep target "$tmp/out")" sh -c \
  "grep -qxF 'target fp8 peak memory <= BF16'\"'\"'s on paper_569m: MET (22.0 against 22.5 GiB)' '$tmp/out' &&
   grep -qxF 'target fp8 peak memory <= BF16'\"'\"'s on paper_1p67b: NOT MET (44.9 against 44.4 GiB)' '$tmp/out'"
python3 dev/bench/e2e_table.py "$tmp/ours.tsv" >"$tmp/out" 2>&1
check "e2e_table: a missing argument: usage, status 2" "rc $?: $(cat "$tmp/out")" [ $? -eq 2 ]

# --- gpu.sh's plans of the two benchmarks, and a bad ACCUM ---
bash scripts/gpu.sh --dry-run bench e2e >"$tmp/out" 2>&1
check "gpu.sh bench e2e: the bf16 and fp8 recipes on paper_569m and paper_1p67b" "$(cat "$tmp/out")" sh -c \
  "grep -q 'paper_569m:fp8_dm:fp8_tensor:precision.recipe=fp8' '$tmp/out' &&
   grep -q 'paper_1p67b:bf16:bf16' '$tmp/out' && grep -q '10 steps of 8 micro-batches' '$tmp/out'"
bash scripts/gpu.sh --dry-run bench attention >"$tmp/out" 2>&1
check "gpu.sh bench attention: the judging table and the published shape" "$(cat "$tmp/out")" sh -c \
  "grep -q 'judging table' '$tmp/out' && grep -q -- '--nvidia-shape' '$tmp/out'"
ACCUM=eight bash scripts/gpu.sh --dry-run bench e2e >"$tmp/out" 2>&1
rc=$?
check "gpu.sh: a bad ACCUM is a usage error naming it" "rc $rc: $(cat "$tmp/out")" sh -c \
  "[ $rc -eq 2 ] && grep -q \"ACCUM must be a whole number >= 1 or 'config', got 'eight'\" '$tmp/out'"
exit 0
