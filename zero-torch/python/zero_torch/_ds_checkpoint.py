"""Reading checkpoints written by DeepSpeed 0.19.8 (``engine.save_checkpoint(dir, tag)``)
without DeepSpeed: every trainable parameter's whole fp32 master weights and Adam moments,
by name, plus the counters, the loss scaler, the LR scheduler and the client state.

Only data-parallel checkpoints are read (ZeRO stages 0-3, fp32/bf16/fp16, any world
size); pipeline, tensor and expert (MoE) parallel ones are refused. Every rank of a loading
job that calls :func:`read_deepspeed_checkpoint` reads *every* rank's files (simple, and
memory-hungry for large models: each process holds the whole fp32 state for a moment).

Unpickling
----------
Files are read with ``torch.load(..., weights_only=True)``. DeepSpeed pickles a few of its
own objects into the ``*_optim_states.pt`` files; each of these global names, and no other,
is mapped (``torch.serialization.safe_globals`` with ``(object, "module.qualname")``) to a
small stand-in defined here that only receives the pickled fields:

- ``deepspeed.runtime.fp16.loss_scaler.LossScaler`` and ``...DynamicLossScaler``: the loss
  scaler object (``stage_1_and_2.py: DeepSpeedZeroOptimizer.state_dict``,
  ``stage3.py: DeepSpeedZeroOptimizer_Stage3._rigid_state_dict``), read back as a dict;
- ``deepspeed.runtime.zero.config.ZeroStageEnum``: the ``zero_stage`` entry, an int enum;
- ``deepspeed.utils.tensor_fragment.fragment_address``: ``param_slice_mappings`` (stages 1
  and 2, ``BF16_Optimizer``), ``(numel, start)`` pairs that this reader does not need.

Anything else the pickle names (``os.system``, a client-state class, ...) is refused by
torch's weights-only unpickler before anything runs, and reported as a
:class:`DeepSpeedCheckpointError` naming the file and the global.

DeepSpeed's layout (``runtime/engine.py: DeepSpeedEngine._save_checkpoint``)
-------------------------------------------------------------------------
``load_dir/latest`` holds the tag; ``load_dir/tag`` holds the files.

*Model states* (``_save_checkpoint`` / ``_common_checkpoint_state``): a dict with
``module`` (the model's ``state_dict()`` in the run's dtype, buffers included, named in
``buffer_names``), ``optimizer`` (the whole optimizer state dict when ZeRO is off, else
None), ``param_shapes`` (ZeRO: one ordered ``{name: shape}`` per flat group, the order of
the flat fp32 data, ``_get_zero_param_shapes``), ``frozen_param_shapes`` /
``frozen_param_fragments`` (stages 2 and 3: parameters the optimizer does not own,
``_get_zero_frozen_param_attributes``; at stage 3 each rank's fragment is its partition),
``shared_params`` (``{alias: name}`` of tied parameters), ``lr_scheduler``,
``global_steps``, ``global_samples``, ``skipped_steps``, ``dp_world_size``,
``mp_world_size``, ``checkpoint_parallel_dimensions``, ``ds_config``, ``ds_version``, and
the client state's keys at top level. Stages 0-2 write one ``mp_rank_00_model_states.pt``
(data-parallel rank 0); stage 3 writes ``zero_pp_rank_<r>_mp_rank_00_model_states.pt`` on
every rank, where ``module`` holds *empty* tensors for the partitioned parameters (their
values are only in the optimizer files; :attr:`DeepSpeedCheckpoint.module` keeps them as
saved).

*Stage 0* (no ZeRO; ``_configure_optimizer``): ``optimizer`` is

- fp32: the torch optimizer's own ``state_dict()`` (state by parameter index, in the
  order of its param groups; the master weights are the module's fp32 weights);
- fp16/bf16 with DeepSpeed's FusedAdam: ``runtime/fp16/fused_optimizer.py:
  FP16_Optimizer.state_dict``: ``fp32_groups_flat`` (one flat fp32 tensor per param group,
  the group's trainable parameters back to back, no padding), ``optimizer_state_dict``
  (the base optimizer's, one flat state per group), and for fp16 the loss-scale fields
  (``cur_scale``, ``cur_iter``, ``dynamic_loss_scale``, ...);
- fp16/bf16 with any other optimizer: ``runtime/fp16/unfused_optimizer.py:
  FP16_UnfusedOptimizer.state_dict``: ``fp32_groups`` (one fp32 tensor per trainable
  parameter, per group) and ``optimizer_state_dict``.

Stage 0 does not record which module weight each of the optimizer's parameters is. In
fp16/bf16 each fp32 master is matched to the module weight (not a buffer; tied ones once)
whose 16-bit value is the master rounded, as DeepSpeed copies the masters into the weights
after every step: the next weight in state-dict order first, then any unused one (param
groups may reorder parameters); weights that match no master are frozen. In fp32 the
optimizer's parameters are taken to be the module's weights in state-dict order (those
with no optimizer state, when others have some, are frozen). Where that cannot work (fp32
with frozen parameters left out of the optimizer, or reordered by param groups), pass
``trainable_names``: the names of the parameters the optimizer holds, in its order.

*Stages 1 and 2* (``runtime/zero/stage_1_and_2.py``): one
``zero_pp_rank_<r>_mp_rank_00_optim_states.pt`` per data-parallel rank (``bf16_`` prefix
in bf16, ``_get_zero_ckpt_name``), holding ``{"optimizer_state_dict": ..., "ds_config",
"ds_version"}`` (``_save_zero_checkpoint``). Per param group, the trainable parameters
(in ``param_shapes`` order, which is ``round_robin_bit16_groups``) are flattened back to
back, each followed by ``param_alignment_paddings[g][i]`` zeros, and the whole padded to a
multiple of ``2 * dp`` (``__init__``, ``flatten_dense_tensors_aligned``); rank ``r`` owns
the ``r``-th equal slice (``get_data_parallel_partitions``).
``single_partition_of_fp32_groups[g]`` is that slice in fp32 with the tail padding cut off
(``_get_groups_without_padding``); concatenated over the ranks they give the group's flat
data. ``base_optimizer_state`` is the base optimizer's ``state_dict()``, one flat state per
group over the *padded* slice (or, with ``elastic_checkpoint``, a list of per-group states
already cut, ``_get_base_optimizer_state``). ``BF16_Optimizer`` (stage 1, bf16 with fp32
gradient accumulation, ``runtime/bf16_optimizer.py: state_dict``) saves the same keys
without ``zero_stage``, ``loss_scaler`` or ``param_alignment_paddings``, with the slices
uncut. ``utils/zero_to_fp32.py: _zero2_merge_trainable_params`` reads the same layout.

*Stage 3* (``runtime/zero/stage3.py: _rigid_state_dict``): the same file names;
``fp32_flat_groups`` is a list of flat fp32 tensors, one per *sub-group*
(``_create_fp16_sub_groups``, ``sub_group_size``), each the rank's partitions of the
sub-group's parameters back to back. Every parameter is partitioned on its own: each rank
holds ``ceil(numel / dp)`` elements (the last rank's tail zero padded). ``param_shapes``
lists the parameters in the same order (one dict per sub-group). The base optimizer's
``optimizer_state_dict`` has one flat state per sub-group, the same length as its
``fp32_flat_groups`` entry. ``utils/zero_to_fp32.py: _zero3_merge_trainable_params``
reads the same layout.

Not read: NVMe-offloaded optimizer state (``offloaded_tensors/``, refused), and the
model-states keys ``data_sampler``, ``random_ltd`` and ``universal_checkpoint_info``
(DeepSpeed's own, so not client state; dropped).
"""

from __future__ import annotations

import _compat_pickle
import math
import os
import pickle
import re
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

try:
    from .errors import CheckpointError as _CheckpointErrorBase
except ImportError:  # loaded on its own, without the package's compiled extension (tests)
    _CheckpointErrorBase = RuntimeError  # type: ignore[assignment,misc]

__all__ = [
    "DeepSpeedCheckpointError",
    "ParamState",
    "DeepSpeedCheckpoint",
    "is_deepspeed_checkpoint",
    "read_deepspeed_checkpoint",
    "DEEPSPEED_PICKLE_GLOBALS",
]

FORMAT = "DeepSpeed checkpoint"
MODEL_FILE = "mp_rank_00_model_states.pt"
ZERO_MODEL_FILE = "zero_pp_rank_{}_mp_rank_00_model_states.pt"
ZERO_OPTIM_FILE = "{}zero_pp_rank_{}_mp_rank_00_optim_states.pt"
OPTIM_PREFIXES = ("", "bf16_", "fp16_")
RANK_FILE = re.compile(r"^(bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_(optim|model)_states\.pt$")

# The keys DeepSpeed itself puts into the model-states dict (engine.py:
# _common_checkpoint_state, _save_checkpoint); every other key is the client state.
DS_MODEL_KEYS = frozenset({
    "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
    "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "skipped_steps",
    "global_steps", "global_samples", "dp_world_size", "mp_world_size",
    "checkpoint_parallel_dimensions", "ds_config", "ds_version", "universal_checkpoint_info",
})
MOE_MODEL_KEYS = ("ds_autoep_layers", "autoep_layers", "ds_autoep_uc_meta")


class DeepSpeedCheckpointError(_CheckpointErrorBase):  # type: ignore[misc,valid-type]
    """A DeepSpeed checkpoint zero cannot read: the message names DeepSpeed's format, the
    file (or folder) and the problem."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{FORMAT} {path}: {problem}")

    def __reduce__(self) -> Tuple[Any, Tuple[str, str]]:
        return (type(self), (self.path, self.problem))


@dataclass
class ParamState:
    """One trainable parameter, whole."""

    master: torch.Tensor
    """fp32, the parameter's full shape."""
    exp_avg: Optional[torch.Tensor]
    """Adam's first moment, fp32, full shape; None when the optimizer state has none."""
    exp_avg_sq: Optional[torch.Tensor]
    """Adam's second moment, fp32, full shape; None when the optimizer state has none."""


@dataclass
class DeepSpeedCheckpoint:
    """A DeepSpeed checkpoint in a neutral form. Tensors may share storage with each other
    (e.g. stage 0's moments with ``base_optimizer_state``); copy before writing into them."""

    path: str
    """``load_dir/tag``."""
    zero_stage: int
    dp_world_size: int
    precision: str
    """``"fp32"``, ``"bf16"`` or ``"fp16"``."""
    params: Dict[str, ParamState]
    """Trainable parameters by name as in ``model.named_parameters()`` (DeepSpeed's
    ``param_shapes`` names), in DeepSpeed's flat order."""
    module: Dict[str, torch.Tensor]
    """The ``module`` state dict of (rank 0's) model-states file: weights in the run's
    dtype and persistent buffers. At stage 3 the partitioned weights are empty tensors
    there (their values are in ``params`` and ``frozen``)."""
    frozen: Dict[str, torch.Tensor]
    """Frozen parameters' values (in the run's dtype), where the checkpoint has them."""
    optimizer_step: Optional[int]
    """Adam's step count from the base optimizer state (the largest, if they differ)."""
    global_steps: int
    global_samples: int
    skipped_steps: int
    loss_scaler: Optional[Dict[str, Any]]
    """fp16 only: ``cur_scale``, ``cur_iter``, ``dynamic`` and whatever else DeepSpeed saved
    (``last_overflow_iter``, ``cur_hysteresis``, ``scale_window``, ...), as plain values."""
    lr_scheduler: Optional[Dict[str, Any]]
    """The saved LR scheduler state dict, or None."""
    client_state: Dict[str, Any]
    """Every key of the model-states dict DeepSpeed did not put there itself."""
    ds_config: Optional[Dict[str, Any]]
    base_optimizer_state: List[Dict[str, Any]] = field(default_factory=list)
    """Per rank, the raw base optimizer state dict (stage 0: one, shared by all ranks);
    empty with ``load_optimizer_states=False``."""


# ---------------------------------------------------------------------------------------
# Stand-ins for the DeepSpeed objects in the pickles


class _PickledFields:
    """Receives a pickled object's ``__dict__`` (the unpickler's BUILD) and nothing else."""

    def as_dict(self) -> Dict[str, Any]:
        return {k: _plain(v) for k, v in vars(self).items()}


class _LossScaler(_PickledFields):
    """``deepspeed.runtime.fp16.loss_scaler.LossScaler`` (a static scale)."""


class _DynamicLossScaler(_PickledFields):
    """``deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler``."""


class _ZeroStage(IntEnum):
    """``deepspeed.runtime.zero.config.ZeroStageEnum`` (pickled as ``ZeroStageEnum(n)``)."""

    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3


class _FragmentAddress(_PickledFields):
    """``deepspeed.utils.tensor_fragment.fragment_address`` (a dataclass: numel, start)."""


DEEPSPEED_PICKLE_GLOBALS: Dict[str, Any] = {
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": _LossScaler,
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": _DynamicLossScaler,
    "deepspeed.runtime.zero.config.ZeroStageEnum": _ZeroStage,
    "deepspeed.utils.tensor_fragment.fragment_address": _FragmentAddress,
}
"""The only non-torch globals zero unpickles from a DeepSpeed checkpoint, and their stand-ins."""


def _plain(value: Any) -> Any:
    """A stand-in's field as a plain value: 0-d tensors as numbers, enums as ints."""
    if isinstance(value, _PickledFields):
        return value.as_dict()
    if isinstance(value, IntEnum):
        return int(value)
    if torch.is_tensor(value) and value.dim() == 0:
        return value.item()
    return value


_GLOBAL_IN_MESSAGE = re.compile(r"GLOBAL ([A-Za-z_][\w.]*)")


def _global_name(name: str) -> str:
    """A pickled global as found, with its Python 3 name where pickle protocol 2 wrote the
    Python 2 one (``commands.check_call`` is ``subprocess.check_call``)."""
    module, _, attr = name.rpartition(".")
    py3 = _compat_pickle.IMPORT_MAPPING.get(module)
    return f"`{name}` (Python 2's name of `{py3}.{attr}`)" if py3 else f"`{name}`"


def _torch_reason(message: str) -> str:
    """The reason in torch's load error, without its advice about ``weights_only=False``
    (which would unpickle anything) and its documentation links."""
    if "WeightsUnpickler error:" in message:
        message = message.split("WeightsUnpickler error:", 1)[1]
    message = message.split("Check the documentation of torch.load", 1)[0]
    message = message.split(" This is an internal miniz error.", 1)[0]
    return " ".join(message.split())


def _load(path: str) -> Any:
    """``torch.load(path, weights_only=True)`` with DeepSpeed's stand-ins allowed; every
    failure is a :class:`DeepSpeedCheckpointError` naming the file."""
    if not os.path.isfile(path):
        raise DeepSpeedCheckpointError(path, "is missing")
    safe_globals = getattr(torch.serialization, "safe_globals", None)
    if safe_globals is None:
        raise DeepSpeedCheckpointError(path, f"reading it needs torch >= 2.5 (torch {torch.__version__} is installed)")
    allowed = [(obj, name) for name, obj in DEEPSPEED_PICKLE_GLOBALS.items()]
    try:
        with safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = _GLOBAL_IN_MESSAGE.search(str(e))
        if found:
            raise DeepSpeedCheckpointError(
                path,
                f"its pickle names the global {_global_name(found.group(1))}, which is not part of DeepSpeed's "
                "checkpoint format as zero reads it; nothing was executed. zero unpickles only tensors, "
                "plain Python values and " + ", ".join(sorted(DEEPSPEED_PICKLE_GLOBALS)),
            ) from e
        raise DeepSpeedCheckpointError(path, f"cannot be unpickled (truncated or corrupt?): {_torch_reason(str(e))}") from e
    except Exception as e:  # torch's zip reader, EOF, ...: a damaged file
        raise DeepSpeedCheckpointError(path, f"cannot be read (truncated or corrupt?): {type(e).__name__}: {_torch_reason(str(e))}") from e


def _need(path: str, d: Any, key: str, what: str = "") -> Any:
    """``d[key]``, or an error saying the file lacks it."""
    if not isinstance(d, dict) or key not in d:
        where = f" {what}" if what else ""
        raise DeepSpeedCheckpointError(path, f"has no `{key}`{where}: not a DeepSpeed 0.19 checkpoint file of the expected kind")
    return d[key]


# ---------------------------------------------------------------------------------------
# Finding the files


def _tag_folder(load_dir: str, tag: Optional[str]) -> str:
    load_dir = os.fspath(load_dir)
    if not os.path.isdir(load_dir):
        raise DeepSpeedCheckpointError(load_dir, "no such folder")
    if tag is None:
        latest = os.path.join(load_dir, "latest")
        if not os.path.isfile(latest):
            raise DeepSpeedCheckpointError(latest, "is missing: pass the tag, or point at a folder DeepSpeed saved into")
        with open(latest) as f:
            tag = f.read().strip()
        if not tag:
            raise DeepSpeedCheckpointError(latest, "is empty")
    folder = os.path.join(load_dir, str(tag))
    if not os.path.isdir(folder):
        raise DeepSpeedCheckpointError(folder, f"no such folder (tag `{tag}`)")
    return folder


def _refuse_non_data_parallel(folder: str, files: Sequence[str]) -> None:
    """Pipeline, tensor and expert parallel checkpoints have files a data-parallel one has
    not (engine.py: _get_ckpt_name, _get_expert_ckpt_name, _get_optimizer_ckpt_name)."""
    for name in files:
        kind = None
        mp = re.search(r"mp_rank_(\d+)", name)
        if mp and int(mp.group(1)) != 0:
            kind = "model-parallel"
        elif (name.startswith("layer_") and "expert" in name) or name.startswith(("expert_", "expp_rank_")):
            kind = "mixture-of-experts"
        elif name.startswith("layer_"):
            kind = "pipeline-parallel"
        if kind:
            raise DeepSpeedCheckpointError(
                os.path.join(folder, name),
                f"belongs to a {kind} checkpoint: zero reads data-parallel checkpoints only")
    if "offloaded_tensors" in files:
        raise DeepSpeedCheckpointError(
            os.path.join(folder, "offloaded_tensors"),
            "holds optimizer state DeepSpeed offloaded to NVMe, which zero does not read")


def _refuse_non_data_parallel_states(path: str, sd: Dict[str, Any]) -> None:
    dims = sd.get("checkpoint_parallel_dimensions") or {}
    degrees = {k: dims.get(k, 1) for k in ("tp_degree", "pp_degree")} if isinstance(dims, dict) else {}
    mp = sd.get("mp_world_size", 1)
    if (isinstance(mp, int) and mp > 1) or any(isinstance(v, int) and v > 1 for v in degrees.values()):
        raise DeepSpeedCheckpointError(
            path, f"was saved with model parallelism (mp_world_size {mp}, {degrees}): "
            "zero reads data-parallel checkpoints only")
    for key in MOE_MODEL_KEYS:
        if sd.get(key):
            raise DeepSpeedCheckpointError(
                path, f"is a mixture-of-experts checkpoint (`{key}`): zero reads data-parallel checkpoints only")


def _refuse_stray_ranks(folder: str, files: Sequence[str], dp: int) -> None:
    for name in files:
        m = RANK_FILE.match(name)
        if m and int(m.group(2)) >= dp:
            raise DeepSpeedCheckpointError(
                os.path.join(folder, name),
                f"is the file of data-parallel rank {m.group(2)}, but the checkpoint says it was saved by "
                f"{dp} ranks (a leftover of an earlier save into the same tag?)")


def _optim_prefix(folder: str, files: Sequence[str]) -> str:
    found = [p for p in OPTIM_PREFIXES if ZERO_OPTIM_FILE.format(p, 0) in files]
    if not found:
        raise DeepSpeedCheckpointError(
            os.path.join(folder, ZERO_OPTIM_FILE.format("", 0)),
            "is missing (and no bf16_/fp16_ variant either): a ZeRO checkpoint keeps the fp32 weights there")
    if len(found) > 1:
        raise DeepSpeedCheckpointError(
            folder, "holds optimizer files of two kinds: "
            + " and ".join(ZERO_OPTIM_FILE.format(p, 0) for p in found))
    return found[0]


# ---------------------------------------------------------------------------------------
# Pieces shared by the stages


def _numel(shape: Any) -> int:
    return int(math.prod(int(s) for s in shape))


def _as_int(value: Any) -> int:
    return int(value.item()) if torch.is_tensor(value) else int(value)


def _param_candidates(module: Dict[str, Any], buffer_names: Iterable[str]) -> List[str]:
    """The names in ``module`` that are parameters, tied ones once (they share storage
    after loading, as they did when saved), in state-dict order."""
    buffers = set(buffer_names or ())
    seen = set()
    names = []
    for name, t in module.items():
        if name in buffers or not torch.is_tensor(t):
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride())) if t.numel() else None
        if key is not None and key in seen:
            continue
        if key is not None:
            seen.add(key)
        names.append(name)
    return names


def _state_moments(path: str, state: Dict[str, Any], where: str) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """Adam's (exp_avg, exp_avg_sq) of one optimizer state entry, or None without them."""
    has = [k for k in ("exp_avg", "exp_avg_sq") if k in state]
    if not has:
        return None
    if len(has) == 1:
        raise DeepSpeedCheckpointError(path, f"optimizer state {where} has `{has[0]}` but not its pair")
    return state["exp_avg"], state["exp_avg_sq"]


def _step_of(states: Iterable[Dict[str, Any]], groups: Iterable[Dict[str, Any]], extra: Optional[Any] = None) -> Optional[int]:
    """The step count: the states' ``step`` (torch's Adam, DeepSpeed's FusedAdam and CPU
    Adam), else ``base_optimizer_state_step`` (elastic checkpoints), else the groups'."""
    steps = [_as_int(s["step"]) for s in states if isinstance(s, dict) and "step" in s]
    if steps:
        return max(steps)
    if extra is not None:
        return _as_int(extra)
    steps = [_as_int(g["step"]) for g in groups if isinstance(g, dict) and "step" in g]
    return max(steps) if steps else None


def _group_indices(path: str, base: Dict[str, Any]) -> List[List[int]]:
    groups = _need(path, base, "param_groups", "in the base optimizer state")
    try:
        return [list(g["params"]) for g in groups]
    except (TypeError, KeyError) as e:
        raise DeepSpeedCheckpointError(path, f"the base optimizer's param_groups have no `params` lists ({e})") from e


def _torch_state_dict(path: str, base: Any) -> Dict[str, Any]:
    if not isinstance(base, dict) or "state" not in base or "param_groups" not in base:
        raise DeepSpeedCheckpointError(path, "the base optimizer state is not a torch optimizer state dict (`state`, `param_groups`)")
    return base


def _param_state(master: torch.Tensor, exp_avg: Optional[torch.Tensor], exp_avg_sq: Optional[torch.Tensor]) -> ParamState:
    """DeepSpeed saves its flat fp32 tensors with ``requires_grad=True``: detached here
    (and made fp32, a no-op for the fp32 state DeepSpeed keeps by default)."""
    d = lambda t: None if t is None else t.detach().float()  # noqa: E731
    return ParamState(master.detach().float(), d(exp_avg), d(exp_avg_sq))


def _too_short(path: str, what: str, have: int, need: int) -> DeepSpeedCheckpointError:
    return DeepSpeedCheckpointError(
        path, f"{what} holds {have} elements, fewer than the {need} its parameters need: the partitions do not add up")


# ---------------------------------------------------------------------------------------
# Stage 0: the whole optimizer in the model-states file


@dataclass
class _Read:
    """What the optimizer part of a checkpoint gave."""

    stage: int
    params: Dict[str, ParamState]
    trainable: List[str]
    base: List[Dict[str, Any]]
    step: Optional[int]


def _holds(lp: torch.Tensor, hp: torch.Tensor) -> bool:
    """Whether the module's 16-bit weight ``lp`` is the fp32 master ``hp`` rounded."""
    return tuple(lp.shape) == tuple(hp.shape) and torch.equal(hp.to(lp.dtype), lp)


class _Matcher:
    """Finds the module weight an fp32 master belongs to, for stage 0 in 16 bits (whose
    files name no parameter): the unused weight whose value is the master rounded to the
    weight's dtype (DeepSpeed copies the masters into the 16-bit weights after each step).
    The next weight in state-dict order is tried first (the usual case, frozen weights
    skipped), then the others (param groups that reorder the parameters). Weights with the
    same value and shape are told apart by order only."""

    def __init__(self, path: str, module: Dict[str, torch.Tensor], candidates: List[str]) -> None:
        self.path = path
        self.module = module
        self.unused = [c for c in candidates if module[c].numel()]
        self.next = 0

    def take(self, fits: Callable[[torch.Tensor], bool], what: str) -> str:
        order = list(range(self.next, len(self.unused))) + list(range(self.next))
        for i in order:
            name = self.unused[i]
            if fits(self.module[name]):
                del self.unused[i]
                self.next = i if i < len(self.unused) else 0
                return name
        raise DeepSpeedCheckpointError(
            self.path, f"stage 0 records no parameter names, and {what} is not the master of any module weight "
            "(no weight is its value rounded): pass trainable_names (the names of the parameters the optimizer "
            "holds, in its order)")


def _named_in_order(path: str, module: Dict[str, torch.Tensor], names: Sequence[str], shapes: List[Tuple[int, ...]]) -> List[str]:
    if len(names) != len(shapes):
        raise DeepSpeedCheckpointError(
            path, f"trainable_names has {len(names)} names but the optimizer holds {len(shapes)} parameters")
    for name, shape in zip(names, shapes):
        if name not in module:
            raise DeepSpeedCheckpointError(path, f"trainable_names names `{name}`, which the module state dict lacks")
        if tuple(module[name].shape) != tuple(shape):
            raise DeepSpeedCheckpointError(
                path, f"`{name}` has shape {tuple(module[name].shape)} but the optimizer's parameter in its "
                f"place has {tuple(shape)}: trainable_names must follow the optimizer's order")
    return list(names)


def _stage0_unfused(path: str, opt: Dict[str, Any], module: Dict[str, torch.Tensor], candidates: List[str],
                    trainable_names: Optional[Sequence[str]], want: bool) -> _Read:
    """FP16_UnfusedOptimizer: one fp32 tensor per trainable parameter."""
    masters = [t for group in _need(path, opt, "fp32_groups", "in `optimizer`") for t in group]
    base = _torch_state_dict(path, _need(path, opt, "optimizer_state_dict", "in `optimizer`"))
    indices = [i for g in _group_indices(path, base) for i in g]
    if len(indices) != len(masters):
        raise DeepSpeedCheckpointError(
            path, f"`fp32_groups` holds {len(masters)} tensors but the base optimizer {len(indices)} parameters")
    if trainable_names is None:
        matcher = _Matcher(path, module, candidates)
        names = [matcher.take(lambda lp, hp=hp: _holds(lp, hp), f"the optimizer's parameter {k} (shape {tuple(hp.shape)})")
                 for k, hp in enumerate(masters)]
    else:
        names = _named_in_order(path, module, trainable_names, [tuple(t.shape) for t in masters])
    params = {}
    for name, hp, idx in zip(names, masters, indices):
        m = _state_moments(path, base["state"].get(idx, {}), f"of `{name}`") if want else None
        params[name] = _param_state(hp.float(), m[0] if m else None, m[1] if m else None)
    step = _step_of(base["state"].values(), base["param_groups"]) if want else None
    return _Read(0, params, names, [base] if want else [], step)


def _fused_layout(path: str, flats: List[torch.Tensor], module: Dict[str, torch.Tensor], candidates: List[str],
                  trainable_names: Optional[Sequence[str]]) -> List[Tuple[str, int, int]]:
    """``(name, group, offset)`` of every parameter in FP16_Optimizer's flat groups: the
    given names in turn, or the module weight whose value is the flat data there rounded."""
    layout: List[Tuple[str, int, int]] = []
    queue = list(trainable_names) if trainable_names is not None else None
    matcher = _Matcher(path, module, candidates)
    for g, flat in enumerate(flats):
        off = 0
        while off < flat.numel():
            if queue is None:
                def fits(lp: torch.Tensor, flat: torch.Tensor = flat, off: int = off) -> bool:
                    return off + lp.numel() <= flat.numel() and _holds(lp, flat[off:off + lp.numel()].view(lp.shape))

                name = matcher.take(fits, f"flat group {g} from element {off} on")
            elif not queue:
                raise _too_short(path, "the parameters trainable_names names", off, flat.numel())
            else:
                name = queue.pop(0)
                if name not in module:
                    raise DeepSpeedCheckpointError(path, f"trainable_names names `{name}`, which the module state dict lacks")
            n = module[name].numel()
            if off + n > flat.numel():
                raise _too_short(path, f"flat group {g} of `fp32_groups_flat`", flat.numel(), off + n)
            layout.append((name, g, off))
            off += n
    if queue:
        raise DeepSpeedCheckpointError(path, f"trainable_names has {len(queue)} names more than `fp32_groups_flat` holds: {queue}")
    return layout


def _stage0_fused(path: str, opt: Dict[str, Any], module: Dict[str, torch.Tensor], candidates: List[str],
                  trainable_names: Optional[Sequence[str]], want: bool) -> _Read:
    """FP16_Optimizer: one flat fp32 tensor per param group, no padding."""
    flats = _need(path, opt, "fp32_groups_flat", "in `optimizer`")
    base = _torch_state_dict(path, _need(path, opt, "optimizer_state_dict", "in `optimizer`"))
    groups = _group_indices(path, base)
    if len(groups) != len(flats) or any(len(g) != 1 for g in groups):
        raise DeepSpeedCheckpointError(
            path, f"`fp32_groups_flat` holds {len(flats)} flat groups but the base optimizer's param groups "
            f"hold {[len(g) for g in groups]} tensors (expected one each)")
    moments = []
    for g, flat in enumerate(flats):
        m = _state_moments(path, base["state"].get(groups[g][0], {}), f"of flat group {g}") if want else None
        if m and (m[0].numel() != flat.numel() or m[1].numel() != flat.numel()):
            raise DeepSpeedCheckpointError(path, f"the Adam moments of flat group {g} do not have its {flat.numel()} elements")
        moments.append(m)
    params: Dict[str, ParamState] = {}
    for name, g, off in _fused_layout(path, flats, module, candidates, trainable_names):
        shape, n, m = module[name].shape, module[name].numel(), moments[g]
        cut = lambda t: t[off:off + n].view(shape)  # noqa: E731
        params[name] = _param_state(cut(flats[g]), cut(m[0]) if m else None, cut(m[1]) if m else None)
    step = _step_of(base["state"].values(), base["param_groups"]) if want else None
    return _Read(0, params, list(params), [base] if want else [], step)


def _stage0_torch(path: str, base: Dict[str, Any], module: Dict[str, torch.Tensor], candidates: List[str],
                  trainable_names: Optional[Sequence[str]], want: bool) -> _Read:
    """fp32 without ZeRO: the torch optimizer steps the module's own fp32 weights."""
    indices = [i for g in _group_indices(path, base) for i in g]
    state = base["state"]
    if trainable_names is not None and len(indices) == len(trainable_names):
        names = list(trainable_names)
    elif len(indices) == len(candidates):
        names = list(candidates)
    else:
        raise DeepSpeedCheckpointError(
            path, f"stage 0 records no parameter names, and the optimizer holds {len(indices)} parameters while the "
            f"module has {len(candidates)}: pass trainable_names (the names of the parameters the optimizer holds, "
            "in its order)")
    any_state = any(state.get(i) for i in indices)
    params: Dict[str, ParamState] = {}
    trainable: List[str] = []
    for name, idx in zip(names, indices):
        if name not in module:
            raise DeepSpeedCheckpointError(path, f"trainable_names names `{name}`, which the module state dict lacks")
        st = state.get(idx, {})
        m = _state_moments(path, st, f"of `{name}`")
        if m and tuple(m[0].shape) != tuple(module[name].shape):
            raise DeepSpeedCheckpointError(
                path, f"the optimizer's state in `{name}`'s place has shape {tuple(m[0].shape)}, the weight "
                f"{tuple(module[name].shape)}: the optimizer's parameter order is not the module's; pass "
                "trainable_names in the optimizer's order")
        frozen = (name not in trainable_names) if trainable_names is not None else (any_state and not st)
        if frozen:
            continue  # a parameter the optimizer holds but never stepped: frozen
        params[name] = _param_state(module[name].float().clone(), m[0] if (m and want) else None, m[1] if (m and want) else None)
        trainable.append(name)
    step = _step_of(state.values(), base["param_groups"]) if want else None
    return _Read(0, params, trainable, [base] if want else [], step)


def _read_stage0(path: str, model0: Dict[str, Any], trainable_names: Optional[Sequence[str]], want: bool) -> _Read:
    opt = model0["optimizer"]
    module = _need(path, model0, "module")
    candidates = _param_candidates(module, model0.get("buffer_names") or ())
    if not isinstance(opt, dict):
        raise DeepSpeedCheckpointError(path, "`optimizer` is not a state dict")
    if "fp32_groups_flat" in opt:
        return _stage0_fused(path, opt, module, candidates, trainable_names, want)
    if "fp32_groups" in opt:
        return _stage0_unfused(path, opt, module, candidates, trainable_names, want)
    if "state" in opt and "param_groups" in opt:
        return _stage0_torch(path, opt, module, candidates, trainable_names, want)
    raise DeepSpeedCheckpointError(
        path, f"`optimizer` has none of the keys DeepSpeed's stage-0 optimizers save (`fp32_groups_flat`, "
        f"`fp32_groups`, or `state` and `param_groups`): it has {sorted(opt)}")


# ---------------------------------------------------------------------------------------
# Stages 1-3: one optimizer file per rank


@dataclass
class _RankFlat:
    """One flat fp32 vector split over the ranks, with the matching Adam moments."""

    master: List[torch.Tensor]
    exp_avg: Optional[List[torch.Tensor]]
    exp_avg_sq: Optional[List[torch.Tensor]]


def _gather_moments(paths: Sequence[str], per_rank: List[Optional[Tuple[torch.Tensor, torch.Tensor]]], what: str) -> Tuple[Optional[List[torch.Tensor]], Optional[List[torch.Tensor]]]:
    """Every rank's moments, or None when no rank has any; an error when only some have."""
    missing = [r for r, m in enumerate(per_rank) if m is None]
    if len(missing) == len(per_rank):
        return None, None
    if missing:
        raise DeepSpeedCheckpointError(
            paths[missing[0]], f"has no Adam moments for {what} while rank(s) "
            f"{[r for r in range(len(per_rank)) if r not in missing]} have them")
    return [m[0] for m in per_rank], [m[1] for m in per_rank]  # type: ignore[index]


def _zero12_group_state(path: str, osd: Dict[str, Any], g: int) -> Dict[str, Any]:
    """A rank's base optimizer state for param group ``g`` (its one flat partition)."""
    bos = _need(path, osd, "base_optimizer_state", "in `optimizer_state_dict`")
    if isinstance(bos, list):  # elastic_checkpoint: per-group states, padding already cut
        if g >= len(bos):
            raise DeepSpeedCheckpointError(path, f"base_optimizer_state has {len(bos)} groups, no group {g}")
        return bos[g]
    base = _torch_state_dict(path, bos)
    groups = _group_indices(path, base)
    if g >= len(groups) or len(groups[g]) != 1:
        raise DeepSpeedCheckpointError(
            path, f"the base optimizer's param group {g} should hold this rank's one flat partition; "
            f"its groups hold {[len(x) for x in groups]}")
    return base["state"].get(groups[g][0], {})


def _zero12_flats(paths: Sequence[str], osds: List[Dict[str, Any]], n_groups: int, want: bool) -> List[_RankFlat]:
    """Per param group, every rank's fp32 slice and moments (cut to the slice)."""
    out = []
    per_rank_groups = []
    for path, osd in zip(paths, osds):
        fp32 = _need(path, osd, "single_partition_of_fp32_groups", "in `optimizer_state_dict`")
        if not isinstance(fp32, list) or len(fp32) != n_groups:
            raise DeepSpeedCheckpointError(
                path, f"single_partition_of_fp32_groups has {len(fp32) if isinstance(fp32, list) else '?'} groups, "
                f"param_shapes {n_groups}")
        per_rank_groups.append(fp32)
    for g in range(n_groups):
        masters = [groups[g] for groups in per_rank_groups]
        moments: List[Optional[Tuple[torch.Tensor, torch.Tensor]]] = []
        for r, (path, osd) in enumerate(zip(paths, osds)):
            if not want:
                moments.append(None)
                continue
            state = _zero12_group_state(path, osd, g)
            m = _state_moments(path, state, f"of group {g}")
            n = masters[r].numel()
            if m and (m[0].numel() < n or m[1].numel() < n):
                raise _too_short(path, f"the Adam moments of group {g}", min(m[0].numel(), m[1].numel()), n)
            moments.append((m[0][:n], m[1][:n]) if m else None)
        ea, eas = _gather_moments(paths, moments, f"group {g}")
        out.append(_RankFlat(masters, ea, eas))
    return out


def _carve_zero12(path: str, flat: _RankFlat, shapes: Dict[str, Any], paddings: Optional[List[int]], dp: int, g: int) -> Dict[str, ParamState]:
    """Group ``g``'s parameters out of its flat data (ranks' slices back to back)."""
    master = torch.cat(flat.master)
    ea = torch.cat(flat.exp_avg) if flat.exp_avg is not None else None
    eas = torch.cat(flat.exp_avg_sq) if flat.exp_avg_sq is not None else None
    if paddings is not None and len(paddings) != len(shapes):
        raise DeepSpeedCheckpointError(path, f"param_alignment_paddings[{g}] has {len(paddings)} entries for {len(shapes)} parameters")
    out = {}
    off = 0
    for i, (name, shape) in enumerate(shapes.items()):
        n = _numel(shape)
        if off + n > master.numel():
            raise _too_short(path, f"flat group {g} (all ranks' slices)", master.numel(), off + n)
        cut = lambda t: t[off:off + n].view(tuple(shape))  # noqa: E731
        out[name] = _param_state(cut(master), cut(ea) if ea is not None else None, cut(eas) if eas is not None else None)
        off += n + (int(paddings[i]) if paddings is not None else 0)
    align = lambda x: 2 * dp * math.ceil(x / (2 * dp))  # noqa: E731
    if align(off) != align(master.numel()):
        raise DeepSpeedCheckpointError(
            path, f"flat group {g} holds {master.numel()} elements but its parameters and padding take {off}: "
            "the partitions do not add up")
    return out


def _read_zero12(paths: Sequence[str], osds: List[Dict[str, Any]], param_shapes: List[Dict[str, Any]], dp: int, want: bool) -> Dict[str, ParamState]:
    paddings = osds[0].get("param_alignment_paddings")
    if paddings is not None and len(paddings) != len(param_shapes):
        raise DeepSpeedCheckpointError(paths[0], f"param_alignment_paddings has {len(paddings)} groups, param_shapes {len(param_shapes)}")
    params: Dict[str, ParamState] = {}
    for g, flat in enumerate(_zero12_flats(paths, osds, len(param_shapes), want)):
        params.update(_carve_zero12(paths[0], flat, param_shapes[g], paddings[g] if paddings is not None else None, dp, g))
    return params


def _zero3_rank(path: str, osd: Dict[str, Any], need: int, want: bool) -> Tuple[torch.Tensor, Optional[Tuple[torch.Tensor, torch.Tensor]]]:
    """One rank's sub-groups back to back: its fp32 partitions and their Adam moments."""
    flats = _need(path, osd, "fp32_flat_groups", "in `optimizer_state_dict`")
    master = torch.cat([t.reshape(-1) for t in flats]) if flats else torch.empty(0)
    if master.numel() < need:
        raise _too_short(path, "fp32_flat_groups", master.numel(), need)
    if master.numel() > need:
        raise DeepSpeedCheckpointError(
            path, f"fp32_flat_groups holds {master.numel()} elements, but its parameters' partitions take {need}: "
            "the partitions do not add up")
    if not want:
        return master, None
    base = _torch_state_dict(path, _need(path, osd, "optimizer_state_dict", "in `optimizer_state_dict`"))
    indices = [i for g in _group_indices(path, base) for i in g]
    if len(indices) != len(flats):
        raise DeepSpeedCheckpointError(
            path, f"the base optimizer holds {len(indices)} tensors but fp32_flat_groups {len(flats)} sub-groups")
    per_sub = [_state_moments(path, base["state"].get(i, {}), f"of sub-group {k}") for k, i in enumerate(indices)]
    if all(m is None for m in per_sub):
        return master, None
    moments: List[Tuple[torch.Tensor, torch.Tensor]] = []
    for k, (m, f) in enumerate(zip(per_sub, flats)):
        if m is None:
            raise DeepSpeedCheckpointError(path, f"has Adam moments for some sub-groups but not for sub-group {k}")
        if m[0].numel() != f.numel() or m[1].numel() != f.numel():
            raise DeepSpeedCheckpointError(path, f"the Adam moments of sub-group {k} do not have its {f.numel()} elements")
        moments.append(m)
    return master, (torch.cat([m[0].reshape(-1) for m in moments]), torch.cat([m[1].reshape(-1) for m in moments]))


def _read_zero3(paths: Sequence[str], osds: List[Dict[str, Any]], param_shapes: List[Dict[str, Any]], dp: int, want: bool) -> Dict[str, ParamState]:
    """Every parameter from its ``ceil(numel / dp)``-element partition on each rank."""
    shapes = {name: shape for group in param_shapes for name, shape in group.items()}
    parts = {name: math.ceil(_numel(s) / dp) for name, s in shapes.items()}
    ranks = [_zero3_rank(path, osd, sum(parts.values()), want) for path, osd in zip(paths, osds)]
    masters = [master for master, _ in ranks]
    ea, eas = _gather_moments(paths, [m for _, m in ranks], "its partitions")
    params: Dict[str, ParamState] = {}
    off = 0
    for name, shape in shapes.items():
        n, p = _numel(shape), parts[name]
        whole = lambda flats: torch.cat([t[off:off + p] for t in flats])[:n].view(tuple(shape))  # noqa: E731
        params[name] = _param_state(whole(masters), whole(ea) if ea is not None else None, whole(eas) if eas is not None else None)
        off += p
    return params


def _check_partition_count(path: str, osd: Dict[str, Any], dp: int) -> None:
    count = osd.get("partition_count")
    counts = count if isinstance(count, list) else [count] if count is not None else []
    if any(int(c) != dp for c in counts):
        raise DeepSpeedCheckpointError(
            path, f"was partitioned {counts} ways but the checkpoint's data-parallel world size is {dp}: "
            "zero reads data-parallel checkpoints only")


def _zero_steps(osds: List[Dict[str, Any]], stage3: bool) -> Optional[int]:
    states: List[Dict[str, Any]] = []
    groups: List[Dict[str, Any]] = []
    extra = None
    for osd in osds:
        base = osd.get("optimizer_state_dict" if stage3 else "base_optimizer_state")
        if isinstance(base, dict):
            states += list(base.get("state", {}).values())
            groups += list(base.get("param_groups", []))
        elif isinstance(base, list):
            states += base
        if osd.get("base_optimizer_state_step") is not None:
            extra = osd["base_optimizer_state_step"]
    return _step_of(states, groups, extra)


def _loss_scaler(osd: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    scaler = osd.get("loss_scaler")
    if scaler is None:
        return None
    out = scaler.as_dict() if isinstance(scaler, _PickledFields) else dict(scaler) if isinstance(scaler, dict) else {"value": scaler}
    out.setdefault("dynamic", bool(osd.get("dynamic_loss_scale", False)))
    out["dynamic_loss_scale"] = bool(osd.get("dynamic_loss_scale", out["dynamic"]))
    if "overflow" in osd:
        out["overflow"] = bool(osd["overflow"])
    return out


def _stage0_loss_scaler(opt: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    keys = ("cur_scale", "cur_iter", "dynamic_loss_scale", "last_overflow_iter", "scale_factor", "scale_window")
    if not isinstance(opt, dict) or "cur_scale" not in opt:
        return None
    out = {k: _plain(opt[k]) for k in keys if k in opt}
    out["dynamic"] = bool(opt.get("dynamic_loss_scale", False))
    return out


# ---------------------------------------------------------------------------------------
# Frozen parameters, precision, the whole


def _frozen(paths: Sequence[str], models: List[Dict[str, Any]], stage3: bool, trainable: Iterable[str]) -> Dict[str, torch.Tensor]:
    """Frozen parameters: from ``frozen_param_shapes``/``frozen_param_fragments`` (stages
    2-3; at stage 3 each rank's fragment is its partition), else the module weights that
    are neither trainable nor tied aliases (stages 0-1)."""
    model0 = models[0]
    shapes = model0.get("frozen_param_shapes")
    if shapes:
        out = {}
        for name, shape in shapes.items():
            frags = []
            for path, sd in zip(paths, models if stage3 else models[:1]):
                fr = sd.get("frozen_param_fragments") or {}
                if name not in fr:
                    raise DeepSpeedCheckpointError(path, f"frozen_param_fragments lacks `{name}`, which frozen_param_shapes lists")
                frags.append(fr[name].reshape(-1))
            flat = torch.cat(frags) if len(frags) > 1 else frags[0]
            n = _numel(shape)
            if flat.numel() < n:
                raise _too_short(paths[0], f"the fragments of frozen `{name}`", flat.numel(), n)
            out[name] = flat[:n].view(tuple(shape)).detach()
        return out
    if stage3:
        return {}  # saved with exclude_frozen_parameters: their values are not in the checkpoint
    module = model0.get("module") or {}
    skip = set(trainable) | set((model0.get("shared_params") or {}).keys())
    return {n: module[n] for n in _param_candidates(module, model0.get("buffer_names") or ()) if n not in skip}


def _enabled(section: Any) -> Optional[bool]:
    if not isinstance(section, dict) or "enabled" not in section:
        return None if section is not None else False
    value = section["enabled"]
    return value if isinstance(value, bool) else None


def _precision(ds_config: Optional[Dict[str, Any]], module: Dict[str, Any], names: Sequence[str]) -> str:
    """From the config's ``fp16``/``bf16`` sections, else the weights' dtype."""
    if isinstance(ds_config, dict):
        fp16 = _enabled(ds_config.get("fp16"))
        bf16 = _enabled(ds_config.get("bf16", ds_config.get("bfloat16")))
        if fp16:
            return "fp16"
        if bf16:
            return "bf16"
        if fp16 is False and bf16 is False:
            return "fp32"
    for name in names:
        t = module.get(name)
        if torch.is_tensor(t) and t.numel():
            return {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(t.dtype, "fp32")
    return "fp32"


def _config_stage(ds_config: Optional[Dict[str, Any]]) -> Optional[int]:
    zo = ds_config.get("zero_optimization") if isinstance(ds_config, dict) else None
    stage = zo.get("stage") if isinstance(zo, dict) else None
    return stage if isinstance(stage, int) else None


def _read_model_states(folder: str, files: Sequence[str]) -> Tuple[bool, List[str], List[Dict[str, Any]]]:
    """Whether it is stage 3's layout, and the model-states files (all ranks' at stage 3)."""
    stage3 = ZERO_MODEL_FILE.format(0) in files
    first = os.path.join(folder, ZERO_MODEL_FILE.format(0) if stage3 else MODEL_FILE)
    if not stage3 and MODEL_FILE not in files:
        raise DeepSpeedCheckpointError(
            first, f"is missing (and so is {ZERO_MODEL_FILE.format(0)}): not a DeepSpeed checkpoint folder")
    model0 = _load(first)
    if not isinstance(model0, dict) or "module" not in model0:
        raise DeepSpeedCheckpointError(first, "is not a DeepSpeed model-states dict (no `module`)")
    _refuse_non_data_parallel_states(first, model0)
    if not stage3:
        return False, [first], [model0]
    dp = _as_int(_need(first, model0, "dp_world_size"))
    paths, models = [first], [model0]
    for r in range(1, dp):
        path = os.path.join(folder, ZERO_MODEL_FILE.format(r))
        sd = _load(path)
        if not isinstance(sd, dict):
            raise DeepSpeedCheckpointError(path, "is not a DeepSpeed model-states dict")
        paths.append(path)
        models.append(sd)
    return True, paths, models


def _read_zero(folder: str, files: Sequence[str], path0: str, model0: Dict[str, Any], ds_config: Optional[Dict[str, Any]],
               dp: int, want: bool) -> Tuple[_Read, Optional[Dict[str, Any]]]:
    """Stages 1-3: every rank's optimizer file; and the loss scaler."""
    param_shapes = model0["param_shapes"]
    if not isinstance(param_shapes, list) or not all(isinstance(g, dict) for g in param_shapes):
        raise DeepSpeedCheckpointError(path0, "param_shapes is not a list of {name: shape} per group")
    prefix = _optim_prefix(folder, files)
    paths = [os.path.join(folder, ZERO_OPTIM_FILE.format(prefix, r)) for r in range(dp)]
    osds = [_need(p, _load(p), "optimizer_state_dict") for p in paths]
    for p, osd in zip(paths, osds):
        _check_partition_count(p, osd, dp)
    if "zero_stage" in osds[0]:
        stage = int(osds[0]["zero_stage"])
    else:  # BF16_Optimizer (runtime/bf16_optimizer.py) saves no zero_stage: stage 1
        stage = _config_stage(ds_config) or 1
    if stage == 3:
        params = _read_zero3(paths, osds, param_shapes, dp, want)
    else:
        params = _read_zero12(paths, osds, param_shapes, dp, want)
    base = [osd.get("optimizer_state_dict" if stage == 3 else "base_optimizer_state") for osd in osds] if want else []
    step = _zero_steps(osds, stage == 3) if want else None
    return _Read(stage, params, list(params), base, step), _loss_scaler(osds[0])


def is_deepspeed_checkpoint(load_dir: str, tag: Optional[str] = None) -> bool:
    """Whether ``load_dir/tag`` (tag None: the one ``load_dir/latest`` names) holds
    DeepSpeed's files (``mp_rank_00_model_states.pt`` or
    ``zero_pp_rank_0_mp_rank_00_model_states.pt``) and no zero manifest
    (``manifest.json``, which zero's own checkpoints have). Never raises."""
    try:
        folder = _tag_folder(os.fspath(load_dir), tag)
    except (DeepSpeedCheckpointError, OSError):
        return False
    has = lambda name: os.path.isfile(os.path.join(folder, name))  # noqa: E731
    return (has(MODEL_FILE) or has(ZERO_MODEL_FILE.format(0))) and not has("manifest.json")


@torch.no_grad()
def read_deepspeed_checkpoint(
    load_dir: str,
    tag: Optional[str] = None,
    *,
    load_optimizer_states: bool = True,
    trainable_names: Optional[Sequence[str]] = None,
) -> DeepSpeedCheckpoint:
    """Reads the DeepSpeed 0.19.8 checkpoint ``load_dir/tag`` (tag None: the one
    ``load_dir/latest`` names), saved by any number of data-parallel ranks at ZeRO stage
    0-3 in fp32, bf16 or fp16, into a :class:`DeepSpeedCheckpoint`.

    It reads every rank's files; each rank of a loading job that calls it does so on its
    own (simple; it costs every process the whole fp32 state for a moment). With
    ``load_optimizer_states=False`` the master weights are still read (at stages 1-3 they
    live in the optimizer files) but not the moments, the step or the base optimizer state.

    ``trainable_names`` matters only at stage 0, whose files do not name the optimizer's
    parameters: the names of the parameters the optimizer holds, in its order (by default
    they are matched to the module's weights in state-dict order, see the module docs).

    Raises :class:`DeepSpeedCheckpointError` (naming the file) for a missing ``latest``,
    tag folder or rank file, a truncated or corrupt file, a pickled global outside
    :data:`DEEPSPEED_PICKLE_GLOBALS`, partitions that do not add up, an optimizer state
    without the expected keys, and pipeline/tensor/expert-parallel checkpoints."""
    folder = _tag_folder(os.fspath(load_dir), tag)
    files = sorted(os.listdir(folder))
    _refuse_non_data_parallel(folder, files)
    stage3, model_paths, models = _read_model_states(folder, files)
    model0, path0 = models[0], model_paths[0]
    dp = _as_int(_need(path0, model0, "dp_world_size"))
    _refuse_stray_ranks(folder, files, dp)
    ds_config = model0.get("ds_config") if isinstance(model0.get("ds_config"), dict) else None
    module = model0["module"]
    want = load_optimizer_states
    if model0.get("param_shapes") is None:
        if model0.get("optimizer") is None:
            raise DeepSpeedCheckpointError(path0, "holds no optimizer state (was DeepSpeed run without an optimizer?)")
        read = _read_stage0(path0, model0, trainable_names, want)
        loss_scaler = _stage0_loss_scaler(model0["optimizer"])
    else:
        read, loss_scaler = _read_zero(folder, files, path0, model0, ds_config, dp, want)
    precision = _precision(ds_config, module, read.trainable)
    return DeepSpeedCheckpoint(
        path=folder,
        zero_stage=read.stage,
        dp_world_size=dp,
        precision=precision,
        params=read.params,
        module=dict(module),
        frozen=_frozen(model_paths, models, stage3, read.trainable),
        optimizer_step=read.step,
        global_steps=_as_int(model0.get("global_steps", 0)),
        global_samples=_as_int(model0.get("global_samples", 0)),
        skipped_steps=_as_int(model0.get("skipped_steps", 0)),
        loss_scaler=loss_scaler if precision == "fp16" else None,
        lr_scheduler=model0.get("lr_scheduler"),
        client_state={k: v for k, v in model0.items() if k not in DS_MODEL_KEYS},
        ds_config=ds_config,
        base_optimizer_state=read.base,
    )
