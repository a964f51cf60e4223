"""``deepspeed.runtime.engine``: ``DeepSpeedEngine`` is zero's engine,
:class:`zero_torch.ZeroEngine` (what ``deepspeed.initialize`` returns)."""

from typing import Callable, Dict, Iterable, Union

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import _LRScheduler

from zero_torch.engine import ZeroEngine as DeepSpeedEngine

from .._missing import module_getattr

DeepSpeedOptimizerCallable = Callable[
    [Union[Iterable[torch.nn.Parameter], Dict[str, Iterable[torch.nn.Parameter]]]], Optimizer
]
"""DeepSpeed's type of an ``optimizer=`` callable (parameters to optimizer)."""

DeepSpeedSchedulerCallable = Callable[[Optimizer], _LRScheduler]
"""DeepSpeed's type of an ``lr_scheduler=`` callable (optimizer to scheduler)."""

__all__ = ["DeepSpeedEngine", "DeepSpeedOptimizerCallable", "DeepSpeedSchedulerCallable"]
__getattr__ = module_getattr(__name__)
