"""``deepspeed.git_version_info``: what DeepSpeed records about its build, for zero.

``version`` is DeepSpeed's API version served (0.19.8) with zero's version as its local
label (``0.19.8+zero.<zero_torch.__version__>``), the same string the ``deepspeed``
distribution record carries. zero builds no DeepSpeed ops, so every op is reported not
installed and not compatible; ``torch_info`` holds DeepSpeed's "0.0" values, which mean
"read the running torch".
"""

from __future__ import annotations

import re
import sys
from typing import Any, Dict

from zero_torch._native import __version__ as zero_version

from ._missing import missing_attribute

API_VERSION = "0.19.8"
"""The DeepSpeed release whose API and behaviour zero serves."""


def _local_label(text: str) -> str:
    """``text`` as a PEP 440 local version label (runs of other characters become dots)."""
    return re.sub(r"[^A-Za-z0-9]+", ".", text).strip(".") or "0"


version = f"{API_VERSION}+zero.{_local_label(zero_version)}"
git_hash = "unknown"
git_branch = "unknown"

_OPS = [
    "deepspeed_not_implemented", "async_io", "deepspeed_ccl_comm", "deepspeed_shm_comm",
    "cpu_adagrad", "cpu_adam", "cpu_lion", "fused_adam", "pin_memory",
]
installed_ops: Dict[str, bool] = dict.fromkeys(_OPS, False)
compatible_ops: Dict[str, bool] = dict.fromkeys(_OPS, False)
torch_info: Dict[str, Any] = {
    "version": "0.0",
    "bf16_support": False,
    "cuda_version": "0.0",
    "nccl_version": "0.0",
    "hip_version": "0.0",
}

def __getattr__(name: str) -> Any:
    """``accelerator_name``: the name of ``get_accelerator()`` (chosen when first asked)."""
    if name == "accelerator_name":
        from zero_torch.accelerator import get_accelerator

        return get_accelerator()._name
    raise missing_attribute(sys.modules[__name__], name, sys._getframe(1))


__all__ = ["version", "git_hash", "git_branch", "installed_ops", "compatible_ops", "torch_info"]
