"""zero_torch under every launcher's variables, with torch's process group beside zero's
own: ``initialize`` creates torch's default group when the script has none (as DeepSpeed's
does), reuses the script's when it has one, and the engine's ranks get rank 0's id
through torch's store, so zero opens no port beside torch's store on ``MASTER_PORT``
(under the ``deepspeed`` launcher nothing else serves it). Each case runs 2 real
processes that train two steps and check the group works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

import pytest

from conftest import LAUNCH_VARS, HERE, free_port

SCRIPT = r"""
import json, os, sys, torch
import torch.distributed as dist
import zero_torch
mode = sys.argv[1]
if mode == "script_group":
    # The script starts torch's group itself on MASTER_PORT, as many DeepSpeed scripts do.
    dist.init_process_group("gloo")
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
cfg = {"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
       "zero_optimization": {"stage": 2}}
engine, _, _, _ = zero_torch.initialize(model=model, config=cfg)
x = torch.randn(2, 4)
for _ in range(2):
    loss = engine(x).pow(2).mean()
    engine.backward(loss)
    engine.step()
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.item(),
                  "backend": dist.get_backend(), "zero_world": engine.world_size}), flush=True)
if mode == "script_group":
    dist.destroy_process_group()  # the script's own group is the script's to close
"""


def launch(world: int, variables: Dict[str, str], mode: str) -> List[Dict[str, object]]:
    """``world`` processes with the launcher variables ``variables`` (``{rank}`` filled
    in per process); each prints one JSON line."""
    port = str(free_port())
    procs = []
    for r in range(world):
        env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
        env.update({k: v.format(rank=r, world=world, port=port) for k, v in variables.items()})
        env["PYTHONPATH"] = os.pathsep.join([str(HERE)] + sys.path)
        env["OMP_NUM_THREADS"] = "1"
        procs.append(subprocess.Popen([sys.executable, "-c", SCRIPT, mode], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    out = []
    for p in procs:
        try:
            log, _ = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError("a rank did not finish in 240 s")
        text = log.decode(errors="replace")
        assert p.returncode == 0, text[-3000:]
        out.append(json.loads(text.strip().splitlines()[-1]))
    return out


TORCHRUN = {"RANK": "{rank}", "WORLD_SIZE": "{world}", "LOCAL_RANK": "{rank}", "LOCAL_WORLD_SIZE": "{world}",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "{port}"}
LAUNCHERS = {
    # The deepspeed launcher's variables: no agent store, so MASTER_PORT is free for the
    # first comer.
    "deepspeed": TORCHRUN,
    "slurm": {"SLURM_PROCID": "{rank}", "SLURM_NTASKS": "{world}", "SLURM_LOCALID": "{rank}",
              "SLURM_JOB_ID": "4242", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "{port}"},
    "mpirun": {"OMPI_COMM_WORLD_RANK": "{rank}", "OMPI_COMM_WORLD_SIZE": "{world}",
               "OMPI_COMM_WORLD_LOCAL_RANK": "{rank}", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "{port}"},
}


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
@pytest.mark.parametrize("mode", ["initialize_makes_the_group", "script_group"])
def test_torchs_group_and_zeros_rendezvous_side_by_side(launcher: str, mode: str) -> None:
    if mode == "script_group" and launcher != "deepspeed":
        pytest.skip("a script's own init_process_group needs RANK/WORLD_SIZE (torchrun's or deepspeed's variables)")
    results = launch(2, LAUNCHERS[launcher], mode)
    for r in results:
        assert r["world"] == 2 and r["zero_world"] == 2 and r["sum"] == 3.0, r
        assert r["backend"] == "gloo", r


def store_exchange(withhold: bool) -> Dict[str, object]:
    """One rank of ``test_rank_zeros_id_goes_through_torchs_store`` (run by ``job``)."""
    import time

    import torch.distributed as dist

    from zero_torch import _dist

    dist.init_process_group("gloo")
    first, second = _dist.id_exchange(), _dist.id_exchange()
    assert first is not None and second is not None
    if dist.get_rank() == 0:
        if withhold:
            time.sleep(6)
            return {}
        # The second engine's id is published first: each engine has its own key.
        return {"second": second(bytes([2, 0]) * 64, 30.0).hex(), "first": first(bytes([1, 0]) * 64, 30.0).hex()}
    started = time.time()
    try:
        return {"first": first(None, 2.0 if withhold else 30.0).hex(), "second": second(None, 30.0).hex()}
    except Exception as e:
        return {"raised": type(e).__name__, "text": str(e), "after_s": time.time() - started}


@pytest.mark.parametrize("withhold", [False, True])
def test_rank_zeros_id_goes_through_torchs_store(job: Any, withhold: bool) -> None:
    """Where torch's group exists, the engine's ranks get rank 0's id (the shared-memory
    group's nonce, NCCL's unique id) through torch's store, one key per engine, instead of a
    port of zero's own; a rank 0 that never publishes it is an error naming the key on
    every other rank within the timeout."""
    results = job(2, "test_launchers.store_exchange", {"withhold": withhold})
    if not withhold:
        for r in results:
            assert r == {"first": (bytes([1, 0]) * 64).hex(), "second": (bytes([2, 0]) * 64).hex()}, r
        return
    r = results[1]
    assert r.get("raised") == "CommError", r
    assert "rank 0 did not publish 'zero_torch/engine/1/id' in torch's store within 2 s" in r["text"], r
    assert r["after_s"] < 5.0, r
