"""``zero_torch.zero``: DeepSpeed's ``deepspeed.zero`` helpers for stage-3 parameters."""

from __future__ import annotations

import weakref
from typing import Any, Iterable, List, Optional, Union

import torch

from .errors import UnsupportedError

_ENGINES: "weakref.WeakSet[Any]" = weakref.WeakSet()
"""Engines alive in this process (GatheredParameters finds the one that owns its
parameters)."""


def _engine_of(params: List[torch.nn.Parameter]) -> Any:
    for engine in list(_ENGINES):
        reg = engine._registry
        if all(id(p) in reg.by_id for p in params):
            return engine
    raise ValueError(
        "GatheredParameters: these parameters belong to no zero_torch engine (pass the "
        "model's parameters after zero_torch.initialize())"
    )


class GatheredParameters:
    """Makes partitioned (stage 3) parameters whole inside a ``with`` block, on every
    rank (a collective: every rank must enter it), and partitions them again on exit.
    In stages 0-2 parameters are always whole and nothing is gathered.

    With ``modifier_rank=r``, changes rank ``r`` makes inside the block become the
    parameters' new values on every rank (and the fp32 master weights) on exit.
    """

    def __init__(
        self,
        params: Union[torch.nn.Parameter, Iterable[torch.nn.Parameter]],
        modifier_rank: Optional[int] = None,
        fwd_module: Any = None,
        enabled: bool = True,
    ) -> None:
        if isinstance(params, torch.Tensor):
            params = [params]
        self.params: List[torch.nn.Parameter] = list(params)
        self.modifier_rank = modifier_rank
        self.enabled = enabled and bool(self.params)
        del fwd_module
        self._units: List[Any] = []
        self._engine: Any = None

    def __enter__(self) -> "GatheredParameters":
        if not self.enabled:
            return self
        self._engine = _engine_of(self.params)
        rt = self._engine._runtime
        rt.ensure_built()
        seen = set()
        for p in self.params:
            u = rt.reg.units[rt.reg.by_id[id(p)].unit]
            if id(u) not in seen:
                seen.add(id(u))
                self._units.append(u)
        for u in sorted(self._units, key=lambda u: u.index):
            if rt.stage3 and not rt.filled.get(u.index):
                rt.gather(u)
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.enabled or self._engine is None:
            return
        rt = self._engine._runtime
        if self.modifier_rank is not None and not exc[0]:
            self._engine._take_modified(self.params, self.modifier_rank)
        for u in sorted(self._units, key=lambda u: u.index):
            if rt.stage3 and rt.filled.get(u.index):
                rt.scatter(u)
        rt.native.abandon_pass()


class Init:
    """DeepSpeed's ``zero.Init`` partitions parameters as a model is built. zero_torch
    partitions them when the engine is built (at the first forward), so this context
    manager only accepts DeepSpeed's arguments: build the model inside it or not, the
    result is the same (each rank holds the whole model until then)."""

    def __init__(self, *args: Any, enabled: bool = True, **kwargs: Any) -> None:
        if kwargs.get("remote_device") not in (None, "cpu", "none"):
            raise UnsupportedError(
                f"zero.Init(remote_device={kwargs['remote_device']!r}) is not supported: use "
                "offload_param in the config"
            )
        self.enabled = enabled

    def __enter__(self) -> "Init":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None
