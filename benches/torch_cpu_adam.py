#!/usr/bin/env python3
"""PyTorch's CPU AdamW on the sizes of zero's `adam` bench (benches/benches/adam.rs), so the
ratios in docs/BENCHMARKS.md come from one session on one machine.

Times, with `time.perf_counter`, the median of --iters steps after --warmup:
  adamw_fp32  torch.optim.AdamW(fused=True) on fp32 params and grads: the work of zero's
              `adam_fp32` group (grad, w, m, v read; w, m, v written: 28 bytes counted)
  mixed_bf16  the mixed-precision sequence zero fuses into one pass (its `adam_bf16`
              group): cast bf16 grads into the fp32 grad -> fused AdamW on the fp32
              master -> round the master into the bf16 parameters

Usage:  python3 benches/torch_cpu_adam.py --threads 2 [--sizes 1,4,16,64]
Run zero's side with the same thread count: RAYON_NUM_THREADS=2 cargo bench -p
zero-benches --bench adam.
"""
import argparse
import statistics
import time

import torch


def timed(fn, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1,4,16,64", help="element counts in Mi")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    print(f"# torch {torch.__version__}, {args.threads} thread(s)")
    for mi in (int(s) for s in args.sizes.split(",")):
        n = mi << 20
        p = torch.nn.Parameter(torch.rand(n, generator=gen) * 2 - 1)
        p.grad = torch.rand(n, generator=gen) * 2 - 1
        opt = torch.optim.AdamW([p], lr=1e-4, fused=True)
        fp32 = timed(opt.step, args.warmup, args.iters)

        g16 = (torch.rand(n, generator=gen) * 2 - 1).to(torch.bfloat16)
        p16 = torch.empty(n, dtype=torch.bfloat16)

        def mixed() -> None:
            p.grad.copy_(g16)
            opt.step()
            p16.copy_(p.detach())

        mixed_s = timed(mixed, args.warmup, args.iters)
        for name, s in (("adamw_fp32", fp32), ("mixed_bf16", mixed_s)):
            print(f"{name:<11} {mi:>3}M  {s * 1e3:9.3f} ms  {28 * n / s / 2**30:7.1f} GiB/s counted")
        del p, opt, g16, p16


if __name__ == "__main__":
    main()
