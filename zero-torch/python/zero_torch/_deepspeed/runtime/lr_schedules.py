"""``deepspeed.runtime.lr_schedules``: :mod:`zero_torch.lr_schedules` (DeepSpeed's five
learning-rate schedules and ``VALID_LR_SCHEDULES``)."""

from zero_torch import lr_schedules as _public
from zero_torch.lr_schedules import *  # noqa: F401,F403
from zero_torch.lr_schedules import __all__  # noqa: F401

from .._missing import module_getattr

__getattr__ = module_getattr(__name__, _public)
