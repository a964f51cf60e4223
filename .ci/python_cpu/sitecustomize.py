"""Where the Python suite's CPU goes, per process (a measuring aid, not part of CI).

Put this folder first on ``PYTHONPATH`` (every process the suite starts inherits it) and
set ``ZT_CPU_LOG`` to a file: at exit, each Python process appends one JSON line with its
command line, the test that started it (``PYTEST_CURRENT_TEST``), whether it was forked
(a zygote's rank), its CPU seconds (user + system) and the CPU seconds spent in top-level
import statements, by package. A process that ends by ``os._exit`` without running
``atexit`` (or is killed) is not counted. ``report.py`` sums the file up. How it was used:
docs/BENCHMARKS.md, "CI time on 2 cores: imports".
"""

import atexit
import builtins
import json
import os
import sys
import time

_LOG = os.environ.get("ZT_CPU_LOG")
_imports: dict = {}
_depth = [0]
_forked = [False]
_original_import = builtins.__import__


def _timed_import(name, globals=None, locals=None, fromlist=(), level=0):
    """``__import__``, timing the outermost import statement by its top-level package."""
    if _depth[0] or level:
        _depth[0] += 1
        try:
            return _original_import(name, globals, locals, fromlist, level)
        finally:
            _depth[0] -= 1
    _depth[0] = 1
    start = time.process_time()
    try:
        return _original_import(name, globals, locals, fromlist, level)
    finally:
        _depth[0] = 0
        top = name.split(".")[0]
        _imports[top] = _imports.get(top, 0.0) + time.process_time() - start


def _after_fork() -> None:
    _imports.clear()
    _forked[0] = True


def _report() -> None:
    t = os.times()
    record = {
        "argv": " ".join(sys.argv)[:200],
        "test": os.environ.get("PYTEST_CURRENT_TEST", "")[:160],
        "forked": _forked[0],
        "cpu": round(t.user + t.system, 3),
        "imports": {k: round(v, 3) for k, v in _imports.items() if v >= 0.01},
    }
    try:
        with open(_LOG, "a") as f:
            f.write(json.dumps(record) + "\n")
    except OSError:
        pass


if _LOG:
    builtins.__import__ = _timed_import
    os.register_at_fork(after_in_child=_after_fork)
    atexit.register(_report)
