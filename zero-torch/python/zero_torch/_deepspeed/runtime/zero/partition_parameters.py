"""``deepspeed.runtime.zero.partition_parameters``: ``Init``, ``GatheredParameters`` and
``ZeroParamStatus`` (the states of a ZeRO-3 parameter's ``ds_status``),
and the two hooks Hugging Face transformers swaps while it builds a model under
``zero.Init`` (``zero_wrapper_for_fp_tensor_constructor`` and ``_orig_torch_arange``).
zero's ``Init`` wraps no tensor constructor, so swapping the wrapper changes nothing."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from zero_torch import zero as _zero
from zero_torch._param_protocol import ZeroParamStatus  # noqa: F401
from zero_torch.accelerator import get_accelerator  # noqa: F401 - read by transformers
from zero_torch.zero import DeepSpeedInit as Init  # noqa: F401
from zero_torch.zero import GatheredParameters  # noqa: F401

from ..._missing import module_getattr

_orig_torch_tensor = torch.tensor
_orig_torch_empty = torch.empty
_orig_torch_zeros = torch.zeros
_orig_torch_ones = torch.ones
_orig_torch_full = torch.full
_orig_torch_arange = torch.arange
_orig_torch_eye = torch.eye
_orig_torch_randn = torch.randn


def zero_wrapper_for_fp_tensor_constructor(
    fn: Callable[..., torch.Tensor], target_fp_dtype: Optional[torch.dtype], target_device: Optional[torch.device]
) -> Callable[..., torch.Tensor]:
    """``fn`` (a tensor constructor) creating on ``target_device`` unless given a device,
    with floating-point results cast to ``target_fp_dtype`` (DeepSpeed's wrapper)."""

    def wrapped_fn(*args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs.get("device", None) is None and target_device is not None:
            kwargs["device"] = target_device
        tensor = fn(*args, **kwargs)
        if target_fp_dtype is not None and tensor.is_floating_point():
            tensor.data = tensor.data.to(target_fp_dtype)
        return tensor

    return wrapped_fn


__all__ = ["Init", "GatheredParameters", "ZeroParamStatus", "zero_wrapper_for_fp_tensor_constructor"]
__getattr__ = module_getattr(__name__, _zero, ("register_external_parameter", "unregister_external_parameter"))
