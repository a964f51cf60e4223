"""``deepspeed.utils.zero_to_fp32``: DeepSpeed's consolidation functions, with their
signatures, for checkpoints saved by zero's engine (:mod:`zero_torch.checkpoint`), and its
file helpers. ``get_model_state_file``, ``get_optim_files``, ``get_model_state_files`` and
``get_checkpoint_files`` return a DeepSpeed tag folder's own files, and for a zero tag
folder stand-ins holding what DeepSpeed's files would (the stage, the counters, the client
state: :mod:`zero_torch._ds_layout`), which is what Lightning's
``convert_zero_checkpoint_to_fp32_state_dict`` reads. ``parse_model_states`` and
``parse_optim_states`` read DeepSpeed's internal structures and are not provided."""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from zero_torch import _ds_layout
from zero_torch.checkpoint import (  # noqa: F401
    OUTPUT_DTYPE_NAMES,
    convert_zero_checkpoint_to_fp32_state_dict,
    convert_zero_checkpoint_to_state_dict,
    get_fp32_state_dict_from_zero_checkpoint,
    load_state_dict_from_zero_checkpoint,
    output_dtype,
)

from .._missing import module_getattr

PathLike = Union[str, "os.PathLike[str]"]


def atoi(text: str) -> Union[int, str]:
    """``text`` as an int if it is all digits (DeepSpeed's sort helper)."""
    return int(text) if text.isdigit() else text


def natural_keys(text: str) -> List[Any]:
    """Sort key ordering embedded numbers by value (DeepSpeed's)."""
    return _ds_layout.natural_keys(text)


def get_model_state_file(checkpoint_dir: PathLike, zero_stage: int) -> str:
    """The model-states file of tag folder ``checkpoint_dir`` saved at ``zero_stage``
    (``mp_rank_00_model_states.pt``; at stage 3 rank 0's); a zero tag folder's stand-in."""
    return _ds_layout.model_state_file(checkpoint_dir, zero_stage)


def get_checkpoint_files(checkpoint_dir: PathLike, glob_pattern: str) -> List[str]:
    """The files of tag folder ``checkpoint_dir`` matching ``glob_pattern``, in natural
    order; ``FileNotFoundError`` if there are none."""
    return _ds_layout.checkpoint_files(checkpoint_dir, glob_pattern)


def get_optim_files(checkpoint_dir: PathLike) -> List[str]:
    """The ``*_optim_states.pt`` files of tag folder ``checkpoint_dir``."""
    return get_checkpoint_files(checkpoint_dir, "*_optim_states.pt")


def get_model_state_files(checkpoint_dir: PathLike) -> List[str]:
    """The ``*_model_states.pt`` files of tag folder ``checkpoint_dir``."""
    return get_checkpoint_files(checkpoint_dir, "*_model_states.pt")


def zero3_partitioned_param_info(unpartitioned_numel: int, world_size: int) -> Tuple[int, int]:
    """DeepSpeed's ZeRO-3 partition of one parameter: ``(elements per rank, padding)``."""
    remainder = unpartitioned_numel % world_size
    padding = (world_size - remainder) if remainder else 0
    return math.ceil(unpartitioned_numel / world_size), padding


def to_torch_tensor(
    state_dict: Dict[str, torch.Tensor], return_empty_tensor: bool = False, dtype: Any = None
) -> Dict[str, torch.Tensor]:
    """``state_dict`` with contiguous tensors, floating ones in ``dtype`` if given (tied
    names stay one tensor); with ``return_empty_tensor``, empty tensors of the same shapes
    and dtypes (to size shards), as DeepSpeed's."""
    to = output_dtype(dtype) if dtype is not None else None
    out: Dict[str, torch.Tensor] = {}
    first: Dict[int, str] = {}
    for name, t in state_dict.items():
        if id(t) in first:
            out[name] = out[first[id(t)]]
            continue
        first[id(t)] = name
        target = to if (to is not None and t.is_floating_point()) else t.dtype
        out[name] = torch.empty(t.shape, dtype=target) if return_empty_tensor else t.contiguous().to(dtype=target)
    return out


__all__ = [
    "OUTPUT_DTYPE_NAMES",
    "atoi",
    "natural_keys",
    "get_model_state_file",
    "get_checkpoint_files",
    "get_optim_files",
    "get_model_state_files",
    "zero3_partitioned_param_info",
    "to_torch_tensor",
    "get_fp32_state_dict_from_zero_checkpoint",
    "convert_zero_checkpoint_to_state_dict",
    "convert_zero_checkpoint_to_fp32_state_dict",
    "load_state_dict_from_zero_checkpoint",
]
__getattr__ = module_getattr(__name__)
