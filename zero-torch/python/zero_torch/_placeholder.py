"""Placeholder parameters: what ``zero.Init`` leaves where a parameter's values would be
(one poison element of the right dtype, expanded to the shape), with how to fill them
(:class:`LazySpec`) and, once transformers' loading wrote them, this rank's shard. The
leaf both :mod:`._lazy_init` (building and filling) and :mod:`._lazy_shards` (the written
shards) stand on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch


@dataclass(frozen=True)
class LazySpec:
    """How the parameters built inside one ``zero.Init`` are filled."""

    seed: int
    param_init_fn: Optional[Callable[[torch.nn.Module], None]]
    checkpoint: Optional[str]
    """A Hugging Face checkpoint folder the engine loads right after it is built."""
    written: bool = False
    """The values are written before ``initialize`` inside ``GatheredParameters(...,
    modifier_rank=r)`` (transformers' loading under ZeRO-3): each rank keeps its shard of
    rank ``r``'s writes (:func:`keep_shards`), and the engine's build gathers a parameter at
    a time. A parameter nothing wrote is an error naming it."""


def spec_of(p: torch.Tensor) -> Optional[LazySpec]:
    """The fill of a placeholder parameter, ``None`` for a parameter with values."""
    return getattr(p, "_zero_lazy", None)


def shard_of(p: torch.Tensor) -> Optional[torch.Tensor]:
    """This rank's shard of a written placeholder's values (:func:`keep_shards`), if any."""
    return getattr(p, "_zero_shard", None)


def _poison(shape: torch.Size, dtype: torch.dtype, device: Optional[torch.device] = None) -> torch.Tensor:
    """One poison element (NaN, or 0 for integers) of ``dtype`` on ``device`` (the CPU by
    default), expanded to ``shape``."""
    value = float("nan") if dtype.is_floating_point or dtype.is_complex else 0
    return torch.full((), value, dtype=dtype, device=device or torch.device("cpu")).expand(shape)


def placeholder(shape: torch.Size, dtype: torch.dtype, requires_grad: bool, spec: LazySpec) -> torch.nn.Parameter:
    """A parameter of ``shape`` and ``dtype`` holding one poison element, expanded."""
    p = torch.nn.Parameter(_poison(shape, dtype), requires_grad=requires_grad)
    p._zero_lazy = spec  # type: ignore[attr-defined]
    return p


def retype(p: torch.nn.Parameter, dtype: torch.dtype, device: Optional[torch.device] = None) -> None:
    """Points placeholder ``p`` (or a parameter whose values wait elsewhere) at poison of
    ``dtype`` (the engine trains in it) on ``device`` (default: where ``p`` is). A placeholder moves to a GPU this way: one
    element there, where ``p.to(device)`` would copy the expanded shape whole."""
    p.data = _poison(p.shape, dtype, device if device is not None else p.device)
