"""``deepspeed.compression.helper``: the shim DeepSpeed 0.19.8 keeps for DeepSpeed-Chat,
``recursive_getattr`` and ``recursive_setattr`` from ``deepspeed.utils.module_utils``.
Importing it warns, as DeepSpeed's does (``FutureWarning``)."""

import warnings

from .._missing import module_getattr
from ..utils.module_utils import recursive_getattr, recursive_setattr

warnings.warn(
    "deepspeed.compression.helper is deprecated; import recursive_getattr and "
    "recursive_setattr from deepspeed.utils.module_utils instead. "
    "See https://github.com/deepspeedai/DeepSpeed/issues/8489",
    FutureWarning,
    stacklevel=2,
)

__all__ = ["recursive_getattr", "recursive_setattr"]
__getattr__ = module_getattr(__name__)
