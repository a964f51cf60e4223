"""The exceptions zero_torch raises. Every one derives from :class:`ZeroError`, a
``RuntimeError``, and its message names the problem."""

from __future__ import annotations

import pickle

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


class NotProvidedAttributeError(AttributeError, UnsupportedError):
    """A DeepSpeed name (``deepspeed.X.y``, read as an attribute) that zero_torch does not
    provide. An ``AttributeError``, so ``hasattr`` and ``getattr(obj, name, default)`` go
    on working; the message names the symbol and, where there is one, what to use
    instead."""


class NotProvidedImportError(ImportError, UnsupportedError):
    """The same as :class:`NotProvidedAttributeError`, raised where the name is imported
    (``from deepspeed.X import y``), so that Python keeps the message instead of turning
    it into a bare "cannot import name"."""


class NotProvidedModuleError(ModuleNotFoundError, UnsupportedError):
    """A ``deepspeed.*`` module that zero_torch does not serve (``deepspeed.pipe``,
    ``deepspeed.inference``, ...): the message names it and what to use instead."""


class LateCompatImportError(ImportError, ZeroError):
    """``zero_torch.deepspeed_compat`` was imported after a module named ``deepspeed`` (the
    real DeepSpeed) was already imported: the one line must come before any import of
    ``deepspeed``, ``transformers`` or ``accelerate``."""


class DistNotInitializedError(AssertionError, ZeroError):
    """A ``deepspeed.comm`` call that needs torch's default process group before it
    exists (an ``AssertionError``, as DeepSpeed's own check is an ``assert``)."""


class PartitionedParameterError(pickle.PicklingError, ZeroError):
    """A ZeRO-3 parameter was pickled (``torch.save``) while partitioned: this rank holds
    only its part, and saving it whole would need every rank. The message names it and
    how to save it whole."""


__all__ += [
    "PartitionedParameterError",
    "NotProvidedAttributeError",
    "NotProvidedImportError",
    "NotProvidedModuleError",
    "LateCompatImportError",
    "DistNotInitializedError",
]
