"""Starting a model bigger than one rank (docs/BENCHMARKS.md, "zero-torch: models bigger
than one rank"): a Llama of 135M parameters (SmolLM-135M's shape) built from its config,
stage 3, bf16, on N CPU processes, three ways:

- ``ordinary``: the whole model built on every rank, then ``initialize``;
- ``init``: built inside ``zero_torch.zero.Init`` (no parameter holds values; the engine
  fills it one unit at a time from seeded initializers);
- ``pretrained``: ``zero_torch.from_pretrained`` of the same model saved with
  ``save_pretrained`` (each rank reads only the byte ranges it holds);
- ``lora``: built inside ``zero_torch.zero.Init`` with a LoRA-style frozen base: every
  parameter but the norms frozen (``requires_grad=False``; about 35K trained), as PEFT
  fine-tuning holds it;
- ``ds_init``, ``ds_pretrained``, ``ds_lora``: DeepSpeed itself (``DS_ACCELERATOR=cpu``, gloo,
  ``torch_adam``) on the same config: the model built inside ``deepspeed.zero.Init``, and
  transformers' ``from_pretrained`` of the same folder under ``HfDeepSpeedConfig`` (as a
  DeepSpeed user's script loads it).

Per rank: peak RSS growth (``VmHWM``, from just before the model is built, through
``--steps`` training steps), the engine's model states, the issue's budget (model states +
2 x (``stage3_max_live_parameters`` + ``reduce_bucket_size``) 16-bit elements + 256 MiB),
and the seconds from building the model to the end of ``initialize``. With a frozen
base the model states include the frozen weights each rank holds (zero's
``memory_report()["frozen"]``; DeepSpeed's frozen ``ds_tensor`` bytes).

    PYTHONPATH=<zero_torch and torch> python3 zero-torch/benches/bench_big_model.py [--worlds 1 2 4]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

LIVE = 30_000_000
BUCKET = 10_000_000
LAUNCH = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]


def llama_config() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                       num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                       tie_word_embeddings=True)


def ds_config(world: int) -> Dict[str, Any]:
    return {
        "train_batch_size": world, "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": 3, "reduce_bucket_size": BUCKET, "stage3_max_live_parameters": LIVE,
                              "stage3_max_reuse_distance": 1_000_000, "stage3_prefetch_bucket_size": BUCKET},
    }


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak() -> None:
    """Resets VmHWM to the current RSS (Linux: writing 5 to clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def rank_main(mode: str, folder: str, steps: int) -> None:
    import torch
    from transformers import LlamaForCausalLM

    import zero_torch

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    cfg = ds_config(world)
    if mode.startswith("ds_"):
        ds_main(mode, folder, steps, cfg)
        return
    reset_peak()
    base = peak_rss()
    t0 = time.perf_counter()
    if mode == "ordinary":
        with zero_torch.zero.Init(config_dict_or_path=cfg, seed=None):
            model = LlamaForCausalLM(llama_config())
    elif mode in ("init", "lora"):
        with zero_torch.zero.Init(config_dict_or_path=cfg, seed=0):
            model = LlamaForCausalLM(llama_config())
        if mode == "lora":
            freeze_base(model)
    else:
        model = zero_torch.from_pretrained(folder, config=cfg)
        model.train()
    engine, _, _, _ = zero_torch.initialize(model=model, config=cfg)
    engine._runtime.ensure_built()
    start_s = time.perf_counter() - t0

    def states() -> int:
        report = engine.memory_report()
        return sum(report.get(k, 0) for k in ("params", "grads", "master", "exp_avg", "exp_avg_sq", "grad_accum", "frozen"))

    train_and_report(engine, rank, steps, base, start_s, states)


def freeze_base(model: Any) -> None:
    """A LoRA-style frozen base: every parameter but the norms stops training."""
    for name, p in model.named_parameters():
        if "norm" not in name:
            p.requires_grad_(False)


def train_and_report(engine: Any, rank: int, steps: int, base: int, start_s: float, states: Any) -> None:
    """``steps`` training steps of ``engine`` (zero's or DeepSpeed's) on this rank's fixed
    sequence, then its ``RESULT`` line: peak RSS growth over ``base``, the model states
    ``states()`` gives after the steps, ``start_s``, the last loss."""
    import torch

    ids = torch.randint(0, 49152, (1, 32), generator=torch.Generator().manual_seed(rank))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - t0)
    later = times[1:] or times
    out = {"rank": rank, "growth": peak_rss() - base, "states": states(), "start_s": start_s,
           "step_s": sorted(later)[len(later) // 2], "loss": float(loss.item())}
    print("RESULT " + json.dumps(out), flush=True)


def ds_main(mode: str, folder: str, steps: int, cfg: Dict[str, Any]) -> None:
    """The same run on DeepSpeed: its zero.Init, or transformers' from_pretrained under
    HfDeepSpeedConfig; model states as DeepSpeed's stage 3 keeps them (16-bit partition,
    fp32 master, two moments, 16-bit gradient partition: 16 bytes per owned parameter)."""
    import deepspeed
    import torch
    from transformers import LlamaForCausalLM

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    deepspeed.init_distributed(dist_backend="gloo")
    cfg = dict(cfg, optimizer={"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}})
    reset_peak()
    base = peak_rss()
    t0 = time.perf_counter()
    if mode in ("ds_init", "ds_lora"):
        with deepspeed.zero.Init(config_dict_or_path=cfg):
            model = LlamaForCausalLM(llama_config())
        if mode == "ds_lora":
            freeze_base(model)
    else:
        from transformers.integrations import HfDeepSpeedConfig

        keep = HfDeepSpeedConfig(cfg)  # noqa: F841  (transformers reads it while it lives)
        model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
        model.train()
    engine, _, _, _ = deepspeed.initialize(model=model, config=cfg, model_parameters=model.parameters())
    start_s = time.perf_counter() - t0
    def states() -> int:
        """16 bytes per owned trained element, the 16-bit partition of a frozen one."""
        return sum((16 if p.requires_grad else p.ds_tensor.element_size()) * p.ds_tensor.numel()
                   for p in model.parameters())

    train_and_report(engine, rank, steps, base, start_s, states)


def launch(world: int, mode: str, folder: str, steps: int) -> List[Dict[str, Any]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(world):
        env = {k: v for k, v in os.environ.items() if k not in LAUNCH}
        env.update({"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(world),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
                    "DS_ACCELERATOR": "cpu"})
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank-main", mode, "--folder", folder,
                                       "--steps", str(steps)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=3600)[0] for p in procs]
    results = []
    for p, o in zip(procs, outs):
        if p.returncode != 0:
            raise SystemExit(f"{mode} at N={world} failed:\n{o[-3000:]}")
        results.append(json.loads(next(line for line in o.splitlines() if line.startswith("RESULT "))[7:]))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--modes", nargs="+", default=["ordinary", "init", "pretrained"])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rank-main", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--folder", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_main:
        rank_main(args.rank_main, args.folder, args.steps)
        return
    import torch
    from transformers import LlamaForCausalLM

    with tempfile.TemporaryDirectory(prefix="zt-big-") as folder:
        if {"pretrained", "ds_pretrained"} & set(args.modes):
            torch.manual_seed(0)
            LlamaForCausalLM(llama_config()).to(torch.bfloat16).save_pretrained(folder)
        mib = 1 << 20
        print("| N | path | peak RSS growth per rank (MiB) | model states (MiB) | budget (MiB) | build + initialize (s) "
              "| s/step (median after the first) |")
        print("|---|---|---|---|---|---|---|")
        for world in args.worlds:
            for mode in args.modes:
                res = launch(world, mode, folder, args.steps)
                growth = max(r["growth"] for r in res)
                states = max(r["states"] for r in res)
                budget = states + 2 * (LIVE + BUCKET) * 2 + 256 * mib
                start = max(r["start_s"] for r in res)
                step = max(r["step_s"] for r in res)
                print(f"| {world} | {mode} | {growth / mib:,.0f} | {states / mib:,.0f} | {budget / mib:,.0f} | {start:.1f} "
                      f"| {step:.2f} |", flush=True)


if __name__ == "__main__":
    main()
