"""``deepspeed.constants``: DeepSpeed's default port and process-group timeout."""

from __future__ import annotations

import os
from datetime import timedelta

from ._missing import module_getattr

TORCH_DISTRIBUTED_DEFAULT_PORT = 29500
"""``MASTER_PORT`` when none is set."""

default_pg_timeout = timedelta(minutes=int(os.getenv("DEEPSPEED_TIMEOUT", default="10")))
"""The process group's timeout: ``DEEPSPEED_TIMEOUT`` minutes (10)."""

__getattr__ = module_getattr(__name__)
