"""What DeepSpeed-Chat's, Lightning's and PEFT's code reads and does around the engine, run
on DeepSpeed 0.19.8 or on zero_torch (``test_ds_protocol.py``), one process per rank:

- ``scheduler``: a torch scheduler given to ``initialize``, then taken back by assigning
  ``engine.lr_scheduler = None`` (Lightning), stepped by the script itself; then another
  scheduler assigned in its place; the learning rate at every step;
- ``protocol``: DeepSpeed's ZeRO-3 parameter attributes (``ds_id``, ``ds_status``,
  ``ds_shape``, ``ds_numel``, ``ds_persist``) at the moments client code reads them;
- ``gathered``: ``GatheredParameters`` given what DeepSpeed accepts (``None`` entries, a
  tuple, a generator, one tensor, ``None``), a write by rank 0 kept on every rank;
- ``surface``: ``deepspeed.compression.helper``, ``memory_efficient_linear: false`` and
  ``offload_param`` below stage 3 (accepted, training as without them), ``engine.tput_timer``.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List

import torch

import models
from semantics_workers import Net, base_config, data, library, rank_world

STEPS = 4


def _loop(engine: Any, steps: int, after_step: Any = None) -> List[float]:
    rank, world = rank_world()
    losses = []
    for x, y in data(steps, 4 * world):
        loss = engine(models.shard(x, rank, world), models.shard(y, rank, world))
        engine.backward(loss)
        engine.step()
        if after_step is not None:
            after_step()
        losses.append(loss.item())
    return losses


def scheduler(lib: str, stage: int) -> Dict[str, Any]:
    """Lightning's pattern, then a second scheduler assigned in place of the first."""
    mod = library(lib)
    if lib == "deepspeed":
        mod.init_distributed(dist_backend="gloo")
    model = Net(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
    cfg = base_config(stage, 4 * rank_world()[1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine, optimizer, _, returned = mod.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=cfg)
        given_back = returned is sched
        engine.lr_scheduler = None  # Lightning takes the scheduler back and steps it itself
        lrs: List[float] = []
        losses = _loop(engine, STEPS, lambda: (sched.step(), lrs.append(optimizer.param_groups[0]["lr"])))
        other = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
        engine.lr_scheduler = other  # the engine steps the one it holds now
        losses += _loop(engine, 2, lambda: lrs.append(optimizer.param_groups[0]["lr"]))
    order = [str(w.message) for w in caught if "lr_scheduler.step()" in str(w.message)]
    return {"lrs": lrs, "losses": losses, "returned_same": given_back, "order_warnings": order}


def _status(p: torch.nn.Parameter) -> Any:
    return p.ds_status.name if hasattr(p, "ds_status") else None


def protocol(lib: str, stage: int) -> Dict[str, Any]:
    """The attributes after the first step, inside a module's forward, inside
    ``GatheredParameters`` and after it; ``ZeroParamStatus`` from DeepSpeed's module."""
    mod = library(lib)
    if lib == "deepspeed":
        mod.init_distributed(dist_backend="gloo")
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus  # the served one on zero

    model = Net(seed=0)
    cfg = base_config(stage, 4 * rank_world()[1])
    cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}
    engine, _, _, _ = mod.initialize(model=model, config=cfg, model_parameters=model.parameters())
    named = list(model.named_parameters())
    seen: Dict[str, Any] = {}
    model.mid.register_forward_pre_hook(lambda m, a: seen.update({n: _status(p) for n, p in m.named_parameters()}))
    _loop(engine, 1)
    out: Dict[str, Any] = {
        "has_ds_id": {n: hasattr(p, "ds_id") for n, p in named},
        "in_forward": seen,
        "after_step": {n: _status(p) for n, p in named},
        "status_names": [s.name for s in ZeroParamStatus],
        "status_values": [s.value for s in ZeroParamStatus],
    }
    if stage == 3:
        ids = [p.ds_id for _, p in named]
        out["ids_in_order"] = ids == sorted(ids) and len(set(ids)) == len(ids)
        out["shape"] = {n: tuple(p.ds_shape) for n, p in named}
        out["numel"] = {n: p.ds_numel for n, p in named}
        out["persist"] = {n: bool(p.ds_persist) for n, p in named}
        out["is_status"] = all(isinstance(p.ds_status, ZeroParamStatus) for _, p in named)
        # DeepSpeed-Chat's _z3_params_to_fetch, then a gather of what it returns.
        fetch = [p for _, p in named if hasattr(p, "ds_id") and p.ds_status == ZeroParamStatus.NOT_AVAILABLE]
        out["to_fetch"] = [n for n, p in named if any(p is q for q in fetch)]
        with mod.zero.GatheredParameters(fetch):
            out["inside"] = {n: _status(p) for n, p in named}
            out["inside_shapes"] = {n: tuple(p.data.shape) for n, p in named}
        out["after_gather"] = {n: _status(p) for n, p in named}
        out["empty_after"] = {n: p.data.numel() == 0 for n, p in named}
        # What this rank holds: DeepSpeed's ds_tensor is its partition, zero's its piece of
        # the bucket partition; both hold fewer elements than the parameter where it is split.
        out["held"] = {n: int(p.ds_tensor.numel()) for n, p in named}
        out["held_attr"] = {n: int(p.ds_tensor.ds_numel) for n, p in named}
    return out


def gathered(lib: str, stage: int) -> Dict[str, Any]:
    """``GatheredParameters`` over what DeepSpeed accepts; rank 0's write inside a
    ``modifier_rank=0`` block becomes every rank's."""
    mod = library(lib)
    if lib == "deepspeed":
        mod.init_distributed(dist_backend="gloo")
    rank, world = rank_world()
    model = Net(seed=0)
    # Before any engine: None entries, as transformers' resize_token_embeddings passes them.
    with mod.zero.GatheredParameters([model.inp.weight, None, model.mid.weight, None], modifier_rank=0):
        pass
    cfg = base_config(stage, 4 * world)
    cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}
    engine, _, _, _ = mod.initialize(model=model, config=cfg, model_parameters=model.parameters())
    losses = _loop(engine, 1)
    shapes = []
    for params in (
        [model.inp.weight, None, model.head.bias],
        (model.inp.weight, model.mid.bias),
        (p for p in model.mid.parameters()),
        model.head.weight,
        None,
        [None],
    ):
        with mod.zero.GatheredParameters(params):
            shapes.append([tuple(p.data.shape) for p in (model.inp.weight, model.mid.bias, model.head.weight)
                           if params is not None])
    with mod.zero.GatheredParameters((p for p in [model.mid.weight, None]), modifier_rank=0):
        if rank == 0:
            with torch.no_grad():
                model.mid.weight.fill_(0.25)
    losses += _loop(engine, 2)
    with mod.zero.GatheredParameters([model.mid.weight]):
        mid = model.mid.weight.detach().clone()
    return {"losses": losses, "mid": mid, "whole_inside": [s for s in shapes if s][0] if shapes else None}


def surface(lib: str, stage: int) -> Dict[str, Any]:
    """DeepSpeed-Chat's config keys and helpers, and the throughput timer's counters."""
    mod = library(lib)
    if lib == "deepspeed":
        mod.init_distributed(dist_backend="gloo")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from deepspeed.compression.helper import recursive_getattr, recursive_setattr
    helper_warned = any(issubclass(w.category, FutureWarning) and "compression.helper" in str(w.message) for w in caught)
    rank, world = rank_world()
    model = Net(seed=0)
    assert recursive_getattr(model, "norm.weight") is model.norm.weight
    recursive_setattr(model, "head", torch.nn.Linear(16, 1))
    torch.manual_seed(1)
    model.head.reset_parameters()
    cfg = base_config(stage, 4 * world)
    cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}
    cfg["zero_optimization"].update({"memory_efficient_linear": False, "offload_param": {"device": "cpu"}})
    cfg["steps_per_print"] = 2
    engine, _, _, _ = mod.initialize(model=model, config=cfg, model_parameters=model.parameters())
    losses = _loop(engine, STEPS)
    t = engine.tput_timer
    t.update_epoch_count()
    counters = {
        "epoch_count": t.epoch_count,
        "micro_step_count": t.micro_step_count,
        "global_step_count": t.global_step_count,
        "batch_size": t.batch_size,
        "steps_per_output": t.steps_per_output,
        "start_step": t.start_step,
    }
    return {"losses": losses, "counters": counters, "helper_warned": helper_warned,
            "avg_is_float": isinstance(t.avg_samples_per_sec(), float)}


def pickling(lib: str, stage: int, out_dir: str) -> Dict[str, Any]:
    """zero only (DeepSpeed cannot pickle its parameters at any stage): ``torch.save`` of
    parameters themselves, as DeepSpeed-Chat's ``save_zero_three_model`` saves ``v.cpu()``
    (a CPU parameter's ``cpu()`` is the parameter); the files, for the test to load without
    zero_torch."""
    import os

    import deepspeed
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    rank, world = rank_world()
    model = Net(seed=0)
    cfg = base_config(stage, 4 * world)
    cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}
    engine, _, _, _ = deepspeed.initialize(model=model, config=cfg, model_parameters=model.parameters())
    _loop(engine, 1)
    model.mid.weight.script_flag = "kept"  # a script's own attribute survives pickling, as in torch
    out: Dict[str, Any] = {}
    try:
        torch.save({"w": model.mid.weight}, os.path.join(out_dir, f"direct{rank}.pt"))
        out["direct"] = "saved"
    except Exception as e:  # noqa: BLE001 - the type is the point
        out["direct"] = f"{type(e).__name__}: {e}"
        out["direct_is_pickling_error"] = isinstance(e, __import__("pickle").PicklingError)
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        torch.save(dict(model.named_parameters()), os.path.join(out_dir, f"gathered{rank}.pt"))
    # DeepSpeed-Chat's save_zero_three_model, as written upstream.
    state = {}
    for k, v in model.named_parameters():
        if hasattr(v, "ds_id"):
            fetch = [v] if v.ds_status == ZeroParamStatus.NOT_AVAILABLE else []
            with deepspeed.zero.GatheredParameters(fetch, enabled=stage == 3):
                v_p = v.data.cpu()
        else:
            v_p = v.cpu()
        state[k] = v_p
    if rank == 0:
        torch.save(state, os.path.join(out_dir, "dschat.pt"))
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        out["whole"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return out


def run(lib: str, cases: List[List[Any]], out_dir: str = "") -> Dict[str, Any]:
    """Each ``[case, stage]`` in its own engine (one process: torch imported once). On zero
    the compat line comes first, so ``deepspeed.*`` imports mean zero, as in a client."""
    if lib == "zero":
        import zero_torch.deepspeed_compat  # noqa: F401
    fns = {"scheduler": scheduler, "protocol": protocol, "gathered": gathered, "surface": surface}
    return {
        f"{name}@{stage}": pickling(lib, stage, out_dir) if name == "pickling" else fns[name](lib, stage)
        for name, stage in cases
    }
