"""Checkpoints: saved by 4 processes in stage 3, loaded by 2 processes in stage 2 and by one
process in stage 3, and read by other people's code.

- The parameters right after a load are the saved ones to the bit (fp32 master weights);
  training then continues as the saving run did, to the tolerance of another world size
  (1e-5 after 2 more steps, as in test_matrix). The client state (a tensor in it) and the
  step count come back.
- ``zero_torch.checkpoint`` (DeepSpeed's ``zero_to_fp32`` functions) gives the state dict;
  Hugging Face's ``from_pretrained`` and ``load_state_dict(strict=True)`` load what it and
  ``save_16bit_model`` write, and ``zero-ckpt to-safetensors`` too, with the same logits.
- A tied-weight model (GPT-2) round-trips under both names; persistent buffers
  (BatchNorm) come back; at one world size a resumed run gives the uninterrupted run's
  bits.
"""

from __future__ import annotations

import os
import subprocess
import warnings
from pathlib import Path
from typing import Any, Dict

import pytest
import torch

import models
import workers
import zero_torch
from zero_torch.checkpoint import (
    convert_zero_checkpoint_to_fp32_state_dict,
    get_fp32_state_dict_from_zero_checkpoint,
    load_state_dict_from_zero_checkpoint,
)

STEPS = 5
SAVE_AT = 3
BATCH = 8


@pytest.fixture(scope="module")
def saved(job: Any, tmp_path_factory: Any) -> Dict[str, Any]:
    root = tmp_path_factory.mktemp("ckpt")
    dirs = {k: str(root / k) for k in ("ckpt", "bin", "st")}
    run = job(4, "ckpt_train", {
        "model": "llama", "stage": 3, "steps": STEPS, "save_at": SAVE_AT, "save_dir": dirs["ckpt"],
        "global_batch": BATCH, "bin_dir": dirs["bin"], "st_dir": dirs["st"],
    })
    return {"dirs": dirs, "run": run[0]}


def logits(model: torch.nn.Module) -> torch.Tensor:
    ids = models.batches(1, 2, 99)[0]
    with torch.no_grad():
        return model(input_ids=ids).logits


def model_with(params: Dict[str, torch.Tensor]) -> torch.nn.Module:
    m = models.build("llama", seed=5)
    m.load_state_dict(params, strict=True)
    return m


def test_four_processes_stage3_resume_on_two_processes_stage2(saved: Dict[str, Any], job: Any) -> None:
    res = job(2, "ckpt_resume", {"model": "llama", "stage": 2, "load_dir": saved["dirs"]["ckpt"], "start": SAVE_AT, "steps": STEPS, "global_batch": BATCH})
    at_save = saved["run"]["at_save"]
    for r in res:
        for n, t in at_save.items():
            assert torch.equal(r["loaded"][n], t), f"{n} differs right after the load"
        assert r["global_steps"] == SAVE_AT
        assert r["client"]["epoch"] == 7 and torch.equal(r["client"]["order"], torch.arange(5))
        assert r["path"] == os.path.join(saved["dirs"]["ckpt"], f"global_step{SAVE_AT}")
    worst = max((res[0]["params"][n] - t).abs().max().item() for n, t in saved["run"]["params"].items())
    print(f"resumed on 2 processes, stage 2: {STEPS - SAVE_AT} more steps, max |difference| {worst:.2g} from the 4-process run")
    assert worst <= 1e-5


def test_one_process_stage3_resumes_too(saved: Dict[str, Any]) -> None:
    r = workers.ckpt_resume("llama", 3, saved["dirs"]["ckpt"], SAVE_AT, STEPS, BATCH)
    for n, t in saved["run"]["at_save"].items():
        assert torch.equal(r["loaded"][n], t), n
    worst = max((r["params"][n] - t).abs().max().item() for n, t in saved["run"]["params"].items())
    assert worst <= 1e-5


def test_fp32_state_dict_loads_into_transformers(saved: Dict[str, Any], tmp_path: Path) -> None:
    at_save = saved["run"]["at_save"]
    state = get_fp32_state_dict_from_zero_checkpoint(saved["dirs"]["ckpt"])
    assert set(state) == set(at_save)
    for n, t in at_save.items():
        assert torch.equal(state[n], t), n
    want = logits(model_with(at_save))
    # pytorch_model.bin, and sharded model.safetensors read by from_pretrained.
    convert_zero_checkpoint_to_fp32_state_dict(saved["dirs"]["ckpt"], tmp_path / "bin")
    m = models.build("llama", seed=5)
    m.load_state_dict(torch.load(tmp_path / "bin" / "pytorch_model.bin"), strict=True)
    assert torch.equal(logits(m), want)
    out = tmp_path / "st"
    convert_zero_checkpoint_to_fp32_state_dict(saved["dirs"]["ckpt"], out, max_shard_size="40KB", safe_serialization=True)
    assert (out / "model.safetensors.index.json").exists(), sorted(os.listdir(out))
    models.build("llama").config.save_pretrained(out)
    from transformers import LlamaForCausalLM

    m = LlamaForCausalLM.from_pretrained(out)
    assert torch.equal(logits(m), want)
    m = load_state_dict_from_zero_checkpoint(models.build("llama", seed=5), saved["dirs"]["ckpt"])
    assert torch.equal(logits(m), want)


def test_16bit_model_loads_strictly(saved: Dict[str, Any]) -> None:
    final = saved["run"]["params"]
    want = logits(model_with(final))
    m = models.build("llama", seed=5)
    m.load_state_dict(torch.load(Path(saved["dirs"]["bin"]) / "pytorch_model.bin"), strict=True)
    assert torch.equal(logits(m), want)
    st = Path(saved["dirs"]["st"])
    models.build("llama").config.save_pretrained(st)
    from transformers import LlamaForCausalLM

    assert torch.equal(logits(LlamaForCausalLM.from_pretrained(st)), want)


def test_zero_ckpt_export_loads_into_transformers(saved: Dict[str, Any], tmp_path: Path) -> None:
    tool = os.environ.get("ZERO_CKPT")
    if not tool:
        pytest.skip("ZERO_CKPT (the zero-ckpt binary) not given")
    out = tmp_path / "export"
    subprocess.run([tool, "to-safetensors", saved["dirs"]["ckpt"], str(out)], check=True, timeout=120)
    models.build("llama").config.save_pretrained(out)
    from transformers import LlamaForCausalLM

    assert torch.equal(logits(LlamaForCausalLM.from_pretrained(out)), logits(model_with(saved["run"]["at_save"])))


def test_tied_weights_round_trip(tmp_path: Path) -> None:
    cfg = workers.config(3, "fp32", 1, 4, extra=None)
    cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    engine, _, _, _ = zero_torch.initialize(model=models.build("gpt2"), config=cfg)
    workers._train_steps(engine, range(2), 4)
    engine.save_checkpoint(tmp_path / "ckpt")
    engine.save_16bit_model(tmp_path / "st", "model.safetensors")
    whole = workers.gathered(engine)
    state = get_fp32_state_dict_from_zero_checkpoint(tmp_path / "ckpt")
    assert torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])
    fresh = models.build("gpt2", seed=9)
    fresh.load_state_dict(state, strict=True)
    ids = models.batches(1, 2, 99)[0]
    ref = models.build("gpt2", seed=9)
    ref.load_state_dict(whole, strict=False)
    with torch.no_grad():
        assert torch.equal(fresh(input_ids=ids).logits, ref(input_ids=ids).logits)
    models.build("gpt2").config.save_pretrained(tmp_path / "st")
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(tmp_path / "st")
    with torch.no_grad():
        assert torch.equal(hf(input_ids=ids).logits, ref(input_ids=ids).logits)


def test_buffers_and_bits_at_one_world_size(tmp_path: Path) -> None:
    def engine() -> zero_torch.ZeroEngine:
        e, _, _, _ = zero_torch.initialize(model=models.Toy("buffers"), config=workers.toy_config(3, 1, 4))
        return e

    data = models.regression(5, 4)

    def train(e: zero_torch.ZeroEngine, steps: range) -> None:
        for i in steps:
            e.backward(e(*data[i]))
            e.step()

    a = engine()
    train(a, range(3))
    a.save_checkpoint(tmp_path, tag="mine", client_state={"k": 1})
    saved_bn = a.module.bn.running_mean.clone()
    train(a, range(3, 5))
    b = engine()
    path, client = b.load_checkpoint(tmp_path)
    assert path == os.path.join(str(tmp_path), "mine") and client == {"k": 1}
    assert torch.equal(b.module.bn.running_mean, saved_bn)
    train(b, range(3, 5))
    wa, wb = workers.gathered(a), workers.gathered(b)
    for n in wa:
        assert torch.equal(wa[n], wb[n]), f"{n}: the resumed run is not the uninterrupted one"
    assert torch.equal(a.module.bn.running_var, b.module.bn.running_var)


def test_missing_latest_and_stage3_without_gather(tmp_path: Path) -> None:
    e, _, _, _ = zero_torch.initialize(model=models.Toy(), config=workers.toy_config(3, 1, 4))
    with pytest.warns(UserWarning, match="latest"):
        assert e.load_checkpoint(tmp_path / "nothing") == (None, None)
    with pytest.warns(UserWarning, match="stage3_gather_16bit_weights_on_model_save"):
        assert e.save_16bit_model(tmp_path / "out") is False
    assert not (tmp_path / "out").exists()
    with pytest.raises(zero_torch.CheckpointError, match="nope"):
        e.load_checkpoint(tmp_path, tag="nope")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        e.save_checkpoint(tmp_path / "c")
    assert (tmp_path / "c" / "latest").read_text().strip() == "global_step0"


@pytest.mark.parametrize("stage", [2, 3])
def test_a_checkpoint_without_frozen_parameters_resumes_on_the_models_own(job: Any, tmp_path: Path, stage: int) -> None:
    """``save_checkpoint(exclude_frozen_parameters=True)`` (the Trainer's call for a PEFT
    model) writes no frozen values; a non-strict load keeps the model's own frozen weights
    and the run goes on as the uninterrupted one, to the bit; a strict load names the
    frozen parameter it lacks."""
    save_dir = str(tmp_path / "ckpt")
    full = job(2, "workers.frozen_excluded", {"stage": stage, "save_dir": save_dir, "mode": "save"})
    tag = (tmp_path / "ckpt" / "latest").read_text().strip()
    assert not list((tmp_path / "ckpt" / tag).glob("frozen*")), "frozen values were written"
    resumed = job(2, "workers.frozen_excluded", {"stage": stage, "save_dir": save_dir, "mode": "resume"})
    for rank in range(2):
        assert resumed[rank]["losses"] == full[rank]["losses"][2:], (resumed[rank]["losses"], full[rank]["losses"])
        for n, p in full[rank]["params"].items():
            assert torch.equal(resumed[rank]["params"][n], p), f"rank {rank}: {n} differs"
    for r in job(2, "workers.frozen_excluded", {"stage": stage, "save_dir": save_dir, "mode": "strict"}, expect_ok=False):
        assert r.get("exception") == "CheckpointError", r
        assert "`inp.weight`" in r["error"] and "not in the checkpoint" in r["error"], r["error"]


def test_recovery_scripts_and_deepspeeds_file_helpers(saved: Dict[str, Any], tmp_path: Path) -> None:
    """``save_checkpoint`` writes DeepSpeed's ``zero_to_fp32.py`` and ``zero_to_torch.py``
    into the folder (for zero's format); they consolidate as DeepSpeed's do. DeepSpeed's
    file helpers (what Lightning's ``convert_zero_checkpoint_to_fp32_state_dict`` opens)
    find the stage and the client state of a zero tag folder, which is left untouched."""
    import sys

    from zero_torch._deepspeed.utils import zero_to_fp32 as ds

    ckpt = Path(saved["dirs"]["ckpt"])
    at_save = saved["run"]["at_save"]
    for name in ("zero_to_fp32.py", "zero_to_torch.py"):
        assert os.access(ckpt / name, os.X_OK), name
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, str(ckpt / "zero_to_fp32.py"), str(ckpt), str(tmp_path / "fp32")], env=env, check=True)
    state = torch.load(tmp_path / "fp32" / "pytorch_model.bin", weights_only=True)
    assert set(state) == set(at_save) and all(torch.equal(state[n], t) for n, t in at_save.items())
    subprocess.run([sys.executable, str(ckpt / "zero_to_torch.py"), str(ckpt), str(tmp_path / "bf16"), "--dtype", "bf16",
                    "--safe_serialization"], env=env, check=True)
    from safetensors.torch import load_file

    half = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    assert all(torch.equal(half[n], t.to(torch.bfloat16)) for n, t in at_save.items())
    bad = subprocess.run([sys.executable, str(ckpt / "zero_to_torch.py"), str(ckpt), str(tmp_path / "x"), "--dtype", "int8"],
                         env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "invalid choice: 'int8'" in bad.stderr, bad.stderr

    # Lightning's converter, as written there: the stage from the first optimizer file, the
    # client state from the model-states file.
    with open(ckpt / "latest") as f:
        tag_dir = ckpt / f.read().strip()
    before = sorted(os.listdir(tag_dir))
    optim = torch.load(ds.get_optim_files(str(tag_dir))[0], map_location="cpu", weights_only=False)
    stage = optim["optimizer_state_dict"]["zero_stage"]
    assert stage == 3
    client = torch.load(ds.get_model_state_file(str(tag_dir), stage), map_location="cpu", weights_only=False)
    assert client["epoch"] == 7 and torch.equal(client["order"], torch.arange(5))
    assert (client["global_steps"], client["dp_world_size"], client["mp_world_size"]) == (SAVE_AT, 4, 1)
    assert client["ds_version"] == "0.19.8" and client["module"] is None
    assert sorted(os.listdir(tag_dir)) == before, "the checkpoint was written to"
    with pytest.raises(FileNotFoundError, match="can't find model states file"):
        ds.get_model_state_file(str(tag_dir), 2)
    with pytest.raises(FileNotFoundError, match=r"can't find \*_optim_states.pt files"):
        ds.get_optim_files(str(tmp_path))
    assert ds.zero3_partitioned_param_info(10, 4) == (3, 2)
