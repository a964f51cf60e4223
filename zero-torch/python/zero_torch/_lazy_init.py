"""Building a model without its parameters (``zero.Init``), and filling it one unit at a
time when the engine is built.

Inside the context every parameter registered on a module is replaced by one on the meta
device (torch's public parameter-registration hook), so the model's ``__init__`` and its
initializers allocate nothing. On leaving it each meta parameter becomes a *placeholder*: a
CPU parameter of the right shape and dtype whose storage is one NaN, expanded (writing into
it is an error, reading it gives NaN). Tied weights stay one parameter.

When the engine is built it asks for each parameter's initial value in unit order (a unit is
a module that owns parameters directly). :class:`UnitFill` then materializes one unit (NaN),
fills it (a checkpoint's bytes, loaded right after the build, or the module's own
initializers under a generator seeded from ``(seed, unit name)``), checks that nothing
poisoned is left, hands the values over and drops them before the next unit. The values
depend on the seed and the unit names only, never on the world size or the stage."""

from __future__ import annotations

import hashlib
import sys
import weakref
from typing import Any, Callable, Dict, List, Optional, Set

import torch

from .errors import ZeroError

from ._placeholder import LazySpec, placeholder, retype, shard_of, spec_of

__all__ = ["LazySpec", "placeholder", "retype", "shard_of", "spec_of"]


class Construction:
    """The registration hook of one ``zero.Init`` block: parameters go to the meta device
    (floating ones in ``dtype`` where given), and on :meth:`close` every module that
    registered one gets placeholders instead."""

    def __init__(self, spec: LazySpec, dtype: Optional[torch.dtype]) -> None:
        self.spec = spec
        self.dtype = dtype
        self.modules: List["weakref.ref[torch.nn.Module]"] = []
        self._seen: Set[int] = set()
        self._handle = torch.nn.modules.module.register_module_parameter_registration_hook(self._hook)

    def _hook(self, module: torch.nn.Module, name: str, param: Optional[torch.nn.Parameter]) -> Optional[torch.nn.Parameter]:
        if id(module) not in self._seen:
            self._seen.add(id(module))
            self.modules.append(weakref.ref(module))
        if param is None or param.is_meta or spec_of(param) is not None:
            return None
        dtype = self.dtype if self.dtype is not None and param.is_floating_point() else param.dtype
        return torch.nn.Parameter(torch.empty(param.shape, dtype=dtype, device="meta"), requires_grad=param.requires_grad)

    def close(self) -> None:
        """Removes the hook and puts placeholders where meta parameters are."""
        self._handle.remove()
        made: Dict[int, torch.nn.Parameter] = {}
        for ref in self.modules:
            module = ref()
            if module is None:
                continue
            for name, p in list(module._parameters.items()):
                if p is None or not p.is_meta:
                    continue
                if id(p) not in made:
                    made[id(p)] = placeholder(p.shape, p.dtype, p.requires_grad, self.spec)
                module._parameters[name] = made[id(p)]
        self.modules.clear()


def unit_seed(seed: int, unit: str) -> int:
    """The generator seed of the unit named ``unit`` (the same at any world size)."""
    digest = hashlib.sha256(f"{seed}/{unit}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def hf_owners(model: torch.nn.Module) -> Dict[int, Any]:
    """For each module of ``model`` inside a transformers ``PreTrainedModel``: the nearest
    one (whose ``_init_weights`` initializes it, as ``post_init`` does)."""
    owners: Dict[int, Any] = {}
    transformers = sys.modules.get("transformers")
    if transformers is None:
        return owners
    pretrained = getattr(transformers, "PreTrainedModel", None)
    if pretrained is None:
        return owners
    for m in model.modules():
        if isinstance(m, pretrained):
            for sub in m.modules():
                owners[id(sub)] = m
    return owners


def fill_module(module: torch.nn.Module, unit: str, spec: LazySpec, owner: Any) -> None:
    """Runs the initializers of ``module``'s own parameters under a generator seeded from
    ``(spec.seed, unit)``: ``spec.param_init_fn(module)``, else the module's
    ``reset_parameters`` followed by its transformers model's ``_init_weights`` (as a
    model's construction and ``post_init`` run them). torch's default generator is left
    as it was."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(unit_seed(spec.seed, unit))
        try:
            if spec.param_init_fn is not None:
                spec.param_init_fn(module)
            else:
                reset = getattr(module, "reset_parameters", None)
                if callable(reset):
                    reset()
                if owner is not None:
                    owner._init_weights(module)
        except Exception as e:
            raise ZeroError(
                f"zero.Init: initializing unit `{unit or '<root>'}` ({type(module).__name__}) failed: {e} "
                "(a unit's initializer may write only that module's own parameters; pass "
                "param_init_fn= to zero.Init to fill it yourself)"
            ) from e


def unfilled(name: str, unit: str, module: torch.nn.Module) -> ZeroError:
    """The error for a parameter no initializer wrote."""
    return ZeroError(
        f"zero.Init: nothing filled parameter `{name}` of unit `{unit or '<root>'}` "
        f"({type(module).__name__}): it still holds the NaN poison. Its module has no "
        "reset_parameters and no transformers _init_weights covers it; pass "
        "param_init_fn= to zero.Init (called with each module that owns parameters)"
    )


def unwritten(name: str, unit: str, module: torch.nn.Module, partly: bool = False) -> ZeroError:
    """The error for a placeholder whose values were to be written before ``initialize``
    (inside ``GatheredParameters(..., modifier_rank=r)``) and were not, or only partly."""
    what = "holds NaN where nothing wrote it" if partly else "was never written"
    return ZeroError(
        f"zero.Init: parameter `{name}` of unit `{unit or '<root>'}` ({type(module).__name__}) {what}: "
        "the model was built while torch's initializers were disabled (transformers' loading "
        "under ZeRO-3), so its values must be written inside GatheredParameters(..., "
        "modifier_rank=r) before initialize(); the checkpoint loaded lacks it, or its load failed"
    )


class UnitFill:
    """The initial values of the placeholder parameters of the units in ``order``, one unit
    materialized at a time (the engine asks in unit order)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.owners = hf_owners(model)
        self.current: Any = None
        self.homes: List[Any] = []
        """The current unit's placeholders, each with the device it goes back to."""
        # Each checkpoint, with the dtype its placeholders were made in (the model's dtype
        # its values are rounded to, as transformers' own load would).
        self.checkpoints: Dict[str, Optional[torch.dtype]] = {}

    def source(self, unit: Any, param: Any) -> Callable[[], Optional[torch.Tensor]]:
        """What the engine calls for ``param``'s initial value (``None``: a checkpoint
        fills it after the build)."""
        spec = spec_of(param.param)
        assert spec is not None
        if spec.written:
            return self._written(unit, param)
        if spec.checkpoint is not None:
            if self.checkpoints.get(spec.checkpoint) is None:
                floating = param.param.is_floating_point()
                self.checkpoints[spec.checkpoint] = param.param.dtype if floating else None
            return lambda: None
        return lambda: self._value(unit, param)

    @staticmethod
    def _written(unit: Any, param: Any) -> Callable[[], torch.Tensor]:
        """The source of a written placeholder: its values gathered from the ranks' shards
        (nothing wrote it: an error on every rank, before the engine is built)."""
        from . import _lazy_shards

        if shard_of(param.param) is None:
            raise unwritten(param.name, unit.name, unit.module)

        def value() -> torch.Tensor:
            (whole,) = _lazy_shards.gather([param.param])
            if whole.is_floating_point() and bool(torch.isnan(whole).any()):
                raise unwritten(param.name, unit.name, unit.module, partly=True)
            return whole

        return value

    def _value(self, unit: Any, param: Any) -> torch.Tensor:
        if self.current is not unit:
            self.release()
            self._materialize(unit)
        return param.param.data

    def _materialize(self, unit: Any) -> None:
        # The fill runs on the CPU whatever the device (a placeholder on a GPU holds one
        # element there): the unit's other parameters are lent as CPU copies, so its
        # initializers neither mix devices nor overwrite them.
        lazy = [p for p in unit.params if spec_of(p.param) is not None]
        kept = [(p, p.param.data) for p in unit.params if spec_of(p.param) is None]
        self.current = unit
        self.homes = [(p, p.param.device) for p in lazy]
        for p in lazy:
            p.param.data = torch.full(tuple(p.shape), float("nan"), dtype=p.param.dtype, device="cpu")
        for p, value in kept:
            p.param.data = value.detach().to("cpu", copy=True)
        spec = spec_of(lazy[0].param)
        assert spec is not None
        try:
            fill_module(unit.module, unit.name, spec, self.owners.get(id(unit.module)))
        finally:
            for p, value in kept:
                p.param.data = value
        for p in lazy:
            if p.param.is_floating_point() and bool(torch.isnan(p.param.data).any()):
                raise unfilled(p.name, unit.name, unit.module)

    def release(self) -> None:
        """Drops the unit materialized last (its parameters hold poison again)."""
        if self.current is None:
            return
        for p, home in self.homes:
            retype(p.param, p.param.dtype, home)
        self.homes = []
        self.current = None


def init_weights(model: torch.nn.Module, seed: int = 0, param_init_fn: Optional[Callable[[torch.nn.Module], None]] = None) -> None:
    """Fills the parameters of a whole (ordinary) model exactly as ``zero.Init(seed=seed,
    param_init_fn=param_init_fn)`` fills the same model unit by unit: the same values, at
    any world size and stage."""
    from ._model import register

    spec = LazySpec(seed=seed, param_init_fn=param_init_fn, checkpoint=None)
    owners = hf_owners(model)
    for unit in register(model, None).units:
        fill_module(unit.module, unit.name, spec, owners.get(id(unit.module)))
