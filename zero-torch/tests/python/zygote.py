"""Ranks started by forking a process that has already imported torch (CI time, issue 49 item
7): a job's rank would otherwise spend about 3 s importing torch and, at its first
optimizer, ``torch._dynamo``, and the suite starts hundreds of ranks. The zygote is what
Python's ``forkserver`` is, made to keep ``conftest.run_job``'s contract: each rank gets
its own environment (the launcher's variables), its output in a log file and its exit
status as ``Popen`` reports it (negative for a signal).

Imported before the fork: torch (with ``torch._dynamo``, which every optimizer's
construction imports), ``models``, ``workers``, and transformers with the model classes the
suite builds (``PRELOAD``: about 2.7 s of CPU per rank on 2026-12-07, paid by most of the
suite's ranks). Never zero_torch, which reads a job's variables, and DeepSpeed only in the
``deepspeed`` flavor (``FLAVORS``), which serves DeepSpeed's reference runs of the client
and Trainer suites (``conftest.run_script``: a script as ``__main__`` with torchrun's
variables); the default zygote has none, as the compat line must come before any
``deepspeed`` module (``serve`` checks it). While importing them, the zygote records every
variable Python code reads from ``os.environ`` and its value (``READ``: the Hugging Face
hub's constants, transformers' verbosity, ``HOME``, ...); a rank whose environment gives
any of them another value is not served by the fork: it execs a fresh interpreter with its
own environment (same pid, log and exit file), so what an import read is always the rank's
own. (torch's own import lists the whole environment, so it is left to the rule below.)
torch and transformers start no thread at import (with ``OMP_NUM_THREADS=1``), so the fork
is safe (``serve`` checks it). A job whose variables could change how torch's C++ side
starts, which no Python read shows (``conftest.FORK_UNSAFE``), gets fresh processes
instead.

Protocol: one JSON line per rank on the zygote's stdin (``env``, ``log``, ``exit``, and for
a script ``argv`` and ``cwd``); the zygote answers with the rank's pid, and when the rank
ends writes its exit status into the file ``exit`` (written whole, then renamed)."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import select
import sys
from typing import IO, Dict, Iterator, List, Optional

PRELOAD = (
    ("transformers", ("GPT2Config", "GPT2LMHeadModel", "LlamaConfig", "LlamaForCausalLM")),
    ("transformers.initialization", ("no_init_weights",)),
)
"""Modules imported before the fork beyond torch, ``models`` and ``workers``, with the names
taken from each (a name of transformers' lazy package imports its module)."""

FLAVORS = {
    "": (),
    "deepspeed": (("deepspeed", ()),),
}
"""What a zygote imports beyond ``PRELOAD``, by flavor: the default one no DeepSpeed (the
compat line must come first), ``deepspeed`` real DeepSpeed, for DeepSpeed's reference runs
(``conftest.run_script``)."""

READ: Dict[str, Optional[str]] = {}
"""Every variable Python code read from ``os.environ`` while the zygote imported ``PRELOAD``,
with the value it read (``None``: unset)."""


@contextlib.contextmanager
def _recording_reads() -> Iterator[None]:
    """Records into ``READ`` each variable read through ``os.environ`` (``os.getenv``,
    ``get``, ``in`` and indexing all go through ``__getitem__``). Listing the variables
    (``__iter__``) is recorded as ``"*"``, which no rank's environment can match."""
    cls = type(os.environ)
    get, walk = cls.__getitem__, cls.__iter__

    def recorded_get(self: os._Environ, key: str) -> str:  # type: ignore[type-arg]
        try:
            value = get(self, key)
        except KeyError:
            READ.setdefault(key, None)
            raise
        READ.setdefault(key, value)
        return value

    def recorded_walk(self: os._Environ) -> Iterator[str]:  # type: ignore[type-arg]
        READ["*"] = "listed"
        return walk(self)

    cls.__getitem__, cls.__iter__ = recorded_get, recorded_walk  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.__getitem__, cls.__iter__ = get, walk  # type: ignore[method-assign]


def _differs(env: Dict[str, str]) -> Optional[str]:
    """The first variable an import read whose value ``env`` changes, if any."""
    for key, value in READ.items():
        if key == "*" or env.get(key) != value:
            return key
    return None


def _child(req: Dict[str, object], answers: IO[str]) -> None:
    """The rank: its environment, its log, ``workers.main()``, then a normal interpreter
    exit (atexit handlers run, as in a fresh process). Where its environment changes a
    variable the zygote's imports read, a fresh interpreter instead (``os.execve``: the same
    pid, log and exit file)."""
    answers.close()  # this process's copy of the zygote's answers
    env: Dict[str, str] = req["env"]  # type: ignore[assignment]
    fd = os.open(str(req["log"]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    argv: Optional[List[str]] = req.get("argv")  # type: ignore[assignment]
    if argv is not None:
        os.chdir(str(req["cwd"]))
    changed = _differs(env)
    if changed is not None:
        os.write(2, f"[zygote] {changed} differs from the zygote's: a fresh interpreter\n".encode())
        os.execve(sys.executable, [sys.executable, *(argv or ["-c", "import workers; workers.main()"])], env)
    os.environ.clear()
    os.environ.update(env)
    code = 0
    try:
        if argv is not None:  # as ``python SCRIPT ARGS...`` would run it
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
            if env.get("PYTHONUNBUFFERED"):
                sys.stdout.reconfigure(write_through=True)  # type: ignore[union-attr]
                sys.stderr.reconfigure(write_through=True)  # type: ignore[union-attr]
            runpy.run_path(argv[0], run_name="__main__")
        else:
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


def serve(flavor: str = "") -> None:
    # The answers go out on a copy of stdout; stdout itself becomes stderr, so that
    # nothing an import prints can reach the test as a pid.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import torch  # noqa: F401  (the point: imported once, before every fork)
    import torch._dynamo  # noqa: F401  (what torch.optim.Optimizer's first use imports: 1.5 s)

    import models  # noqa: F401
    import workers  # noqa: F401

    with _recording_reads():
        for module, names in PRELOAD + FLAVORS[flavor]:
            loaded = importlib.import_module(module)
            for name in names:
                getattr(loaded, name)
    served = sorted(m for m in sys.modules if m == "deepspeed" or m.startswith("deepspeed."))
    if served and not flavor:
        raise SystemExit(f"zygote_imports_no_deepspeed: {served[:3]} came in with the preloaded modules")
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if threads != 1:
        raise SystemExit(f"zygote_is_single_threaded: {threads} threads after importing torch; a fork would copy their locks")
    requests = sys.stdin.buffer
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
                try:
                    with open(path + ".tmp", "w") as f:
                        f.write(str(_status(raw)))
                    os.replace(path + ".tmp", path)
                except OSError:  # its job's folder is gone: no one waits for it any more
                    pass
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
                _child(req, answers)
            exits[pid] = str(req["exit"])
            answers.write(f"{pid}\n")
            answers.flush()


if __name__ == "__main__":
    serve()
