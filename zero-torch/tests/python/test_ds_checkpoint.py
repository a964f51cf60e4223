"""zero_torch's reader of DeepSpeed 0.19.8 checkpoints (``zero_torch/_ds_checkpoint.py``)
against real DeepSpeed: one 2-process job (and one 1-process job) trains a small model with
DeepSpeed at ZeRO stages 0-3 in fp32, bf16 and fp16 (torch AdamW, DeepSpeed's FusedAdam
and CPU Adam, one and two param groups, sub-groups, round-robin gradients,
BF16_Optimizer), saves a checkpoint per case and records, from the live engine, what the
checkpoint must hold; a fresh process that never imports DeepSpeed reads them back, and
must give those values to the bit. Then the errors, on copies of those checkpoints.

The jobs are started here (``run_ds_job``, modelled on ``conftest.run_job``): each
process runs ``ds_ckpt_workers.main()``."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

import conftest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import ds_ckpt_workers  # noqa: E402


# Two processes: every stage and precision, and the optimizer wrappers DeepSpeed picks.
CASES_2: List[Dict[str, Any]] = [
    {"name": "s0_fp32", "stage": 0, "dtype": "fp32"},
    {"name": "s0_fp32_trainable_only", "stage": 0, "dtype": "fp32", "trainable_only": True},
    {"name": "s0_bf16", "stage": 0, "dtype": "bf16"},
    {"name": "s0_fp16_groups", "stage": 0, "dtype": "fp16", "groups": True},  # FP16_UnfusedOptimizer
    {"name": "s0_fp16_fused", "stage": 0, "dtype": "fp16", "fused": True},  # FP16_Optimizer, FusedAdam
    {"name": "s1_fp32", "stage": 1, "dtype": "fp32"},
    {"name": "s1_bf16", "stage": 1, "dtype": "bf16"},
    {"name": "s1_fp16", "stage": 1, "dtype": "fp16"},
    {"name": "s1_fp16_elastic", "stage": 1, "dtype": "fp16", "zero": {"elastic_checkpoint": True}},
    {"name": "s1_bf16_fp32_accum", "stage": 1, "dtype": "bf16",  # BF16_Optimizer
     "extra": {"data_types": {"grad_accum_dtype": "fp32"}}},
    {"name": "s2_fp32_groups", "stage": 2, "dtype": "fp32", "groups": True},
    {"name": "s2_bf16_fused", "stage": 2, "dtype": "bf16", "fused": True},
    {"name": "s2_fp16_round_robin", "stage": 2, "dtype": "fp16", "zero": {"round_robin_gradients": True}},
    {"name": "s2_bf16_cpu_offload", "stage": 2, "dtype": "bf16", "fused": True,  # DeepSpeedCPUAdam
     "zero": {"offload_optimizer": {"device": "cpu"}}},
    {"name": "s3_fp32_groups_subgroups", "stage": 3, "dtype": "fp32", "groups": True, "zero": {"sub_group_size": 40}},
    {"name": "s3_bf16", "stage": 3, "dtype": "bf16"},
    {"name": "s3_fp16", "stage": 3, "dtype": "fp16"},
    {"name": "s3_fp16_cpu_offload", "stage": 3, "dtype": "fp16", "fused": True,
     "zero": {"offload_optimizer": {"device": "cpu"}}},
]
# One process: the checkpoint of a single rank.
CASES_1: List[Dict[str, Any]] = [
    {"name": "w1_s0_fp16", "stage": 0, "dtype": "fp16"},
    {"name": "w1_s2_bf16", "stage": 2, "dtype": "bf16"},
    {"name": "w1_s3_fp32", "stage": 3, "dtype": "fp32"},
]
WORLD = {c["name"]: 2 for c in CASES_2} | {c["name"]: 1 for c in CASES_1}
CASE = {c["name"]: c for c in CASES_2 + CASES_1}
# Stage 0 does not name the optimizer's parameters; with frozen ones left out of an fp32
# optimizer only the caller knows which are which.
NEEDS_NAMES = {"s0_fp32_trainable_only"}


def _deepspeed_bin() -> Optional[str]:
    """The ``bin`` folder beside the installed DeepSpeed (``ninja``, for its CPU ops),
    found without importing it."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or spec.origin is None:
        return None
    b = Path(spec.origin).parent.parent / "bin"
    return str(b) if b.is_dir() else None


def run_ds_job(world: int, task: str, args: Dict[str, Any], timeout: float = 300.0) -> List[Dict[str, Any]]:
    """Runs ``ds_ckpt_workers.<task>(**args)`` on ``world`` processes with torchrun's
    variables (``conftest.run_job``), DeepSpeed on its CPU accelerator with its ``bin``
    folder on ``PATH``; returns each rank's result."""
    env = {"DS_ACCELERATOR": "cpu"}
    bin_dir = _deepspeed_bin()
    if bin_dir:
        env["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    return conftest.run_job(world, f"ds_ckpt_workers.{task}", args, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def ckpt_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case's checkpoint (``root/<name>``) and reference (``root/<name>.ref.pt``)."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("DeepSpeed is not installed: it writes the checkpoints these tests read")
    root = tmp_path_factory.mktemp("ds-ckpts")
    run_ds_job(2, "write_checkpoints", {"root": str(root), "cases": CASES_2})
    run_ds_job(1, "write_checkpoints", {"root": str(root), "cases": CASES_1})
    return root


@pytest.fixture(scope="module")
def refs(ckpt_root: Path) -> Dict[str, Dict[str, Any]]:
    return {name: torch.load(ckpt_root / f"{name}.ref.pt", weights_only=True) for name in CASE}


@pytest.fixture(scope="module")
def read_back(ckpt_root: Path, refs: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Every checkpoint read by zero_torch's reader in a fresh process without DeepSpeed."""
    names = list(CASE)
    trainable = {n: refs[n]["optimizer_order"] for n in NEEDS_NAMES}
    (res,) = run_ds_job(1, "read_checkpoints", {"root": str(ckpt_root), "names": names, "trainable": trainable})
    return res


@pytest.fixture(scope="module")
def reader() -> Any:
    return ds_ckpt_workers.load_reader()


def _copy(ckpt_root: Path, name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(ckpt_root / name, dst)
    return dst


def _tag_dir(load_dir: Path) -> Path:
    return load_dir / (load_dir / "latest").read_text().strip()


# ---------------------------------------------------------------------------------------
# The values


def test_reader_never_imports_deepspeed(read_back: Dict[str, Any]) -> None:
    assert read_back["deepspeed_imported"] is False


@pytest.mark.parametrize("name", list(CASE))
def test_matches_deepspeeds_live_engine(name: str, read_back: Dict[str, Any], refs: Dict[str, Dict[str, Any]]) -> None:
    got, ref, case = read_back[name], refs[name], CASE[name]
    assert "error" not in got, got.get("error")
    assert got["zero_stage"] == case["stage"]
    assert got["precision"] == case["dtype"]
    assert got["dp_world_size"] == WORLD[name]
    assert got["is_ds"] is True
    assert set(got["params"]) == set(ref["params"]) == set(ref["trainable"])
    for pname, want in ref["params"].items():
        have = got["params"][pname]
        for key in ("master", "exp_avg", "exp_avg_sq"):
            assert want[key] is not None, (pname, key)
            assert have[key].dtype == torch.float32, (pname, key)
            assert torch.equal(have[key], want[key]), f"{name}: {pname}.{key} differs from DeepSpeed's live engine"
    assert set(got["frozen"]) == set(ref["frozen"]) == {"gate"}
    for fname, value in ref["frozen"].items():
        assert torch.equal(got["frozen"][fname], value.to(got["frozen"][fname].dtype))
    assert got["optimizer_step"] == ref["step"]
    assert (got["global_steps"], got["global_samples"], got["skipped_steps"]) == (
        ref["global_steps"], ref["global_samples"], ref["skipped_steps"])
    assert got["global_steps"] == 3 and got["global_samples"] == 3 * 2 * WORLD[name]
    assert got["lr_scheduler"] == ref["lr_scheduler"] and got["lr_scheduler"]["last_batch_iteration"] == 2
    assert got["client_state"] == {"epoch": 3, "note": name}
    assert got["ds_config"]["zero_optimization"]["stage"] == case["stage"]
    assert torch.equal(got["module"]["buf"], ref["buf"])
    assert len(got["base_optimizer_state"]) == (1 if case["stage"] == 0 else WORLD[name])
    if case["dtype"] == "fp16":
        scaler = got["loss_scaler"]
        assert scaler["dynamic"] is True
        assert float(scaler["cur_scale"]) == ref["loss_scaler"]["cur_scale"]
        assert scaler["cur_iter"] == ref["loss_scaler"]["cur_iter"]
    else:
        assert got["loss_scaler"] is None


@pytest.mark.parametrize("name", [n for n, c in CASE.items() if c["dtype"] != "fp32" and c["stage"] < 3])
def test_16bit_weights_are_the_masters_rounded(name: str, read_back: Dict[str, Any]) -> None:
    """An independent check of the names: DeepSpeed copies each master into the model's
    16-bit weight after the step, and stages 0-2 save those weights whole."""
    got = read_back[name]
    for pname, p in got["params"].items():
        lp = got["module"][pname]
        assert torch.equal(p["master"].to(lp.dtype), lp), pname


def test_stage3_module_weights_are_empty(read_back: Dict[str, Any]) -> None:
    got = read_back["s3_bf16"]
    assert all(got["module"][n].numel() == 0 for n in list(got["params"]) + ["gate"])
    assert got["module"]["buf"].numel() == 3


# ---------------------------------------------------------------------------------------
# Options


def test_stage0_without_names_needs_trainable_names(reader: Any, ckpt_root: Path, refs: Dict[str, Dict[str, Any]]) -> None:
    """fp32 stage 0 whose optimizer left the frozen parameter out: the file does not say
    which module weights the optimizer holds."""
    with pytest.raises(reader.DeepSpeedCheckpointError, match="trainable_names"):
        reader.read_deepspeed_checkpoint(str(ckpt_root / "s0_fp32_trainable_only"))
    ck = reader.read_deepspeed_checkpoint(
        str(ckpt_root / "s0_fp32_trainable_only"), trainable_names=refs["s0_fp32_trainable_only"]["optimizer_order"])
    assert set(ck.params) == set(refs["s0_fp32_trainable_only"]["trainable"])


def test_without_optimizer_states(reader: Any, ckpt_root: Path, refs: Dict[str, Dict[str, Any]]) -> None:
    for name in ("s2_fp32_groups", "s3_bf16", "s0_fp16_fused"):
        ck = reader.read_deepspeed_checkpoint(str(ckpt_root / name), load_optimizer_states=False)
        assert ck.base_optimizer_state == [] and ck.optimizer_step is None
        for pname, p in ck.params.items():
            assert torch.equal(p.master, refs[name]["params"][pname]["master"])
            assert p.exp_avg is None and p.exp_avg_sq is None


def test_explicit_tag_and_detection(reader: Any, ckpt_root: Path, tmp_path: Path) -> None:
    load_dir = ckpt_root / "s1_fp32"
    tag = (load_dir / "latest").read_text().strip()
    assert reader.read_deepspeed_checkpoint(str(load_dir), tag).path == str(load_dir / tag)
    assert reader.is_deepspeed_checkpoint(str(load_dir), tag)
    assert not reader.is_deepspeed_checkpoint(str(load_dir), "no_such_tag")
    assert not reader.is_deepspeed_checkpoint(str(tmp_path / "nothing"))
    zero_like = _copy(ckpt_root, "s1_fp32", tmp_path)
    (_tag_dir(zero_like) / "manifest.json").write_text("{}")
    assert not reader.is_deepspeed_checkpoint(str(zero_like))


def test_error_class(reader: Any) -> None:
    assert issubclass(reader.DeepSpeedCheckpointError, RuntimeError)
    try:
        import zero_torch
    except ImportError:
        return  # the compiled extension is not built here: the reader was loaded on its own
    assert issubclass(reader.DeepSpeedCheckpointError, zero_torch.CheckpointError)


# ---------------------------------------------------------------------------------------
# Errors, on copies


def test_missing_latest_and_tag(reader: Any, ckpt_root: Path, tmp_path: Path) -> None:
    d = _copy(ckpt_root, "s1_bf16", tmp_path)
    with pytest.raises(reader.DeepSpeedCheckpointError, match=r"DeepSpeed checkpoint .*no_such_tag.*no such folder"):
        reader.read_deepspeed_checkpoint(str(d), "no_such_tag")
    (d / "latest").unlink()
    with pytest.raises(reader.DeepSpeedCheckpointError, match=r"DeepSpeed checkpoint .*latest: is missing"):
        reader.read_deepspeed_checkpoint(str(d))


@pytest.mark.parametrize("name,missing", [
    ("s2_bf16_fused", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"),
    ("s1_fp32", "zero_pp_rank_1_mp_rank_00_optim_states.pt"),
    ("s3_fp16", "zero_pp_rank_1_mp_rank_00_model_states.pt"),
    ("s3_fp16", "zero_pp_rank_1_mp_rank_00_optim_states.pt"),
    ("s0_fp32", "mp_rank_00_model_states.pt"),
])
def test_missing_rank_file(reader: Any, ckpt_root: Path, tmp_path: Path, name: str, missing: str) -> None:
    d = _copy(ckpt_root, name, tmp_path)
    (_tag_dir(d) / missing).unlink()
    with pytest.raises(reader.DeepSpeedCheckpointError, match=missing.replace(".", r"\.") + ": is missing"):
        reader.read_deepspeed_checkpoint(str(d))


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_damaged_file(reader: Any, ckpt_root: Path, tmp_path: Path, damage: str) -> None:
    d = _copy(ckpt_root, "s2_fp32_groups", tmp_path)
    f = _tag_dir(d) / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\x80\x02not a pickle" * 10)
    with pytest.raises(reader.DeepSpeedCheckpointError, match=r"zero_pp_rank_1_mp_rank_00_optim_states\.pt: cannot be"):
        reader.read_deepspeed_checkpoint(str(d))


class _RunsACommand:
    def __init__(self, func: Any, marker: Path) -> None:
        self.func, self.marker = func, marker

    def __reduce__(self) -> Any:
        return (self.func, (f"touch {self.marker}",) if self.func is os.system else (["touch", str(self.marker)],))


@pytest.mark.parametrize("func,shown", [(os.system, "system"), (subprocess.check_call, "subprocess.check_call")])
def test_disallowed_global_is_refused_unexecuted(reader: Any, ckpt_root: Path, tmp_path: Path, func: Any, shown: str) -> None:
    d = _copy(ckpt_root, "s0_fp32", tmp_path)
    f = _tag_dir(d) / "mp_rank_00_model_states.pt"
    marker = tmp_path / "executed"
    torch.save({"module": {}, "buffer_names": [], "epoch": _RunsACommand(func, marker)}, f)
    with pytest.raises(reader.DeepSpeedCheckpointError) as e:
        reader.read_deepspeed_checkpoint(str(d))
    msg = str(e.value)
    assert "DeepSpeed checkpoint" in msg and str(f) in msg and shown in msg and "nothing was executed" in msg
    assert not marker.exists()


def test_client_class_is_refused(reader: Any, ckpt_root: Path, tmp_path: Path) -> None:
    d = _copy(ckpt_root, "s2_fp32_groups", tmp_path)
    f = _tag_dir(d) / "mp_rank_00_model_states.pt"
    sd = torch.load(f, weights_only=True)
    sd["model_object"] = ds_ckpt_workers.Net()
    torch.save(sd, f)
    with pytest.raises(reader.DeepSpeedCheckpointError, match=r"ds_ckpt_workers\.Net"):
        reader.read_deepspeed_checkpoint(str(d))


@pytest.mark.parametrize("name", ["s2_fp32_groups", "s3_bf16", "s1_bf16_fp32_accum"])
def test_partitions_shorter_than_parameters(reader: Any, ckpt_root: Path, tmp_path: Path, name: str) -> None:
    d = _copy(ckpt_root, name, tmp_path)
    model_file = "zero_pp_rank_0_mp_rank_00_model_states.pt" if CASE[name]["stage"] == 3 else "mp_rank_00_model_states.pt"
    f = _tag_dir(d) / model_file
    sd = torch.load(f, weights_only=True)
    for group in sd["param_shapes"]:
        if "l1.weight" in group:
            group["l1.weight"] = torch.Size([13, 11])
    torch.save(sd, f)
    with pytest.raises(reader.DeepSpeedCheckpointError, match="do not add up"):
        reader.read_deepspeed_checkpoint(str(d))


def _resave_without(reader: Any, f: Path, key: str) -> None:
    """Rewrites an optimizer file without ``key``, with DeepSpeed's objects as plain values."""
    sd = reader._load(str(f))
    osd = sd["optimizer_state_dict"]
    osd.pop(key)
    for k in ("loss_scaler", "param_slice_mappings"):
        osd.pop(k, None)
    if "zero_stage" in osd:
        osd["zero_stage"] = int(osd["zero_stage"])
    torch.save(sd, f)


@pytest.mark.parametrize("name,key", [
    ("s1_fp16", "single_partition_of_fp32_groups"),
    ("s2_fp32_groups", "base_optimizer_state"),
    ("s3_fp32_groups_subgroups", "fp32_flat_groups"),
])
def test_optimizer_state_without_expected_keys(reader: Any, ckpt_root: Path, tmp_path: Path, name: str, key: str) -> None:
    d = _copy(ckpt_root, name, tmp_path)
    f = _tag_dir(d) / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    _resave_without(reader, f, key)
    with pytest.raises(reader.DeepSpeedCheckpointError, match=rf"zero_pp_rank_1_mp_rank_00_optim_states\.pt: has no `{key}`"):
        reader.read_deepspeed_checkpoint(str(d))


def test_stage0_optimizer_without_expected_keys(reader: Any, ckpt_root: Path, tmp_path: Path) -> None:
    d = _copy(ckpt_root, "s0_bf16", tmp_path)
    f = _tag_dir(d) / "mp_rank_00_model_states.pt"
    sd = torch.load(f, weights_only=True)
    sd["optimizer"] = {"something": 1}
    torch.save(sd, f)
    with pytest.raises(reader.DeepSpeedCheckpointError, match="none of the keys"):
        reader.read_deepspeed_checkpoint(str(d))


@pytest.mark.parametrize("extra_file,what", [
    ("mp_rank_01_model_states.pt", "model-parallel"),
    ("layer_01_expert_0_mp_rank_00_model_states.pt", "mixture-of-experts"),
    ("expp_rank_0_mp_rank_00_optim_states.pt", "mixture-of-experts"),
    ("layer_01-model_00-model_states.pt", "pipeline-parallel"),
])
def test_not_data_parallel(reader: Any, ckpt_root: Path, tmp_path: Path, extra_file: str, what: str) -> None:
    d = _copy(ckpt_root, "s2_fp32_groups", tmp_path)
    shutil.copy(_tag_dir(d) / "mp_rank_00_model_states.pt", _tag_dir(d) / extra_file)
    with pytest.raises(reader.DeepSpeedCheckpointError, match=f"{what} checkpoint: zero reads data-parallel checkpoints only"):
        reader.read_deepspeed_checkpoint(str(d))


def test_model_parallel_metadata(reader: Any, ckpt_root: Path, tmp_path: Path) -> None:
    d = _copy(ckpt_root, "s1_fp32", tmp_path)
    f = _tag_dir(d) / "mp_rank_00_model_states.pt"
    sd = torch.load(f, weights_only=True)
    sd["checkpoint_parallel_dimensions"] = {"pp_degree": 1, "tp_degree": 2}
    torch.save(sd, f)
    with pytest.raises(reader.DeepSpeedCheckpointError, match="data-parallel checkpoints only"):
        reader.read_deepspeed_checkpoint(str(d))


def test_leftover_rank_file(reader: Any, ckpt_root: Path, tmp_path: Path) -> None:
    d = _copy(ckpt_root, "s1_fp32", tmp_path)
    t = _tag_dir(d)
    shutil.copy(t / "zero_pp_rank_1_mp_rank_00_optim_states.pt", t / "zero_pp_rank_2_mp_rank_00_optim_states.pt")
    with pytest.raises(reader.DeepSpeedCheckpointError, match="rank 2, but the checkpoint says it was saved by 2 ranks"):
        reader.read_deepspeed_checkpoint(str(d))
