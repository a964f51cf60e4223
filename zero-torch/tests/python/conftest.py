"""Shared by zero_torch's tests: starting jobs of N processes (each a rank, with the
variables torchrun sets) that run a function of ``workers.py`` and return its result.
Ranks are forked from a zygote that has imported torch once (``zygote.py``;
``ZT_NO_ZYGOTE=1`` starts each fresh)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

HERE = Path(__file__).resolve().parent
# The tests choose their device: the CPU unless a test moves the model to a GPU (as
# DeepSpeed, zero_torch would otherwise train on a GPU wherever torch sees one).
os.environ.setdefault("DS_ACCELERATOR", "cpu")
# Deterministic cuBLAS for the GPU tests that compare bits (torch.use_deterministic_algorithms).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
LAUNCH_VARS = [
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "ZERO_RENDEZVOUS_PORT",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "ZERO_JOB_ID",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JobFailed(AssertionError):
    pass


def run_job(
    world: int,
    task: str,
    args: Optional[Dict[str, Any]] = None,
    timeout: float = 600.0,
    kill_rank: Optional[int] = None,
    kill_after: float = 0.0,
    expect_ok: bool = True,
    env: Optional[Dict[str, str]] = None,
) -> List[Dict[str, Any]]:
    """Runs ``workers.<task>(**args)`` on ``world`` processes; returns each rank's result
    (or ``{"error": ..., "exception": ...}`` where it raised). Every process is killed
    after ``timeout`` seconds. With ``kill_rank``, that rank gets SIGKILL ``kill_after``
    seconds after it says it is ready. ``task`` may name a function of another test module
    (``"module.function"``); ``env`` adds variables to every process."""
    port = free_port()
    out = Path(tempfile.mkdtemp(prefix="zt-job-"))
    extra = dict(env or {})
    procs = []
    started = time.time()
    for r in range(world):
        env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
        env.update({
            "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
            "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "ZT_TASK": task, "ZT_OUT": str(out),
            "ZT_ARGS": json.dumps(args or {}), "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(HERE)] + sys.path),
        })
        env.update(extra)
        procs.append(_start_rank(env, out / f"log{r}", fork=not any(k.startswith(FORK_UNSAFE) for k in extra)))
    if kill_rank is not None:
        ready = out / f"ready{kill_rank}"
        deadline = time.time() + timeout
        while not ready.exists() and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(kill_after)
        procs[kill_rank].kill()
    results: List[Dict[str, Any]] = []
    logs = []
    deadline = time.time() + timeout
    for r, p in enumerate(procs):
        try:
            p.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            p.wait()
            raise JobFailed(f"rank {r} of `{task}` did not finish in {timeout} s:\n{p.log()[-4000:]}")
        logs.append(p.log())
        f = out / f"rank{r}.pkl"
        if f.exists():
            with open(f, "rb") as fh:
                results.append(pickle.load(fh))
        else:
            results.append({"error": f"no result (exit code {p.returncode})", "log": logs[-1][-4000:]})
    if expect_ok:
        for r, res in enumerate(results):
            if r == kill_rank:
                continue
            if "error" in res:
                raise JobFailed(f"rank {r} of `{task}` failed: {res['error']}\n{res.get('log', logs[r][-4000:])}")
    JOBS.append((world, time.time() - started, all(p.popen is None for p in procs)))
    return results


FORK_UNSAFE = ("PYTHON", "TORCH", "OMP", "MKL", "KMP", "CUDA", "LD_", "MALLOC", "GLIBC")
"""A job whose added variables start so gets fresh processes: they could change how the
interpreter or torch starts, which a forked rank has already done (``zygote.py``)."""

SCRIPT_FORK_SAFE = ("PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE")
"""Variables of :func:`run_script`'s environment a forked rank honours itself: the zygote's
path already holds the suite's folders, and the other two it applies (``zygote.py``)."""

JOBS: List[Tuple[int, float, bool]] = []
"""(ranks, seconds, forked from the zygote) of every job this session ran: the closing summary's figures."""


class _Rank:
    """One rank's process, whether forked by the zygote or started fresh: ``wait``,
    ``kill``, ``returncode`` and ``log`` as ``Popen`` would give them."""

    def __init__(self, pid: int, exit_file: Path, log_file: Path, popen: Optional[subprocess.Popen] = None):
        self.pid, self.exit_file, self.log_file, self.popen = pid, exit_file, log_file, popen
        self.returncode: Optional[int] = None

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.popen is not None:
            self.returncode = self.popen.wait(timeout=timeout)
            return self.returncode
        deadline = None if timeout is None else time.time() + timeout
        pause = 0.002
        while not self.exit_file.exists():
            if deadline is not None and time.time() > deadline:
                raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout or 0.0)
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        self.returncode = int(self.exit_file.read_text())
        return self.returncode

    def kill(self) -> None:
        if self.popen is not None:
            self.popen.kill()
        elif not self.exit_file.exists():
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""


_ZYGOTES: Dict[str, subprocess.Popen] = {}
"""This session's zygotes by flavor (``zygote.FLAVORS``), each started on first use."""


def _zygote(flavor: str) -> Optional[subprocess.Popen]:
    """This session's zygote of ``flavor`` (``zygote.py``), started on first use; ``None``
    where it cannot run (no ``fork``, or ``ZT_NO_ZYGOTE`` is set) or has died (then the
    ranks it would serve start fresh)."""
    if os.environ.get("ZT_NO_ZYGOTE") or not hasattr(os, "fork"):
        return None
    z = _ZYGOTES.get(flavor)
    if z is not None:
        return z if z.poll() is None else None
    _ZYGOTES[flavor] = subprocess.Popen([sys.executable, "-c", f"import zygote; zygote.serve({flavor!r})"],
                                        env=_zygote_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    return _ZYGOTES[flavor]


def _zygote_env() -> Dict[str, str]:
    """A zygote's environment: this process's, less the launcher's variables."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(HERE)] + sys.path)})
    return env


def _start_rank(env: Dict[str, str], log: Path, fork: bool, flavor: str = "",
                argv: Optional[List[str]] = None, cwd: Optional[Path] = None) -> _Rank:
    """One rank: ``workers.main()``, or with ``argv`` the script ``argv[0]`` as
    ``__main__`` in the folder ``cwd``."""
    exit_file = log.with_name(log.name + ".exit")
    z = _zygote(flavor) if fork else None
    if z is not None and z.stdin is not None and z.stdout is not None:
        req: Dict[str, Any] = {"env": env, "log": str(log), "exit": str(exit_file)}
        if argv is not None:
            req.update({"argv": argv, "cwd": str(cwd or Path.cwd())})
        z.stdin.write((json.dumps(req) + "\n").encode())
        z.stdin.flush()
        answer = z.stdout.readline()
        if answer.strip():
            return _Rank(int(answer), exit_file, log)
    cmd = [sys.executable, *argv] if argv is not None else [sys.executable, "-c", "import workers; workers.main()"]
    with open(log, "wb") as fh:
        popen = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT)
    return _Rank(popen.pid, exit_file, log, popen)


def torchrun_env(rank: int, world: int, port: int) -> Dict[str, str]:
    """The variables ``torchrun --nproc-per-node <world>`` gives worker ``rank`` on one
    machine (torch 2.11's elastic agent), except that rank 0 serves the store itself
    (``TORCHELASTIC_USE_AGENT_STORE=False``: there is no agent)."""
    return {
        "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
        "ROLE_NAME": "default", "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
        "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "1",
    }


TORCHRUN_VARS = list(torchrun_env(0, 1, 0))


def run_script(world: int, argv: List[str], env: Dict[str, str], cwd: Path, log: Path,
               timeout: float, flavor: str = "deepspeed") -> int:
    """Runs the script ``argv[0]`` (with its arguments) on ``world`` ranks, each with
    ``env`` and torchrun's variables (:func:`torchrun_env`), forked from the zygote of
    ``flavor`` (real DeepSpeed already imported: for DeepSpeed's reference runs, whose
    launcher changes nothing they compute). Each rank's output is appended to ``log``;
    returns 0, or the exit status of the first rank that failed (the others are then
    killed, as torchrun's agent does), or -9 when ``timeout`` seconds passed (every rank
    killed). ``PYTHONUNBUFFERED`` and ``PYTHONDONTWRITEBYTECODE`` in
    ``env`` take effect in a forked rank too (``zygote.py``)."""
    port = free_port()
    started = time.time()
    zygote_env = _zygote_env()
    own = Path(tempfile.mkdtemp(prefix="zt-script-"))  # each rank's log and exit file, this run's only
    ranks = []
    for r in range(world):
        renv = {k: v for k, v in env.items() if k not in LAUNCH_VARS and k not in TORCHRUN_VARS}
        renv.update(torchrun_env(r, world, port))
        unsafe = [k for k in set(renv) | set(zygote_env) if k.startswith(FORK_UNSAFE)
                  and k not in SCRIPT_FORK_SAFE and k not in TORCHRUN_VARS and zygote_env.get(k) != renv.get(k)]
        ranks.append(_start_rank(renv, own / f"log{r}", fork=not unsafe, flavor=flavor, argv=argv, cwd=cwd))
    deadline = time.time() + timeout
    codes: List[Optional[int]] = [None] * world
    while None in codes:
        for r, p in enumerate(ranks):
            if codes[r] is None:
                try:
                    codes[r] = p.wait(timeout=0)
                except subprocess.TimeoutExpired:
                    pass
        if None in codes and (any(c for c in codes) or time.time() > deadline):
            # A rank failed, or the time is up: the others are stopped, as torchrun's agent
            # stops a failed worker's peers (they would wait for it until their timeout).
            for r, p in enumerate(ranks):
                if codes[r] is None:
                    p.kill()
                    codes[r] = p.wait(timeout=60)
            break
        time.sleep(0.05)
    with open(log, "a", errors="replace") as out:
        for r, p in enumerate(ranks):
            out.write(f"[rank {r}]\n{p.log()}")
    shutil.rmtree(own, ignore_errors=True)
    JOBS.append((world, time.time() - started, all(p.popen is None for p in ranks)))
    return next((c for c in codes if c not in (0, -9)), next((c for c in codes if c), 0))  # type: ignore[return-value]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Where the suite's time goes (issue 49, item 7): jobs, ranks, seconds in them."""
    if JOBS:
        ranks = sum(w for w, _, _ in JOBS)
        forked = sum(1 for _, _, f in JOBS if f)
        terminalreporter.write_line(f"jobs: {len(JOBS)} of {ranks} ranks ({forked} forked from the zygote), "
                                    f"{sum(t for _, t, _ in JOBS):.0f} s in them")


def pytest_sessionfinish(session: Any) -> None:
    for z in _ZYGOTES.values():
        for pipe in (z.stdin, z.stdout):
            if pipe is not None:
                pipe.close()
        try:
            z.wait(timeout=10)
        except subprocess.TimeoutExpired:
            z.kill()


@pytest.fixture(scope="session")
def job():
    return run_job
