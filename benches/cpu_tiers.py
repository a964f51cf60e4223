#!/usr/bin/env python3
"""Step time of zero_torch's CPU tiers on a 2-node launch (two torchrun agents of 2
processes on this machine), for docs/BENCHMARKS.md: stage 3, flat and with one-node shard
groups (``mics_shard_size: 2``), with the nodes as one machine (every collective over
zero's shared-memory group) and as two (``ZERO_CPU_INTER_NODE=gloo``: shared memory inside
each node, torch's gloo group between them, docs/GLOO_TIER.md), beside DeepSpeed 0.19.8's
flat stage 3 on the same launch (its collectives on gloo).

The model: ``--layers`` Linear(``--width``, ``--width``) layers with GELU between (8 x 1024:
8.4 M parameters), a batch of ``--batch`` rows per rank, MSE loss, fp32, Adam. Each run
takes ``--warmup`` steps, then the median of ``--steps`` timed ones (rank 0's clock, from
one ``step()`` return to the next).

Usage (torch, DeepSpeed and the zero_torch wheel importable):

    PYTHONPATH=<zero_torch site>:target/py-torch python3 benches/cpu_tiers.py
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

RUNS = [
    ("zero, one machine, flat", "zero", {}, {}),
    ("zero, one machine, mics_shard_size 2", "zero", {"mics_shard_size": 2}, {}),
    ("zero, two machines (gloo between), flat", "zero", {}, {"ZERO_CPU_INTER_NODE": "gloo"}),
    ("zero, two machines (gloo between), mics_shard_size 2", "zero", {"mics_shard_size": 2},
     {"ZERO_CPU_INTER_NODE": "gloo"}),
    ("DeepSpeed 0.19.8 (gloo), flat", "deepspeed", {}, {}),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(args: Dict[str, Any]) -> None:
    """One rank: trains, and rank 0 writes the step times."""
    import torch

    if args["engine"] == "zero":
        import zero_torch.deepspeed_compat  # noqa: F401  (the one added line)
    import deepspeed

    if args["engine"] == "deepspeed":
        deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    w = args["width"]
    layers: List[Any] = []
    for _ in range(args["layers"]):
        layers += [torch.nn.Linear(w, w), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers)
    world = int(os.environ["WORLD_SIZE"])
    cfg = {
        "train_batch_size": args["batch"] * world,
        "train_micro_batch_size_per_gpu": args["batch"],
        "optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": 3, **args["zero"]},
    }
    if args["engine"] == "deepspeed":
        cfg["optimizer"]["params"]["torch_adam"] = True
    engine, _, _, _ = deepspeed.initialize(model=model, config=cfg, model_parameters=model.parameters())
    g = torch.Generator().manual_seed(1 + int(os.environ["RANK"]))
    x = torch.randn(args["batch"], w, generator=g)
    y = torch.randn(args["batch"], w, generator=g)
    times = []
    last = time.perf_counter()
    for i in range(args["warmup"] + args["steps"]):
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        now = time.perf_counter()
        if i >= args["warmup"]:
            times.append(now - last)
        last = now
    if os.environ["RANK"] == "0":
        Path(args["out"]).write_text(json.dumps(times))
    if args["engine"] == "deepspeed":
        # torch 2.11's gloo workers release finished collectives late and abort a process
        # whose teardown began ("terminate called without an active exception");
        # zero_torch waits for them at exit (_dist._at_exit), DeepSpeed does not.
        time.sleep(0.1)
        torch.distributed.destroy_process_group()


def launch(engine: str, zero: Dict[str, Any], extra: Dict[str, str], opts: argparse.Namespace) -> float:
    """Median step time (s) of one configuration on two torchrun agents of 2 processes."""
    out = Path(tempfile.mkdtemp(prefix="zero-tiers-")) / "times.json"
    args = {"engine": engine, "zero": zero, "out": str(out), "width": opts.width, "layers": opts.layers,
            "batch": opts.batch, "warmup": opts.warmup, "steps": opts.steps}
    env = {k: v for k, v in os.environ.items() if k != "ZERO_CPU_INTER_NODE"}
    env.update({"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", **extra})
    port = str(free_port())
    agents = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
             "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", port,
             __file__, "--worker", json.dumps(args)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for node in range(2)
    ]
    for a in agents:
        log, _ = a.communicate(timeout=1800)
        if a.returncode != 0:
            raise SystemExit(f"{engine} {zero} {extra} failed:\n{log.decode(errors='replace')[-4000:]}")
    return statistics.median(json.loads(out.read_text()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    opts = p.parse_args()
    if opts.worker:
        worker(json.loads(opts.worker))
        return
    params = opts.layers * (opts.width * opts.width + opts.width)
    print(f"stage 3, {params / 1e6:.1f} M parameters ({opts.layers} x Linear({opts.width}, {opts.width})), "
          f"batch {opts.batch} per rank, 4 ranks as 2 nodes of 2, fp32; median of {opts.steps} steps")
    results = []
    for name, engine, zero, extra in RUNS:
        t0 = time.time()
        step = launch(engine, zero, extra, opts)
        results.append((name, step))
        print(f"{name}: {step * 1e3:.1f} ms per step ({time.time() - t0:.0f} s for the launch)", flush=True)
    base = results[0][1]
    print("\n| run | ms per step | vs zero on one machine, flat |\n|---|---|---|")
    for name, step in results:
        print(f"| {name} | {step * 1e3:.1f} | {step / base:.2f}x |")


if __name__ == "__main__":
    main()
