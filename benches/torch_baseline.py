#!/usr/bin/env python3
"""PyTorch on the same sizes as zero's GPU benches (benches/benches/gpu.rs), so the ratios
in docs/BENCHMARKS.md come from one run on one GPU.

Times, with CUDA events, the median of --iters runs after --warmup:
  copy        a device-to-device f32 copy (the roofline), 8 bytes per element
  adamw_fp32  torch.optim.AdamW(fused=True) on fp32 params and grads, 16 bytes per element
              read + written (param, grad, exp_avg, exp_avg_sq; grad read only: 28 total)
  mixed       the mixed-precision sequence zero fuses: cast bf16 grads to fp32 ->
              fused AdamW on fp32 master weights -> copy params to bf16
  cat         torch.cat of 4 large bf16 tensors, and of ~2,000 small ones
  split       torch.split_with_sizes_copy back into them (unflatten)

Usage on the GPU host:  python3 benches/torch_baseline.py --sizes 16,256 [--json out.json]
"""
import argparse
import json
import statistics

import torch


def timed(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def row(name, n, bytes_moved, seconds):
    return {
        "bench": name,
        "elements": n,
        "median_s": seconds,
        "GB/s": bytes_moved / seconds / 1e9,
        "Gparams/s": n / seconds / 1e9,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="16,256", help="element counts in millions")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    dev = torch.device("cuda")
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | CUDA {torch.version.cuda}")
    rows = []
    for m in (int(s) for s in args.sizes.split(",")):
        n = m << 20
        src = torch.rand(n, device=dev)
        dst = torch.empty_like(src)
        rows.append(row("copy", n, 8 * n, timed(lambda: dst.copy_(src), args.warmup, args.iters)))
        del src, dst

        p = torch.nn.Parameter(torch.rand(n, device=dev))
        p.grad = torch.rand(n, device=dev)
        opt = torch.optim.AdamW([p], lr=1e-4, fused=True)
        rows.append(row("adamw_fp32", n, 28 * n, timed(opt.step, args.warmup, args.iters)))

        g16 = torch.rand(n, device=dev).to(torch.bfloat16)
        p16 = torch.empty(n, device=dev, dtype=torch.bfloat16)

        def mixed():
            p.grad.copy_(g16)  # cast bf16 grads into the fp32 grad buffer
            opt.step()
            p16.copy_(p.detach())  # round the master weights to bf16

        rows.append(row("mixed_bf16", n, 28 * n, timed(mixed, args.warmup, args.iters)))
        del p, opt, g16, p16
        torch.cuda.empty_cache()

        small = max(n // 2000, 1)
        for kind, sizes in (("4_tensors", [n // 4] * 4), ("2000_tensors", [small] * 2000)):
            ts = [torch.rand(k, device=dev).to(torch.bfloat16) for k in sizes]
            total = sum(sizes)
            flat = torch.cat(ts)
            rows.append(row(f"cat_{kind}", total, 4 * total, timed(lambda: torch.cat(ts, out=flat), args.warmup, args.iters)))
            outs = [torch.empty_like(t) for t in ts]
            rows.append(row(
                f"split_{kind}", total, 4 * total,
                timed(lambda: torch.split_with_sizes_copy(flat, sizes, out=outs), args.warmup, args.iters),
            ))
            del ts, flat, outs
            torch.cuda.empty_cache()
    for r in rows:
        print(f"{r['bench']:<22} {r['elements'] >> 20:>6}M  {r['median_s'] * 1e3:9.3f} ms  {r['GB/s']:8.1f} GB/s  {r['Gparams/s']:7.2f} Gparams/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
