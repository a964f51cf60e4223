"""zero-torch's benchmarks (CPU), printed as the tables of docs/BENCHMARKS.md.

    PYTHONPATH=<zero_torch and torch> python3 zero-torch/benches/bench_zero_torch.py [--only NAME]

- ``vs-deepspeed``: ``examples/train_gpt2.py`` on 2 processes, zero and DeepSpeed itself
  (``DS_ACCELERATOR=cpu``, gloo, ``torch.optim.AdamW``), stages 0-3, in ``--precision``
  fp32 or bf16: median step time, each rank's peak and final RSS, and what torch storage
  holds of the parameters at rest outside the engine's buffers.
- ``overhead``: one process, the same GPT-2 in a plain PyTorch loop (``torch.optim.AdamW``)
  against zero at stages 0 and 3: median step time.
- ``hooks``: one process, a stack of tiny ``Linear`` layers, so that the per-module work
  of the hooks dominates: zero's time per module per step above plain PyTorch's.
- ``gpu``: one process on the GPU (NCCL at world size 1), a GPT-2 of ``--gpu-width`` and
  ``--gpu-layers`` in bf16 (fp32 master weights), plain PyTorch with
  ``torch.optim.AdamW(fused=True)`` on fp32 weights under bf16 autocast against zero at
  stages 0 and 3: median step time, synchronized. Prints a skip without a GPU.

Speed is measured here, not in tests (three warm-up steps, then the median). The
one-process loops run on one thread everywhere: torch's (``torch.set_num_threads(1)``) and
zero's (``RAYON_NUM_THREADS=1``, set before zero_torch is imported).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parent / "examples" / "train_gpt2.py"
LAUNCH = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world: int, args: List[str], timeout: float = 1800) -> List[str]:
    """Runs the example on ``world`` processes (torchrun's variables); each rank's output."""
    port = free_port()
    procs = []
    for r in range(world):
        env = {k: v for k, v in os.environ.items() if k not in LAUNCH}
        env.update({"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                    "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"})
        procs.append(subprocess.Popen([sys.executable, str(EXAMPLE)] + args, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, o in zip(procs, outs):
        # torch 2.11's gloo can abort a finished process in its teardown ("terminate
        # called without an active exception", zero-torch README); DeepSpeed's runs hit
        # it. A rank that printed its results before that counts, and the abort is said.
        torn_down = "terminate called without an active exception" in o and "peak RSS" in o
        if p.returncode != 0 and not torn_down:
            raise RuntimeError(f"{args} failed:\n{o[-3000:]}")
        if p.returncode != 0:
            print(f"(note: {' '.join(args)}: a rank aborted in gloo's teardown after its results)", flush=True)
    return outs


def vs_deepspeed(steps: int, width: int, layers: int, precision: str, stages: List[int]) -> None:
    size = ["--width", str(width), "--layers", str(layers), "--seq", "64", "--steps", str(steps),
            "--precision", precision]
    print(f"\nGPT-2 width {width}, {layers} layers, seq 64, global batch 32 (micro 8 x 2 accumulation), "
          f"{precision}, 2 processes, {steps} steps (median of the last 80%)\n")
    print("| stage | zero ms/step | DeepSpeed ms/step | DeepSpeed / zero | zero RSS peak / at the end (MiB, ranks 0, 1) | DeepSpeed RSS peak / at the end | zero: torch param storage at rest / engine model states (MiB, rank 0) | final loss zero / DeepSpeed |")
    print("|---|---|---|---|---|---|---|---|")
    for stage in stages:
        row: Dict[str, Tuple[float, List[float], float]] = {}
        for engine in ("zero", "deepspeed"):
            outs = launch(2, size + ["--stage", str(stage), "--engine", engine])
            ms = float(re.search(r"median step ([\d.]+) ms", outs[0]).group(1))
            loss = float(re.search(r"final smoothed loss ([\d.]+)", outs[0]).group(1))
            rss = [tuple(map(float, re.search(r"peak RSS (\d+) MiB, now (\d+) MiB", o).groups())) for o in outs]
            held = re.search(r"rank 0: .*torch storage at rest ([\d.]+) MiB(?:; engine model states ([\d.]+) MiB)?", "\n".join(outs))
            row[engine] = (ms, rss, loss, held.group(1), held.group(2))
        z, d = row["zero"], row["deepspeed"]
        print(f"| {stage} | {z[0]:.1f} | {d[0]:.1f} | {d[0] / z[0]:.2f} | {', '.join(f'{a:.0f}/{b:.0f}' for a, b in z[1])} | "
              f"{', '.join(f'{a:.0f}/{b:.0f}' for a, b in d[1])} | {z[3]} / {z[4]} | {z[2]:.4f} / {d[2]:.4f} |", flush=True)


def _median_step(step, n: int) -> float:
    for _ in range(3):
        step()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _config(stage: int, batch: int) -> Dict:
    return {"train_batch_size": batch, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 5e5, "stage3_prefetch_bucket_size": 5e5,
                                  "stage3_param_persistence_threshold": 1000}}


def overhead(n: int, width: int, layers: int) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    import zero_torch

    torch.set_num_threads(1)

    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=64, n_embd=width, n_layer=layers, n_head=4,
                                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                          bos_token_id=63, eos_token_id=63))

    ids = torch.randint(0, 64, (8, 64), generator=torch.Generator().manual_seed(1))
    m = build()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)

    def plain() -> None:
        m(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()

    results = {"PyTorch + torch.optim.AdamW": _median_step(plain, n)}
    for stage in (0, 3):
        engine, _, _, _ = zero_torch.initialize(model=build(), config=_config(stage, 8))

        def z() -> None:
            engine.backward(engine(input_ids=ids, labels=ids).loss)
            engine.step()

        results[f"zero_torch stage {stage}"] = _median_step(z, n)
    ds = _deepspeed()
    for stage in (0, 3) if ds is not None else ():
        model = build()
        engine, _, _, _ = ds.initialize(model=model, model_parameters=model.parameters(), config=_ds_config(stage, 8, 1000))

        def d() -> None:
            engine.backward(engine(input_ids=ids, labels=ids).loss)
            engine.step()

        results[f"DeepSpeed stage {stage}"] = _median_step(d, n)
        engine.destroy()
    base = results["PyTorch + torch.optim.AdamW"]
    params = sum(p.numel() for p in m.parameters())
    print(f"\nOne process, 1 thread: GPT-2 width {width}, {layers} layers ({params:,} parameters), batch 8 x 64, fp32, median of {n} steps\n")
    print("| loop | ms/step | vs PyTorch |")
    print("|---|---|---|")
    for k, v in results.items():
        print(f"| {k} | {v * 1000:.1f} | {v / base:.3f} |", flush=True)


def gpu_overhead(n: int, width: int, layers: int) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    if not torch.cuda.is_available():
        print("\nSKIPPED the GPU benchmark: torch sees no CUDA GPU on this machine", flush=True)
        return
    import zero_torch

    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_positions=1024, n_embd=width, n_layer=layers,
                                          n_head=max(1, width // 64), resid_pdrop=0.0, embd_pdrop=0.0,
                                          attn_pdrop=0.0)).cuda()

    ids = torch.randint(0, 50257, (8, 1024), generator=torch.Generator().manual_seed(1)).cuda()

    def timed(step) -> float:
        def synced() -> None:
            step()
            torch.cuda.synchronize()

        return _median_step(synced, n)

    m = build()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)

    def plain() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()

    results = {"PyTorch, bf16 autocast + AdamW(fused=True)": timed(plain)}
    params = sum(p.numel() for p in m.parameters())
    del m, opt
    torch.cuda.empty_cache()
    for stage in (0, 3):
        cfg = _config(stage, 8)
        cfg["bf16"] = {"enabled": True}
        cfg["zero_optimization"].update({"reduce_bucket_size": 5e7, "stage3_prefetch_bucket_size": 5e7,
                                         "stage3_param_persistence_threshold": 1e5})
        engine, _, _, _ = zero_torch.initialize(model=build(), config=cfg)

        def z() -> None:
            engine.backward(engine(input_ids=ids, labels=ids).loss)
            engine.step()

        results[f"zero_torch stage {stage}, bf16"] = timed(z)
        engine.destroy()
        del engine
        torch.cuda.empty_cache()
    base = next(iter(results.values()))
    print(f"\nOne process on {torch.cuda.get_device_name()}: GPT-2 width {width}, {layers} layers "
          f"({params:,} parameters), batch 8 x 1024, median of {n} synchronized steps\n")
    print("| loop | ms/step | vs PyTorch |")
    print("|---|---|---|")
    for k, v in results.items():
        print(f"| {k} | {v * 1000:.1f} | {v / base:.3f} |", flush=True)


def _deepspeed():
    """DeepSpeed in this process as a world of one (CPU accelerator, gloo), or None."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(free_port())}.items():
        os.environ.setdefault(k, v)
    try:
        import deepspeed
    except ImportError:
        return None
    import torch.distributed as dist

    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo")
    return deepspeed


def _ds_config(stage: int, batch: int, persistence: int) -> Dict:
    cfg = _config(stage, batch)
    cfg["optimizer"]["params"]["torch_adam"] = True
    cfg["zero_optimization"]["stage3_param_persistence_threshold"] = persistence
    return cfg


def _phases(fwd_bwd, step, n: int) -> Tuple[float, float]:
    """Median seconds of ``fwd_bwd()`` and of ``step()`` over ``n`` steps (one warm-up)."""
    for _ in range(3):
        fwd_bwd()
        step()
    a, b = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        fwd_bwd()
        t1 = time.perf_counter()
        step()
        b.append(time.perf_counter() - t1)
        a.append(t1 - t0)
    return statistics.median(a), statistics.median(b)


def hooks(n: int, modules: int) -> None:
    import torch

    import zero_torch

    torch.set_num_threads(1)

    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(modules)])

    x = torch.randn(4, 16)
    m = build()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)

    def opt_step() -> None:
        opt.step()
        opt.zero_grad()

    rows = {"PyTorch + torch.optim.AdamW": _phases(lambda: m(x).square().mean().backward(), opt_step, n)}
    engines = []
    for stage in (0, 3):
        cfg = _config(stage, 4)
        cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        engine, _, _, _ = zero_torch.initialize(model=build(), config=cfg)
        engines.append(engine)
        rows[f"zero_torch stage {stage}"] = _phases(lambda e=engine: e.backward(e(x).square().mean()), engine.step, n)
    ds = _deepspeed()
    for stage in (0, 3) if ds is not None else ():
        model = build()
        engine, _, _, _ = ds.initialize(model=model, model_parameters=model.parameters(), config=_ds_config(stage, 4, 0))
        rows[f"DeepSpeed stage {stage}"] = _phases(lambda e=engine: e.backward(e(x).square().mean()), engine.step, n)
        engine.destroy()
    base = rows["PyTorch + torch.optim.AdamW"][0]
    print(f"\nOne process, 1 thread: {modules} x Linear(16, 16) in sequence (every parameter partitioned in stage 3), "
          f"batch 4, median of {n} steps\n")
    print("| loop | forward + backward ms | per module above PyTorch | optimizer step ms |")
    print("|---|---|---|---|")
    for k, (fb, st) in rows.items():
        extra = "" if k.startswith("PyTorch") else f"{(fb - base) / modules * 1e6:.1f} us"
        print(f"| {k} | {fb * 1000:.2f} | {extra} | {st * 1000:.2f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["vs-deepspeed", "overhead", "hooks", "gpu"])
    ap.add_argument("--gpu-width", type=int, default=768)
    ap.add_argument("--gpu-layers", type=int, default=12)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="vs-deepspeed's precision")
    ap.add_argument("--stages", type=int, nargs="+", choices=[0, 1, 2, 3], default=[0, 1, 2, 3],
                    help="vs-deepspeed's stages")
    args = ap.parse_args()
    os.environ["RAYON_NUM_THREADS"] = "1"
    import platform

    print(f"# zero-torch benchmarks, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}")
    if args.only in (None, "overhead"):
        overhead(20, args.width, args.layers)
    if args.only in (None, "hooks"):
        hooks(50, 200)
    if args.only in (None, "vs-deepspeed"):
        vs_deepspeed(args.steps, args.width, args.layers, args.precision, args.stages)
    if args.only in (None, "gpu"):
        gpu_overhead(20, args.gpu_width, args.gpu_layers)


if __name__ == "__main__":
    main()
