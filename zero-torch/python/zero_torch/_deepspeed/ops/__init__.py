"""``deepspeed.ops``: the optimizers zero provides (``adam``, ``adagrad``). Nothing here is
compiled: ``__compatible_ops__`` reports every DeepSpeed op as not built."""

from typing import Dict

from .._missing import module_getattr
from ..git_version_info import compatible_ops as _compatible_ops
from . import adagrad, adam  # noqa: F401

__compatible_ops__: Dict[str, bool] = dict(_compatible_ops)
"""DeepSpeed's probe of its buildable ops: none (zero builds none)."""

__getattr__ = module_getattr(__name__)
