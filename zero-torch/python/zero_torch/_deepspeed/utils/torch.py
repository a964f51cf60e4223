"""``deepspeed.utils.torch``: ``required_torch_version``."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.torch_version import TorchVersion

from .._missing import module_getattr


def required_torch_version(min_version: Optional[Any] = None, max_version: Optional[Any] = None) -> bool:
    """Whether the running torch is at least ``min_version`` and at most ``max_version``
    (versions as strings or numbers, compared as PEP 440 versions)."""
    assert min_version or max_version, "Must provide a min_version or max_version argument"
    running = TorchVersion(torch.__version__)
    if min_version and running < str(min_version):
        return False
    if max_version and running > str(max_version):
        return False
    return True


__all__ = ["required_torch_version"]
__getattr__ = module_getattr(__name__)
