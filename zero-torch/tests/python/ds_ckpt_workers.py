"""What each process of ``test_ds_checkpoint.py``'s jobs runs: real DeepSpeed writing
checkpoints (and recording, from its live engine, what they must hold), or zero_torch's
reader reading them back in a process that never imports DeepSpeed.

A job is started by ``test_ds_checkpoint.run_ds_job``: one process per rank with the
variables torchrun sets, the task named by ``DSC_TASK`` called with the keyword arguments
in ``DSC_ARGS`` (JSON), its result pickled to ``DSC_OUT/rank<r>.pkl``."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

HERE = Path(__file__).resolve().parent
READER_PATH = HERE.parents[1] / "python" / "zero_torch" / "_ds_checkpoint.py"


class Net(torch.nn.Module):
    """Odd sizes (so partitions and alignment padding fall inside parameters), a LayerNorm,
    one frozen parameter and one persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(7, 13)
        self.ln = torch.nn.LayerNorm(13)
        self.gate = torch.nn.Parameter(torch.linspace(0.5, 1.5, 13), requires_grad=False)
        self.l2 = torch.nn.Linear(13, 5)
        self.l3 = torch.nn.Linear(5, 3, bias=False)
        self.register_buffer("buf", torch.arange(3, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.ln(self.l1(x)) * self.gate.to(x.dtype))
        return self.l3(torch.tanh(self.l2(h))) + self.buf.to(x.dtype)


def rank_world() -> tuple:
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def ds_config(case: Dict[str, Any]) -> Dict[str, Any]:
    """DeepSpeed's config for one case: ``stage``, ``dtype`` and optional ``fused``
    (a config-built FusedAdam, JIT-built), ``zero`` (extra zero_optimization keys) and
    ``extra`` (extra top-level keys)."""
    cfg: Dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1000,
        "zero_optimization": {"stage": case["stage"], **case.get("zero", {})},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_max_lr": 1e-2}},
    }
    if not case.get("fused"):
        cfg["optimizer"]["params"]["torch_adam"] = True
    if case["dtype"] == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    elif case["dtype"] == "bf16":
        cfg["bf16"] = {"enabled": True}
    cfg.update(case.get("extra", {}))
    return cfg


def model_parameters(model: Net, case: Dict[str, Any]) -> Any:
    """The parameters handed to DeepSpeed: all of them (the frozen one included), only the
    trainable ones (``trainable_only``), or two param groups (``groups``: the matrices with
    decay, the rest without; an order that is not the model's)."""
    if case.get("trainable_only"):
        return [p for p in model.parameters() if p.requires_grad]
    if not case.get("groups"):
        return list(model.parameters())
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() > 1]
    rest = [p for n, p in model.named_parameters() if not (n.endswith("weight") and p.dim() > 1)]
    return [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]


def optimizer_order(model: Net, params: Any) -> List[str]:
    """The names of the trainable parameters in the order the optimizer holds them."""
    names = {p: n for n, p in model.named_parameters()}
    flat = [p for g in params for p in g["params"]] if params and isinstance(params[0], dict) else list(params)
    return [names[p] for p in flat if p.requires_grad]


def _stage0_reference(engine: Any, names: Dict[Any, str]) -> Dict[str, Dict[str, Optional[torch.Tensor]]]:
    """Whole fp32 master weights and Adam moments of a stage-0 engine (no ZeRO): the torch
    optimizer itself (fp32), or DeepSpeed's FP16_Optimizer / FP16_UnfusedOptimizer."""
    opt = engine.optimizer
    out: Dict[str, Dict[str, Optional[torch.Tensor]]] = {}

    def moments(base: Any, p: torch.Tensor) -> Dict[str, Optional[torch.Tensor]]:
        st = base.state.get(p, {})
        return {k: (st[k].detach().float().clone() if k in st else None) for k in ("exp_avg", "exp_avg_sq")}

    if hasattr(opt, "fp32_groups_flat"):  # fused FP16_Optimizer
        for lp_group, flat in zip(opt.fp16_groups, opt.fp32_groups_flat):
            m = moments(opt.optimizer, flat)
            off = 0
            for p in lp_group:
                n = p.numel()
                out[names[p]] = {
                    "master": flat.detach()[off:off + n].view(p.shape).clone(),
                    **{k: (v[off:off + n].view(p.shape).clone() if v is not None else None) for k, v in m.items()},
                }
                off += n
    elif hasattr(opt, "fp32_groups"):  # FP16_UnfusedOptimizer
        for lp_group, hp_group in zip(opt.fp16_groups, opt.fp32_groups):
            for p, hp in zip(lp_group, hp_group):
                out[names[p]] = {"master": hp.detach().clone(), **moments(opt.optimizer, hp)}
    else:  # the torch optimizer, on the fp32 parameters themselves
        for group in opt.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    out[names[p]] = {"master": p.detach().clone(), **moments(opt, p)}
    return out


def _zero_reference(engine: Any, names: Dict[Any, str]) -> Dict[str, Dict[str, Optional[torch.Tensor]]]:
    """Whole fp32 master weights and Adam moments of a ZeRO engine, gathered from its live
    state (a collective: every rank calls it, in the same order).

    Stage 3 uses DeepSpeed's ``safe_get_full_fp32_param`` / ``safe_get_full_optimizer_state``.
    Stages 1 and 2 (and BF16_Optimizer) all-gather each group's live fp32 partition and its
    base-optimizer state, and cut the parameters out at the engine's own offsets
    (``round_robin_bit16_groups`` / ``round_robin_bit16_offsets``). DeepSpeed 0.19.8's
    ``safe_get_*`` accessors are not usable there: they fail with several param groups and
    a torch optimizer ("exp_avg not found in optimizer state fragment": the state is linked
    after the first group's step, before the other groups have any), and with
    ``round_robin_gradients`` they return other parameters' values (``_link_all_hp_params``
    maps the fragments in ``bit16_groups`` order, while the flat buffer is in round-robin
    order; the module's 16-bit weights and ``zero_to_fp32`` agree with the flat buffer)."""
    import deepspeed.comm as dist
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    opt = engine.optimizer
    out: Dict[str, Dict[str, Optional[torch.Tensor]]] = {}
    if engine.zero_optimization_partition_weights():
        for p in engine.module.parameters():
            if not p.requires_grad:
                continue
            entry: Dict[str, Optional[torch.Tensor]] = {"master": safe_get_full_fp32_param(p).detach().float().clone()}
            for key in ("exp_avg", "exp_avg_sq"):
                v = safe_get_full_optimizer_state(p, key)
                entry[key] = None if v is None else v.detach().float().clone()
            out[names[p]] = entry
        return out
    if hasattr(opt, "single_partition_of_fp32_groups"):
        flats = opt.single_partition_of_fp32_groups
        groups = [list(zip(g, o)) for g, o in zip(opt.round_robin_bit16_groups, opt.round_robin_bit16_offsets)]
    else:  # BF16_Optimizer: no reordering, no per-parameter padding
        flats = opt.fp32_groups_flat_partition
        groups = []
        for g in opt.bf16_groups:
            offsets, off = [], 0
            for p in g:
                offsets.append(off)
                off += p.numel()
            groups.append(list(zip(g, offsets)))
    world = dist.get_world_size()
    for flat, params in zip(flats, groups):
        state = opt.optimizer.state[flat]
        whole = {}
        for key in ("master", "exp_avg", "exp_avg_sq"):
            part = flat.detach() if key == "master" else state[key].detach()
            gathered = [torch.empty_like(part) for _ in range(world)]
            dist.all_gather(gathered, part.contiguous())
            whole[key] = torch.cat(gathered)
        for p, off in params:
            n = p.numel()
            out[names[p]] = {k: v[off:off + n].view(p.shape).clone() for k, v in whole.items()}
    return out


def _base_optimizer(engine: Any) -> Any:
    opt = engine.optimizer
    return opt.optimizer if hasattr(opt, "optimizer") else opt


def _step_of(engine: Any) -> Optional[int]:
    steps = []
    base = _base_optimizer(engine)
    for st in base.state.values():
        if "step" in st:
            s = st["step"]
            steps.append(int(s.item()) if torch.is_tensor(s) else int(s))
    return max(steps) if steps else None


def _loss_scaler_of(engine: Any, dtype: str) -> Optional[Dict[str, Any]]:
    if dtype != "fp16":
        return None
    opt = engine.optimizer
    if hasattr(opt, "loss_scaler"):
        return {"cur_scale": float(opt.loss_scaler.cur_scale), "cur_iter": int(opt.loss_scaler.cur_iter)}
    cfg = opt.loss_scale_config
    return {"cur_scale": float(cfg.cur_scale), "cur_iter": int(cfg.cur_iter)}


def write_checkpoints(root: str, cases: List[Dict[str, Any]], steps: int = 3) -> Dict[str, Any]:
    """For each case: DeepSpeed trains ``Net`` ``steps`` steps, saves a checkpoint into
    ``root/<case name>`` (``client_state={"epoch": 3}``), and rank 0 writes the reference
    (what the checkpoint must hold, from the live engine) to ``root/<case name>.ref.pt``."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = rank_world()
    done = []
    for case in cases:
        torch.manual_seed(0)
        model = Net()
        cfg = ds_config(case)
        params = model_parameters(model, case)
        order = optimizer_order(model, params)
        engine, _, _, _ = deepspeed.initialize(model=model, config=cfg, model_parameters=params)
        g = torch.Generator().manual_seed(1 + rank)
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[case["dtype"]]
        for _ in range(steps):
            x = torch.randn(2, 7, generator=g).to(dtype)
            y = torch.randn(2, 3, generator=g).to(dtype)
            loss = torch.nn.functional.mse_loss(engine(x).float(), y.float())
            engine.backward(loss)
            engine.step()
        save_dir = os.path.join(root, case["name"])
        engine.save_checkpoint(save_dir, client_state={"epoch": 3, "note": case["name"]})
        names = {p: n for n, p in engine.module.named_parameters()}
        if case["stage"] == 0:
            ref_params = _stage0_reference(engine, names)
        else:
            ref_params = _zero_reference(engine, names)
        frozen_params = [p for p in engine.module.parameters() if not p.requires_grad]
        with deepspeed.zero.GatheredParameters(frozen_params, enabled=case["stage"] == 3):
            frozen = {n: p.detach().clone() for n, p in engine.module.named_parameters() if not p.requires_grad}
        reference = {
            "params": ref_params,
            "frozen": frozen,
            "trainable": [n for n, p in engine.module.named_parameters() if p.requires_grad],
            "optimizer_order": order,
            "step": _step_of(engine),
            "global_steps": engine.global_steps,
            "global_samples": engine.global_samples,
            "skipped_steps": engine.skipped_steps,
            "loss_scaler": _loss_scaler_of(engine, case["dtype"]),
            "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None,
            "optimizer_class": type(engine.optimizer).__name__,
            "base_optimizer_class": type(_base_optimizer(engine)).__name__,
            "buf": engine.module.buf.detach().clone(),
            "world": world,
        }
        if rank == 0:
            torch.save(reference, os.path.join(root, case["name"] + ".ref.pt"))
        engine.destroy()
        done.append(case["name"])
    return {"done": done}


def load_reader() -> Any:
    """zero_torch's reader: ``zero_torch._ds_checkpoint`` where the package imports (its
    compiled extension is built), else the file on its own (its error class then derives
    from ``RuntimeError`` instead of ``zero_torch.CheckpointError``)."""
    try:
        import zero_torch._ds_checkpoint as reader  # noqa: PLC0415

        return reader
    except ImportError:
        spec = importlib.util.spec_from_file_location("zt_ds_checkpoint", READER_PATH)
        assert spec is not None and spec.loader is not None
        reader = importlib.util.module_from_spec(spec)
        sys.modules["zt_ds_checkpoint"] = reader
        spec.loader.exec_module(reader)
        return reader


def read_checkpoints(root: str, names: List[str], trainable: Optional[Dict[str, List[str]]] = None) -> Dict[str, Any]:
    """Reads every checkpoint ``root/<name>`` with zero_torch's reader (DeepSpeed is never
    imported here); returns each as a plain dict, or the error it raised."""
    reader = load_reader()
    out: Dict[str, Any] = {}
    for name in names:
        load_dir = os.path.join(root, name)
        kwargs = {}
        if trainable and name in trainable:
            kwargs["trainable_names"] = trainable[name]
        try:
            ck = reader.read_deepspeed_checkpoint(load_dir, **kwargs)
            d = dataclasses.asdict(ck)
            d["is_ds"] = reader.is_deepspeed_checkpoint(load_dir)
            out[name] = d
        except Exception as e:  # reported to the test
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    out["deepspeed_imported"] = any(m == "deepspeed" or m.startswith("deepspeed.") for m in sys.modules)
    return out
