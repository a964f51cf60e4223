"""What DeepSpeed-Chat, Lightning, PEFT and TRL read or do around DeepSpeed's engine,
run on DeepSpeed 0.19.8 itself and on zero_torch (``protocol_workers.py``, 2 processes,
fp32), compared:

- a scheduler taken back (``engine.lr_scheduler = None``, Lightning) is not stepped by the
  engine, one assigned in its place is; no torch "lr_scheduler.step() before
  optimizer.step()" warning where DeepSpeed gives none;
- the ZeRO-3 parameter protocol (``ds_id``, ``ds_status``, ``ds_shape``, ``ds_numel``,
  ``ds_persist``, ``ZeroParamStatus``) at the moments client code reads it, and none of it
  below stage 3;
- ``GatheredParameters`` over what DeepSpeed accepts (``None`` entries, tuples,
  generators, one tensor, ``None``), before and after the engine exists;
- DeepSpeed-Chat's surface: ``deepspeed.compression.helper``, ``memory_efficient_linear:
  false``, ``offload_param`` below stage 3, ``engine.tput_timer``'s counters.

Where zero does what DeepSpeed cannot, zero alone is checked: parameters pickle as plain
torch parameters of their full shape, loadable with ``torch.load(weights_only=True)``
where zero_torch is not installed (DeepSpeed cannot pickle its parameters at all), and a
partitioned one is a named error.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

import pytest
import torch

WORLD = 2
CASES: List[List[Any]] = [
    ["scheduler", 0], ["scheduler", 3],
    ["protocol", 2], ["protocol", 3],
    ["gathered", 1], ["gathered", 3],
    ["surface", 0], ["surface", 2],
]


@pytest.fixture(scope="module")
def runs(job: Any) -> Dict[str, List[Dict[str, Any]]]:
    ds = job(WORLD, "protocol_workers.run", {"lib": "deepspeed", "cases": CASES}, timeout=900)
    zero = job(WORLD, "protocol_workers.run", {"lib": "zero", "cases": CASES}, timeout=900)
    return {"deepspeed": ds, "zero": zero}


def _rel(a: List[float], b: List[float]) -> float:
    assert len(a) == len(b), (a, b)
    return max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)), default=0.0)


@pytest.mark.parametrize("stage", [0, 3])
def test_scheduler_taken_back_is_not_stepped_by_the_engine(runs: Dict[str, Any], stage: int) -> None:
    for r in range(WORLD):
        ds, zero = runs["deepspeed"][r][f"scheduler@{stage}"], runs["zero"][r][f"scheduler@{stage}"]
        print(f"rank {r}: lrs {zero['lrs']} (DeepSpeed {ds['lrs']})")
        # Lightning's loop: gamma 0.5 once per step, then StepLR's 0.1 once per step.
        assert zero["lrs"] == ds["lrs"]
        assert zero["lrs"][:2] == [0.005, 0.0025]
        assert _rel(zero["losses"], ds["losses"]) <= 1e-6
        assert zero["returned_same"] and ds["returned_same"]
        assert zero["order_warnings"] == ds["order_warnings"] == []


@pytest.mark.parametrize("stage", [2, 3])
def test_zero3_parameter_protocol_is_deepspeeds(runs: Dict[str, Any], stage: int) -> None:
    for r in range(WORLD):
        ds, zero = runs["deepspeed"][r][f"protocol@{stage}"], runs["zero"][r][f"protocol@{stage}"]
        assert zero["status_names"] == ds["status_names"] and zero["status_values"] == ds["status_values"]
        same = ["has_ds_id", "in_forward", "after_step"]
        if stage == 3:
            same += ["shape", "numel", "persist", "to_fetch", "inside", "after_gather", "empty_after",
                     "ids_in_order", "is_status"]
        for key in same:
            assert zero[key] == ds[key], (key, zero[key], ds[key])
        if stage == 3:
            assert zero["to_fetch"], "nothing was partitioned"
            assert all(s == "AVAILABLE" for s in zero["inside"].values())
            assert zero["held_attr"] == zero["held"]
    if stage == 3:
        # zero partitions buckets, not parameters: a rank holds its piece of the bucket
        # partition (the pieces make up the parameter) or, kept whole, all of it.
        zero = [runs["zero"][r]["protocol@3"] for r in range(WORLD)]
        for name, numel in zero[0]["numel"].items():
            held = [z["held"][name] for z in zero]
            if zero[0]["persist"][name]:
                assert held == [numel] * WORLD, (name, held)
            else:
                assert sum(held) == numel, (name, held)
        print("zero's pieces:", zero[0]["held"], zero[1]["held"])
        print("DeepSpeed's partitions:", runs["deepspeed"][0]["protocol@3"]["held"])


@pytest.mark.parametrize("stage", [1, 3])
def test_gathered_parameters_takes_what_deepspeed_takes(runs: Dict[str, Any], stage: int) -> None:
    for r in range(WORLD):
        ds, zero = runs["deepspeed"][r][f"gathered@{stage}"], runs["zero"][r][f"gathered@{stage}"]
        # The same training up to rank 0's write (DeepSpeed at stage 3 loses that write at its next
        # step: it changes the 16-bit parameter, not the fp32 master weights; below stage 3 it does
        # not even broadcast it; zero keeps it on every rank).
        assert _rel(zero["losses"][:1], ds["losses"][:1]) <= 1e-6
        assert zero["whole_inside"][0] == (16, 8)
        assert (zero["mid"] - 0.25).abs().max().item() < 0.05
        assert torch.equal(zero["mid"], runs["zero"][0][f"gathered@{stage}"]["mid"])


@pytest.mark.parametrize("stage", [0, 2])
def test_deepspeed_chat_surface(runs: Dict[str, Any], stage: int) -> None:
    for r in range(WORLD):
        ds, zero = runs["deepspeed"][r][f"surface@{stage}"], runs["zero"][r][f"surface@{stage}"]
        assert _rel(zero["losses"], ds["losses"]) <= 1e-6
        assert zero["counters"] == ds["counters"]
        assert zero["helper_warned"] == ds["helper_warned"]
        assert zero["avg_is_float"] and ds["avg_is_float"]


def _load_without_zero_torch(path: str) -> Dict[str, Any]:
    """``torch.load(path, weights_only=True)`` in a Python where zero_torch is not
    importable (torch only): ``{name: (type name, shape, dtype)}``."""
    site = os.environ.get("ZERO_TORCH_SITE")
    if not site:
        pytest.skip("ZERO_TORCH_SITE is not set (torch's folder without zero_torch)")
    code = (
        "import importlib.util, sys, torch\n"
        "assert importlib.util.find_spec('zero_torch') is None, 'zero_torch is importable'\n"
        f"d = torch.load({path!r}, weights_only=True)\n"
        "print(repr({k: (type(v).__name__, tuple(v.shape), str(v.dtype), sorted(getattr(v, '__dict__', {}))) "
        "for k, v in d.items()}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = site
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    import ast

    return ast.literal_eval(got.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("stage", [2, 3])
def test_parameters_pickle_whole_and_load_without_zero_torch(job: Any, stage: int) -> None:
    out = tempfile.mkdtemp(prefix="zt-pickle-")
    res = job(WORLD, "protocol_workers.run", {"lib": "zero", "cases": [["pickling", stage]], "out_dir": out},
              timeout=600)
    whole = res[0][f"pickling@{stage}"]["whole"]
    shapes = {n: tuple(t.shape) for n, t in whole.items()}
    for r in range(WORLD):
        got = res[r][f"pickling@{stage}"]
        if stage == 3:
            assert got["direct"].startswith("PartitionedParameterError: parameter mid.weight"), got["direct"]
            assert got["direct_is_pickling_error"]
        else:
            assert got["direct"] == "saved"
        loaded = _load_without_zero_torch(os.path.join(out, f"gathered{r}.pt"))
        assert {n: v[1] for n, v in loaded.items()} == shapes
        assert all(v[0] == "Parameter" for v in loaded.values()), loaded
        assert loaded["mid.weight"][3] == ["script_flag"], loaded["mid.weight"]
    loaded = _load_without_zero_torch(os.path.join(out, "dschat.pt"))
    assert {n: v[1] for n, v in loaded.items()} == shapes
    saved = torch.load(os.path.join(out, "dschat.pt"), weights_only=True)
    for n, t in saved.items():
        assert torch.equal(t, whole[n]), n
