"""``deepspeed.accelerator``: :mod:`zero_torch.accelerator` (``get_accelerator()`` for the
CPU and CUDA, chosen as DeepSpeed chooses)."""

from zero_torch import accelerator as _public
from zero_torch.accelerator import *  # noqa: F401,F403
from zero_torch.accelerator import __all__  # noqa: F401

from .._missing import module_getattr

__getattr__ = module_getattr(__name__, _public)
