"""``deepspeed.compression``: what DeepSpeed 0.19.8 keeps of its removed compression
library, the ``helper`` shim (DeepSpeed issue 8489)."""

from .._missing import module_getattr

__getattr__ = module_getattr(__name__)
