"""The exceptions zero_torch raises. Every one derives from :class:`ZeroError`, a
``RuntimeError``, and its message names the problem."""

from __future__ import annotations

from ._native import CheckpointError, CommError, ConfigError, DeviceError, OrderError, ZeroError


class UnsupportedError(ZeroError):
    """A DeepSpeed argument, call or model feature zero_torch does not support; the message
    names it and, where there is one, the way to do the same."""


__all__ = [
    "ZeroError",
    "ConfigError",
    "CommError",
    "OrderError",
    "CheckpointError",
    "DeviceError",
    "UnsupportedError",
]
