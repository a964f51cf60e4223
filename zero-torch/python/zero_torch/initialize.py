"""``initialize``: DeepSpeed's entry point, with its signature, returning its 4-tuple."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Dict, Iterable, Optional, Tuple, Union

import torch

from . import _native
from .engine import ZeroEngine
from .errors import ConfigError, UnsupportedError


def _load_config(args: Any, config: Any, config_params: Any) -> Dict[str, Any]:
    """The config from exactly one of ``config`` (a path or a dict), ``config_params``
    (DeepSpeed's older name) or ``args.deepspeed_config``."""
    given = []
    if config is not None:
        given.append(("config", config))
    if config_params is not None:
        given.append(("config_params", config_params))
    from_args = getattr(args, "deepspeed_config", None) if args is not None else None
    if from_args is not None:
        given.append(("args.deepspeed_config", from_args))
    if not given:
        raise ConfigError(
            "no DeepSpeed config: pass config= (a path to ds_config.json, or a dict)"
        )
    if len(given) > 1:
        names = ", ".join(n for n, _ in given)
        raise ConfigError(f"the config was given more than once ({names}): pass exactly one")
    name, value = given[0]
    if isinstance(value, (str, os.PathLike)):
        try:
            with open(value) as f:
                return json.load(f)
        except OSError as e:
            raise ConfigError(f"{name}={value!s}: {e}") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{name}={value!s} is not valid JSON: {e}") from None
    if isinstance(value, dict):
        return json.loads(json.dumps(value))
    raise ConfigError(f"{name} must be a path or a dict, not {type(value).__name__}")


def _adopt_optimizer(cfg: Dict[str, Any], optimizer: Any) -> None:
    """A torch Adam/AdamW passed in code becomes the config's optimizer section (zero steps
    its own fused Adam with those hyperparameters); anything else is refused by name."""
    if optimizer is None:
        return
    if callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer):
        raise UnsupportedError(
            "optimizer= as a callable is not supported: pass a torch.optim.AdamW (or Adam), "
            "or an optimizer section in the config"
        )
    kind = type(optimizer).__name__
    if kind not in ("Adam", "AdamW"):
        raise UnsupportedError(
            f"optimizer={kind} is not supported: zero steps a fused Adam/AdamW; pass "
            "torch.optim.AdamW (or Adam), or an optimizer section in the config"
        )
    if "optimizer" in cfg:
        raise ConfigError(
            "an optimizer was passed in code and the config has an optimizer section: "
            "pass only one (DeepSpeed refuses both too)"
        )
    if len(optimizer.param_groups) != 1:
        raise UnsupportedError(
            f"the optimizer has {len(optimizer.param_groups)} parameter groups: zero uses one "
            "set of hyperparameters for every parameter"
        )
    g = optimizer.param_groups[0]
    if g.get("amsgrad") or g.get("maximize"):
        raise UnsupportedError("Adam with amsgrad or maximize is not supported")
    lr = g["lr"]
    cfg["optimizer"] = {
        "type": kind,
        "params": {
            "lr": float(lr.item() if isinstance(lr, torch.Tensor) else lr),
            "betas": [float(b) for b in g["betas"]],
            "eps": float(g["eps"]),
            "weight_decay": float(g["weight_decay"]),
        },
    }


def _parameter_ids(model_parameters: Optional[Iterable[Any]]) -> Optional[set]:
    if model_parameters is None:
        return None
    ids = set()
    for item in model_parameters:
        if isinstance(item, dict):  # parameter groups
            for p in item.get("params", []):
                ids.add(id(p))
        elif isinstance(item, tuple) and len(item) == 2:  # named_parameters()
            ids.add(id(item[1]))
        else:
            ids.add(id(item))
    return ids


def initialize(
    args: Any = None,
    model: Optional[torch.nn.Module] = None,
    optimizer: Any = None,
    model_parameters: Optional[Iterable[Any]] = None,
    training_data: Any = None,
    lr_scheduler: Any = None,
    distributed_port: Optional[int] = None,
    mpu: Any = None,
    dist_init_required: Optional[bool] = None,
    collate_fn: Any = None,
    config: Union[str, os.PathLike, Dict[str, Any], None] = None,
    mesh_param: Any = None,
    config_params: Union[Dict[str, Any], str, None] = None,
) -> Tuple[ZeroEngine, Any, Optional[torch.utils.data.DataLoader], Any]:
    """DeepSpeed's ``deepspeed.initialize``, on zero's engine.

    Returns ``(engine, optimizer, training_dataloader, lr_scheduler)``. The engine joins the
    launcher's job (``torchrun``, ``deepspeed``, ``srun``, ``mpirun``: one rank per process,
    on the CPU over shared memory) or runs alone. The config is read by zero's own parser:
    DeepSpeed's keys, ``"auto"``, and errors that name the key (with a suggestion for a
    misspelt one). An ``optimizer`` given in code must be ``torch.optim.Adam``/``AdamW``
    (its hyperparameters are used); the config's ``scheduler`` section sets the learning
    rate. Arguments zero does not support raise :class:`~zero_torch.UnsupportedError`
    naming them.
    """
    if model is None:
        raise ValueError("initialize() needs model=")
    if mpu is not None:
        raise UnsupportedError("mpu= (model parallelism) is not supported: zero is data-parallel ZeRO")
    if mesh_param is not None:
        raise UnsupportedError("mesh_param= (tensor/sequence parallel meshes) is not supported")
    if lr_scheduler is not None:
        raise UnsupportedError(
            "lr_scheduler= objects are not supported: describe the schedule in the config's "
            "scheduler section (WarmupLR, WarmupDecayLR, WarmupCosineLR)"
        )
    if distributed_port is not None and distributed_port != 29500:
        raise UnsupportedError(
            "distributed_port= is not supported: the launcher's MASTER_PORT is used"
        )
    del dist_init_required  # zero never needs torch.distributed
    cfg = _load_config(args, config, config_params)
    _adopt_optimizer(cfg, optimizer)
    _, world, _ = _native.launch_info()
    resolved = json.loads(_native.resolve_config(json.dumps(cfg), world))
    engine = ZeroEngine(model, cfg, resolved, trained=_parameter_ids(model_parameters))
    loader = None
    if training_data is not None:
        sampler = torch.utils.data.distributed.DistributedSampler(
            training_data, num_replicas=engine.world_size, rank=engine.global_rank
        )
        loader = torch.utils.data.DataLoader(
            training_data,
            batch_size=engine.train_micro_batch_size_per_gpu(),
            sampler=sampler,
            collate_fn=collate_fn,
        )
    return engine, engine.optimizer, loader, engine.lr_scheduler


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds DeepSpeed's ``--deepspeed`` and ``--deepspeed_config`` (and ``--local_rank``,
    which the deepspeed launcher passes) to ``parser``."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true", help="train with zero's engine")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file")
    if not any(a.dest == "local_rank" for a in parser._actions):
        parser.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    return parser
