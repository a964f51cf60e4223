"""``engine.tput_timer``: DeepSpeed's ``ThroughputTimer`` (``deepspeed/utils/timer.py``), the
samples-per-second counter its engine starts at every forward and stops at every
``step()``. Scripts read its counters and call ``update_epoch_count()`` (DeepSpeed-Chat
does at each epoch's end). At each ``steps_per_print`` optimizer step it logs DeepSpeed's
line at INFO on the ``DeepSpeed`` logger (not shown at the logger's default level,
WARNING, as in DeepSpeed). The config's ``timers.throughput`` section (``enabled``,
``synchronized``) applies as in DeepSpeed."""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Optional

import torch

_EPSILON = 1e-8
"""Added to an elapsed time before dividing by it (DeepSpeed's ``TIME_EPSILON``)."""


class ThroughputTimer:
    """DeepSpeed's throughput timer: ``start()`` / ``stop(global_step, report_speed)`` around
    each micro-step, the first ``start_step`` optimizer steps left out of the average."""

    def __init__(
        self,
        config: Dict[str, Any],
        batch_size: Optional[int],
        start_step: int = 2,
        steps_per_output: Optional[int] = None,
        device: Optional[torch.device] = None,
        logging_fn: Optional[Callable[[str], None]] = None,
    ) -> None:
        section = (config.get("timers") or {}).get("throughput") or {}
        self.enabled = bool(section.get("enabled", True))
        self.synchronized = bool(section.get("synchronized", True))
        self.start_time = 0.0
        self.end_time = 0.0
        self.started = False
        self.batch_size = 1 if batch_size is None else batch_size
        self.start_step = start_step
        self.epoch_count = 0
        self.micro_step_count = 0
        self.global_step_count = 0
        self.total_elapsed_time = 0.0
        self.step_elapsed_time = 0.0
        self.steps_per_output = steps_per_output
        self._device = device if device is not None else torch.device("cpu")
        if logging_fn is None:
            from ._deepspeed.utils.logging import logger

            logging_fn = logger.info
        self.logging = logging_fn

    def update_epoch_count(self) -> None:
        """An epoch ended: counts it and restarts the micro-step count."""
        self.epoch_count += 1
        self.micro_step_count = 0

    def _synchronize(self) -> None:
        if self.synchronized and self._device.type == "cuda":
            torch.cuda.synchronize(self._device)

    def start(self) -> None:
        """A micro-step begins (timed once ``start_step`` optimizer steps are done)."""
        if not self.enabled:
            return
        self.started = True
        if self.global_step_count >= self.start_step:
            self._synchronize()
            self.start_time = time.time()

    def stop(self, global_step: bool = False, report_speed: bool = True) -> None:
        """A micro-step ends (``global_step``: with an optimizer step); at every
        ``steps_per_output`` optimizer steps, with ``report_speed``, logs the speed."""
        if not self.enabled or not self.started:
            return
        self.started = False
        self.micro_step_count += 1
        if global_step:
            self.global_step_count += 1
        if self.start_time > 0:
            self._synchronize()
            self.end_time = time.time()
            duration = self.end_time - self.start_time
            self.total_elapsed_time += duration
            self.step_elapsed_time += duration
            if global_step:
                if report_speed and self.steps_per_output and self.global_step_count % self.steps_per_output == 0:
                    on_gpu = self._device.type == "cuda"
                    allocated = torch.cuda.memory_allocated(self._device) if on_gpu else 0
                    peak = torch.cuda.max_memory_allocated(self._device) if on_gpu else 0
                    self.logging(
                        f"epoch={self.epoch_count}/micro_step={self.micro_step_count}/"
                        f"global_step={self.global_step_count}, RunningAvgSamplesPerSec={self.avg_samples_per_sec()}, "
                        f"CurrSamplesPerSec={self.batch_size / (self.step_elapsed_time + _EPSILON)}, "
                        f"MemAllocated={round(allocated / 1024**3, 2)}GB, MaxMemAllocated={round(peak / 1024**3, 2)}GB"
                    )
                self.step_elapsed_time = 0.0

    def avg_samples_per_sec(self) -> float:
        """Samples per second over the timed optimizer steps (``-inf`` before the first)."""
        if self.global_step_count > 0:
            timed = self.global_step_count - self.start_step
            if timed <= 0 or self.total_elapsed_time <= 0:
                return float("-inf")
            return self.batch_size / (self.total_elapsed_time / timed)
        return float("-inf")


__all__ = ["ThroughputTimer"]
