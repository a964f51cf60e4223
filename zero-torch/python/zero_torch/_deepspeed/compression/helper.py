"""``deepspeed.compression.helper``: the shim DeepSpeed 0.19.8 keeps for DeepSpeed-Chat,
``recursive_getattr`` and ``recursive_setattr`` from ``deepspeed.utils.module_utils``.
Importing it warns, as DeepSpeed's does (``FutureWarning``)."""

import sys
import warnings

from .._missing import module_getattr
from ..utils.module_utils import recursive_getattr, recursive_setattr


def _importer_level() -> int:
    """The ``stacklevel`` of the line that imported this module: the first frame outside
    the import machinery and zero_torch's own (its compat loader imports it on the
    script's behalf), so the warning points where DeepSpeed's does."""
    frame, level = sys._getframe(1), 1
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        internal = "importlib" in frame.f_code.co_filename and "_bootstrap" in frame.f_code.co_filename
        if not (internal or name.startswith("importlib") or name.startswith("zero_torch")):
            return level
        # warnings.warn does not count the import system's frames (_is_internal_frame).
        frame, level = frame.f_back, level + (0 if internal else 1)
    return 2


warnings.warn(
    "deepspeed.compression.helper is deprecated; import recursive_getattr and "
    "recursive_setattr from deepspeed.utils.module_utils instead. "
    "See https://github.com/deepspeedai/DeepSpeed/issues/8489",
    FutureWarning,
    stacklevel=_importer_level(),
)

__all__ = ["recursive_getattr", "recursive_setattr"]
__getattr__ = module_getattr(__name__)
