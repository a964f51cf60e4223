"""``zero_torch.zero``: DeepSpeed's ``deepspeed.zero`` helpers for stage-3 parameters."""

from __future__ import annotations

import os
import weakref
from collections import abc
from typing import Any, Callable, Iterable, List, Optional, Union

import torch

from . import _host_memory, _lazy_init, _lazy_shards
from .errors import CheckpointError, ConfigError, UnsupportedError, ZeroError

_ENGINES: "weakref.WeakSet[Any]" = weakref.WeakSet()
"""Engines alive in this process (GatheredParameters finds the one that owns its
parameters)."""


def _engine_of(params: List[torch.nn.Parameter], before_engine: bool = False) -> Any:
    """The engine that holds ``params``; with ``before_engine``, the one that holds any of
    them (the others are not ZeRO parameters, which DeepSpeed's ``GatheredParameters``
    leaves alone too), or ``None`` where none does (a model no engine has taken yet)."""
    holders = [e for e in list(_ENGINES) if any(id(p) in e._registry.by_id for p in params)]
    if len(holders) == 1 and (before_engine or all(id(p) in holders[0]._registry.by_id for p in params)):
        return holders[0]
    if not holders and before_engine:
        return None
    raise ValueError(
        "GatheredParameters: these parameters belong to no zero_torch engine, or to several "
        "(pass the parameters of one model)"
    )


def _param_list(params: Any) -> List[torch.nn.Parameter]:
    """What DeepSpeed's ``GatheredParameters`` accepts as ``params``: one tensor, or any
    iterable of them (a list, a tuple, a generator such as ``model.parameters()``), where
    ``None`` entries (a module's missing bias) are skipped; ``None`` alone is nothing. Any
    other entry is a ``TypeError`` naming it (DeepSpeed would silently gather nothing)."""
    if params is None:
        return []
    if isinstance(params, torch.Tensor):
        return [params]
    if not isinstance(params, abc.Iterable):
        raise TypeError(
            f"GatheredParameters takes a parameter or an iterable of parameters, not {type(params).__name__}"
        )
    out = []
    for i, p in enumerate(params):
        if p is None:
            continue
        if not isinstance(p, torch.Tensor):
            raise TypeError(
                f"GatheredParameters: entry {i} is a {type(p).__name__}, not a parameter (pass "
                "module.parameters() to gather a module's)"
            )
        out.append(p)
    return out


class GatheredParameters:
    """Makes partitioned (stage 3) parameters whole inside a ``with`` block, on every
    rank (a collective: every rank must enter it), and partitions them again on exit.
    In stages 0-2 parameters are always whole and nothing is gathered.

    With ``modifier_rank=r``, changes rank ``r`` makes inside the block become the
    parameters' new values on every rank (and the fp32 master weights) on exit.

    Before any engine has the model (as transformers loads a checkpoint under ZeRO-3,
    rank 0 writing each module's weights inside the block), its parameters are whole
    tensors: nothing is gathered, and on exit rank ``r``'s values are broadcast to every
    rank through ``torch.distributed`` (when its group is up). A placeholder the compat
    ``zero.Init`` built for transformers' loading (:class:`DeepSpeedInit`) is made whole
    for the block (from the shards written so far, else NaN) and, on exit, rank ``r``'s
    values are scattered: each rank keeps its shard. A ``zero.Init`` parameter filled from
    a ``seed`` or checkpoint cannot be written that way: that is a named error (load such a
    model with ``zero_torch.from_pretrained``).
    """

    def __init__(
        self,
        params: Union[None, torch.nn.Parameter, Iterable[Optional[torch.nn.Parameter]]],
        modifier_rank: Optional[int] = None,
        fwd_module: Any = None,
        enabled: bool = True,
    ) -> None:
        self.params: List[torch.nn.Parameter] = _param_list(params)
        self.modifier_rank = modifier_rank
        self.enabled = enabled and bool(self.params)
        del fwd_module
        self._units: List[Any] = []
        self._engine: Any = None
        self._written: List[torch.nn.Parameter] = []

    def __enter__(self) -> "GatheredParameters":
        if not self.enabled:
            return self
        self._engine = _engine_of(self.params, before_engine=True)
        if self._engine is None:
            lazy = [p for p in self.params if _lazy_init.spec_of(p) is not None]
            fixed = [p for p in lazy if not _lazy_init.spec_of(p).written]  # type: ignore[union-attr]
            fixed_ids = {id(p) for p in fixed}
            if fixed and self.modifier_rank is not None:
                raise UnsupportedError(
                    f"GatheredParameters(modifier_rank={self.modifier_rank}) before initialize() on a parameter "
                    f"zero.Init built without values (shape {tuple(fixed[0].shape)}): its values come from "
                    "zero.Init's seed or checkpoint when the engine is built; load the checkpoint with "
                    "zero_torch.from_pretrained, or build inside zero.Init(seed=None)"
                )
            # Placeholders whose values are written before initialize (transformers'
            # loading): the block's own become whole, from the shards kept so far.
            self._written = [p for p in lazy if id(p) not in fixed_ids]
            if self._written:
                _lazy_shards.materialize(self._written)
            return self
        held = self._engine._registry.by_id
        # Parameters no engine holds (a module built after initialize) are left alone, as
        # DeepSpeed leaves a parameter without ds_id.
        self.params = [p for p in self.params if id(p) in held]
        if not self.params:
            self.enabled = False
            return self
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
                rt.fetch(u)
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.enabled:
            return
        if self._engine is None:
            self._exit_before_engine(exc[0] is not None)
            return
        rt = self._engine._runtime
        if self.modifier_rank is not None and not exc[0]:
            self._engine._take_modified(self.params, self.modifier_rank)
        for u in sorted(self._units, key=lambda u: u.index):
            if rt.stage3 and rt.filled.get(u.index):
                rt.release(u)
        rt.abandon()

    def _exit_before_engine(self, raised: bool) -> None:
        """The exit of a block no engine owns: rank ``modifier_rank``'s values broadcast
        (whole parameters) or scattered (placeholders keep their shards). Every rank
        first learns whether the block raised anywhere: then none sends, the
        placeholders keep what they held, and a rank whose block went well raises an
        error naming the ranks that failed (they raise their own)."""
        from . import _dist

        if self.modifier_rank is None:
            _lazy_shards.release(self._written)
            return
        failed = _dist.failed_ranks(raised)
        if failed:
            _lazy_shards.release(self._written)
            if not raised:
                raise ZeroError(
                    f"GatheredParameters(modifier_rank={self.modifier_rank}): the block raised on rank(s) "
                    f"{failed}, so no values were sent and these {len(self.params)} parameters keep what "
                    "they held (see those ranks' errors)"
                )
            return
        written = {id(p) for p in self._written}
        _dist.broadcast_tensors([p.data for p in self.params if id(p) not in written], self.modifier_rank)
        _lazy_shards.keep_shards(self._written, self.modifier_rank)


def register_external_parameter(module: torch.nn.Module, parameter: torch.nn.Parameter) -> None:
    """DeepSpeed's ``zero.register_external_parameter``: ``module``'s forward uses
    ``parameter``, which another module owns; under stage 3 it is gathered before
    ``module``'s forward and backward and released after, like ``module``'s own. zero
    also notices such reads by itself during a forward (``nn.MultiheadAttention``'s
    ``out_proj.weight``, tied weights reached by attribute); registering says so ahead of
    time."""
    if not isinstance(parameter, torch.Tensor):
        raise TypeError(f"register_external_parameter takes a parameter, not {type(parameter).__name__}")
    for engine in list(_ENGINES):
        rt = engine._runtime
        info = rt.reg.by_id.get(id(parameter))
        if info is not None:
            rt.add_use(module, rt.reg.units[info.unit])
            return
    # Before initialize() (usually in the model's constructor): applied when an engine
    # takes the model.
    _PENDING.setdefault(module, []).append(parameter)


_PENDING: "weakref.WeakKeyDictionary[torch.nn.Module, List[torch.nn.Parameter]]" = weakref.WeakKeyDictionary()
"""External parameters registered before any engine had the model."""


def apply_pending(runtime: Any) -> None:
    """Registrations made before ``runtime``'s engine existed, for its model's modules."""
    for module in runtime.model.modules():
        for p in _PENDING.pop(module, []):
            info = runtime.reg.by_id.get(id(p))
            if info is not None:
                runtime.add_use(module, runtime.reg.units[info.unit])


def unregister_external_parameter(module: torch.nn.Module, parameter: torch.nn.Parameter) -> None:
    """DeepSpeed's ``zero.unregister_external_parameter``: undoes
    :func:`register_external_parameter` (a parameter the module owns stays its own)."""
    engine = _engine_of([parameter])
    rt = engine._runtime
    info = rt.reg.by_id[id(parameter)]
    unit = rt.reg.units[info.unit]
    uses = rt.reg.uses.get(id(module), [])
    owns = any(id(p) == id(parameter) for p in module.parameters(recurse=False))
    if unit in uses and not owns and unit.module is not module:
        uses.remove(unit)


class Init:
    """``zero.Init``: a model built inside it never holds its parameters. Each parameter is
    registered on the meta device (so ``__init__`` and its initializers allocate nothing)
    and becomes a placeholder (shape and dtype, one NaN of storage) when the block ends.
    When the engine is built, it fills the model one unit (a module owning parameters) at a
    time, in the engine's order, and keeps only what this rank holds:

    - from ``checkpoint``, a Hugging Face folder (``config.json`` with ``model.safetensors``
      or its sharded index), each rank reading only the byte ranges it holds (as
      :meth:`~zero_torch.engine.ZeroEngine.load_hf_checkpoint`);
    - else by each unit's own initializers (``param_init_fn(module)`` if given, else the
      module's ``reset_parameters`` and its transformers model's ``_init_weights``) under a
      generator seeded from ``(seed, unit name)``: the same model at any world size and
      stage, and the one :func:`init_weights` gives a whole model.

    A parameter nothing fills is an error naming it. The model is made in the run's 16-bit
    dtype (``dtype=``, else the config's ``bf16``/``fp16``), as DeepSpeed makes it. It
    trains on the CPU or on a GPU: there each placeholder is one element on the device, and
    each unit is filled on the host and uploaded (its rank's part) before the next.

    Entering it pins glibc malloc's mmap threshold at 1 MiB (``_host_memory.pin_heap``):
    freed tensors of 1 MiB or more then leave the heap, which keeps a stage-3 run within
    its memory bound, at some step time where a step allocates many such tensors.

    ``seed=None`` (what ``deepspeed.zero.Init`` under ``zero_torch.deepspeed_compat``
    defaults to) builds the model whole instead, drawing from torch's generator as
    DeepSpeed does, so a DeepSpeed script starts from DeepSpeed's values; the engine then
    takes its shard at the first forward."""

    def __init__(
        self,
        module: Any = None,
        data_parallel_group: Any = None,
        mem_efficient_linear: bool = True,
        remote_device: Any = None,
        pin_memory: bool = False,
        config_dict_or_path: Any = None,
        config: Any = None,
        enabled: bool = True,
        dtype: Optional[torch.dtype] = None,
        mpu: Any = None,
        *,
        checkpoint: Any = None,
        param_init_fn: Optional[Callable[[torch.nn.Module], None]] = None,
        seed: Optional[int] = 0,
        **kwargs: Any,
    ) -> None:
        del module, data_parallel_group, mem_efficient_linear, pin_memory, mpu, kwargs
        if remote_device not in (None, "cpu", "none"):
            raise UnsupportedError(
                f"zero.Init(remote_device={remote_device!r}) is not supported: use offload_param in the config"
            )
        self.enabled = enabled
        self._config_given: Any = config_dict_or_path if config_dict_or_path is not None else config
        self.dtype = dtype if dtype is not None else _config_dtype(self._config_given)
        self._saved: Optional[torch.dtype] = None
        self._spec: Optional[_lazy_init.LazySpec] = None
        if enabled and (seed is not None or checkpoint is not None or param_init_fn is not None):
            if checkpoint is not None:
                checkpoint = os.path.abspath(os.fspath(checkpoint))
                if not os.path.isdir(checkpoint):
                    raise CheckpointError(f"zero.Init(checkpoint={checkpoint!r}): no such folder")
            self._spec = _lazy_init.LazySpec(seed=0 if seed is None else int(seed), param_init_fn=param_init_fn,
                                             checkpoint=checkpoint)
        self._construction: Optional[_lazy_init.Construction] = None

    def __enter__(self) -> "Init":
        if self.enabled:
            _host_memory.pin_heap()
        if self.enabled and self.dtype in (torch.float16, torch.bfloat16):
            self._saved = torch.get_default_dtype()
            torch.set_default_dtype(self.dtype)
        if self._spec is not None:
            self._construction = _lazy_init.Construction(self._spec, self.dtype)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._construction is not None:
            self._construction.close()
            self._construction = None
        if self._saved is not None:
            torch.set_default_dtype(self._saved)
            self._saved = None


class DeepSpeedInit(Init):
    """``deepspeed.zero.Init`` under ``zero_torch.deepspeed_compat``: :class:`Init` with
    ``seed=None`` by default, so a DeepSpeed script's model draws DeepSpeed's values
    (built whole; the engine takes its shard at the first forward). Passing ``seed=``,
    ``checkpoint=`` or ``param_init_fn=`` builds it without its parameters.

    Entered while torch's initializers are disabled (transformers' ``from_pretrained`` and
    ``from_config`` under ZeRO-3, on the CPU or on GPUs once torch's group exists), it
    builds the model without its parameters too: transformers then writes each module's
    values on rank 0 inside ``GatheredParameters(..., modifier_rank=0)``, and each rank
    keeps only its shard of them (``_lazy_shards``, over gloo whatever torch's backend),
    so a model bigger than one rank (or one GPU) loads this way."""

    def __init__(self, *args: Any, seed: Optional[int] = None, **kwargs: Any) -> None:
        super().__init__(*args, seed=seed, **kwargs)
        self._build_whole = self.enabled and self._spec is None

    def __enter__(self) -> "Init":
        if self._build_whole and _initializers_disabled() and _shards_stay_on_host():
            # transformers' loading under ZeRO-3 (from_pretrained, from_config): torch's
            # initializers are off, so the values are written afterwards, rank 0's inside
            # GatheredParameters(modifier_rank=0). Each rank keeps a shard of them.
            self._spec = _lazy_init.LazySpec(seed=0, param_init_fn=None, checkpoint=None, written=True)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        if self._build_whole:
            self._spec = None


class MiCSInit(DeepSpeedInit):
    """``deepspeed.zero.MiCS_Init`` under ``zero_torch.deepspeed_compat`` (DeepSpeed 0.18
    and before; 0.19.8 removed it): :class:`DeepSpeedInit` for a script written for MiCS.
    As DeepSpeed's, it needs the config (``config_dict_or_path``, or the deprecated
    ``config``), and the config must name ``zero_optimization.mics_shard_size``; a missing
    one is a :class:`~zero_torch.errors.ConfigError` naming it.

    The model is built as :class:`DeepSpeedInit` builds it (whole, from torch's
    generator, unless ``seed=``, ``checkpoint=`` or ``param_init_fn=`` say otherwise): in
    zero the engine partitions the parameters when ``initialize`` builds it, over the
    shard groups of the config ``initialize`` gets, so MiCS_Init's own shard size is
    checked, not used (a script passes the same config to both)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._config_given is None:
            raise ConfigError(
                "deepspeed.zero.MiCS_Init needs the DeepSpeed config (config_dict_or_path=), "
                "whose zero_optimization.mics_shard_size sets the shard groups"
            )
        zero_section = (_read_config(self._config_given) or {}).get("zero_optimization")
        size = zero_section.get("mics_shard_size") if isinstance(zero_section, dict) else None
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(
                "deepspeed.zero.MiCS_Init: the config has no zero_optimization.mics_shard_size "
                f"of 1 or more (found {size!r}); MiCS_Init partitions over shard groups of that "
                "many ranks (use deepspeed.zero.Init for flat ZeRO-3)"
            )
        self.shard_size: int = size


def _initializers_disabled() -> bool:
    """Whether torch's initializers write nothing (transformers' ``no_init_weights``
    replaces them while it builds a model whose weights it loads afterwards)."""
    probe = torch.zeros(1, device="cpu", dtype=torch.float32)  # whatever device context is in force
    torch.nn.init.constant_(probe, 1.0)
    return probe.item() == 0.0


def _shards_stay_on_host() -> bool:
    """Whether values written before ``initialize`` can be kept as host shards: torch's
    group exists (gloo, NCCL or any other: the shards cross zero's gloo host group,
    ``_dist.host_group``), or there is none and no GPU (a world of one). Without a group
    on a GPU machine the world size is not known yet, so the model is built whole."""
    import torch.distributed as dist

    if dist.is_initialized():
        return True
    return not torch.cuda.is_available()


def init_weights(model: torch.nn.Module, seed: int = 0,
                 param_init_fn: Optional[Callable[[torch.nn.Module], None]] = None) -> None:
    """Fills a whole model's parameters exactly as ``Init(seed=seed,
    param_init_fn=param_init_fn)`` fills the same model unit by unit (to compare the two,
    or to start an ordinary run from the same values)."""
    _lazy_init.init_weights(model, seed=seed, param_init_fn=param_init_fn)


def _read_config(config: Any) -> Optional[dict]:
    """A DeepSpeed config given as a dict or a JSON file's path; ``None`` for anything
    else."""
    if isinstance(config, dict):
        return config
    if not isinstance(config, (str, os.PathLike)):
        return None
    import json

    with open(config) as f:
        loaded = json.load(f)
    return loaded if isinstance(loaded, dict) else None


def _config_dtype(config: Any) -> Optional[torch.dtype]:
    """The 16-bit dtype a DeepSpeed config (dict or path) trains in, if any."""
    config = _read_config(config)
    if config is None:
        return None
    for key, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16), ("bfloat16", torch.bfloat16)):
        section = config.get(key)
        if isinstance(section, dict) and section.get("enabled") is True:
            return dtype
    return None
