"""DeepSpeed's ZeRO-3 parameter protocol on zero's parameters, and what a parameter
pickles as.

Code written for DeepSpeed decides whether to gather a parameter by reading attributes
DeepSpeed's ``zero.Init`` puts on it (DeepSpeed-Chat's and TRL's
``hasattr(p, "ds_id") and p.ds_status == ZeroParamStatus.NOT_AVAILABLE``, PEFT's and
transformers' ``ds_numel``). Once an engine holds a model, each of its parameters is a
:class:`ZeroParameter` (its class is switched in place: the same object, still an
``nn.Parameter``) that answers them, with DeepSpeed 0.19.8's meaning, at ZeRO stage 3;
below stage 3 it has none of them, as in DeepSpeed:

==================  ============================================================
``ds_id``           an ``int``, unique in the process: a counter over the
                    parameters in ``model.parameters()`` order as engines take
                    them (DeepSpeed numbers them in that order for a model handed
                    to ``initialize``, in construction order inside ``zero.Init``)
``ds_status``       :class:`ZeroParamStatus`: ``AVAILABLE`` while the parameter is
                    whole in torch (gathered for a module's forward or backward or
                    by ``GatheredParameters``; always for one kept whole: at or
                    under ``stage3_param_persistence_threshold``, frozen, or before
                    the engine is built at the first forward), else
                    ``NOT_AVAILABLE`` (its ``.data`` is then empty, as DeepSpeed's)
``ds_shape``        its full ``torch.Size``
``ds_numel``        its full element count
``ds_persist``      whether it is kept whole between uses
``ds_tensor``       what this rank keeps of it between uses, 1-D in the run's
                    16-bit dtype, viewing the engine's memory, with ``ds_numel``
                    set to its length (see below)
==================  ============================================================

``ds_tensor`` differs from DeepSpeed's in length: DeepSpeed partitions each parameter
(``ceil(numel / world)`` per rank, padded), zero partitions each bucket, so a rank's piece
of a parameter is what falls in its partition: shorter, longer than DeepSpeed's or empty,
and the ranks' pieces in rank order make up the flattened parameter. A parameter kept
whole is held whole. With ``offload_param`` it views the host tier (a CPU tensor); on
NVMe it is a copy read from the swap file.

Pickling (``torch.save`` of a parameter itself, as ``v.cpu()`` of a CPU parameter returns
it): a :class:`ZeroParameter` pickles as a plain ``torch.nn.Parameter`` of its full shape,
with the attributes a script set on it and none of zero's, so the file loads with
``torch.load(weights_only=True)`` and without zero_torch. A stage-3 parameter that is
partitioned at that moment cannot be pickled whole without a collective:
:class:`~zero_torch.errors.PartitionedParameterError` names it (DeepSpeed 0.19.8 cannot
pickle its parameters at any stage: a ``ProcessGroup`` in their attributes).
"""

from __future__ import annotations

import enum
import itertools
import weakref
from collections import OrderedDict
from typing import Any, Optional, Tuple

import torch

from .errors import PartitionedParameterError

_IDS = itertools.count()
"""``ds_id``s, process-wide (DeepSpeed's ``Init.param_id``)."""

_LINK = "_zero_param"
"""The attribute (in the parameter's ``__dict__``) linking it to its engine: ``(weak
reference to the Runtime, its registry entry, its ds_id)``."""


class ZeroParamStatus(enum.Enum):
    """DeepSpeed's ``deepspeed.runtime.zero.partition_parameters.ZeroParamStatus``."""

    AVAILABLE = 1
    """Whole on every rank."""
    NOT_AVAILABLE = 2
    """Partitioned: only this rank's part is kept."""
    INFLIGHT = 3
    """Being gathered (zero's Python side never sees a parameter in this state)."""


def _missing(name: str) -> AttributeError:
    return AttributeError(f"'Parameter' object has no attribute '{name}' (it is not a ZeRO-3 parameter)")


class ZeroParameter(torch.nn.Parameter):
    """A parameter an engine holds (see the module docs). Created by switching an
    ``nn.Parameter``'s class (:func:`adopt`), never constructed by zero."""

    def _zero_link(self, name: str) -> Tuple[Any, Any, int]:
        """``(runtime, registry entry, ds_id)`` at stage 3, else ``AttributeError`` for
        ``name`` (below stage 3, a copy made by ``deepcopy``, an engine that is gone)."""
        link = self.__dict__.get(_LINK)
        runtime = link[0]() if link is not None else None
        if runtime is None or not runtime.stage3:
            raise _missing(name)
        return runtime, link[1], link[2]

    @property
    def ds_id(self) -> int:
        return self._zero_link("ds_id")[2]

    @property
    def ds_shape(self) -> torch.Size:
        return torch.Size(self._zero_link("ds_shape")[1].shape)

    @property
    def ds_numel(self) -> int:
        return int(self._zero_link("ds_numel")[1].numel)

    @property
    def ds_persist(self) -> bool:
        runtime, info, _ = self._zero_link("ds_persist")
        return _kept_whole(runtime, info)

    @property
    def ds_status(self) -> ZeroParamStatus:
        runtime, info, _ = self._zero_link("ds_status")
        return ZeroParamStatus.AVAILABLE if _whole_now(runtime, info) else ZeroParamStatus.NOT_AVAILABLE

    @property
    def ds_tensor(self) -> torch.Tensor:
        runtime, info, _ = self._zero_link("ds_tensor")
        if runtime.native is None:
            held = self.data.reshape(-1)  # whole in torch until the engine is built
        else:
            got = runtime.native.held(runtime.reg.units[info.unit].index, info.k)
            if isinstance(got, bytes):  # on NVMe: a copy read from the swap file
                held = torch.frombuffer(bytearray(got), dtype=torch.float32).to(self.dtype)
            else:
                held = torch.from_dlpack(got)
        held.ds_numel = held.numel()  # type: ignore[attr-defined]
        return held

    def __reduce_ex__(self, proto: Any) -> Any:
        link = self.__dict__.get(_LINK)
        runtime = link[0]() if link is not None else None
        if runtime is not None and runtime.stage3 and not _whole_now(runtime, link[1]):
            info = link[1]
            raise PartitionedParameterError(
                f"parameter {info.name} (shape {tuple(info.shape)}) is partitioned (ZeRO stage 3): this rank "
                "holds only its part, so it cannot be saved whole here. Gather it first (inside "
                "deepspeed.zero.GatheredParameters([param]) save param.data), or save the whole model with "
                "engine.save_16bit_model / engine._zero3_consolidated_16bit_state_dict()"
            )
        state = torch._utils._get_obj_state(self)
        if isinstance(state, dict):
            state = {k: v for k, v in state.items() if not k.startswith("_zero")}
        hooks: "OrderedDict[int, Any]" = OrderedDict()  # torch never pickles hooks
        if not state:
            return (torch._utils._rebuild_parameter, (self.data, self.requires_grad, hooks))
        return (torch._utils._rebuild_parameter_with_state, (self.data, self.requires_grad, hooks, state))


def _kept_whole(runtime: Any, info: Any) -> bool:
    """Whether the engine keeps ``info``'s parameter whole between uses (before it is
    built: whether it will, by the persistence threshold)."""
    if runtime.native is None:
        return info.numel <= runtime.persistence_threshold or info.trainable_k is None
    return bool(info.persistent)


def _whole_now(runtime: Any, info: Any) -> bool:
    """Whether ``info``'s parameter is whole in torch now."""
    if runtime.native is None or info.persistent:
        return True
    return bool(runtime.filled.get(runtime.reg.units[info.unit].index))


def adopt(runtime: Any, model: torch.nn.Module) -> None:
    """Makes every parameter of ``model`` that ``runtime``'s registry holds a
    :class:`ZeroParameter` linked to ``runtime``, with a ``ds_id`` (kept if it had one)."""
    ref = weakref.ref(runtime)
    for p in model.parameters():
        info = runtime.reg.by_id.get(id(p))
        if info is None:
            continue
        old: Optional[Tuple[Any, Any, int]] = p.__dict__.get(_LINK)
        ds_id = old[2] if old is not None else next(_IDS)
        if type(p) is torch.nn.Parameter:
            p.__class__ = ZeroParameter
        elif type(p) is not ZeroParameter:
            continue  # another Parameter subclass keeps its class (and gets no protocol)
        p.__dict__[_LINK] = (ref, info, ds_id)


__all__ = ["ZeroParamStatus", "ZeroParameter", "adopt"]
