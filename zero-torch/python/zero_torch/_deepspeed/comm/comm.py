"""``deepspeed.comm.comm``: the module DeepSpeed's ``deepspeed.comm`` functions live in;
here too :mod:`zero_torch.comm`."""

from zero_torch import comm as _public
from zero_torch.comm import *  # noqa: F401,F403
from zero_torch.comm import __all__  # noqa: F401

from .._missing import module_getattr

__getattr__ = module_getattr(__name__, _public)
