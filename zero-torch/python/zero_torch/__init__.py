"""zero_torch: PyTorch training scripts written for ``deepspeed.initialize`` train on zero's
ZeRO engine (written in Rust), with no build step at run time.

.. code-block:: python

    import zero_torch

    engine, optimizer, _, _ = zero_torch.initialize(model=model, config="ds_config.json")
    for batch in loader:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint("ckpt")
"""

from __future__ import annotations

from . import checkpoint, zero
from ._native import __version__
from .engine import ZeroEngine
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

__all__ = [
    "initialize",
    "add_config_arguments",
    "ZeroEngine",
    "zero",
    "checkpoint",
    "ZeroError",
    "ConfigError",
    "CommError",
    "OrderError",
    "CheckpointError",
    "DeviceError",
    "UnsupportedError",
    "__version__",
]
