"""``deepspeed.checkpointing`` (``deepspeed.runtime.activation_checkpointing.checkpointing``):
:mod:`zero_torch.activation_checkpointing`."""

from zero_torch import activation_checkpointing as _public
from zero_torch.activation_checkpointing import *  # noqa: F401,F403
from zero_torch.activation_checkpointing import __all__  # noqa: F401

from ..._missing import module_getattr

__getattr__ = module_getattr(__name__, _public)
