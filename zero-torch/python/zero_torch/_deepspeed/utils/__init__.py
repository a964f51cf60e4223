"""``deepspeed.utils``: ``logger`` and ``log_dist`` (``utils.logging``), ``zero_to_fp32``,
``module_utils`` and ``torch``. DeepSpeed's parameter-state accessors (``safe_get_full_fp32_param``, ...), ZeRO-3
leaf modules and parallel groups are not provided (each raises naming what to use)."""

from .._missing import module_getattr
from . import logging, module_utils, torch, zero_to_fp32  # noqa: F401
from .logging import log_dist, logger  # noqa: F401

__all__ = ["logger", "log_dist"]
__getattr__ = module_getattr(__name__)
