"""``deepspeed.comm``: :mod:`zero_torch.comm` (DeepSpeed's communication API, delegated to
torch.distributed)."""

from zero_torch import comm as _public
from zero_torch.comm import *  # noqa: F401,F403
from zero_torch.comm import __all__  # noqa: F401

from .._missing import module_getattr
from . import comm  # noqa: F401 - DeepSpeed's module of the same functions

__getattr__ = module_getattr(__name__, _public)
