"""``zero_torch.lr_schedules``: DeepSpeed's ``deepspeed.runtime.lr_schedules``.

The five schedules of DeepSpeed 0.19.8 (``LRRangeTest``, ``OneCycle``, ``WarmupLR``,
``WarmupDecayLR``, ``WarmupCosineLR``) as client schedulers over a torch optimizer's
``param_groups``: same arguments and defaults, the same learning rate (and momentum, for
``OneCycle``) at every step, ``step(n)`` to jump, and ``state_dict()`` =
``{"last_batch_iteration": n}``. Each value is computed in the same order of operations
as DeepSpeed's, so the floats are equal.

The optimizer must be a ``torch.optim.Optimizer`` (or wrap one as ``.optimizer``), as in
DeepSpeed. Differences: the warning DeepSpeed logs at every construction ("Attempting to
get learning rate from scheduler before it has started") is not logged; the other warnings
go to the ``DeepSpeed`` logger as DeepSpeed's do.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch.optim import Optimizer

logger = logging.getLogger("DeepSpeed")

LR_SCHEDULE = "lr_schedule"
LR_RANGE_TEST = "LRRangeTest"
ONE_CYCLE = "OneCycle"
WARMUP_LR = "WarmupLR"
WARMUP_DECAY_LR = "WarmupDecayLR"
WARMUP_COSINE_LR = "WarmupCosineLR"
VALID_LR_SCHEDULES = [LR_RANGE_TEST, ONE_CYCLE, WARMUP_LR, WARMUP_DECAY_LR, WARMUP_COSINE_LR]
"""The schedule names a config's ``scheduler.type`` may give (DeepSpeed's list)."""

WARMUP_LOG_RATE = "log"
WARMUP_LINEAR_RATE = "linear"

Number = Union[float, int]
PerGroup = Union[Number, Sequence[Number]]


def update_lr(param_groups: List[Dict[str, Any]], lrs: List[Any]) -> List[Any]:
    """Writes ``lrs`` into the groups (in place into a tensor learning rate) and returns
    the groups' learning rates."""
    for group, lr in zip(param_groups, lrs):
        if torch.is_tensor(group["lr"]):
            group["lr"].fill_(lr.squeeze() if torch.is_tensor(lr) else lr)
        else:
            group["lr"] = lr
    return [group["lr"] for group in param_groups]


def get_torch_optimizer(optimizer: Any) -> Optimizer:
    """``optimizer`` if it is a ``torch.optim.Optimizer``, else the one it wraps as
    ``.optimizer``; ``TypeError`` otherwise (as DeepSpeed)."""
    if isinstance(optimizer, Optimizer):
        return optimizer
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, Optimizer):
        return inner
    raise TypeError(f"{type(optimizer).__name__} is not a subclass of torch.optim.Optimizer")


def _per_group(optimizer: Optimizer, value: Any, name: str) -> List[Any]:
    """``value`` for every group: a scalar repeated, or a list/tuple of one per group."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(f"expected {len(optimizer.param_groups)} value for {name}, got {len(value)}")
        return list(value)
    return [value] * len(optimizer.param_groups)


class _Schedule:
    """What every schedule shares: the step counter, ``get_last_lr`` and the state dict."""

    optimizer: Optimizer
    last_batch_iteration: int
    _last_lr: Optional[List[Any]] = None

    def get_lr(self) -> List[Any]:  # pragma: no cover - every schedule defines it
        raise NotImplementedError

    def get_last_lr(self) -> List[Any]:
        """The learning rates last written (``AssertionError`` before any, as DeepSpeed)."""
        assert self._last_lr is not None, "need to call step() first"
        return self._last_lr

    def step(self, last_batch_iteration: Optional[int] = None) -> None:
        """Moves to the next batch (or to batch ``last_batch_iteration``) and writes its
        learning rates into the optimizer."""
        if last_batch_iteration is None:
            last_batch_iteration = self.last_batch_iteration + 1
        self.last_batch_iteration = last_batch_iteration
        self._last_lr = update_lr(self.optimizer.param_groups, self.get_lr())

    def state_dict(self) -> Dict[str, int]:
        """``{"last_batch_iteration": n}``."""
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, sd: Dict[str, int]) -> None:
        """Restores the step counter (the optimizer's learning rates change at the next
        :meth:`step`, as in DeepSpeed)."""
        self.last_batch_iteration = sd["last_batch_iteration"]


class LRRangeTest(_Schedule):
    """The learning-rate range test: ``min_lr * (1 + step_rate * (iteration + 1) /
    step_size)``, continuous or in stairs (``lr_range_test_staircase``)."""

    def __init__(
        self,
        optimizer: Optimizer,
        lr_range_test_min_lr: PerGroup = 1e-3,
        lr_range_test_step_size: int = 2000,
        lr_range_test_step_rate: float = 1.0,
        lr_range_test_staircase: bool = False,
        last_batch_iteration: int = -1,
    ) -> None:
        self.optimizer = get_torch_optimizer(optimizer)
        if isinstance(lr_range_test_min_lr, (list, tuple)) and len(lr_range_test_min_lr) != len(self.optimizer.param_groups):
            raise ValueError(
                f"expected {len(self.optimizer.param_groups)} lr_range_test_min_lr, got {len(lr_range_test_min_lr)}"
            )
        self.min_lr = _per_group(self.optimizer, lr_range_test_min_lr, "lr_range_test_min_lr")
        if not isinstance(lr_range_test_step_size, int) or lr_range_test_step_size <= 0:
            raise ValueError(f"lr_range_test_step_size must be a positive integer, got {lr_range_test_step_size}")
        self.step_size = lr_range_test_step_size
        self.step_rate = lr_range_test_step_rate
        self.last_batch_iteration = last_batch_iteration
        self.staircase = lr_range_test_staircase
        if last_batch_iteration == -1:
            self._last_lr = update_lr(self.optimizer.param_groups, self.min_lr)

    def _interval(self) -> float:
        if self.staircase:
            return math.floor(float(self.last_batch_iteration + 1) / self.step_size)
        return float(self.last_batch_iteration + 1) / self.step_size

    def get_lr(self) -> List[Any]:
        """The learning rates at the current iteration."""
        increase = 1 + self.step_rate * self._interval()
        return [min_lr * increase for min_lr in self.min_lr]

    def step(self, batch_iteration: Optional[int] = None) -> None:
        """Moves to the next batch (or to ``batch_iteration``)."""
        super().step(batch_iteration)


class OneCycle(_Schedule):
    """1Cycle: the learning rate rises from ``cycle_min_lr`` to ``cycle_max_lr`` over
    ``cycle_first_step_size`` batches, falls back over ``cycle_second_step_size``, then
    decays; the momentum (``betas[0]``, for optimizers with ``betas``) moves the other way,
    with ``betas[1]`` set to 0.99 (as DeepSpeed does)."""

    def __init__(
        self,
        optimizer: Optimizer,
        cycle_min_lr: PerGroup,
        cycle_max_lr: PerGroup,
        decay_lr_rate: float = 0.0,
        cycle_first_step_size: int = 2000,
        cycle_second_step_size: Optional[int] = None,
        cycle_first_stair_count: int = 0,
        cycle_second_stair_count: Optional[int] = None,
        decay_step_size: int = 0,
        cycle_momentum: bool = True,
        cycle_min_mom: PerGroup = 0.8,
        cycle_max_mom: PerGroup = 0.9,
        decay_mom_rate: float = 0.0,
        last_batch_iteration: int = -1,
    ) -> None:
        self.optimizer = get_torch_optimizer(optimizer)
        first = float(cycle_first_step_size)
        second = float(cycle_second_step_size) if cycle_second_step_size is not None else first
        if first <= 0:
            raise ValueError(f"cycle_first_step_size must be positive, got {first}")
        if second < 0:
            raise ValueError(f"cycle_second_step_size must be non-negative, got {second}")
        self.total_size = first + second
        self.step_ratio = first / self.total_size
        self.first_step_size = first
        self.second_step_size = second
        self.first_stair_count = cycle_first_stair_count
        self.second_stair_count = cycle_first_stair_count if cycle_second_stair_count is None else cycle_second_stair_count
        self.decay_step_size = decay_step_size
        self.skip_lr_decay = self.skip_mom_decay = math.isclose(self.decay_step_size, 0)

        self.min_lrs = _per_group(self.optimizer, cycle_min_lr, "cycle_min_lr")
        self.max_lrs = _per_group(self.optimizer, cycle_max_lr, "cycle_max_lr")
        if last_batch_iteration == -1:
            update_lr(self.optimizer.param_groups, self.min_lrs)
        self.decay_lr_rate = decay_lr_rate
        if math.isclose(self.decay_lr_rate, 0):
            self.skip_lr_decay = True

        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            self._initialize_momentum(cycle_min_mom, cycle_max_mom, decay_mom_rate, last_batch_iteration)
        self.last_batch_iteration = last_batch_iteration

    def _initialize_momentum(self, cycle_min_mom: PerGroup, cycle_max_mom: PerGroup, decay_mom_rate: float,
                             last_batch_iteration: int) -> None:
        if "betas" not in self.optimizer.defaults:
            logger.warning(
                f"cycle_momentum is disabled because optimizer {type(self.optimizer).__name__} does not "
                "support momentum, no betas attribute in defaults"
            )
            self.cycle_momentum = False
            return
        self.decay_mom_rate = decay_mom_rate
        self.min_moms = [(m, 0.99) for m in _per_group(self.optimizer, cycle_min_mom, "cycle_min_mom")]
        self.max_moms = [(m, 0.99) for m in _per_group(self.optimizer, cycle_max_mom, "cycle_max_mom")]
        if last_batch_iteration == -1:
            for momentum, group in zip(self.min_moms, self.optimizer.param_groups):
                group["betas"] = momentum
        if math.isclose(self.decay_mom_rate, 0):
            self.skip_mom_decay = True

    def _scale_factor(self) -> float:
        batch = self.last_batch_iteration + 1
        cycle = math.floor(1 + batch / self.total_size)
        x = 1.0 + batch / self.total_size - cycle
        if x <= self.step_ratio:
            scale = x / self.step_ratio
            stairs = self.first_stair_count
        else:
            scale = (x - 1) / (self.step_ratio - 1)
            stairs = self.second_stair_count
        if stairs > 0:
            # Stairs are counted from the integer offset in the cycle, not from `scale`.
            at = batch % self.total_size
            if at <= self.first_step_size:
                position = at * stairs / self.first_step_size
            else:
                position = (self.total_size - at) * stairs / self.second_step_size
            scale = math.floor(position) / stairs
        return scale

    def get_lr(self) -> List[Any]:
        """The learning rates at the current iteration."""
        if self.last_batch_iteration < self.total_size:
            scale = self._scale_factor()
            return [low + (high - low) * scale for low, high in zip(self.min_lrs, self.max_lrs)]
        if self.skip_lr_decay:
            return self.min_lrs
        interval = (self.last_batch_iteration - self.total_size + 1) / self.decay_step_size
        factor = 1 + self.decay_lr_rate * interval
        return [low / factor for low in self.min_lrs]

    def get_mom(self) -> Optional[List[Tuple[float, float]]]:
        """The ``betas`` at the current iteration (``None`` without momentum cycling)."""
        if not self.cycle_momentum:
            return None
        if self.last_batch_iteration < self.total_size:
            scale = self._scale_factor()
            return [(high[0] - (high[0] - low[0]) * scale, low[1]) for low, high in zip(self.min_moms, self.max_moms)]
        if self.skip_mom_decay:
            return self.max_moms
        interval = (self.last_batch_iteration - self.total_size + 1) / self.decay_step_size
        factor = 1 + self.decay_mom_rate * interval
        return [(beta0 * factor, beta1) for beta0, beta1 in self.max_moms]

    def step(self, batch_iteration: Optional[int] = None) -> None:
        """Moves to the next batch (or to ``batch_iteration``) and writes its learning rates
        (and momentum) into the optimizer."""
        super().step(batch_iteration)
        if self.cycle_momentum:
            for group, momentum in zip(self.optimizer.param_groups, self.get_mom() or []):
                group["betas"] = momentum


class WarmupLR(_Schedule):
    """Warm-up from ``warmup_min_lr`` to ``warmup_max_lr`` (default: each group's current
    learning rate) over ``warmup_num_steps`` (at least 2), logarithmic or linear, then
    constant. The learning rate is ``warmup_min_lr`` at construction and for the first
    step (``log(1) = 0``)."""

    def __init__(
        self,
        optimizer: Optimizer,
        warmup_min_lr: PerGroup = 0.0,
        warmup_max_lr: Optional[PerGroup] = None,
        warmup_num_steps: int = 1000,
        warmup_type: str = WARMUP_LOG_RATE,
        last_batch_iteration: int = -1,
    ) -> None:
        if not isinstance(warmup_num_steps, int) or warmup_num_steps <= 0:
            raise ValueError(f"warmup_num_steps must be a positive integer, got {warmup_num_steps}")
        self.optimizer = get_torch_optimizer(optimizer)
        if warmup_max_lr is None:
            warmup_max_lr = [group["lr"] for group in self.optimizer.param_groups]
        self.min_lrs = _per_group(self.optimizer, warmup_min_lr, "min_lr")
        self.max_lrs = _per_group(self.optimizer, warmup_max_lr, "max_lr")
        self.delta_lrs = [big - small for big, small in zip(self.max_lrs, self.min_lrs)]
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_type = _warmup_type(warmup_type)
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)
        self.last_batch_iteration = last_batch_iteration
        if last_batch_iteration == -1:
            self._last_lr = update_lr(self.optimizer.param_groups, self.get_lr())

    def get_lr(self) -> List[Any]:
        """The learning rates at the current iteration (the minimum before the first step)."""
        if self.last_batch_iteration < 0:
            return self.min_lrs
        gamma = self._get_gamma()
        return [low + delta * gamma for low, delta in zip(self.min_lrs, self.delta_lrs)]

    def _warmup_gamma(self) -> float:
        if self.warmup_type == WARMUP_LOG_RATE:
            return self.inverse_log_warm_up * math.log(self.last_batch_iteration + 1)
        return self.last_batch_iteration / self.warmup_num_steps

    def _get_gamma(self) -> float:
        if self.last_batch_iteration < self.warmup_num_steps:
            return self._warmup_gamma()
        return 1.0


class WarmupDecayLR(WarmupLR):
    """:class:`WarmupLR` (with ``warmup_max_lr`` defaulting to 0.001), then a linear decay
    to 0 at ``total_num_steps``."""

    def __init__(
        self,
        optimizer: Optimizer,
        total_num_steps: int,
        warmup_min_lr: PerGroup = 0.0,
        warmup_max_lr: PerGroup = 0.001,
        warmup_num_steps: int = 1000,
        warmup_type: str = WARMUP_LOG_RATE,
        last_batch_iteration: int = -1,
    ) -> None:
        self.total_num_steps = total_num_steps
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type, last_batch_iteration)
        if self.total_num_steps < self.warmup_num_steps:
            logger.warning(f"total_num_steps {total_num_steps} is less than warmup_num_steps {warmup_num_steps}")

    def _get_gamma(self) -> float:
        if self.last_batch_iteration < self.warmup_num_steps:
            return self._warmup_gamma()
        return max(
            0.0,
            float(self.total_num_steps - self.last_batch_iteration)
            / float(max(1.0, self.total_num_steps - self.warmup_num_steps)),
        )


class WarmupCosineLR(_Schedule):
    """Each group's learning rate times a ratio: warm-up from ``warmup_min_ratio`` to 1 over
    ``warmup_num_steps`` (log or linear), then a cosine down to ``cos_min_ratio`` at
    ``total_num_steps``, held there after."""

    def __init__(
        self,
        optimizer: Optimizer,
        total_num_steps: int,
        warmup_min_ratio: float = 0.0,
        warmup_num_steps: int = 1000,
        cos_min_ratio: float = 0.0001,
        warmup_type: str = WARMUP_LOG_RATE,
        last_batch_iteration: int = -1,
    ) -> None:
        if not isinstance(warmup_num_steps, int) or warmup_num_steps <= 0:
            raise ValueError(f"warmup_num_steps must be a positive integer, got {warmup_num_steps}")
        self.optimizer = get_torch_optimizer(optimizer)
        self.total_num_steps = total_num_steps
        self.last_batch_iteration = last_batch_iteration
        self.cos_min_ratio = cos_min_ratio
        self.warmup_type = _warmup_type(warmup_type)
        self.warmup_min_ratio = warmup_min_ratio
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)
        if self.total_num_steps < self.warmup_num_steps:
            logger.warning(f"total_num_steps {total_num_steps} is less than warmup_num_steps {warmup_num_steps}")
        self.org_lrs = [g["lr"].clone() if torch.is_tensor(g["lr"]) else g["lr"] for g in self.optimizer.param_groups]
        if last_batch_iteration == -1:
            self._last_lr = update_lr(self.optimizer.param_groups, self.get_lr())

    def get_lr_ratio(self) -> float:
        """The ratio at the current iteration (0 before the first step)."""
        if self.last_batch_iteration < 0:
            return 0.0
        if self.last_batch_iteration < self.warmup_num_steps:
            if self.warmup_type == WARMUP_LOG_RATE:
                ratio = self.inverse_log_warm_up * math.log(self.last_batch_iteration + 1)
            else:
                ratio = self.last_batch_iteration / self.warmup_num_steps
            return self.warmup_min_ratio + ratio * (1.0 - self.warmup_min_ratio)
        done = self.last_batch_iteration - self.warmup_num_steps + 1
        span = max(1, self.total_num_steps - self.warmup_num_steps)
        progress = min(1.0, done / span)
        ratio = (1 + math.cos(math.pi * progress)) / 2
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * ratio)

    def get_lr(self) -> List[Any]:
        """Each group's original learning rate times :meth:`get_lr_ratio` (0 before the
        first step)."""
        if self.last_batch_iteration < 0:
            return [0.0 for _ in self.org_lrs]
        ratio = self.get_lr_ratio()
        return [lr * ratio for lr in self.org_lrs]


def _warmup_type(warmup_type: str) -> str:
    if warmup_type not in (WARMUP_LOG_RATE, WARMUP_LINEAR_RATE):
        logger.warning(f"Using unknown warmup_type: {warmup_type}. The increasing function is set to default (log)")
        return WARMUP_LOG_RATE
    return warmup_type


__all__ = [
    "VALID_LR_SCHEDULES",
    "LR_SCHEDULE",
    "LR_RANGE_TEST",
    "ONE_CYCLE",
    "WARMUP_LR",
    "WARMUP_DECAY_LR",
    "WARMUP_COSINE_LR",
    "WARMUP_LOG_RATE",
    "WARMUP_LINEAR_RATE",
    "LRRangeTest",
    "OneCycle",
    "WarmupLR",
    "WarmupDecayLR",
    "WarmupCosineLR",
    "update_lr",
    "get_torch_optimizer",
]
