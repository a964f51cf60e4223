"""Stages 0-3 on 2 and 4 processes (one rank each, as ``torchrun`` starts them), in fp32,
bf16 and fp16, with 1 and 3 accumulation steps, on the tiny Llama.

- Stages compute the same function to the bit: stages only change where state lives, and
  the engine reduces in one fixed order whatever the stage (ARCHITECTURE.md, invariant 8).
  With one micro-step per step, the losses and final parameters of stages 1-3 equal stage
  0's exactly, on every rank. With accumulation, stages 2 and 3 reduce every micro-step's
  gradients as they come (what saves their memory, as in DeepSpeed) while stages 0 and 1
  reduce the accumulated sum once: 0 and 1 agree to the bit, 2 and 3 agree to the bit,
  and the two pairs as below.
- Against one process on the same global batch (no communication), the ranks' gradients are
  averaged from halves or quarters of the batch, a few roundings apart: fp32 parameters
  agree to 1e-5 after 3 steps. In bf16 and fp16 each rank's gradient is rounded to 16 bits
  before the sum, a relative 2^-9 or 2^-12; Adam divides every gradient by its own running
  size, so where a gradient is mostly rounding the step changes by up to ``lr``: two
  16-bit runs that split the batch differently drift apart by a few percent of how far
  training moved the parameters. Plain PyTorch does the same (``references.
  mixed_precision`` with the batch split as the ranks split it: 2.7-4.6% after 3 steps),
  so the distance between zero's N-process and one-process parameters must be at most
  twice PyTorch's own for the same split.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Tuple

import pytest
import torch

import models
import references
import workers

STEPS = 3
LR = 1e-2
BATCH = 12
STAGES = [0, 1, 2, 3]
MATRIX = {
    2: [("fp32", 1), ("fp32", 3), ("bf16", 1), ("bf16", 3), ("fp16", 1)],
    4: [("fp32", 1), ("fp32", 3), ("bf16", 1), ("bf16", 3)],
}


def _args(dtype: str, gas: int, stage: int) -> Dict[str, Any]:
    return {"model": "llama", "stage": stage, "dtype": dtype, "gas": gas, "steps": STEPS, "global_batch": BATCH}


@pytest.fixture(scope="module")
def results(job: Any) -> Dict[Tuple[int, str, int, int], List[Dict[str, Any]]]:
    """(world, dtype, gas, stage) -> each rank's result."""
    out: Dict[Tuple[int, str, int, int], List[Dict[str, Any]]] = {}
    for world, cases in MATRIX.items():
        todo = [_args(d, g, s) for d, g in cases for s in STAGES]
        ranks = job(world, "train_many", {"runs": todo})
        for i, a in enumerate(todo):
            out[(world, a["dtype"], a["gas"], a["stage"])] = [r["runs"][i] for r in ranks]
    one = workers.train_many([_args(d, g, 0) for d, g in sorted({c for cs in MATRIX.values() for c in cs})])
    for a, r in zip(sorted({c for cs in MATRIX.values() for c in cs}), one["runs"]):
        out[(1, a[0], a[1], 0)] = [r]
    return out


CASES = [(w, d, g) for w, cs in MATRIX.items() for d, g in cs]


@pytest.mark.parametrize("world,dtype,gas", CASES)
def test_stages_compute_the_same_bits(results: Dict[Any, Any], world: int, dtype: str, gas: int) -> None:
    for stage in STAGES:
        base_stage = 0 if gas == 1 or stage < 2 else 2
        base = results[(world, dtype, gas, base_stage)]
        got = results[(world, dtype, gas, stage)]
        for rank in range(world):
            assert got[rank]["losses"] == base[rank]["losses"], f"stage {stage} rank {rank} losses"
            for n, t in base[0]["params"].items():
                assert torch.equal(got[rank]["params"][n], t), f"stage {stage} rank {rank}: {n}"
    same = "stages 0-3" if gas == 1 else "stages 0-1, and 2-3,"
    print(f"{world} processes, {dtype}, gas {gas}: {same} equal to the bit on every rank")
    if gas > 1:
        said = close(results[(world, dtype, gas, 2)][0]["params"], results[(world, dtype, gas, 0)][0]["params"], dtype, gas, world)
        print(f"  stages 2-3 against 0-1: {said}")


def drift(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor], dtype: str) -> float:
    """How far apart two runs' parameters are, over how far ``b`` moved from the start."""
    init = {n: p.detach().to(references.DTYPES[dtype]).float() for n, p in models.build("llama").named_parameters()}
    apart = math.sqrt(sum(((a[n] - r) ** 2).sum().item() for n, r in b.items()))
    moved = math.sqrt(sum(((r - init[n]) ** 2).sum().item() for n, r in b.items()))
    assert moved > 0
    return apart / moved


def close(got: Dict[str, torch.Tensor], ref: Dict[str, torch.Tensor], dtype: str, gas: int, split: int) -> str:
    """Asserts ``got`` (``split`` ranks) is within the module's tolerance of ``ref`` (one
    rank); says by how much."""
    if dtype == "fp32":
        worst = max((got[n] - r).abs().max().item() for n, r in ref.items())
        assert worst <= 1e-5, worst
        return f"max difference {worst:.2g} (bound 1e-5)"
    whole, _, _ = references.mixed_precision("llama", dtype, STEPS, BATCH, LR, gas=gas)
    parts, _, _ = references.mixed_precision("llama", dtype, STEPS, BATCH, LR, gas=gas, split=split)
    natural = drift(parts, whole, dtype)
    ours = drift(got, ref, dtype)
    assert ours <= 2 * natural, (ours, natural)
    return f"drift {ours:.2%} of the distance moved; PyTorch's own for this split {natural:.2%}"


@pytest.mark.parametrize("world,dtype,gas", CASES)
def test_matches_one_process(results: Dict[Any, Any], world: int, dtype: str, gas: int) -> None:
    said = close(results[(world, dtype, gas, 0)][0]["params"], results[(1, dtype, gas, 0)][0]["params"], dtype, gas, world)
    print(f"{world} processes, {dtype}, gas {gas} against one process: {said}")
    # Per-rank memory: stage 3 holds a 1/world share of the model states.
    m0 = results[(world, dtype, gas, 0)][0]["memory"]["model_states"]
    m3 = results[(world, dtype, gas, 3)][0]["memory"]["model_states"]
    assert m3 < m0 * (1.5 / world), (m0, m3)
