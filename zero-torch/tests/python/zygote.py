"""Ranks started by forking a process that has already imported torch (CI time, issue 49
item 7): a job's rank would otherwise spend about 3 s importing torch and, at its first
optimizer, ``torch._dynamo``, and the suite starts hundreds of ranks. The zygote is what
Python's ``forkserver`` is, made to keep ``conftest.run_job``'s contract: each rank gets
its own environment (the launcher's variables), its output in a log file and its exit
status as ``Popen`` reports it (negative for a signal).

Only torch (with ``torch._dynamo``, which every optimizer's construction imports),
``models`` and ``workers`` are imported before the fork; none of them reads the variables
a job sets (zero_torch, DeepSpeed and transformers are imported by the rank, after its
environment is in place). torch starts no thread at import, so the fork is safe
(``serve`` checks it). A job whose variables could change how torch itself starts
(``conftest.FORK_UNSAFE``) gets fresh processes instead.

Protocol: one JSON line per rank on the zygote's stdin (``env``, ``log``, ``exit``); the
zygote answers with the rank's pid, and when the rank ends writes its exit status into the
file ``exit`` (written whole, then renamed)."""

from __future__ import annotations

import json
import os
import select
import sys
from typing import Dict


def _child(req: Dict[str, object]) -> None:
    """The rank: its environment, its log, ``workers.main()``, then a normal interpreter
    exit (atexit handlers run, as in a fresh process)."""
    os.environ.clear()
    os.environ.update(req["env"])  # type: ignore[arg-type]
    fd = os.open(str(req["log"]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    code = 0
    try:
        import workers

        workers.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # as an uncaught exception ends ``python -c``
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(code)


def _status(raw: int) -> int:
    return -os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else os.WEXITSTATUS(raw)


def serve() -> None:
    import torch  # noqa: F401  (the point: imported once, before every fork)
    import torch._dynamo  # noqa: F401  (what torch.optim.Optimizer's first use imports: 1.5 s)

    import models  # noqa: F401
    import workers  # noqa: F401

    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if threads != 1:
        raise SystemExit(f"zygote_is_single_threaded: {threads} threads after importing torch; a fork would copy their locks")
    requests = sys.stdin.buffer
    answers = sys.stdout
    exits: Dict[int, str] = {}
    line = b""
    while True:
        ready, _, _ = select.select([requests], [], [], 0.02)
        while exits:
            pid, raw = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            path = exits.pop(pid, None)
            if path is not None:
                with open(path + ".tmp", "w") as f:
                    f.write(str(_status(raw)))
                os.replace(path + ".tmp", path)
        if not ready:
            continue
        chunk = os.read(requests.fileno(), 65536)
        if not chunk:  # the test session ended
            return
        line += chunk
        while b"\n" in line:
            one, line = line.split(b"\n", 1)
            req = json.loads(one)
            pid = os.fork()
            if pid == 0:
                _child(req)
            exits[pid] = str(req["exit"])
            answers.write(f"{pid}\n")
            answers.flush()


if __name__ == "__main__":
    serve()
