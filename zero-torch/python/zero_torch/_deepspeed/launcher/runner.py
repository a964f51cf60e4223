"""``deepspeed.launcher.runner``: the name of the environment file DeepSpeed's launcher
exports to every node (``DEEPSPEED_ENVIRONMENT_NAME``)."""

import os

from .._missing import module_getattr

DEEPSPEED_ENVIRONMENT_NAME = os.getenv("DS_ENV_FILE", ".deepspeed_env")
"""``DS_ENV_FILE``, else ``.deepspeed_env``."""

__all__ = ["DEEPSPEED_ENVIRONMENT_NAME"]
__getattr__ = module_getattr(__name__)
