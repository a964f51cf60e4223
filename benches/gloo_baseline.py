#!/usr/bin/env python3
"""torch.distributed on gloo, the collectives backend a PyTorch user has on CPU, measured
on the same operations and sizes as zero's `collectives` bench (benches/benches/
collectives.rs), for the side-by-side table in docs/BENCHMARKS.md.

- latency: all_reduce of 1 f32 and of 4 KiB (1024 f32), median over repeats;
- bandwidth: all_reduce, reduce_scatter and all_gather of 64 Mi bf16 elements (algorithm
  bandwidth: n x 2 bytes / time), median over repeats.

Usage (torch from PyPI; one process per rank, started here):

    PYTHONPATH=target/py-torch python3 benches/gloo_baseline.py --world 2 4
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BIG = 1 << 26


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(fn, iters: int, repeats: int) -> float:
    """Median seconds per call of `fn` over `repeats` runs of `iters` calls, each run
    started and ended with a barrier (as the Rust bench does)."""
    fn()
    samples = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        dist.barrier()
        samples.append((time.perf_counter() - t0) / iters)
    return statistics.median(samples)


def worker(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    results = {}
    for name, n in [("all_reduce 1 f32", 1), ("all_reduce 4 KiB", 1024)]:
        x = torch.ones(n, dtype=torch.float32)
        results[name] = timed(lambda: dist.all_reduce(x), 200, 9)
    dtype = torch.bfloat16
    x = torch.ones(BIG, dtype=dtype)
    piece = BIG // world
    ops = {
        "all_reduce": lambda: dist.all_reduce(x),
    }
    out_rs = torch.empty(piece, dtype=dtype)
    ops["reduce_scatter"] = lambda: dist.reduce_scatter_tensor(out_rs, x)
    mine = torch.ones(piece, dtype=dtype)
    ops["all_gather"] = lambda: dist.all_gather_into_tensor(x, mine)
    for name, fn in ops.items():
        try:
            results[f"{name} 64Mi bf16"] = timed(fn, 2, 5)
        except (RuntimeError, ValueError) as e:  # an operation gloo lacks
            results[f"{name} 64Mi bf16"] = f"unsupported: {e}".splitlines()[0]
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, nargs="+", default=[2, 4])
    args = p.parse_args()
    print(f"torch {torch.__version__}, gloo, {os.cpu_count()} cores")
    for world in args.world:
        out = f"/tmp/gloo_baseline_{world}.json"
        mp.spawn(worker, args=(world, free_port(), out), nprocs=world, join=True)
        with open(out) as f:
            results = json.load(f)
        for name, v in results.items():
            if isinstance(v, float) and "64Mi" in name:
                gbs = 2 * BIG / v / (1 << 30)
                print(f"{world} processes  {name:<26} {v * 1e3:9.2f} ms   {gbs:6.2f} GiB/s")
            elif isinstance(v, float):
                print(f"{world} processes  {name:<26} {v * 1e6:9.1f} us")
            else:
                print(f"{world} processes  {name:<26} {v}")


if __name__ == "__main__":
    main()
