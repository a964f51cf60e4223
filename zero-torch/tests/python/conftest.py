"""Shared by zero_torch's tests: starting jobs of N processes (each a rank, with the
variables torchrun sets) that run a function of ``workers.py`` and return its result."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

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
        procs.append(subprocess.Popen(
            [sys.executable, "-c", "import workers; workers.main()"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        ))
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
            log, _ = p.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            log, _ = p.communicate()
            raise JobFailed(f"rank {r} of `{task}` did not finish in {timeout} s:\n{log.decode(errors='replace')[-4000:]}")
        logs.append(log.decode(errors="replace"))
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
    return results


@pytest.fixture(scope="session")
def job():
    return run_job
