"""zero_torch: PyTorch training scripts written for DeepSpeed train on zero's ZeRO engine
(written in Rust), with no build step at run time. One added line serves the whole
``deepspeed`` package (``import deepspeed``, ``from deepspeed.X import Y``):

.. code-block:: python

    import zero_torch.deepspeed_compat  # the one added line
    import deepspeed

    engine, optimizer, _, _ = deepspeed.initialize(model=model, config="ds_config.json")
    for batch in loader:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint("ckpt")
"""

from __future__ import annotations

from . import accelerator, checkpoint, comm, lr_schedules, optim, zero
from . import activation_checkpointing as checkpointing
from ._dist import init_distributed
from ._native import __version__
from .engine import ZeroEngine, ZeroOptimizer
from .errors import (
    CheckpointError,
    CommError,
    ConfigError,
    DeviceError,
    OrderError,
    UnsupportedError,
    ZeroError,
)
from .initialize import add_config_arguments, initialize
from .pretrained import from_pretrained

DeepSpeedEngine = ZeroEngine
"""DeepSpeed's name for the engine class (``isinstance(engine, deepspeed.DeepSpeedEngine)``)."""

__all__ = [
    "initialize",
    "from_pretrained",
    "init_distributed",
    "add_config_arguments",
    "ZeroEngine",
    "DeepSpeedEngine",
    "ZeroOptimizer",
    "zero",
    "checkpoint",
    "comm",
    "accelerator",
    "checkpointing",
    "lr_schedules",
    "optim",
    "ZeroError",
    "ConfigError",
    "CommError",
    "OrderError",
    "CheckpointError",
    "DeviceError",
    "UnsupportedError",
    "__version__",
]
