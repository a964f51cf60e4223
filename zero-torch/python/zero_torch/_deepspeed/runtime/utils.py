"""``deepspeed.runtime.utils``: ``set_random_seed``, ``see_memory_usage``, ``noop_context``."""

from __future__ import annotations

import gc
import random

import torch

from zero_torch import comm as dist
from zero_torch.accelerator import _host_memory, get_accelerator, noop_context

from .._missing import module_getattr


def set_random_seed(seed: int) -> None:
    """Seeds Python's ``random``, NumPy (``seed % 2**32``, where NumPy is installed) and
    torch (``seed % 2**63``)."""
    random.seed(seed)
    try:
        import numpy
    except ImportError:
        pass
    else:
        numpy.random.seed(seed % (2**32))
    torch.manual_seed(seed % (2**63))


def see_memory_usage(message: str, force: bool = False) -> None:
    """With ``force``, prints ``message`` and the accelerator's memory (allocated, peak,
    reserved, peak reserved, in GB) and the host's, on rank 0 only; then resets the peaks.
    Without ``force`` it does nothing (as DeepSpeed)."""
    if not force:
        return
    if dist.is_initialized() and not dist.get_rank() == 0:
        return
    gc.collect()
    acc = get_accelerator()
    gb = 1024**3
    print(message)
    print(
        f"MA {round(acc.memory_allocated() / gb, 2)} GB "
        f"        Max_MA {round(acc.max_memory_allocated() / gb, 2)} GB "
        f"        CA {round(acc.memory_reserved() / gb, 2)} GB "
        f"        Max_CA {round(acc.max_memory_reserved() / gb)} GB "
    )
    host = _host_memory()
    used = host["total"] - host["available"]
    print(f"CPU Virtual Memory:  used = {round(used / gb, 2)} GB, percent = {round(100 * used / host['total'], 1)}%")
    acc.reset_peak_memory_stats()


__all__ = ["set_random_seed", "see_memory_usage", "noop_context"]
__getattr__ = module_getattr(__name__)
