"""NCCL's rules kept by zero_torch's own use of torch's process group (issue 48, item 4).

torch's NCCL backend serves CUDA tensors only; zero's host-side collectives (rank 0's
model to every rank, ``GatheredParameters`` before an engine, transformers' ZeRO-3 loading,
every rank's word on a save) move CPU tensors and pickled objects,
so they must never cross a group that is not gloo. Without GPUs, ``nccl_rules.py``'s
backend keeps the rule: gloo registered for CUDA only, so every CPU tensor sent over it
fails as over NCCL. ``nccl_rules_workers.run`` drives each such path of zero_torch under it
and under plain gloo, 2 processes, stages 0 and 3: both run, with the same numbers, where
before these paths broadcast CPU tensors over torch's default group.

Checked by reading, the call sites of ``torch.distributed`` in zero_torch (2026-11-28):
``_dist.broadcast_tensors`` (``broadcast_model``, ``GatheredParameters`` before an engine),
``_dist.failed_ranks``, ``_dist.broadcast_text``
(``save_hf_checkpoint``'s agreement) and ``_lazy_shards.gather``/``keep_shards`` use
``_dist.host_group()`` (``_dist.id_exchange``, the engine's start-up, uses torch's store, no
collective); ``comm.py`` (``deepspeed.comm``) hands the script's own tensors to
torch as DeepSpeed does (the script chose their device); the engine's collectives
(gradient reductions, gathers, the checkpoint agreement, the shared-memory and NCCL
groups) are zero's own communicator, never torch's group (on a GPU the stand-in checks
its NCCL rules: device memory, the same order on every rank).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

WORLD = 2


@pytest.mark.parametrize("stage", [0, 3])
def test_zeros_host_side_collectives_never_send_a_cpu_tensor_over_nccl(job: Any, tmp_path: Any, stage: int) -> None:
    import nccl_rules

    runs = {}
    for backend in ("gloo", nccl_rules.NAME):
        work = tmp_path / backend
        work.mkdir()
        runs[backend] = job(WORLD, "nccl_rules_workers.run", {"backend": backend, "stage": stage, "work": str(work)},
                            timeout=600)
    rules, gloo = runs[nccl_rules.NAME], runs["gloo"]
    for r in range(WORLD):
        # The double refuses what NCCL refuses: a CPU tensor on the default group.
        assert rules[r]["backend"] == nccl_rules.NAME
        assert "No backend type associated with device type cpu" in rules[r]["cpu_collective"], rules[r]["cpu_collective"]
        assert gloo[r]["cpu_collective"] == "ran"
        # zero's paths ran under it, with gloo's numbers.
        assert rules[r]["losses"] == gloo[r]["losses"], (rules[r]["losses"], gloo[r]["losses"])
        assert rules[r]["losses_loaded"] == gloo[r]["losses_loaded"]
        # transformers' ZeRO-3 loading keeps a shard per rank on a non-gloo group too.
        assert rules[r]["loaded_placeholders"] and gloo[r]["loaded_placeholders"]
        for key in ("params", "loaded"):
            for n, t in gloo[r][key].items():
                assert torch.equal(rules[r][key][n], t), (key, n)
    # Every rank started from rank 0's model, and rank 0's writes reached every rank.
    for key in ("params", "loaded"):
        for n, t in rules[0][key].items():
            assert torch.equal(rules[1][key][n], t), (key, n)
    assert all(dev == "cpu" for dev, _ in rules[0]["consolidated"].values()), rules[0]["consolidated"]
    assert rules[1]["consolidated"] == {}
