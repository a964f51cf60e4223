"""A LoRA-style frozen base at stage 3 (``models.freeze_base``: the tiny Llama's
projections and embedding frozen, its norms and head trained), as PEFT fine-tuning runs:
the frozen weights are partitioned like the trained ones, as DeepSpeed 0.19.8 partitions
them, so each of N ranks holds about 1/N of them (``memory_report()["frozen"]``; before,
every rank held them whole). Training is unchanged: stage 3 gives stage 2's losses and
parameters bit for bit, and DeepSpeed's within ``test_deepspeed.py``'s bounds (1e-5
relative on every loss; every parameter within 1e-5 or twice DeepSpeed's own distance
between its stages 1 and 3)."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
import torch

STEPS = 10
BATCH = 4


@pytest.fixture(scope="module")
def two(job: Any) -> Dict[str, List[Dict[str, Any]]]:
    todo = [{"model": "llama", "stage": s, "dtype": "fp32", "gas": 1, "steps": STEPS, "global_batch": BATCH, "frozen": True} for s in (2, 3)]
    zero = job(2, "train_many", {"runs": todo})
    ds = job(2, "deepspeed_many", {"stages": [1, 3], "steps": STEPS, "global_batch": BATCH, "frozen": True})
    return {"zero": [zero[0]["runs"], zero[1]["runs"]], "deepspeed": [ds[0]["runs"], ds[1]["runs"]]}


def test_stage_3_partitions_the_frozen_base_and_trains_to_stage_2s_bits(two: Dict[str, Any]) -> None:
    for rank in range(2):
        s2, s3 = two["zero"][rank]
        assert s3["losses"] == s2["losses"], rank
        for n, t in s2["params"].items():
            assert torch.equal(s3["params"][n], t), f"rank {rank}: {n}"
        whole, held = s2["memory"]["frozen"], s3["memory"]["frozen"]
        ds_held = two["deepspeed"][rank][1]["frozen_held"]
        print(f"rank {rank}: frozen bytes held at stage 2 {whole}, stage 3 {held}, DeepSpeed's stage 3 {ds_held}")
        # Half of the frozen base, plus the partitions' alignment padding (512 bytes each).
        assert 2 * held <= whole * 1.1, (held, whole)
        assert held <= ds_held * 1.1, (held, ds_held)


def test_stage_3_with_a_frozen_base_trains_as_deepspeed(two: Dict[str, Any]) -> None:
    zero, ds = two["zero"][0][1], two["deepspeed"][0][1]
    rel = max(abs(a - b) / abs(b) for a, b in zip(zero["losses"], ds["losses"]))
    ds1 = two["deepspeed"][0][0]["params"]
    own = max((ds1[n] - t).abs().max().item() for n, t in ds["params"].items())
    diffs = {n: (zero["params"][n] - t).abs().max().item() for n, t in ds["params"].items()}
    worst = max(diffs.values())
    print(f"frozen base, stage 3: losses within {rel:.2g} relative, parameters within {worst:.2g} of DeepSpeed's (its own stage 1 to 3: {own:.2g})")
    assert rel <= 1e-5, (zero["losses"], ds["losses"])
    assert worst <= max(1e-5, 2 * own), (worst, own)


def test_four_ranks_hold_a_quarter_of_the_frozen_base(job: Any) -> None:
    todo = [{"model": "llama", "stage": s, "dtype": "bf16", "gas": 1, "steps": 2, "global_batch": BATCH, "frozen": True} for s in (2, 3)]
    res = job(4, "train_many", {"runs": todo})
    for rank, r in enumerate(res):
        s2, s3 = r["runs"]
        assert s3["losses"] == s2["losses"], rank
        whole, held = s2["memory"]["frozen"], s3["memory"]["frozen"]
        print(f"rank {rank} of 4: frozen bytes held at stage 2 {whole}, stage 3 {held}")
        assert 4 * held <= whole * 1.25, (held, whole)
