"""How a launched test script ends: :func:`exit_before_teardown`, for zero's runs and
DeepSpeed's reference runs alike."""

from __future__ import annotations

import atexit
import os
import sys


def exit_before_teardown() -> None:
    """After a script that returned: runs the ``atexit`` handlers (zero's and DeepSpeed's),
    then ends the process without the interpreter's teardown. torch 2.11's gloo aborts a
    rank there now and then ("terminate called without an active exception": its worker
    thread frees a finished collective's tensors after finalization began and cannot take
    the GIL); DeepSpeed leaves torch's group to that teardown, so its reference runs
    aborted now and then in CI, with every loss recorded."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
