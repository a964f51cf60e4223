"""``deepspeed.ops.adagrad``: ``DeepSpeedCPUAdagrad``."""

from ..._missing import module_getattr
from .cpu_adagrad import DeepSpeedCPUAdagrad

__all__ = ["DeepSpeedCPUAdagrad"]
__getattr__ = module_getattr(__name__)
