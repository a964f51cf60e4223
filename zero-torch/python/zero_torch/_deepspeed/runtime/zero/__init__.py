"""``deepspeed.zero`` (``deepspeed.runtime.zero``): :mod:`zero_torch.zero`'s ``Init``,
``MiCS_Init`` (DeepSpeed 0.18's, which 0.19.8 removed) and ``GatheredParameters`` (and
``register_external_parameter`` where zero_torch provides it), ``offload_config``,
``partition_parameters`` and ``mics``."""

from zero_torch import zero as _public
from zero_torch.zero import DeepSpeedInit as Init  # noqa: F401
from zero_torch.zero import GatheredParameters  # noqa: F401
from zero_torch.zero import MiCSInit as MiCS_Init  # noqa: F401

from ..._missing import module_getattr
from . import mics, offload_config, partition_parameters  # noqa: F401

EXTERNAL_PARAMETER_NAMES = ("register_external_parameter", "unregister_external_parameter")
"""Names read from zero_torch.zero when asked for (provided there as they are written)."""

__getattr__ = module_getattr(__name__, _public, EXTERNAL_PARAMETER_NAMES)
