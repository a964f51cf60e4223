"""Hugging Face's ``Trainer`` on zero with one added import line, against DeepSpeed 0.19.8
itself on the same CPU: ``hf_trainer_script.py`` under ``torchrun --nproc-per-node 2`` with
``TrainingArguments(use_cpu=True, deepspeed=...)``, "auto" values throughout, accumulation
2 and clipping, the model loaded with ``from_pretrained`` after ``TrainingArguments``
(at stage 3 through ``zero.Init`` and ``GatheredParameters(modifier_rank=0)`` before any
engine exists, as transformers loads under ZeRO-3).

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
  stages 2 and 3 logs DeepSpeed's losses (``hf_accelerate_script.py``).
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
from typing import Any, Dict, Optional

import pytest
import torch

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


def torchrun(model: Path, out: Path, stage: int, case: str, compat: bool,
             resume: Optional[Path] = None, script: Path = SCRIPT) -> Dict[str, Any]:
    """``script`` on 2 processes under torchrun; rank 0's JSON result."""
    out.mkdir(parents=True, exist_ok=True)
    result = out / "result.json"
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update({"ZT_STAGE": str(stage), "ZT_CASE": case, "ZT_COMPAT": "1" if compat else "0",
                "ZT_MODEL_DIR": str(model), "ZT_OUT_DIR": str(out), "ZT_RESULT": str(result),
                "ZT_RESUME": str(resume or ""), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu",
                "PYTHONPATH": os.pathsep.join([str(HERE)] + sys.path)})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(free_port()), str(script)]
    try:
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    except subprocess.TimeoutExpired as e:  # torchrun's agent kills its workers with it
        raise AssertionError(f"the Trainer run did not finish in 300 s:\n{(e.output or b'').decode(errors='replace')[-3000:]}")
    log = done.stdout.decode(errors="replace")
    assert done.returncode == 0 and result.exists(), f"{'zero' if compat else 'DeepSpeed'} stage {stage} case {case}:\n{log[-5000:]}"
    return json.loads(result.read_text())


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


def reference(model: Path, root: Path, case: str) -> Dict[str, Any]:
    """DeepSpeed's stage-2 run of ``case`` on ``model`` (once per module)."""
    key = f"{model.name}-{case}"
    if key not in _REFERENCE:
        _REFERENCE[key] = torchrun(model, root / f"deepspeed-{key}", 2, case, compat=False)
    return _REFERENCE[key]


def close(a: float, b: float) -> bool:
    return abs(a - b) <= TOLERANCE * max(abs(a), abs(b))


@pytest.mark.parametrize("model,case", [("gpt2", c) for c in "ABCDEO"] + [("llama", "A")])
@pytest.mark.parametrize("stage", [2, 3])
def test_the_trainer_on_zero_logs_deepspeeds_losses(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                                                    stage: int, model: str, case: str) -> None:
    root = tmp_path_factory.getbasetemp()
    folder = request.getfixturevalue(f"{model}_dir" if model == "llama" else "model_dir")
    want = reference(folder, root, case)
    got = torchrun(folder, tmp_path_factory.mktemp(f"zero-{stage}-{model}-{case}"), stage, case, compat=True)
    assert got["steps"] == want["steps"] and got["global_step"] == want["global_step"], (got, want)
    for step, a, b in zip(got["steps"], got["losses"], want["losses"]):
        assert close(a, b), f"stage {stage} case {case} step {step}: loss {a} on zero, {b} on DeepSpeed"
    for step, a, b in zip(got["steps"], got["grad_norms"], want["grad_norms"]):
        assert close(a, b), f"stage {stage} case {case} step {step}: grad norm {a} on zero, {b} on DeepSpeed"
    assert close(got["eval_loss"], want["eval_loss"]), (got["eval_loss"], want["eval_loss"])
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
def test_a_plain_accelerate_loop_on_zero_gives_deepspeeds_losses(model_dir: Path, tmp_path: Path, stage: int) -> None:
    script = HERE / "hf_accelerate_script.py"
    want = torchrun(model_dir, tmp_path / "deepspeed", stage, "-", compat=False, script=script)["losses"]
    got = torchrun(model_dir, tmp_path / "zero", stage, "-", compat=True, script=script)["losses"]
    assert len(got) == len(want) == 6, (got, want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert close(a, b), f"stage {stage} micro-step {i}: loss {a} on zero, {b} on DeepSpeed"
