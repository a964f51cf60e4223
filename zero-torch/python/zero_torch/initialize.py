"""``initialize``: DeepSpeed's entry point, with its signature, returning its 4-tuple."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Dict, Iterable, Optional, Tuple, Union

import torch

import warnings

from . import _dist, _native, _optim
from .engine import ZeroEngine, choose_device
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


def _sanitize(value: Any, path: str = "") -> Any:
    """The config as JSON zero's parser reads: Python's ``inf`` (accelerate writes
    ``"steps_per_print": float("inf")``) becomes the largest count; NaN is an error."""
    if isinstance(value, dict):
        return {k: _sanitize(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_sanitize(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, float) and value != value:
        raise ConfigError(f"config key `{path}` is NaN")
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        if value < 0:
            raise ConfigError(f"config key `{path}` is -inf")
        return 2**62
    return value


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

    Returns ``(engine, optimizer, training_dataloader, lr_scheduler)``, as DeepSpeed does:

    - torch's default process group is created if none exists (gloo on the CPU, NCCL on
      GPUs), and every rank takes rank 0's parameters and buffers;
    - the optimizer is the one passed in code (a ``torch.optim`` optimizer or a callable;
      it wins over the config's section), else the config's (DeepSpeed's defaults), else
      none (forward passes only); parameter groups keep their own hyper-parameters;
    - the LR scheduler is the one passed in code (an object with ``step()``, or a callable
      given the optimizer), else the config's section;
    - the engine joins the launcher's job (``torchrun``, ``deepspeed``, ``srun``,
      ``mpirun``: one rank per process, on the CPU over shared memory) or runs alone.

    The config is read by zero's own parser: DeepSpeed's keys, ``"auto"``, and errors that
    name the key (with a suggestion for a misspelt one). Arguments zero does not support
    raise :class:`~zero_torch.UnsupportedError` naming them.
    """
    if model is None:
        raise ValueError("initialize() needs model=")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if next(model.parameters(), None) is None:
        raise ValueError("the model has no parameters: there is nothing to train")
    if lr_scheduler is not None and not (hasattr(lr_scheduler, "step") or callable(lr_scheduler)):
        raise UnsupportedError(
            f"lr_scheduler={type(lr_scheduler).__name__}: pass a scheduler (an object with step()) "
            "or a callable that makes one from the optimizer"
        )
    if mpu is not None:
        raise UnsupportedError("mpu= (model parallelism) is not supported: zero is data-parallel ZeRO")
    if mesh_param is not None:
        raise UnsupportedError("mesh_param= (tensor/sequence parallel meshes) is not supported")
    cfg = _sanitize(_load_config(args, config, config_params))
    _check_local_rank(args)
    launch = _native.launch_info()
    device = choose_device(model, launch.local_rank)
    _dist.init_distributed(
        dist_backend=_dist.backend_for(device),
        distributed_port=distributed_port if distributed_port is not None else _dist.DEFAULT_PORT,
        dist_init_required=dist_init_required,
    )
    world = launch.world_size
    if _dist.world_size() != world:
        raise ConfigError(
            f"torch's process group has {_dist.world_size()} ranks and the launcher's job {world}: "
            "zero trains one data-parallel group of every rank"
        )
    # Every rank starts from rank 0's model, before anything else (as DeepSpeed does).
    _dist.broadcast_model(model)
    resolved = _native.resolve_config(json.dumps(cfg), world)
    plan = _optim.resolve(model, optimizer, model_parameters, cfg, resolved, device)
    scheduler = lr_scheduler
    if scheduler is not None and callable(scheduler) and not hasattr(scheduler, "step"):
        if plan.basic is None:
            raise ConfigError("lr_scheduler= is a callable, and there is no optimizer to give it")
        scheduler = scheduler(plan.basic)
    if scheduler is not None and resolved.scheduler:
        warnings.warn(
            "initialize() got lr_scheduler= and the config has a scheduler section: the one "
            "passed in code is used, as DeepSpeed does",
            stacklevel=2,
        )
    _warn_stage0_16bit(cfg, resolved)
    engine = ZeroEngine(
        model,
        cfg,
        resolved,
        plan=plan,
        lr_scheduler=scheduler,
    )
    if resolved.offload_optimizer_partial:
        # DeepSpeed's stage-3 partial offload draws one number from torch's generator for
        # its backup optimizer (runtime/zero/stage3.py); a seeded script's later draws then
        # depend on it, so zero draws it too.
        torch.randn(1)
    loader = None
    if training_data is not None:
        loader = engine.deepspeed_io(training_data, collate_fn=collate_fn)
    return engine, engine.optimizer, loader, engine.lr_scheduler


def _check_local_rank(args: Any) -> None:
    """DeepSpeed's check: ``args.local_rank``, where a script sets it (the deepspeed
    launcher passes ``--local_rank``), must be the launcher's ``LOCAL_RANK``."""
    given = getattr(args, "local_rank", None) if args is not None else None
    env = os.environ.get("LOCAL_RANK")
    if isinstance(given, int) and given >= 0 and env is not None and int(env) != given:
        raise ConfigError(
            f"args.local_rank is {given} but the launcher's LOCAL_RANK is {env}: pass "
            "--local_rank from the launcher (or leave it at -1)"
        )


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds DeepSpeed's ``--deepspeed`` and ``--deepspeed_config`` (and ``--local_rank``,
    which the deepspeed launcher passes) to ``parser``."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true", help="train with zero's engine")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file")
    if not any(a.dest == "local_rank" for a in parser._actions):
        parser.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    return parser


def _warn_stage0_16bit(cfg: Dict[str, Any], resolved: _native.ResolvedConfig) -> None:
    """Says, on rank 0, where a DeepSpeed 0.19.8 script gets other numbers on zero: 16-bit
    training at stage 0 (bf16 with gradients summed in bf16, or fp16), where DeepSpeed's
    ``FP16_UnfusedOptimizer``/``FP16_Optimizer`` step the optimizer once with zero
    gradients when they are built and zero does not (zero-torch README, "Differences";
    measured for bf16, read in DeepSpeed's code for fp16)."""
    accum = (cfg.get("data_types") or {}).get("grad_accum_dtype")
    sixteen = resolved.dtype == "float16" or (
        resolved.dtype == "bfloat16" and accum in (None, "bf16", "bfloat16")
    )
    if resolved.stage != 0 or not sixteen:
        return
    if _native.launch_info().rank == 0:
        warnings.warn(
            f"{resolved.dtype} at ZeRO stage 0: DeepSpeed 0.19.8 steps its optimizer once with zero gradients "
            "when it builds this path (FP16_UnfusedOptimizer / FP16_Optimizer), so its Adam starts at step 1 and "
            "applies weight decay once more; zero steps Adam as DeepSpeed's stages 1-3 do, so the numbers differ "
            "from DeepSpeed's stage 0 from the first step (zero-torch README, Differences)",
            stacklevel=3,
        )
