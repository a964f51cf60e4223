"""``deepspeed.utils.zero_to_fp32``: :mod:`zero_torch.checkpoint`'s functions, with
DeepSpeed's signatures, for checkpoints saved by zero's engine."""

from zero_torch.checkpoint import (  # noqa: F401
    convert_zero_checkpoint_to_fp32_state_dict,
    get_fp32_state_dict_from_zero_checkpoint,
    load_state_dict_from_zero_checkpoint,
)

from .._missing import module_getattr

__all__ = [
    "get_fp32_state_dict_from_zero_checkpoint",
    "convert_zero_checkpoint_to_fp32_state_dict",
    "load_state_dict_from_zero_checkpoint",
]
__getattr__ = module_getattr(__name__)
