"""``zero_torch.activation_checkpointing``: DeepSpeed's ``deepspeed.checkpointing``
(``deepspeed.runtime.activation_checkpointing.checkpointing``).

:func:`checkpoint` recomputes a block's forward during backward instead of keeping its
activations, as DeepSpeed's does: reentrant (``torch.utils.checkpoint.checkpoint`` with
``use_reentrant=True``, which saves and restores the RNG state so dropout repeats), keyword
tensors taking part in autograd like positional ones, and DeepSpeed's return convention (a
single output comes back bare, several as a tuple). :func:`non_reentrant_checkpoint` is
torch's non-reentrant form. zero's engine handles both (stage 3 gathers the block's
parameters again for the recomputation).

What DeepSpeed adds on top is refused by name
(:class:`~zero_torch.errors.UnsupportedError`): partitioning activations across
model-parallel ranks, moving them to the CPU, contiguous buffers, synchronizing or timing
the boundaries, a model-parallel unit (``mpu``), and Megatron's model-parallel RNG
tracker.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Optional

import torch
import torch.utils.checkpoint

from .errors import UnsupportedError


class _Settings:
    """What :func:`configure` was told (DeepSpeed keeps the same as module globals)."""

    configured = False
    num_layers: Optional[int] = None


def _refuse(feature: str) -> UnsupportedError:
    return UnsupportedError(
        f"activation checkpointing with {feature} is not provided by zero: zero checkpoints "
        "activations with torch.utils.checkpoint (deepspeed.checkpointing.checkpoint) on each rank"
    )


def _deepspeed_returns(outputs: Any) -> Any:
    """DeepSpeed's convention: a tensor comes back as is, one output bare, several as a tuple."""
    if torch.is_tensor(outputs):
        return outputs
    items = list(outputs)
    return items[0] if len(items) == 1 else tuple(items)


def checkpoint(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Runs ``function(*args, **kwargs)`` without keeping its activations; backward runs it
    again (reentrant, RNG state restored). Tensor keyword arguments take part in autograd as
    positional ones do."""
    if kwargs:
        run, keys, count = function, tuple(kwargs), len(args)

        def function(*all_args: Any) -> Any:  # noqa: F811 - DeepSpeed's own rebinding
            return run(*all_args[:count], **dict(zip(keys, all_args[count:])))

        args = args + tuple(kwargs.values())
    outputs = torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=True)
    return _deepspeed_returns(outputs)


def non_reentrant_checkpoint(function: Callable[..., Any], *args: Any) -> Any:
    """:func:`checkpoint` with torch's non-reentrant implementation (which also works when
    no input requires a gradient)."""
    outputs = torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)
    return _deepspeed_returns(outputs)


def _section(deepspeed_config: Any) -> Dict[str, Any]:
    """The ``activation_checkpointing`` section of a config path, dict or DeepSpeedConfig."""
    params = getattr(deepspeed_config, "_param_dict", deepspeed_config)
    if isinstance(params, (str, os.PathLike)):
        with open(params) as f:
            params = json.load(f)
    if not isinstance(params, dict):
        raise TypeError(f"deepspeed_config must be a path, a dict or a DeepSpeedConfig, not {type(params).__name__}")
    section = params.get("activation_checkpointing", {}) or {}
    if not isinstance(section, dict):
        raise TypeError("the config's activation_checkpointing section must be an object")
    return section


def configure(
    mpu_: Any,
    deepspeed_config: Any = None,
    partition_activations: Optional[bool] = None,
    contiguous_checkpointing: Optional[bool] = None,
    num_checkpoints: Optional[int] = None,
    checkpoint_in_cpu: Optional[bool] = None,
    synchronize: Optional[bool] = None,
    profile: Optional[bool] = None,
) -> None:
    """DeepSpeed's ``deepspeed.checkpointing.configure``. The config's
    ``activation_checkpointing`` section is read first, then the arguments override it.
    Everything beyond plain recomputation raises: an ``mpu_``, ``partition_activations``,
    ``contiguous_checkpointing`` (``contiguous_memory_optimization``),
    ``checkpoint_in_cpu`` (``cpu_checkpointing``), ``synchronize``
    (``synchronize_checkpoint_boundary``) and ``profile``."""
    wanted: Dict[str, Any] = {
        "partition activations (partition_activations)": False,
        "contiguous buffers (contiguous_checkpointing)": False,
        "activations on the CPU (checkpoint_in_cpu)": False,
        "synchronized boundaries (synchronize)": False,
        "profiling (profile)": False,
    }
    layers = None
    if deepspeed_config is not None:
        section = _section(deepspeed_config)
        wanted["partition activations (partition_activations)"] = section.get("partition_activations", False)
        wanted["contiguous buffers (contiguous_checkpointing)"] = section.get("contiguous_memory_optimization", False)
        wanted["activations on the CPU (checkpoint_in_cpu)"] = section.get("cpu_checkpointing", False)
        wanted["synchronized boundaries (synchronize)"] = section.get("synchronize_checkpoint_boundary", False)
        wanted["profiling (profile)"] = section.get("profile", False)
        layers = section.get("number_checkpoints")
    overrides = [partition_activations, contiguous_checkpointing, checkpoint_in_cpu, synchronize, profile]
    for key, value in zip(list(wanted), overrides):
        if value is not None:
            wanted[key] = value
    if mpu_ is not None:
        raise _refuse("a model-parallel unit (mpu)")
    for feature, on in wanted.items():
        if on:
            raise _refuse(feature)
    _Settings.num_layers = num_checkpoints if num_checkpoints is not None else layers
    _Settings.configured = True


def is_configured() -> bool:
    """Whether :func:`configure` has been called."""
    return _Settings.configured


def reset() -> None:
    """DeepSpeed frees its contiguous checkpoint buffers here; zero keeps none."""
    return None


def set_num_layers(nlayers: int) -> None:
    """Records the number of checkpointed layers (used by contiguous buffers only)."""
    _Settings.num_layers = nlayers


def partition_activations_in_checkpoint(partition_activation: bool) -> None:
    """``False`` is accepted; partitioning activations is refused."""
    if partition_activation:
        raise _refuse("partition activations (partition_activations)")


def get_cuda_rng_tracker() -> Any:
    """Refused: Megatron's model-parallel RNG tracker."""
    raise _refuse("Megatron's model-parallel RNG tracker (get_cuda_rng_tracker)")


def model_parallel_cuda_manual_seed(seed: int) -> None:
    """Refused: Megatron's model-parallel seeding (seed with get_accelerator().manual_seed)."""
    raise _refuse("Megatron's model-parallel seeds (model_parallel_cuda_manual_seed)")


def model_parallel_reconfigure_tp_seed(seed: int) -> None:
    """Refused: Megatron's model-parallel seeding."""
    raise _refuse("Megatron's model-parallel seeds (model_parallel_reconfigure_tp_seed)")


__all__ = [
    "checkpoint",
    "non_reentrant_checkpoint",
    "configure",
    "is_configured",
    "reset",
    "set_num_layers",
    "partition_activations_in_checkpoint",
    "get_cuda_rng_tracker",
    "model_parallel_cuda_manual_seed",
    "model_parallel_reconfigure_tp_seed",
]
