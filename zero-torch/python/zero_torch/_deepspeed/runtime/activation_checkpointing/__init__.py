"""``deepspeed.runtime.activation_checkpointing``: holds ``checkpointing``."""

from ..._missing import module_getattr
from . import checkpointing  # noqa: F401

__getattr__ = module_getattr(__name__)
