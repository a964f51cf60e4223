"""Hugging Face's ``Trainer`` on zero with one added import line, against DeepSpeed 0.19.8
itself on the same CPU: ``hf_trainer_script.py`` under ``torchrun --nproc-per-node 2`` (DeepSpeed's
reference runs in 2 ranks with torchrun's variables, forked from the suite's zygote) with
``TrainingArguments(use_cpu=True, deepspeed=...)``, "auto" values throughout, accumulation
2 and clipping, the model loaded with ``from_pretrained`` after ``TrainingArguments``
(at stage 3 through ``zero.Init`` and ``GatheredParameters(modifier_rank=0)`` before any
engine exists, as transformers loads under ZeRO-3: each rank then holds half of each
parameter and no parameter storage, checked).

- A tiny GPT-2 at stages 2 and 3 x the Trainer's four optimizer/scheduler cases (A: both in the config;
  B: the Trainer's optimizer, two parameter groups; C: the Trainer's scheduler; D: both
  the Trainer's), and E: by epochs, each ending with an accumulation window of one
  micro-step (accelerate's ``set_gradient_accumulation_boundary``), and O: A with
  ``offload_optimizer: cpu`` (DeepSpeed's ``DeepSpeedCPUAdam``); a tiny Llama in case A.
  Every logged loss and
  the eval loss within 1e-5 relative of DeepSpeed's. DeepSpeed's stage 3 cannot load with
  ``from_pretrained`` at 2 ranks on CPU (its ``zero.Init`` builds its config before its
  process group exists, HF_TRAINER.md §6c), so its stage 2 is the reference for both:
  the stages compute the same function.
- A plain ``Accelerator`` loop (``prepare``, ``accumulate``, ``backward``, ``step``) at
  stages 2 and 3 logs DeepSpeed's losses (``hf_accelerate_script.py``); so does the same
  script, without the added line, under ``accelerate launch --use_deepspeed`` with
  ``ZERO_AS_DEEPSPEED=1`` and the wheel's ``.pth``.
- ``save_model`` writes a folder plain transformers loads, giving the engine's logits on a
  fixed batch; a resume from ``checkpoint-2`` in new processes ends with the same saved
  model, byte for byte, as the uninterrupted run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import torch

import conftest
from conftest import HERE, LAUNCH_VARS, free_port

pytest.importorskip("accelerate", reason="the Trainer needs accelerate (.ci/run installs it)")
SCRIPT = HERE / "hf_trainer_script.py"
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 saved with ``save_pretrained``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32)).save_pretrained(folder)
    return folder


def script_env(model: Path, out: Path, stage: int, case: str, compat: bool,
               resume: Optional[Path] = None) -> Dict[str, str]:
    """The variables a test script reads (``ZT_*``), on this process's environment less
    the launcher's."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update({"ZT_STAGE": str(stage), "ZT_CASE": case, "ZT_COMPAT": "1" if compat else "0",
                "ZT_MODEL_DIR": str(model), "ZT_OUT_DIR": str(out), "ZT_RESULT": str(out / "result.json"),
                "ZT_RESUME": str(resume or ""), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu",
                "PYTHONPATH": os.pathsep.join([str(HERE)] + sys.path)})
    return env


def result_of(cmd: List[str], env: Dict[str, str], out: Path, what: str) -> Dict[str, Any]:
    """Runs ``cmd`` (a launcher of 2 processes) within 300 s; rank 0's JSON result in
    ``out``, or an error with the end of the log naming ``what``."""
    try:
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    except subprocess.TimeoutExpired as e:  # the launcher's agent kills its workers with it
        raise AssertionError(f"{what} did not finish in 300 s:\n{(e.output or b'').decode(errors='replace')[-3000:]}")
    return read_result(out, done.returncode, done.stdout.decode(errors="replace"), what)


def read_result(out: Path, returncode: int, log: str, what: str) -> Dict[str, Any]:
    """Rank 0's JSON result in ``out`` of a run that exited with ``returncode``, or an
    error with the end of its ``log`` naming ``what``."""
    result = out / "result.json"
    assert returncode == 0 and result.exists(), f"{what} (exit {returncode}):\n{log[-5000:]}"
    return json.loads(result.read_text())


def torchrun(model: Path, out: Path, stage: int, case: str, compat: bool,
             resume: Optional[Path] = None, script: Path = SCRIPT) -> Dict[str, Any]:
    """``script`` on 2 processes under torchrun; rank 0's JSON result. DeepSpeed's runs
    (``compat=False``) are its references: their ranks get torchrun's variables and are
    forked from the suite's zygote that imported DeepSpeed once (``conftest.run_script``;
    the launcher changes how ranks start, not what DeepSpeed computes)."""
    out.mkdir(parents=True, exist_ok=True)
    env = script_env(model, out, stage, case, compat, resume)
    what = f"{script.name} on {'zero' if compat else 'DeepSpeed'}, stage {stage} case {case}"
    if not compat:
        log = out / "log.txt"
        rc = conftest.run_script(2, [str(script)], env, out, log, 300.0)
        return read_result(out, rc, log.read_text(errors="replace"), what)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(free_port()), str(script)]
    return result_of(cmd, env, out, what)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama saved with ``save_pretrained``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2,
                                 max_position_embeddings=32)).save_pretrained(folder)
    return folder


_REFERENCE: Dict[str, Dict[str, Any]] = {}


def reference(model: Path, root: Path, case: str, script: Path = SCRIPT) -> Dict[str, Any]:
    """DeepSpeed's stage-2 run of ``script`` (``case``) on ``model``, once per module."""
    key = f"{script.stem}-{model.name}-{case}"
    if key not in _REFERENCE:
        _REFERENCE[key] = torchrun(model, root / f"deepspeed-{key}", 2, case, compat=False, script=script)
    return _REFERENCE[key]


def close(a: float, b: float) -> bool:
    return abs(a - b) <= TOLERANCE * max(abs(a), abs(b))


@pytest.mark.parametrize("model,case", [("gpt2", c) for c in "ABCDEO"] + [("llama", "A"), ("llama", "L")])
@pytest.mark.parametrize("stage", [2, 3])
def test_the_trainer_on_zero_logs_deepspeeds_losses(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                                                    stage: int, model: str, case: str) -> None:
    root = tmp_path_factory.getbasetemp()
    folder = request.getfixturevalue(f"{model}_dir" if model == "llama" else "model_dir")
    want = reference(folder, root, case)
    out = tmp_path_factory.mktemp(f"zero-{stage}-{model}-{case}")
    got = torchrun(folder, out, stage, case, compat=True)
    assert want["engine"].startswith("deepspeed") and got["engine"].startswith("zero_torch"), (want["engine"], got["engine"])
    assert got["steps"] == want["steps"] and got["global_step"] == want["global_step"], (got, want)
    for step, a, b in zip(got["steps"], got["losses"], want["losses"]):
        assert close(a, b), f"stage {stage} case {case} step {step}: loss {a} on zero, {b} on DeepSpeed"
    for step, a, b in zip(got["steps"], got["grad_norms"], want["grad_norms"]):
        assert close(a, b), f"stage {stage} case {case} step {step}: grad norm {a} on zero, {b} on DeepSpeed"
    assert close(got["eval_loss"], want["eval_loss"]), (got["eval_loss"], want["eval_loss"])
    held = got["loaded"]
    if stage == 3:
        # from_pretrained went through zero.Init: rank 0 holds placeholders (one element
        # each) and half of every parameter, never the model.
        assert held["storage_bytes"] <= held["itemsize"] * held["params"], held
        assert held["numel"] / 2 <= held["shard_numel"] <= held["numel"] / 2 + held["params"], held
    else:
        assert held["storage_bytes"] == held["itemsize"] * held["numel"] and held["shard_numel"] == 0, held
    if case == "L":
        # save_model writes the adapter as peft saves it (every rank's LoRA weights gathered
        # at stage 3, the frozen base left out), with DeepSpeed's values.
        from safetensors.torch import load_file

        mine = load_file(str(out / "final" / "adapter_model.safetensors"))
        theirs = load_file(str(root / f"deepspeed-{SCRIPT.stem}-{folder.name}-{case}" / "final" / "adapter_model.safetensors"))
        assert mine.keys() == theirs.keys() and mine, (sorted(mine), sorted(theirs))
        assert all("lora_" in k for k in mine), sorted(mine)
        assert all(t.abs().max() > 0 for k, t in mine.items() if "lora_B" in k), "the adapter did not train (B starts at 0)"
        for k, t in theirs.items():
            assert mine[k].shape == t.shape and torch.allclose(mine[k], t, rtol=1e-4, atol=1e-6), k
    print(f"{model} stage {stage} case {case}: {len(got['losses'])} logged losses and the eval loss match DeepSpeed's")


@pytest.mark.parametrize("stage", [2, 3])
def test_save_model_is_read_by_transformers_and_a_resume_ends_the_same(model_dir: Path, tmp_path: Path,
                                                                       stage: int) -> None:
    from transformers import AutoModelForCausalLM

    whole = torchrun(model_dir, tmp_path / "whole", stage, "A", compat=True)
    saved = tmp_path / "whole" / "final" / "model.safetensors"
    assert saved.exists(), sorted(p.name for p in saved.parent.iterdir())
    # Plain transformers reads the saved folder and gives the engine's logits.
    loaded = AutoModelForCausalLM.from_pretrained(saved.parent, dtype=torch.float32)
    loaded.eval()
    engine = torch.load(tmp_path / "whole" / "logits.pt")
    with torch.no_grad():
        logits = loaded(input_ids=engine["input_ids"]).logits
    worst = (logits - engine["logits"]).abs().max().item()
    assert worst <= 1e-5 * engine["logits"].abs().max().item(), f"stage {stage}: transformers' logits differ by {worst}"
    # A resume from checkpoint-2 in new processes saves the same model, byte for byte.
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "whole" / "checkpoint-2", resumed_dir / "checkpoint-2")
    resumed = torchrun(model_dir, resumed_dir, stage, "A", compat=True, resume=resumed_dir / "checkpoint-2")
    assert resumed["losses"][-2:] == whole["losses"][-2:], (resumed["losses"], whole["losses"])
    assert (resumed_dir / "final" / "model.safetensors").read_bytes() == saved.read_bytes(), \
        "the resumed run saved a different model"


@pytest.mark.parametrize("stage", [2, 3])
def test_a_plain_accelerate_loop_on_zero_gives_deepspeeds_losses(model_dir: Path, tmp_path: Path,
                                                                   tmp_path_factory: pytest.TempPathFactory,
                                                                   stage: int) -> None:
    """DeepSpeed's stage 2 is the reference for both stages, as for the Trainer (its stage 3
    cannot load with ``from_pretrained`` at 2 ranks on CPU). Each run says which engine
    ``prepare`` made: with ``cpu=True`` accelerate wraps the model in DDP and never
    reaches either (this test compared two DDP runs until 2026-11-27)."""
    script = HERE / "hf_accelerate_script.py"
    want_run = reference(model_dir, tmp_path_factory.getbasetemp(), "-", script)
    assert want_run["engine"].startswith("deepspeed"), f"accelerate prepared {want_run['engine']}, not DeepSpeed's engine"
    got_run = torchrun(model_dir, tmp_path / "zero", stage, "-", compat=True, script=script)
    assert got_run["engine"].startswith("zero_torch"), f"accelerate prepared {got_run['engine']}, not zero's engine"
    got, want = got_run["losses"], want_run["losses"]
    assert len(got) == len(want) > 0, (got, want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert close(a, b), f"stage {stage} micro-step {i}: loss {a} on zero, {b} on DeepSpeed"


def accelerate_launch(model_dir: Path, out: Path, as_deepspeed: bool, user: Path) -> Dict[str, Any]:
    """``accelerate launch --use_deepspeed --zero_stage 2`` of the plain loop on 2
    processes, with the user site ``user`` (holding the wheel's .pth) and
    ``ZERO_AS_DEEPSPEED=1`` or not; rank 0's JSON result."""
    out.mkdir(parents=True, exist_ok=True)
    env = script_env(model_dir, out, 2, "-", compat=False)
    env["PYTHONUSERBASE"] = str(user)
    env.pop("ZERO_AS_DEEPSPEED", None)
    if as_deepspeed:
        env["ZERO_AS_DEEPSPEED"] = "1"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--use_deepspeed", "--zero_stage", "2",
           "--num_processes", "2", "--num_machines", "1", "--main_process_port", str(free_port()),
           str(HERE / "hf_accelerate_script.py")]
    return result_of(cmd, env, out, f"accelerate launch {'with' if as_deepspeed else 'without'} ZERO_AS_DEEPSPEED=1")


def test_accelerate_launch_use_deepspeed_trains_on_zero_with_the_variable(model_dir: Path, tmp_path: Path) -> None:
    """``ZERO_AS_DEEPSPEED=1 accelerate launch --use_deepspeed script.py``, the script
    without the added line: the wheel's ``zero_torch_as_deepspeed.pth`` (installed beside
    the package; here put on a user site folder, which Python reads as it reads
    site-packages) imports the compat module as each process starts, the launcher process
    too, which looks for DeepSpeed before the script runs. The workers' engine is zero's,
    with the losses of the same launch on DeepSpeed 0.19.8 (the variable unset: the .pth
    does nothing)."""
    import zero_torch

    pth = Path(zero_torch.__file__).parent.parent / "zero_torch_as_deepspeed.pth"
    assert pth.is_file(), f"the wheel ships {pth.name} beside the package: not found at {pth}"
    user = tmp_path / "user"
    site = user / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    site.mkdir(parents=True)
    shutil.copy(pth, site / pth.name)
    env = {k: v for k, v in os.environ.items() if k != "ZERO_AS_DEEPSPEED"}
    env.update({"PYTHONUSERBASE": str(user), "PYTHONPATH": os.pathsep.join(sys.path)})
    probe = [sys.executable, "-c", "import sys; print('zero_torch.deepspeed_compat' in sys.modules)"]
    inert = subprocess.run(probe, env=env, stdout=subprocess.PIPE, timeout=120).stdout.decode().strip()
    assert inert == "False", "the .pth imported zero without ZERO_AS_DEEPSPEED=1"
    on = subprocess.run(probe, env={**env, "ZERO_AS_DEEPSPEED": "1"}, stdout=subprocess.PIPE, timeout=120).stdout.decode().strip()
    assert on == "True", "the .pth did not import the compat module with ZERO_AS_DEEPSPEED=1"
    got = accelerate_launch(model_dir, tmp_path / "zero", True, user)
    assert got["engine"].startswith("zero_torch"), f"accelerate launch trained on {got['engine']}, not zero"
    want = accelerate_launch(model_dir, tmp_path / "deepspeed", False, user)
    assert want["engine"].startswith("deepspeed"), f"without the variable: {want['engine']}"
    assert len(got["losses"]) == len(want["losses"]) > 0, (got, want)
    for i, (a, b) in enumerate(zip(got["losses"], want["losses"])):
        assert close(a, b), f"micro-step {i}: loss {a} under accelerate launch on zero, {b} on DeepSpeed"


@pytest.fixture(scope="module")
def dropout_gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 with dropout (tied head without a bias, as GPT-2's)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path_factory.mktemp("gpt2-dropout")
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def test_resize_token_embeddings_at_stage3_under_accelerate_launch(dropout_gpt2_dir: Path, tmp_path: Path) -> None:
    """``hf_resize_script.py`` (``resize_token_embeddings`` after a ``zero.Init`` load, then
    training with dropout) under ``accelerate launch --use_deepspeed --zero_stage 3
    --zero3_init_flag true``: on zero (``ZERO_AS_DEEPSPEED=1``, no added line) every loss
    within 1e-6 of DeepSpeed 0.19.8's and torch's generator in DeepSpeed's state at each,
    so the new rows drew what DeepSpeed's drew and dropout saw the same stream."""
    import zero_torch

    pth = Path(zero_torch.__file__).parent.parent / "zero_torch_as_deepspeed.pth"
    user = tmp_path / "user"
    site = user / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    site.mkdir(parents=True)
    shutil.copy(pth, site / pth.name)
    results = {}
    for lib in ("zero", "deepspeed"):
        out = tmp_path / lib
        out.mkdir()
        env = script_env(dropout_gpt2_dir, out, 3, "-", compat=False)
        env["PYTHONUSERBASE"] = str(user)
        env.pop("ZERO_AS_DEEPSPEED", None)
        if lib == "zero":
            env["ZERO_AS_DEEPSPEED"] = "1"
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--use_deepspeed", "--zero_stage", "3",
               "--zero3_init_flag", "true", "--num_processes", "2", "--num_machines", "1",
               "--main_process_port", str(free_port()), str(HERE / "hf_resize_script.py")]
        results[lib] = result_of(cmd, env, out, f"resize_token_embeddings at stage 3 on {lib}")
    got, want = results["zero"], results["deepspeed"]
    assert got["engine"].startswith("zero_torch") and want["engine"].startswith("deepspeed"), (got["engine"], want["engine"])
    assert got["vocab"] == want["vocab"] == 70
    assert len(got["losses"]) == len(want["losses"]) > 0
    for i, (a, b) in enumerate(zip(got["losses"], want["losses"])):
        assert abs(a - b) <= 1e-6 * abs(b), f"micro-step {i}: loss {a} on zero, {b} on DeepSpeed"
    assert got["rng"] == want["rng"], "torch's generator is not in DeepSpeed's state"
