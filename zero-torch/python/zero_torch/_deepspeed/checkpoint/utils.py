"""``deepspeed.checkpoint.utils``: ``clone_tensors_for_torch_save``."""

from __future__ import annotations

from typing import Any, Union

import torch

from .._missing import module_getattr


def clone_tensors_for_torch_save(item: Any, device: Union[str, torch.device] = torch.device("cpu")) -> Any:
    """A copy of ``item`` with every tensor in it (nested in lists, tuples and dicts)
    replaced by a detached clone on ``device`` (the CPU by default), so that
    ``torch.save`` writes no views of larger storages. Other values are kept as they are."""
    if torch.is_tensor(item):
        target = torch.device(device) if isinstance(device, str) else device
        if target == item.device:
            return item.detach().clone()
        return item.detach().to(target)
    if isinstance(item, list):
        return [clone_tensors_for_torch_save(v, device) for v in item]
    if isinstance(item, tuple):
        return tuple(clone_tensors_for_torch_save(v, device) for v in item)
    if isinstance(item, dict):
        return type(item)({k: clone_tensors_for_torch_save(v, device) for k, v in item.items()})
    return item


__all__ = ["clone_tensors_for_torch_save"]
__getattr__ = module_getattr(__name__)
