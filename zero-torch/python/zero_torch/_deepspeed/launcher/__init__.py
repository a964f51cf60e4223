"""``deepspeed.launcher``: ``runner.DEEPSPEED_ENVIRONMENT_NAME`` (read by accelerate's
launcher). DeepSpeed's launcher itself is not provided: start one process per rank with
torchrun (or srun, mpirun)."""

from .._missing import module_getattr
from . import runner  # noqa: F401

__getattr__ = module_getattr(__name__)
