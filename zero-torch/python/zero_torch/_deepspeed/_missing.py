"""What a ``deepspeed.*`` name that zero does not provide raises.

Every module served under the name ``deepspeed`` ends with a module ``__getattr__`` from
here. A name it does not define raises an error that names the DeepSpeed symbol and says
what to use instead:

- read as an attribute (``deepspeed.pipe.PipelineModule``, ``hasattr(deepspeed, "foo")``):
  :class:`~zero_torch.errors.NotProvidedAttributeError`, an ``AttributeError``, so
  ``hasattr`` and ``getattr(obj, name, default)`` keep working;
- imported by name (``from deepspeed.utils import set_z3_leaf_modules``):
  :class:`~zero_torch.errors.NotProvidedImportError`. Python turns an ``AttributeError``
  from a module ``__getattr__`` into a bare "cannot import name" that loses the message,
  so ``__getattr__`` looks at the instruction its caller is executing: ``IMPORT_FROM``
  means a ``from ... import``;
- a module zero does not serve (``import deepspeed.pipe``): the import finder raises
  :class:`~zero_torch.errors.NotProvidedModuleError` with :func:`message`.
"""

from __future__ import annotations

import dis
import sys
from types import FrameType, ModuleType
from typing import Any, Callable, Dict, Iterable, Optional

from ..errors import NotProvidedAttributeError, NotProvidedImportError

SERVED_PREFIX = "zero_torch._deepspeed"
"""The package whose modules are served under the name ``deepspeed``."""

_PIPELINE = (
    "pipeline parallelism is not part of zero (data-parallel ZeRO, stages 0-3): build the "
    "whole model as one torch.nn.Module and pass it to deepspeed.initialize"
)
_INFERENCE = (
    "DeepSpeed's inference engine is not part of zero: run the trained model itself "
    "(engine.module, under torch.no_grad())"
)
_TENSOR_PARALLEL = "kernel injection and tensor parallelism (AutoTP) are not part of zero"
_MASTER_STATE = (
    "reading or writing a parameter's fp32 master copy, gradient or optimizer state is not "
    "provided yet: gather parameters with deepspeed.zero.GatheredParameters, or read the fp32 "
    "weights of a checkpoint with deepspeed.utils.zero_to_fp32 (zero_torch.checkpoint)"
)
_OPTIMIZERS = (
    "DeepSpeed's Lamb, Lion, Muon and ZenFlow kernels are not part of zero: it steps Adam/AdamW "
    "(deepspeed.ops.adam.FusedAdam, DeepSpeedCPUAdam, torch.optim.Adam/AdamW) with its fused "
    "kernel, and any elementwise torch.optim optimizer on each rank's fp32 shard"
)
_ZERO_OPTIMIZERS = (
    "DeepSpeed's optimizer wrappers (ZeRO stages, fp16/bf16 optimizers, loss scalers) are not "
    "part of zero: zero's engine does all of it (engine.optimizer is its view)"
)

HINTS: Dict[str, str] = {
    "deepspeed.pipe": _PIPELINE,
    "deepspeed.runtime.pipe": _PIPELINE,
    "deepspeed.PipelineModule": _PIPELINE,
    "deepspeed.PipelineEngine": _PIPELINE,
    "deepspeed.DualPipeVEngine": _PIPELINE,
    "deepspeed.DualPipeVModule": _PIPELINE,
    "deepspeed.utils.zero_to_fp32.parse_model_states": (
        "it reads DeepSpeed's internal checkpoint structures; zero's checkpoints are read whole by "
        "get_fp32_state_dict_from_zero_checkpoint (zero_torch.checkpoint)"
    ),
    "deepspeed.utils.zero_to_fp32.parse_optim_states": "see deepspeed.utils.zero_to_fp32.parse_model_states",
    "deepspeed.inference": _INFERENCE,
    "deepspeed.init_inference": _INFERENCE,
    "deepspeed.InferenceEngine": _INFERENCE,
    "deepspeed.DeepSpeedInferenceConfig": _INFERENCE,
    "deepspeed.default_inference_config": _INFERENCE,
    "deepspeed.model_implementations": _INFERENCE,
    "deepspeed.module_inject": _TENSOR_PARALLEL,
    "deepspeed.replace_transformer_layer": _TENSOR_PARALLEL,
    "deepspeed.set_autotp_mode": _TENSOR_PARALLEL,
    "deepspeed.tp_model_init": _TENSOR_PARALLEL,
    "deepspeed.runtime.tensor_parallel": _TENSOR_PARALLEL,
    "deepspeed.ops.transformer": (
        "DeepSpeed's fused transformer kernels are not part of zero: use a torch.nn layer "
        "(torch.nn.TransformerEncoderLayer, or the Hugging Face model's own layer)"
    ),
    "deepspeed.DeepSpeedTransformerLayer": "see deepspeed.ops.transformer",
    "deepspeed.DeepSpeedTransformerConfig": "see deepspeed.ops.transformer",
    "deepspeed.ops.sparse_attention": (
        "sparse attention was removed from DeepSpeed itself before 0.19.8 (issue #8489): use "
        "torch.nn.functional.scaled_dot_product_attention"
    ),
    "deepspeed.ops.op_builder": "zero compiles no ops at run time: there is nothing to build",
    "deepspeed.ops.lamb": _OPTIMIZERS,
    "deepspeed.ops.lion": _OPTIMIZERS,
    "deepspeed.ops.muon": _OPTIMIZERS,
    "deepspeed.ops.adam.ZenFlowCPUAdam": _OPTIMIZERS,
    "deepspeed.ops.adam.ZenFlowSelectiveAdamW": _OPTIMIZERS,
    "deepspeed.ops.adam.ZenFlowSelectiveAdamW_stage3": _OPTIMIZERS,
    "deepspeed.moe.layer": "Mixture-of-Experts layers and expert parallelism are not part of zero",
    "deepspeed.moe.sharded_moe": "see deepspeed.moe.layer",
    "deepspeed.moe.experts": "see deepspeed.moe.layer",
    "deepspeed.compile": "DeepCompile is not part of zero: call torch.compile on the module",
    "deepspeed.runtime.compiler": "see deepspeed.compile",
    "deepspeed.utils.set_z3_leaf_modules": (
        "ZeRO-3 leaf modules are not provided yet: zero gathers each module's parameters just "
        "before that module's forward"
    ),
    "deepspeed.utils.unset_z3_leaf_modules": "see deepspeed.utils.set_z3_leaf_modules",
    "deepspeed.utils.get_z3_leaf_modules": "see deepspeed.utils.set_z3_leaf_modules",
    "deepspeed.utils.z3_leaf_module": "see deepspeed.utils.set_z3_leaf_modules",
    "deepspeed.utils.groups": "model-, expert- and sequence-parallel groups are not part of zero",
    "deepspeed.runtime.sequence_parallel": "sequence parallelism (Ulysses) is not part of zero",
    "deepspeed.sequence": "sequence parallelism (Ulysses) is not part of zero",
    "deepspeed.runtime.data_pipeline": (
        "DeepSpeed's data-efficiency pipeline (curriculum learning, random-LTD, data analyzer) "
        "is not part of zero"
    ),
    "deepspeed.runtime.dataloader": (
        "pass training_data= to deepspeed.initialize: a torch DataLoader with a "
        "DistributedSampler comes back"
    ),
    "deepspeed.runtime.hybrid_engine": "the hybrid (RLHF generation) engine is not part of zero",
    "deepspeed.DeepSpeedHybridEngine": "see deepspeed.runtime.hybrid_engine",
    "deepspeed.runtime.fp16": _ZERO_OPTIMIZERS,
    "deepspeed.runtime.bf16_optimizer": _ZERO_OPTIMIZERS,
    "deepspeed.runtime.zero.stage3": _ZERO_OPTIMIZERS,
    "deepspeed.runtime.zero.stage_1_and_2": _ZERO_OPTIMIZERS,
    "deepspeed.runtime.zero.parameter_offload": _ZERO_OPTIMIZERS,
    "deepspeed.DeepSpeedOptimizer": _ZERO_OPTIMIZERS,
    "deepspeed.runtime.zero.TiledLinear": "tiled linear layers are not part of zero",
    "deepspeed.zero.TiledLinear": "tiled linear layers are not part of zero",
    "deepspeed.OnDevice": (
        "building a model on another device (OnDevice) is not provided: build it as usual "
        "(optionally inside deepspeed.zero.Init)"
    ),
    "deepspeed.utils.OnDevice": "see deepspeed.OnDevice",
    "deepspeed.profiling": "DeepSpeed's flops profiler is not part of zero: use torch.profiler",
    "deepspeed.monitor": "DeepSpeed's monitors (TensorBoard, W&B, CSV) are not part of zero",
    "deepspeed.autotuning": "DeepSpeed's autotuner is not part of zero",
    "deepspeed.checkpoint.DeepSpeedCheckpoint": (
        "DeepSpeed's checkpoint readers are not provided: zero's checkpoints load at any world "
        "size and stage; read their fp32 weights with zero_torch.checkpoint"
    ),
    "deepspeed.checkpoint.ds_to_universal": "see deepspeed.checkpoint.DeepSpeedCheckpoint",
    "deepspeed.checkpoint.universal_checkpoint": "see deepspeed.checkpoint.DeepSpeedCheckpoint",
    "deepspeed.launcher.runner.main": (
        "DeepSpeed's launcher is not provided: start one process per rank with torchrun "
        "(or srun, mpirun)"
    ),
    "deepspeed.launcher.launch": "see deepspeed.launcher.runner.main",
    "deepspeed.pt": "deepspeed.pt was removed from DeepSpeed years ago",
    "deepspeed.runtime.config.ONEBIT_ADAM_OPTIMIZER": "1-bit optimizers were removed from DeepSpeed 0.19.8 too",
    "deepspeed.runtime.config.ONEBIT_LAMB_OPTIMIZER": "1-bit optimizers were removed from DeepSpeed 0.19.8 too",
    "deepspeed.runtime.config.ZERO_ONE_ADAM_OPTIMIZER": "1-bit optimizers were removed from DeepSpeed 0.19.8 too",
}
"""DeepSpeed names (modules or attributes) that zero refuses, with what to do instead. A
name without an entry takes the entry of its nearest listed parent, if any."""

for _verb in ("get", "set"):
    for _scope in ("full", "local"):
        for _what in ("fp32_param", "grad", "optimizer_state"):
            HINTS[f"deepspeed.utils.safe_{_verb}_{_scope}_{_what}"] = _MASTER_STATE
HINTS["deepspeed.utils.safe_update_full_grad_vectorized"] = _MASTER_STATE
HINTS["deepspeed.utils.tensor_fragment"] = _MASTER_STATE


def served_to_deepspeed(module_name: str) -> str:
    """``zero_torch._deepspeed.a.b`` → ``deepspeed.a.b`` (other names unchanged)."""
    if module_name == SERVED_PREFIX or module_name.startswith(SERVED_PREFIX + "."):
        return "deepspeed" + module_name[len(SERVED_PREFIX):]
    return module_name


def hint(name: str) -> Optional[str]:
    """What to use instead of DeepSpeed's ``name``, from :data:`HINTS` (the entry of the
    name or of its nearest listed parent)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        found = HINTS.get(".".join(parts[:n]))
        if found is not None:
            if found.startswith("see "):  # an entry that shares another's advice
                return hint(found[len("see "):])
            return found
    return None


def message(name: str) -> str:
    """The message of every "not provided" error for DeepSpeed's ``name``."""
    text = (
        f"`{name}` is not provided by zero (zero_torch serves DeepSpeed 0.19.8's data-parallel "
        "training API; docs/DEEPSPEED_API.md lists it)"
    )
    advice = hint(name)
    return f"{text}: {advice}" if advice else text


_IMPORT_FROM: Optional[int] = dis.opmap.get("IMPORT_FROM")


def _importing_from(frame: Optional[FrameType]) -> bool:
    """Whether ``frame`` is executing ``IMPORT_FROM`` (the ``y`` of ``from x import y``)."""
    if frame is None or _IMPORT_FROM is None:
        return False
    code = frame.f_code.co_code
    at = frame.f_lasti
    return 0 <= at < len(code) and code[at] == _IMPORT_FROM


def missing_attribute(module: ModuleType, attr: str, caller: Optional[FrameType]) -> Exception:
    """The error for ``module.attr``, which ``module`` (served as ``deepspeed.*``) does not
    define; ``caller`` is the frame that asked for it."""
    owner = served_to_deepspeed(module.__name__)
    if attr.startswith("__") and attr.endswith("__"):
        # Python's own probes (__path__, __wrapped__, ...) get the usual error.
        return AttributeError(f"module {owner!r} has no attribute {attr!r}", name=attr, obj=module)
    text = message(f"{owner}.{attr}")
    if _importing_from(caller):
        return NotProvidedImportError(text, name=owner)
    return NotProvidedAttributeError(text, name=attr, obj=module)


def module_getattr(
    module_name: str, forward_to: Optional[ModuleType] = None, names: Optional[Iterable[str]] = None
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the served module ``module_name``. A name of ``names``
    (default: ``forward_to.__all__``) is read from ``forward_to``, the zero_torch module it
    serves, at every access (so a value set there later is never a stale copy, and a name
    that module gains later appears); any other name raises :func:`missing_attribute`."""
    forwarded = frozenset(names if names is not None else getattr(forward_to, "__all__", ()))

    def __getattr__(attr: str) -> Any:
        if forward_to is not None and attr in forwarded and hasattr(forward_to, attr):
            return getattr(forward_to, attr)
        raise missing_attribute(sys.modules[module_name], attr, sys._getframe(1))

    return __getattr__
