"""What each rank of a test job runs (``conftest.run_job``): the task named by
``ZT_TASK`` with the keyword arguments in ``ZT_ARGS``; its result is pickled to
``ZT_OUT/rank<r>.pkl``."""

from __future__ import annotations

import json
import os
import pickle
import traceback
from pathlib import Path
from typing import Any, Dict, List

import torch

import models


def rank_world() -> tuple:
    """This process's rank and the world size (0 of 1 without a launcher)."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def ready() -> None:
    """Tells the test this rank got as far as it needs (for the kill test)."""
    Path(os.environ["ZT_OUT"], f"ready{os.environ['RANK']}").touch()


def config(stage: int, dtype: str, gas: int, global_batch: int, lr: float = 1e-2, clip: float = 0.0, extra: Dict[str, Any] = None) -> Dict[str, Any]:
    cfg: Dict[str, Any] = {
        "train_batch_size": global_batch,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": clip,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}},
        "zero_optimization": {
            "stage": stage,
            "reduce_bucket_size": 4096,
            "stage3_prefetch_bucket_size": 4096,
            "stage3_param_persistence_threshold": 64,
        },
    }
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    for k, v in (extra or {}).items():
        cfg[k] = {**cfg[k], **v} if isinstance(v, dict) and isinstance(cfg.get(k), dict) else v
    return cfg


def gathered(engine: Any) -> Dict[str, torch.Tensor]:
    """Every parameter of the model, whole, as float32 (a collective in stage 3)."""
    import zero_torch

    params = list(engine.module.parameters())
    with zero_torch.zero.GatheredParameters(params):
        return {n: p.detach().float().clone() for n, p in engine.module.named_parameters()}


def train_one(model: str, stage: int, dtype: str, gas: int, steps: int, global_batch: int, seed: int = 0, clip: float = 0.0, lr: float = 1e-2, snapshot_at: int = -1, extra: Dict[str, Any] = None,
              frozen: bool = False) -> Dict[str, Any]:
    """Trains ``steps`` optimizer steps (``extra``: more config sections; ``frozen``: a
    LoRA-style frozen base, ``models.freeze_base``); returns the losses, the final
    parameters (and those after step ``snapshot_at``), and the memory report."""
    import zero_torch

    rank, world = rank_world()
    m = models.build(model, seed)
    if frozen:
        models.freeze_base(m)
    engine, _, _, _ = zero_torch.initialize(model=m, config=config(stage, dtype, gas, global_batch, lr=lr, clip=clip, extra=extra))
    losses: List[float] = []
    snapshot = None
    for step, ids in enumerate(models.batches(steps, global_batch, seed + 1)):
        mine = models.shard(ids, rank, world)
        total = 0.0
        for k in range(gas):
            loss = models.loss_of(engine, models.micro(mine, k, gas))
            engine.backward(loss)
            engine.step()
            total += loss.item()
        losses.append(total / gas)
        if step + 1 == snapshot_at:
            snapshot = gathered(engine)
    return {"losses": losses, "params": gathered(engine), "snapshot": snapshot, "memory": engine.memory_report()}


def cuda_train(model: str, stage: int, dtype: str, steps: int, global_batch: int, lr: float = 1e-2, side_stream: bool = False,
               gas: int = 1, extra: Dict[str, Any] = None, script_all_reduce: bool = False) -> Dict[str, Any]:
    """``train_one`` with the model on the GPU (``cuda:0``, NCCL at world size 1) and
    deterministic torch kernels; with ``side_stream`` every forward, backward and step runs
    on a stream other than torch's default one (the engine's copies must order themselves
    with whichever stream is current); with ``script_all_reduce`` the script all-reduces
    each loss on torch's NCCL group between backward and step, as DeepSpeed scripts log
    losses (issue 30, M3). Returns the losses, the parameters (on the CPU), what stage 3
    leaves in torch's CUDA storage at rest, the memory report, the losses the script
    all-reduced, and the consolidated state dict (each entry's device and values)."""
    import torch.distributed as dist

    import zero_torch

    torch.use_deterministic_algorithms(True)
    m = models.build(model).cuda()
    engine, _, _, _ = zero_torch.initialize(model=m, config=config(stage, dtype, gas, global_batch, lr=lr, extra=extra))
    assert engine.device == torch.device("cuda", 0), engine.device
    stream = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    losses: List[float] = []
    reduced: List[float] = []
    with torch.cuda.stream(stream):
        for ids in models.batches(steps, global_batch, 1):
            ids = ids.to(engine.device)
            total_loss = 0.0
            for k in range(gas):
                loss = models.loss_of(engine, models.micro(ids, k, gas))
                engine.backward(loss)
                if script_all_reduce:
                    logged = loss.detach().clone()
                    dist.all_reduce(logged)
                    reduced.append(logged.item())
                engine.step()
                total_loss += loss.item()
            losses.append(total_loss / gas)
        memory = engine.memory_report()
        held = sharded_bytes(engine)
        params = {n: t.cpu() for n, t in gathered(engine).items()}
        consolidated = engine._zero3_consolidated_16bit_state_dict()
    torch.cuda.synchronize()
    return {"losses": losses, "params": params, "held_at_rest": held, "memory": memory, "reduced": reduced,
            "backend": dist.get_backend(),
            "consolidated": {n: (str(t.device), t.float()) for n, t in consolidated.items()}}


def torch_cuda_adamw(model: str, steps: int, global_batch: int, lr: float = 1e-2) -> Dict[str, Any]:
    """The same training with ``torch.optim.AdamW`` on the GPU (deterministic kernels)."""
    torch.use_deterministic_algorithms(True)
    m = models.build(model).cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    losses = []
    for ids in models.batches(steps, global_batch, 1):
        loss = models.loss_of(m, ids.cuda())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "params": {n: p.detach().float().cpu() for n, p in m.named_parameters()}}


def toy_config(stage: int, gas: int, global_batch: int, dtype: str = "fp32") -> Dict[str, Any]:
    """``config`` with buckets small enough that ``Toy`` spans several, and small
    parameters (LayerNorm, biases) kept whole in stage 3."""
    cfg = config(stage, dtype, gas, global_batch)
    cfg["zero_optimization"].update({"reduce_bucket_size": 600, "stage3_prefetch_bucket_size": 600, "stage3_param_persistence_threshold": 20})
    return cfg


def sharded_bytes(engine: Any) -> int:
    """Elements held in torch storage by the parameters that stage 3 partitions."""
    rt = engine._runtime
    return sum(p.param.numel() for u in rt.order for p in u.params if not p.persistent)


def pattern_run(pattern: str, stage: int, gas: int, steps: int, global_batch: int) -> Dict[str, Any]:
    """Trains ``models.Toy(pattern)``; besides losses and parameters, records what the
    hooks leave behind: the partitioned parameters' storage after each backward and after a
    ``no_grad`` evaluation (stage 3 frees it), and whether parameters moved between
    micro-steps (only at the accumulation boundary)."""
    import zero_torch

    rank, world = rank_world()
    model = models.Toy(pattern)
    engine, _, _, _ = zero_torch.initialize(model=model, config=toy_config(stage, gas, global_batch))
    losses: List[float] = []
    held_after_backward: List[int] = []
    moved_off_boundary = False
    boundaries: List[bool] = []
    for step, (x, y) in enumerate(models.regression(steps, global_batch)):
        x, y = models.shard(x, rank, world), models.shard(y, rank, world)
        for k in range(gas):
            before = None
            if k < gas - 1:
                before = {n: t.clone() for n, t in gathered(engine).items()}
            loss = engine(models.micro(x, k, gas), models.micro(y, k, gas))
            engine.backward(loss)
            held_after_backward.append(sharded_bytes(engine))
            boundaries.append(engine.is_gradient_accumulation_boundary())
            engine.step()
            losses.append(loss.item())
            if before is not None:
                after = gathered(engine)
                moved_off_boundary |= any(not torch.equal(before[n], after[n]) for n in before)
        if step == 0:
            with torch.no_grad():
                engine.eval()
                engine(x, y)
                engine.train()
            held_after_eval = sharded_bytes(engine)
    return {
        "losses": losses,
        "params": gathered(engine),
        "held_after_backward": held_after_backward,
        "held_after_eval": held_after_eval,
        "moved_off_boundary": moved_off_boundary,
        "boundaries": boundaries,
    }


def pattern_many(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Several ``pattern_run``s in one process."""
    return {"runs": [pattern_run(**r) for r in runs]}


def train_many(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Several trainings in one process (torch is imported once)."""
    return {"runs": [train_one(**r) for r in runs]}


def deepspeed_many(stages: List[int], steps: int, global_batch: int, model: str = "llama", frozen: bool = False) -> Dict[str, Any]:
    """DeepSpeed itself (``DS_ACCELERATOR=cpu``, gloo) on the same model, data and config
    as ``train_one`` in fp32, once per stage; its optimizer is ``torch.optim.AdamW``
    (``torch_adam``), as DeepSpeed has no fused Adam on the CPU without a JIT build.
    ``frozen``: a LoRA-style frozen base (``models.freeze_base``); the memory of the
    frozen weights each rank holds at stage 3 (their ``ds_tensor``) is returned."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = rank_world()
    runs = []
    for stage in stages:
        m = models.build(model)
        if frozen:
            models.freeze_base(m)
        cfg = config(stage, "fp32", 1, global_batch)
        cfg["optimizer"]["params"]["torch_adam"] = True
        engine, _, _, _ = deepspeed.initialize(model=m, config=cfg, model_parameters=m.parameters())
        losses: List[float] = []
        for ids in models.batches(steps, global_batch, 1):
            loss = models.loss_of(engine, models.shard(ids, rank, world))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        params = list(engine.module.parameters())
        held = sum(p.ds_tensor.numel() * p.ds_tensor.element_size() for p in params if not p.requires_grad and hasattr(p, "ds_tensor"))
        with deepspeed.zero.GatheredParameters(params, enabled=stage == 3):
            whole = {n: p.detach().float().clone() for n, p in engine.module.named_parameters()}
        runs.append({"losses": losses, "params": whole, "frozen_held": held})
        engine.destroy()
    return {"runs": runs}


def killed_mid_collective(stage: int) -> Dict[str, Any]:
    """Every rank trains; rank 1 is killed by the test after its first step."""
    import zero_torch

    rank, world = rank_world()
    m = models.build("llama")
    engine, _, _, _ = zero_torch.initialize(model=m, config=config(stage, "fp32", 1, 2 * world))
    ids = models.batches(1, 2 * world)[0]
    loss = models.loss_of(engine, models.shard(ids, rank, world))
    engine.backward(loss)
    engine.step()
    import time

    ready()
    if rank == 1:
        time.sleep(600)
    t0 = time.time()
    try:
        for _ in range(100000):
            loss = models.loss_of(engine, models.shard(ids, rank, world))
            engine.backward(loss)
            engine.step()
    except zero_torch.ZeroError as e:
        return {"raised": type(e).__name__, "message": str(e), "after": time.time() - t0}
    return {"raised": None}


def _train_steps(engine: Any, steps: range, global_batch: int) -> List[float]:
    """Optimizer steps ``steps`` (indices into the run's batches) on this rank's shard."""
    rank, world = rank_world()
    data = models.batches(steps.stop, global_batch, 1)
    losses = []
    for i in steps:
        loss = models.loss_of(engine, models.shard(data[i], rank, world))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def ckpt_train(model: str, stage: int, steps: int, save_at: int, save_dir: str, global_batch: int, bin_dir: str = "", st_dir: str = "") -> Dict[str, Any]:
    """Trains ``steps`` steps, saving a checkpoint (with a client state holding a tensor)
    after step ``save_at``; at the end saves the 16-bit model as ``.bin`` into ``bin_dir``
    and as safetensors into ``st_dir``."""
    import zero_torch

    cfg = config(stage, "fp32", 1, global_batch)
    cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    engine, _, _, _ = zero_torch.initialize(model=models.build(model), config=cfg)
    losses = _train_steps(engine, range(save_at), global_batch)
    engine.save_checkpoint(save_dir, client_state={"epoch": 7, "order": torch.arange(5)})
    at_save = gathered(engine)
    losses += _train_steps(engine, range(save_at, steps), global_batch)
    if bin_dir:
        assert engine.save_16bit_model(bin_dir)
    if st_dir:
        assert engine.save_16bit_model(st_dir, "model.safetensors")
    return {"losses": losses, "at_save": at_save, "params": gathered(engine)}


def ckpt_resume(model: str, stage: int, load_dir: str, start: int, steps: int, global_batch: int) -> Dict[str, Any]:
    """Loads the checkpoint of ``load_dir`` into a new engine and trains steps ``start`` to
    ``steps``."""
    import zero_torch

    cfg = config(stage, "fp32", 1, global_batch)
    engine, _, _, _ = zero_torch.initialize(model=models.build(model, seed=123), config=cfg)
    path, client = engine.load_checkpoint(load_dir)
    loaded = gathered(engine)
    global_steps = engine.global_steps
    losses = _train_steps(engine, range(start, steps), global_batch)
    return {"path": path, "client": client, "loaded": loaded, "global_steps": global_steps, "losses": losses, "params": gathered(engine)}


def frozen_excluded(stage: int, save_dir: str, mode: str, steps: int = 4, save_at: int = 2) -> Dict[str, Any]:
    """``models.Toy("frozen")`` (its input layer frozen), as the Trainer checkpoints a PEFT
    model: ``mode`` ``save`` trains ``steps`` steps, saving with
    ``exclude_frozen_parameters=True`` after ``save_at``; ``resume`` loads that checkpoint
    with ``load_module_strict=False`` into a model whose other weights differ and trains
    the remaining steps; ``strict`` loads it strictly (an error naming a frozen parameter)."""
    import zero_torch

    rank, world = rank_world()
    cfg = toy_config(stage, 1, 4)
    model = models.Toy("frozen", seed=0 if mode == "save" else 9)
    if mode != "save":
        # The base weights come from elsewhere (a PEFT model's pretrained base): the same.
        model.inp.load_state_dict(models.Toy("frozen", seed=0).inp.state_dict())
    engine, _, _, _ = zero_torch.initialize(model=model, config=cfg)
    data = models.regression(steps, 4)

    def train(indices: range) -> List[float]:
        out = []
        for i in indices:
            x, y = data[i]
            loss = engine(models.shard(x, rank, world), models.shard(y, rank, world))
            engine.backward(loss)
            engine.step()
            out.append(loss.item())
        return out

    if mode == "save":
        losses = train(range(save_at))
        engine.save_checkpoint(save_dir, exclude_frozen_parameters=True)
        losses += train(range(save_at, steps))
        return {"losses": losses, "params": gathered(engine)}
    try:
        engine.load_checkpoint(save_dir, load_module_strict=mode == "strict")
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}", "exception": type(e).__name__}
    return {"losses": train(range(save_at, steps)), "params": gathered(engine)}


def mismatched_model() -> Dict[str, Any]:
    """Rank 1 builds a wider model than rank 0: every rank must get an error naming the
    mismatch, not hang."""
    import time

    import zero_torch

    rank, world = rank_world()
    model = models.Toy("plain", d=16 if rank == 0 else 24)
    t0 = time.time()
    try:
        engine, _, _, _ = zero_torch.initialize(model=model, config=toy_config(3, 1, 2 * world))
        x, y = models.regression(1, 2 * world)[0]
        engine.backward(engine(models.shard(x, rank, world), models.shard(y, rank, world)))
        engine.step()
    except zero_torch.ZeroError as e:
        return {"raised": type(e).__name__, "message": str(e), "after": time.time() - t0}
    return {"raised": None}


def main() -> None:
    import ds_cpu_fp16

    ds_cpu_fp16.install()
    task = os.environ["ZT_TASK"]
    args = json.loads(os.environ["ZT_ARGS"])
    out = Path(os.environ["ZT_OUT"])
    rank = int(os.environ["RANK"])
    try:
        if "." in task:  # a function of another test module: "module.function"
            import importlib

            module, name = task.rsplit(".", 1)
            fn = getattr(importlib.import_module(module), name)
        else:
            fn = globals()[task]
        result = fn(**args)
    except BaseException as e:  # reported to the test, which decides
        result = {"error": f"{type(e).__name__}: {e}", "exception": type(e).__name__, "log": traceback.format_exc()}
    with open(out / f"rank{rank}.pkl", "wb") as f:
        pickle.dump(result, f)
