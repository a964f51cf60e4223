"""``deepspeed``, as ``import zero_torch.deepspeed_compat`` serves it: DeepSpeed 0.19.8's
API for data-parallel training scripts, on zero's engine.

``initialize`` is :func:`zero_torch.initialize` and ``DeepSpeedEngine`` is
:class:`zero_torch.ZeroEngine`; ``comm``, ``accelerator``, ``checkpointing``,
``runtime.lr_schedules`` are zero_torch's public modules of the same purpose; the other
submodules DeepSpeed imports eagerly (``ops``, ``zero``, ``utils``, ``moe``, ``checkpoint``,
``runtime``, ``git_version_info``) are imported here too, so scripts reach them by
attribute. Any other ``deepspeed`` name raises an error that names it and says what to use
instead (``docs/DEEPSPEED_API.md``).
"""

from zero_torch import add_config_arguments, initialize  # noqa: F401

from . import _missing
from . import accelerator, checkpoint, comm, constants, git_version_info, launcher, moe, ops, runtime, utils  # noqa: F401
from .accelerator import get_accelerator  # noqa: F401
from .comm import init_distributed  # noqa: F401
from .constants import TORCH_DISTRIBUTED_DEFAULT_PORT  # noqa: F401
from .git_version_info import API_VERSION as _API_VERSION
from .git_version_info import git_branch, git_hash, version
from .runtime import zero  # noqa: F401
from .runtime.activation_checkpointing import checkpointing  # noqa: F401
from .runtime.config import DeepSpeedConfig, DeepSpeedConfigError  # noqa: F401
from .runtime.engine import DeepSpeedEngine, DeepSpeedOptimizerCallable, DeepSpeedSchedulerCallable  # noqa: F401
from .utils import log_dist, logger  # noqa: F401

__version__ = version
"""``0.19.8+zero.<zero_torch version>``: DeepSpeed's API version, zero's as local label."""

__version_major__, __version_minor__, __version_patch__ = (int(p) for p in _API_VERSION.split("."))
__git_hash__ = git_hash
__git_branch__ = git_branch

__all__ = [
    "initialize",
    "init_distributed",
    "add_config_arguments",
    "DeepSpeedEngine",
    "DeepSpeedConfig",
    "DeepSpeedConfigError",
    "get_accelerator",
    "log_dist",
    "logger",
    "zero",
    "comm",
    "accelerator",
    "checkpointing",
    "ops",
    "runtime",
    "utils",
    "moe",
    "launcher",
    "checkpoint",
    "git_version_info",
    "__version__",
]
__getattr__ = _missing.module_getattr(__name__)
