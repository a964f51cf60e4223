"""Offload and overlap from the config, as in Rust: ``offload_optimizer`` (cpu, nvme),
``offload_param`` (nvme, stage 3) and ``overlap_comm`` only move where state lives and
when reductions run, never what is computed. On 2 processes, the tiny Llama in bf16 with
2 accumulation steps trains to the same bits as without them."""

from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, List

import pytest
import torch

STEPS = 3
BATCH = 8


def _run(stage: int, extra: Dict[str, Any]) -> Dict[str, Any]:
    return {"model": "llama", "stage": stage, "dtype": "bf16", "gas": 2, "steps": STEPS,
            "global_batch": BATCH, "extra": {"zero_optimization": extra}}


@pytest.mark.parametrize("stage", [2, 3])
def test_offload_and_overlap_give_the_same_bits(job: Any, stage: int) -> None:
    with tempfile.TemporaryDirectory(prefix="zt-nvme-") as nvme:
        variants: List[Dict[str, Any]] = [
            {},
            {"overlap_comm": True},
            {"offload_optimizer": {"device": "cpu"}},
            {"offload_optimizer": {"device": "nvme", "nvme_path": nvme}},
        ]
        if stage == 3:
            variants.append({"offload_optimizer": {"device": "nvme", "nvme_path": nvme},
                             "offload_param": {"device": "nvme", "nvme_path": nvme}})
        ranks = job(2, "train_many", {"runs": [_run(stage, v) for v in variants]})
        left = [os.path.join(d, f) for d, _, fs in os.walk(nvme) for f in fs]
    assert left == [], f"swap files left behind: {left}"
    for rank in ranks:
        base = rank["runs"][0]
        for v, got in zip(variants[1:], rank["runs"][1:]):
            assert got["losses"] == base["losses"], v
            for n, t in base["params"].items():
                assert torch.equal(got["params"][n], t), f"{v}: {n}"
    print(f"stage {stage}: {len(variants) - 1} offload/overlap variants equal to the bit on both ranks")
