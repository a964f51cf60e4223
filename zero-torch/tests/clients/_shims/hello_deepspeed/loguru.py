"""Stand-in for loguru (not installed in the test environment): ``loguru.logger`` with the
methods ``train_bert_ds.py`` calls (``info``, ``error``, ``debug``; also ``warning``),
writing ``time | LEVEL | message`` lines to stderr as loguru's default sink does. Only
appended to ``sys.path`` by the client suite's bootstrap, so an installed loguru wins."""

import logging
import sys


class _Logger:
    def __init__(self):
        self._log = logging.getLogger("loguru-stand-in")
        self._log.setLevel(logging.DEBUG)
        self._log.propagate = False
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)-8s | %(message)s"))
        self._log.addHandler(handler)

    def _emit(self, level, message, *args, **kwargs):
        text = str(message).format(*args, **kwargs) if (args or kwargs) else str(message)
        self._log.log(level, text)

    def debug(self, message, *args, **kwargs):
        self._emit(logging.DEBUG, message, *args, **kwargs)

    def info(self, message, *args, **kwargs):
        self._emit(logging.INFO, message, *args, **kwargs)

    def warning(self, message, *args, **kwargs):
        self._emit(logging.WARNING, message, *args, **kwargs)

    def error(self, message, *args, **kwargs):
        self._emit(logging.ERROR, message, *args, **kwargs)


logger = _Logger()
