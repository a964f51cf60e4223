"""``deepspeed.runtime``: the engine, its config, ``lr_schedules``, ``zero``,
``activation_checkpointing`` and ``utils``, as zero provides them."""

from .._missing import module_getattr
from . import activation_checkpointing, config, engine, lr_schedules, utils, zero  # noqa: F401

__getattr__ = module_getattr(__name__)
