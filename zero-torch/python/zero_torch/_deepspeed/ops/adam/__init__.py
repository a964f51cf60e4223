"""``deepspeed.ops.adam``: ``FusedAdam`` and ``DeepSpeedCPUAdam``
(:mod:`zero_torch.optim`): given to ``deepspeed.initialize`` they set the hyperparameters
of zero's fused Adam; used alone they step in plain PyTorch."""

from zero_torch.optim import DeepSpeedCPUAdam, FusedAdam

from ..._missing import module_getattr

__all__ = ["FusedAdam", "DeepSpeedCPUAdam"]
__getattr__ = module_getattr(__name__)
