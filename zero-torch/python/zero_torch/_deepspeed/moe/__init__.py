"""``deepspeed.moe``: ``utils`` (parameter-group helpers, for models without
Mixture-of-Experts layers). MoE layers (``deepspeed.moe.layer.MoE``) are not provided."""

from .._missing import module_getattr
from . import utils  # noqa: F401

__getattr__ = module_getattr(__name__)
