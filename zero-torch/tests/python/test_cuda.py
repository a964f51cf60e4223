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
- Four micro-steps per step sum as the host engine sums them, in bf16 or in fp32
  (``data_types.grad_accum_dtype``), at every stage.
- A script's own ``all_reduce`` on torch's NCCL group beside stage 3's ``overlap_comm``
  neither hangs nor changes the bits.
- The memory report's device categories match what the driver's memory pool holds.
- One copy of the parameters (issue 35): every parameter is a view of the engine's
  device buffer (DLPack over a lease; stage 3's gathered ones of the gathered bucket),
  kept whole at a fixed address, torch holds no parameter storage of its own, a script's
  own changes are taken, and a parameter kept after its engine keeps its values.
"""

from __future__ import annotations

import json
import os
import types
from typing import Any

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


@needs_gpu
@pytest.mark.parametrize("stage", [2, 3])
def test_the_consolidated_state_dict_is_in_host_memory(stage: int) -> None:
    """``_zero3_consolidated_16bit_state_dict`` (the HF Trainer's ``save_model``,
    accelerate's ``get_state_dict``) hands back host tensors, as DeepSpeed's: each gathered
    module is copied off the GPU before the next gather (issue 48, item 5)."""
    r = one_rank("cuda_train", model="gpt2", stage=stage, dtype="bf16", steps=2, global_batch=BATCH)
    devices = {dev for dev, _ in r["consolidated"].values()}
    assert devices == {"cpu"}, devices
    for n, t in r["params"].items():
        assert torch.equal(r["consolidated"][n][1], t.float()), n


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
    with pytest.raises(zero_torch.DeviceError):
        _native.NativeEngine(cfg, modules, [[lin.weight.data, lin.bias.data]], 10.0, "cuda:1")
    for bad in ("tpu", "cuda:x", "cuda:-1", "cpu:0"):
        with pytest.raises(ValueError, match=f"device '{bad}'".replace("'", '"')):
            _native.NativeEngine(cfg, modules, [[lin.weight.data, lin.bias.data]], 10.0, bad)


class _OnDevice(torch.nn.Module):
    """Stands for a model on ``device`` (torch's CPU build cannot make CUDA tensors):
    ``choose_device`` reads only its parameters' ``device``."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device

    def parameters(self, recurse: bool = True) -> Any:  # type: ignore[override]
        return iter([types.SimpleNamespace(device=self.device)])


def test_python_and_rust_train_on_the_device_python_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device is chosen once, in Python, and handed to Rust as ``cuda:N`` (issue 30,
    M5): with ``LOCAL_RANK``, ``CUDA_VISIBLE_DEVICES`` and ``torch.cuda.set_device``
    disagreeing, the choice is DeepSpeed's (a model already on a GPU stays there; else one
    visible GPU, else the local rank's), and it is what the engine is built with."""
    from zero_torch.engine import choose_device

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    current = {"device": 3}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current["device"])
    cpu = torch.device("cpu")
    for visible, count, local_rank, model_on, want in [
        # torchrun: all 8 GPUs visible, LOCAL_RANK 1, the script set_device(3) but kept
        # the model on the CPU: the local rank's GPU, as DeepSpeed's engine picks it.
        ("0,1,2,3,4,5,6,7", 8, 1, cpu, 1),
        # SLURM --gpus-per-task=1: one visible GPU is device 0, whatever LOCAL_RANK says.
        ("5", 1, 5, cpu, 0),
        # The script moved the model to cuda:2 itself: it trains there, not on LOCAL_RANK's.
        ("0,1,2,3", 4, 0, torch.device("cuda", 2), 2),
        # A model on "cuda" (no index) is on torch's current device (set_device(3)).
        ("0,1,2,3", 4, 0, torch.device("cuda"), 3),
    ]:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        monkeypatch.setenv("LOCAL_RANK", str(local_rank))
        monkeypatch.setattr(torch.cuda, "device_count", lambda n=count: n)
        got = choose_device(_OnDevice(model_on) if model_on.type == "cuda" else models.Toy(), local_rank)
        assert got == torch.device("cuda", want), (visible, local_rank, model_on, got)
        # What Rust is given: the same ordinal, never a choice of its own.
        assert str(got) == f"cuda:{want}"


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


@needs_gpu
def test_accumulation_on_the_gpu_sums_as_the_host_engine_does() -> None:
    """bf16, four micro-steps per step, at world size 1 (measured on the host engine too):
    - summed in bf16 (DeepSpeed's default), stages 0-1 add the 16-bit gradients in place
      and stages 2-3 in the gradient shard (``CudaDevice::accumulate``): the same sums, so
      stages 0-3 give the same bits;
    - summed in fp32 (``grad_accum_dtype: "fp32"``), stages 0-1 round the window's sum to
      bf16 for their reduction (as DeepSpeed's bf16 optimizer reduces its 16-bit
      gradients) and stages 2-3 keep it in fp32: 0 equals 1, 2 equals 3;
    - the two sums end apart (four terms round differently), so none of it is a sum of
      unused gradients."""
    def run(stage: int, accum: str):
        return one_rank("cuda_train", model="llama", stage=stage, dtype="bf16", steps=4, global_batch=8, gas=4,
                        extra={"data_types": {"grad_accum_dtype": accum}})

    def same(a, b, what: str) -> None:
        for n, t in a["params"].items():
            assert torch.equal(b["params"][n], t), f"{what}: {n} differs"
        assert a["losses"] == b["losses"], what

    bf16 = [run(s, "bf16") for s in range(4)]
    for s in (1, 2, 3):
        same(bf16[0], bf16[s], f"summed in bf16, stage {s} against stage 0")
    fp32 = [run(s, "fp32") for s in range(4)]
    same(fp32[0], fp32[1], "summed in fp32, stage 1 against stage 0")
    same(fp32[2], fp32[3], "summed in fp32, stage 3 against stage 2")
    apart = [max(difference(n, f["params"][n], t).max().item() for n, t in b["params"].items())
             for f, b in ((fp32[0], bf16[0]), (fp32[2], bf16[2]), (fp32[2], fp32[0]))]
    print(f"cuda bf16 gas 4: fp32 sums against bf16 sums {apart[0]:.3g} (stage 0), {apart[1]:.3g} (stage 2); "
          f"fp32 sums, stage 2 against 0: {apart[2]:.3g}")
    assert min(apart) > 0, apart


@needs_gpu
def test_a_scripts_all_reduce_beside_overlap_comm() -> None:
    """Stage 3 with ``overlap_comm``: a script's ``all_reduce`` of each loss on torch's
    NCCL group between backward and step (DeepSpeed scripts log losses so) neither hangs
    nor changes the training (issue 30, M3: zero waits for its own collectives first)."""
    extra = {"zero_optimization": {"overlap_comm": True}}
    base = one_rank("cuda_train", model="gpt2", stage=3, dtype="bf16", steps=5, global_batch=BATCH, gas=2, extra=extra)
    mixed = one_rank("cuda_train", model="gpt2", stage=3, dtype="bf16", steps=5, global_batch=BATCH, gas=2, extra=extra,
                     script_all_reduce=True)
    assert mixed["backend"] == "nccl", mixed["backend"]
    assert len(mixed["reduced"]) == 10
    for n, t in base["params"].items():
        assert torch.equal(mixed["params"][n], t), f"{n} differs with the script's all_reduce"
    assert mixed["losses"] == base["losses"]


@needs_gpu
@pytest.mark.parametrize("stage", [0, 3])
def test_the_memory_report_matches_the_device(stage: int) -> None:
    """A 126M-parameter Llama after two bf16 steps: the bytes the CUDA driver counts in use
    in the default memory pool (every zero buffer draws from it; the figure is this
    process's, unlike ``cudaMemGetInfo``, which other processes on the GPU move) against
    the report's device categories: within 5% plus 1 MiB for zero's per-stream kernel
    tables (docs/GPU_FIRST_RUN.md, step 7)."""
    r = one_rank("cuda_train", model="wide_llama", stage=stage, dtype="bf16", steps=2, global_batch=BATCH)
    mem = r["memory"]
    mib = 2**20
    print(f"cuda stage {stage} wide llama: the pool holds {mem['allocator_used'] / mib:.1f} MiB, the report's device "
          f"categories {mem['device_total'] / mib:.1f} MiB ({ {k: round(v / mib, 1) for k, v in mem.items() if v} })")
    assert mem["device_total"] > 0
    assert mem["device_total"] <= mem["allocator_used"] <= 1.05 * mem["device_total"] + mib, mem


@needs_gpu
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_parameters_are_the_engines_gpu_buffers(stage: int, dtype: str) -> None:
    """Every parameter kept whole (all below stage 3, stage 3's persistent ones) lies in an
    engine buffer on the GPU after every step, at the address of the first step (the step
    wrote it in place: no copy), 512-byte aligned; in stage 3 every gathered parameter lies
    in the gathered bucket during its module's forward; the memory report counts no
    parameter storage of torch's own, at rest or during the forward, and fp32 parameters
    are their own master weights."""
    r = one_rank("one_copy_workers.placement", model="llama", stage=stage, dtype=dtype, steps=3,
                 global_batch=BATCH, device="cuda")
    assert r["problems"] == [], r["problems"][:5]
    for rep in r["reports"] + r["during"]:
        assert rep["torch_params"] == 0, f"torch holds parameter storage of its own: {rep}"
    if dtype == "fp32":
        assert r["reports"][-1]["master"] == 0, r["reports"][-1]


@needs_gpu
@pytest.mark.parametrize("stage", [0, 2])
def test_a_scripts_own_changes_to_gpu_parameters_are_taken(tmp_path: Any, stage: int) -> None:
    """``load_state_dict``, ``p.data = ...`` and an in-place write into parameters that
    view the engine's GPU buffers: each is taken (a checkpoint saved right after holds the
    new values), the replaced parameter views the engine again, and training goes on."""
    r = one_rank("one_copy_workers.user_changes", stage=stage, dtype="bf16", global_batch=BATCH,
                 save_dir=str(tmp_path), device="cuda")
    assert r["mismatched"] == [], r["mismatched"]
    assert r["outside"] == [], r["outside"]
    assert r["trained"]


@needs_gpu
@pytest.mark.parametrize("stage", [0, 2])
def test_a_gpu_parameter_outlives_its_engine(stage: int) -> None:
    """A CUDA parameter kept after its engine is gone keeps its values (the lease keeps the
    device memory; it is freed after a device-wide wait once the tensor goes)."""
    r = one_rank("one_copy_workers.outlives_engine", stage=stage, device="cuda")
    assert not r["engine_alive"], "the engine was freed"
    assert r["equal"] and r["numel"] > 0


def _same(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), what
    for n in a:
        assert torch.equal(a[n], b[n]), f"{what}: {n} differs"


@needs_gpu
@pytest.mark.parametrize("stage", [0, 3])
def test_zero_init_and_a_host_model_build_the_gpu_engine_at_initialize(stage: int) -> None:
    """A Llama built inside ``zero.Init``, or whole on the CPU, for a GPU engine (issue 48,
    items 1 and 2): the engine is built at ``initialize`` on the GPU, a placeholder one
    element there and each unit filled on the host (a host model: each parameter read)
    and uploaded before the next, so torch's allocator never holds the model, before or
    during the first step. The script's ``model.cuda()`` first is the reference: it holds
    the model whole (the measure sees a model). All three train to the same bits."""
    args = {"model": "llama", "stage": stage, "dtype": "bf16", "gas": 1, "steps": 3, "global_batch": BATCH,
            "device": "cuda"}
    lazy = one_rank("init_workers.seeded", **args, lazy=True)
    host = one_rank("init_workers.seeded", **args, lazy=False)
    moved = one_rank("init_workers.seeded", **args, lazy=False, moved=True)
    model_bytes = sum(t.numel() * 2 for t in moved["start"].values())
    peaks = {k: r["torch_peak_at_initialize"] for k, r in (("zero.Init", lazy), ("host", host), ("moved", moved))}
    print(f"cuda stage {stage}: torch's peak through initialize {peaks} B (model {model_bytes} B in bf16)")
    assert {lazy["device"], host["device"], moved["device"]} == {"cuda:0"}
    assert lazy["placeholders"] and not host["placeholders"]
    assert peaks["moved"] >= model_bytes, "the measure cannot see a model"
    assert peaks["zero.Init"] < model_bytes // 8 and peaks["host"] < model_bytes // 8, peaks
    for r, what in ((lazy, "zero.Init"), (host, "host model")):
        _same(r["start"], moved["start"], f"{what}: initial values")
        assert r["losses"] == moved["losses"], (what, r["losses"], moved["losses"])
        _same(r["params"], moved["params"], f"{what}: trained values")


@needs_gpu
def test_from_pretrained_and_transformers_zero3_loading_on_the_gpu(tmp_path: Any) -> None:
    """``zero_torch.from_pretrained`` and transformers' ZeRO-3 loading (built inside the
    compat ``deepspeed.zero.Init`` with torch's initializers off, rank 0 writing inside
    ``GatheredParameters``, torch's group NCCL) train on the GPU engine at stage 3 to the
    bits of transformers' whole model, with torch's allocator never holding the model."""
    folder = tmp_path / "llama"
    models.build("llama", 11).save_pretrained(folder, max_shard_size="40KB")
    args = {"path": str(folder), "stage": 3, "dtype": "bf16", "steps": 3, "device": "cuda"}
    got = one_rank("init_workers.pretrained", **args)
    want = one_rank("init_workers.pretrained", **args, ordinary=True)
    model_bytes = sum(t.numel() * 2 for t in want["params"].values())
    assert got["device"] == "cuda:0" and got["report"] is not None, (got["device"], got["report"])
    assert max(got["torch_peak_at_initialize"], want["torch_peak_at_initialize"]) < model_bytes // 8, (
        got["torch_peak_at_initialize"], want["torch_peak_at_initialize"])
    _same(got["params"], want["params"], "from_pretrained, initial values")
    assert torch.equal(got["logits"], want["logits"])
    assert got["losses"] == want["losses"], (got["losses"], want["losses"])
    _same(got["trained"], want["trained"], "from_pretrained, trained values")

    loaded = one_rank("init_workers.written", stage=3, device="cuda")
    ordinary = one_rank("init_workers.written", stage=3, mode="ordinary", device="cuda")
    assert loaded["device"] == "cuda:0" and loaded["read_equal"]
    assert loaded["held"]["storage_bytes"] <= 4 * loaded["held"]["params"], loaded["held"]
    assert loaded["torch_peak_at_initialize"] < model_bytes // 8, loaded["torch_peak_at_initialize"]
    assert loaded["losses"] == ordinary["losses"], (loaded["losses"], ordinary["losses"])
    _same(loaded["params"], ordinary["params"], "transformers' ZeRO-3 loading, trained values")


@needs_gpu
def test_a_frozen_base_inside_zero_init_with_offload_stays_within_its_budget_on_the_gpu() -> None:
    """Issue 48, items 2 and 8: a LoRA-style frozen base built inside ``zero.Init`` on the
    GPU at stage 3 with ``offload_param`` and ``offload_optimizer`` (cpu): zero's device
    memory peaks (``allocator_peak``, the pool's high-water mark through ``initialize``
    and three steps) within the engine's own bound (``memory_report()["device_bound"]``:
    its buffers at rest, the most gathered at once and what those gathers hold while they
    run, as ``big_model_gpu.rs`` checks on the stand-in) and 64 KiB for its device
    scalars (torch's activations live in torch's allocator, not in this pool), and the
    run gives the bits of the same model built on the host."""
    extra = {"zero_optimization": {"offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"},
                                   "stage3_max_reuse_distance": 0}}
    args = {"model": "llama", "stage": 3, "dtype": "bf16", "gas": 1, "steps": 3, "global_batch": BATCH,
            "device": "cuda", "extra": extra, "frozen": True, "budget": True}
    lazy = one_rank("init_workers.seeded", **args, lazy=True)
    host = one_rank("init_workers.seeded", **args, lazy=False)
    r = lazy["memory"]
    rest = r["device_total"] - r["gathered"]
    budget = r["device_bound"] + (64 << 10)
    print(f"cuda zero.Init, frozen base, offload: zero's pool peaked at {r['allocator_peak']} B; budget {budget} B "
          f"({rest} B at rest, {r['peak_gathered']} B gathered at most); frozen partitions {r['frozen']} B on the device")
    assert 0 < r["allocator_peak"] <= budget, (r["allocator_peak"], budget)
    assert lazy["losses"] == host["losses"], (lazy["losses"], host["losses"])
    _same(lazy["params"], host["params"], "zero.Init against the host model, trained values")
