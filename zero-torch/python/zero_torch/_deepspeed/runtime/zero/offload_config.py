"""``deepspeed.runtime.zero.offload_config``: DeepSpeed's offload enums."""

from enum import Enum

from ..._missing import module_getattr


class OffloadDeviceEnum(str, Enum):
    """Where ZeRO offloads to: ``none``, ``cpu`` or ``nvme``."""

    none = "none"
    cpu = "cpu"
    nvme = "nvme"


class OffloadStateTypeEnum(str, Enum):
    """The engine's buffers ``engine.offload_states(include=...)`` may move."""

    optim_states = "optim_states"
    hp_params = "hp_params"
    lp_params = "lp_params"
    lp_grads = "lp_grads"
    contiguous_grad_buffer = "contiguous_grad_buffer"


__all__ = ["OffloadDeviceEnum", "OffloadStateTypeEnum"]
__getattr__ = module_getattr(__name__)
