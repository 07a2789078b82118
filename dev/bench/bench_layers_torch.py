"""bench_layers_torch.py: the PyTorch peer of bench_layers.cu's cross-entropy row: F.cross_entropy
forward and backward on the same shape of BF16 logits (chunk, V), random values in [-2, 2), CUDA
events, median of timed runs after warm-up. Prints one markdown row, in bench_layers' columns
(GB/s over the same 4 bytes per logit, though PyTorch moves more).

    python3 dev/bench/bench_layers_torch.py [chunk=8192] [V=50257] [N=16384]
"""
import sys

import torch
import torch.nn.functional as F


def main():
    chunk = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    V = int(sys.argv[2]) if len(sys.argv) > 2 else 50257
    N = int(sys.argv[3]) if len(sys.argv) > 3 else 16384  # tokens of the step: the mean's divisor
    g = torch.Generator(device="cuda").manual_seed(1)
    logits = (torch.rand(chunk, V, device="cuda", generator=g) * 4 - 2).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, V, (chunk,), device="cuda", generator=g)

    def step():
        loss = F.cross_entropy(logits, targets, reduction="sum") / N
        (grad,) = torch.autograd.grad(loss, logits)
        return grad

    for _ in range(5):
        step()
    times = []
    for _ in range(25):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    ms = sorted(times)[len(times) // 2]
    print("| %-36s | %8.4f | %7.0f | |" % ("PyTorch F.cross_entropy fwd+bwd", ms, 4.0 * chunk * V / (ms * 1e-3) / 1e9))
    print("# torch %s, %s" % (torch.__version__, torch.cuda.get_device_name()))


if __name__ == "__main__":
    main()
