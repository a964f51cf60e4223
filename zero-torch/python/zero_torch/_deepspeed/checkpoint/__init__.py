"""``deepspeed.checkpoint``: ``utils.clone_tensors_for_torch_save``. DeepSpeed's readers of
its own checkpoint files are not provided (zero's checkpoints are read by
:mod:`zero_torch.checkpoint`)."""

from .._missing import module_getattr
from . import utils  # noqa: F401

__getattr__ = module_getattr(__name__)
