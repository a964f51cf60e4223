"""zero_torch on CUDA: the engine on the GPU (zero's ``CudaDevice``, NCCL at world size 1,
since one GPU cannot hold two NCCL ranks) training torch's CUDA tensors, its copies
ordered with torch's current stream by events in both directions.

Without a GPU, the tests that need one print a visible skip; the errors a machine without
one gives, and the choice of device, are tested everywhere.

- fp32 against ``torch.optim.AdamW`` on the same GPU, with deterministic torch kernels:
  the gradients are torch's own bit for bit, so the bound is the CPU test's (32 ulps of
  1.0 after 20 steps; see ``test_against_torch``).
- Stages 0-3 give the same bits on the GPU too, and stage 3 leaves no partitioned
  parameter in torch's CUDA storage at rest.
- A forward, backward and step on a side stream (not torch's default one) give the bits
  of the default stream: a missing event in either direction would read a gradient before
  it is written or hand torch a parameter before it is copied.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

import conftest
import models
import workers
from test_against_torch import difference

HAS_GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="zero_torch on CUDA: torch sees no CUDA GPU on this machine")
STEPS = 20
BATCH = 4


def one_rank(task: str, **args):
    (result,) = conftest.run_job(1, task, args, timeout=600)
    return result


@needs_gpu
@pytest.mark.parametrize("name", ["llama", "gpt2"])
@pytest.mark.parametrize("stage", [0, 3])
def test_fp32_matches_torch_adamw_on_the_gpu(name: str, stage: int) -> None:
    ref = one_rank("torch_cuda_adamw", model=name, steps=STEPS, global_batch=BATCH)["params"]
    got = one_rank("cuda_train", model=name, stage=stage, dtype="fp32", steps=STEPS, global_batch=BATCH)["params"]
    assert set(got) == set(ref)
    worst = max(difference(n, got[n], ref[n]).max().item() for n in ref)
    print(f"cuda {name} stage {stage} fp32: max |zero - torch| = {worst:.3g} after {STEPS} steps")
    assert worst <= 32 * 2.0**-23, worst


@needs_gpu
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_stages_agree_to_the_bit_on_the_gpu(dtype: str) -> None:
    runs = [one_rank("cuda_train", model="llama", stage=s, dtype=dtype, steps=5, global_batch=BATCH) for s in range(4)]
    for s, r in enumerate(runs[1:], start=1):
        for n, t in runs[0]["params"].items():
            assert torch.equal(r["params"][n], t), f"stage {s} {dtype}: {n} differs from stage 0"
        assert r["losses"] == runs[0]["losses"], f"stage {s} {dtype}"
    assert runs[3]["held_at_rest"] == 0, runs[3]["held_at_rest"]
    print(f"cuda {dtype}: stages 0-3 equal; stage 3 model states {runs[3]['memory']['model_states']} B "
          f"vs stage 0 {runs[0]['memory']['model_states']} B")


@needs_gpu
@pytest.mark.parametrize("stage", [0, 3])
def test_a_side_stream_gives_the_default_streams_bits(stage: int) -> None:
    base = one_rank("cuda_train", model="gpt2", stage=stage, dtype="bf16", steps=5, global_batch=BATCH)
    side = one_rank("cuda_train", model="gpt2", stage=stage, dtype="bf16", steps=5, global_batch=BATCH, side_stream=True)
    for n, t in base["params"].items():
        assert torch.equal(side["params"][n], t), f"stage {stage}: {n} differs on a side stream"
    assert side["losses"] == base["losses"]


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU: the no-GPU errors cannot be shown here")
def test_without_a_gpu_cuda_is_an_error_that_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import zero_torch
    from zero_torch import _native

    # Asking torch's side for CUDA: refused before anything starts.
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    with pytest.raises(zero_torch.UnsupportedError, match="no CUDA GPU"):
        zero_torch.initialize(model=models.Toy(), config=workers.toy_config(0, 1, 2))
    # The engine itself on "cuda": the missing driver is named.
    cfg = json.dumps(workers.toy_config(0, 1, 2))
    lin = torch.nn.Linear(3, 2)
    modules = [("lin", [("weight", [2, 3], True, [], 0), ("bias", [2], True, [], 0)])]
    with pytest.raises(zero_torch.DeviceError) as err:
        _native.NativeEngine(cfg, modules, [[lin.weight.data, lin.bias.data]], 10.0, "cuda")
    print(f"no GPU: {err.value}")
    assert "libcuda" in str(err.value) or "GPU" in str(err.value), str(err.value)
    with pytest.raises(ValueError, match="tpu"):
        _native.NativeEngine(cfg, modules, [[lin.weight.data, lin.bias.data]], 10.0, "tpu")


def test_the_accelerator_is_chosen_as_deepspeed_chooses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import zero_torch
    from zero_torch.engine import choose_device

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    assert choose_device(models.Toy(), 0) == torch.device("cpu")
    monkeypatch.setenv("DS_ACCELERATOR", "tpu")
    with pytest.raises(zero_torch.UnsupportedError, match="tpu"):
        choose_device(models.Toy(), 0)
    monkeypatch.delenv("DS_ACCELERATOR")
    want = torch.device("cuda", 0) if HAS_GPU else torch.device("cpu")
    assert choose_device(models.Toy(), 0) == want
    mixed = models.Toy()
    if HAS_GPU:
        mixed.head.cuda()
        with pytest.raises(zero_torch.UnsupportedError, match="several devices"):
            choose_device(mixed, 0)
