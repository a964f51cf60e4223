"""``deepspeed.utils.logging``: DeepSpeed's ``logger`` (named ``DeepSpeed``, level WARNING,
printing to stdout with DeepSpeed's format, not propagating) and ``log_dist``."""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any, List, Optional

from .._missing import module_getattr

log_levels = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


def _create_logger(name: str = "DeepSpeed", level: int = logging.WARNING) -> logging.Logger:
    """The ``DeepSpeed`` logger, set up as DeepSpeed's ``LoggerFactory`` sets it up (once:
    a second call leaves its handlers as they are)."""
    made = logging.getLogger(name)
    if not getattr(made, "_zero_torch_configured", False):
        made.setLevel(level)
        made.propagate = False
        handler = logging.StreamHandler(stream=sys.stdout)
        handler.setLevel(level)
        handler.setFormatter(
            logging.Formatter("[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s")
        )
        made.addHandler(handler)
        made._zero_torch_configured = True  # type: ignore[attr-defined]
    return made


logger = _create_logger()


@functools.lru_cache(None)
def warning_once(*args: Any, **kwargs: Any) -> None:
    """``logger.warning``, once per distinct message."""
    logger.warning(*args, **kwargs)


logger.warning_once = warning_once  # type: ignore[attr-defined]


def get_dist_msg(message: str, ranks: Optional[List[int]] = None) -> Optional[str]:
    """``"[Rank r] message"`` when this rank should log it (no process group, or ``r`` in
    ``ranks``, or ``ranks == [-1]``), else ``None``."""
    from zero_torch import comm as dist

    should_log = not dist.is_initialized()
    ranks = ranks or []
    my_rank = dist.get_rank() if dist.is_initialized() else -1
    if ranks and not should_log:
        should_log = ranks[0] == -1 or my_rank in set(ranks)
    return f"[Rank {my_rank}] {message}" if should_log else None


def log_dist(message: str, ranks: Optional[List[int]] = None, level: int = logging.INFO) -> None:
    """Logs ``message`` at ``level`` on the ranks :func:`get_dist_msg` selects."""
    final = get_dist_msg(message, ranks)
    if final is not None:
        logger.log(level, final)


def print_dist(message: str, ranks: Optional[List[int]] = None) -> None:
    """Prints ``message`` on the ranks :func:`get_dist_msg` selects, whatever the log level."""
    final = get_dist_msg(message, ranks)
    if final is not None:
        print(final)


def set_log_level_from_string(log_level_str: str, custom_logger: Optional[logging.Logger] = None) -> None:
    """Sets ``logger``'s (or ``custom_logger``'s) level and its handlers' from a name
    (``"info"``, ...)."""
    if log_level_str not in log_levels:
        raise ValueError(f"{log_level_str} is not one of the log levels {list(log_levels)}")
    level = log_levels[log_level_str]
    target = logger if custom_logger is None else custom_logger
    target.setLevel(level)
    for handler in target.handlers:
        handler.setLevel(level)


__all__ = ["logger", "log_dist", "print_dist", "warning_once", "get_dist_msg", "log_levels", "set_log_level_from_string"]
__getattr__ = module_getattr(__name__)
