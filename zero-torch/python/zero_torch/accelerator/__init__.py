"""``zero_torch.accelerator``: DeepSpeed's ``deepspeed.accelerator`` for the CPU and CUDA.

``get_accelerator()`` returns one accelerator object per process, chosen as DeepSpeed
0.19.8 chooses it: ``DS_ACCELERATOR`` (``cpu`` or ``cuda``) if set, else CUDA where torch
sees a GPU, else the CPU. Its methods return what DeepSpeed's ``CPU_Accelerator`` and
``CUDA_Accelerator`` return (``deepspeed/accelerator/cpu_accelerator.py``,
``cuda_accelerator.py``), with these differences:

- op builders (``create_op_builder``, ``get_op_builder``, ``op_builder_dir``,
  ``build_extension``) raise :class:`~zero_torch.errors.UnsupportedError`: zero compiles
  nothing at run time;
- DeepSpeed's other accelerators (``xpu``, ``npu``, ``mps``, ``hpu``, ...) are refused;
- the CPU's communication backend is always ``gloo`` (DeepSpeed picks ``ccl`` when
  oneCCL's torch bindings are installed; zero does not use oneCCL);
- the CPU's ``is_fp16_supported()`` returns ``False`` where DeepSpeed's returns ``None``;
- ``DS_PIN_MEMORY_BACKEND=native`` (DeepSpeed's own pinned-memory op) is refused.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from ..errors import UnsupportedError
from .base import SERVED_ACCELERATORS, SUPPORTED_ACCELERATOR_LIST, DeepSpeedAccelerator, noop_context
from .cpu import CPU_Accelerator, _host_memory  # noqa: F401 - deepspeed.runtime.utils reads it
from .cuda import CUDA_Accelerator


class _Current:
    """The process's accelerator (``None`` until first asked for)."""

    accelerator: Optional[DeepSpeedAccelerator] = None


def _choose() -> DeepSpeedAccelerator:
    name = os.environ.get("DS_ACCELERATOR")
    if name is not None:
        if name not in SUPPORTED_ACCELERATOR_LIST:
            raise ValueError(
                f"DS_ACCELERATOR must be one of {SUPPORTED_ACCELERATOR_LIST}. Value \"{name}\" is not supported"
            )
        if name not in SERVED_ACCELERATORS:
            raise UnsupportedError(
                f"DS_ACCELERATOR={name}: zero runs on the CPU and on CUDA GPUs only (set "
                "DS_ACCELERATOR=cpu or cuda, or leave it unset)"
            )
    elif torch.cuda.device_count() > 0 and torch.cuda.is_available():
        name = "cuda"
    else:
        name = "cpu"
    return CUDA_Accelerator() if name == "cuda" else CPU_Accelerator()


def get_accelerator() -> DeepSpeedAccelerator:
    """The process's accelerator: ``DS_ACCELERATOR`` (``cpu`` or ``cuda``) if set, else
    CUDA where torch sees a GPU, else the CPU. The same object at every call."""
    if _Current.accelerator is None:
        _Current.accelerator = _choose()
    return _Current.accelerator


def set_accelerator(accel_obj: DeepSpeedAccelerator) -> None:
    """Makes ``accel_obj`` (one of zero's accelerators) the process's accelerator."""
    if not isinstance(accel_obj, DeepSpeedAccelerator):
        raise AssertionError(f"{accel_obj.__class__.__name__} accelerator is not subclass of DeepSpeedAccelerator")
    _Current.accelerator = accel_obj


def is_current_accelerator_supported() -> bool:
    """Whether the accelerator's device name is one DeepSpeed knows (always, here)."""
    return get_accelerator().device_name() in SUPPORTED_ACCELERATOR_LIST


__all__ = [
    "DeepSpeedAccelerator",
    "CPU_Accelerator",
    "CUDA_Accelerator",
    "SUPPORTED_ACCELERATOR_LIST",
    "get_accelerator",
    "set_accelerator",
    "is_current_accelerator_supported",
    "noop_context",
]
