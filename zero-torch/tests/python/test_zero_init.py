"""Models bigger than one rank: ``zero.Init`` builds a model without its parameters and the
engine fills it one unit at a time (seeded initializers, the same at any world size and
stage, and the same as ``zero.init_weights`` on a whole model); ``from_pretrained`` builds
a Hugging Face folder's model the same way and each rank reads only the byte ranges it
holds; ``save_hf_checkpoint`` writes a folder transformers reads, whole or not at all.
Errors (a parameter nothing fills, a damaged or foreign checkpoint, a failed save) raise on
every rank."""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path
from typing import Any, Dict

import pytest
import torch

import models

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _equal(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor], what: str) -> None:
    assert a.keys() == b.keys()
    for n in a:
        assert torch.equal(a[n], b[n]), f"{what}: {n} differs"


@pytest.mark.parametrize("model,stage,dtype,gas,clip,world", [
    ("llama", 3, "bf16", 1, 0.0, 2),
    ("llama", 0, "fp32", 2, 1.0, 2),
    ("gpt2", 3, "fp32", 2, 0.5, 2),
    ("gpt2", 2, "bf16", 1, 0.0, 2),
    ("llama", 1, "bf16", 2, 0.0, 2),
    ("llama", 3, "fp16", 1, 1.0, 2),
    ("llama", 3, "bf16", 2, 1.0, 4),
    ("gpt2", 2, "fp32", 1, 0.5, 1),
])
def test_a_model_built_inside_init_trains_to_the_bits_of_the_ordinary_path(
        job: Any, model: str, stage: int, dtype: str, gas: int, clip: float, world: int) -> None:
    args = {"model": model, "stage": stage, "dtype": dtype, "gas": gas, "steps": 3, "global_batch": max(4, world * gas),
            "clip": clip}
    lazy = job(world, "init_workers.seeded", {**args, "lazy": True})
    whole = job(world, "init_workers.seeded", {**args, "lazy": False})
    for rank in range(world):
        assert lazy[rank]["placeholders"], "a parameter built inside zero.Init holds values"
        assert lazy[rank]["held_before"] <= 4 * 64, lazy[rank]["held_before"]
        assert not whole[rank]["placeholders"]
        for name, p in lazy[rank]["start"].items():
            assert torch.isfinite(p).all(), f"{name} was left unfilled"
        _equal(lazy[rank]["start"], whole[rank]["start"], f"rank {rank} initial values")
        assert lazy[rank]["losses"] == whole[rank]["losses"], (lazy[rank]["losses"], whole[rank]["losses"])
        _equal(lazy[rank]["params"], whole[rank]["params"], f"rank {rank} trained values")


def test_the_seeded_fill_does_not_depend_on_world_size_or_stage(job: Any) -> None:
    args = {"model": "llama", "dtype": "fp32", "gas": 1, "steps": 0, "global_batch": 4, "lazy": True}
    one = job(1, "init_workers.seeded", {**args, "stage": 0})[0]["start"]
    two = job(2, "init_workers.seeded", {**args, "stage": 3})
    for r in two:
        _equal(r["start"], one, "world 2, stage 3 against world 1, stage 0")
    for r in job(4, "init_workers.seeded", {**args, "stage": 2}):
        _equal(r["start"], one, "world 4, stage 2 against world 1, stage 0")
    other = job(1, "init_workers.seeded", {**args, "stage": 0, "seed": 8})[0]["start"]
    assert not torch.equal(other["model.layers.0.self_attn.q_proj.weight"], one["model.layers.0.self_attn.q_proj.weight"])


def test_a_parameter_nothing_fills_is_an_error_naming_it_on_every_rank(job: Any) -> None:
    res = job(2, "init_workers.unfilled", expect_ok=False)
    for r in res:
        assert r.get("exception") == "ZeroError", r
        assert "`gain`" in r["error"] and "param_init_fn" in r["error"], r["error"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: Any) -> Dict[str, Any]:
    """A Llama saved sharded and a GPT-2 (tied weights) saved as one file, with their
    parameters and logits; and the Llama saved in bfloat16 (``llama_bf16``)."""
    root = tmp_path_factory.mktemp("pretrained")
    out: Dict[str, Any] = {"root": root}
    ids = models.batches(1, 2, 3)[0]
    for name, shard in (("llama", "40KB"), ("gpt2", None)):
        m = models.build(name, 11)
        kwargs = {"max_shard_size": shard} if shard else {}
        m.save_pretrained(root / name, **kwargs)
        with torch.no_grad():
            logits = m(input_ids=ids).logits.float()
        out[name] = {"params": {n: p.detach().clone() for n, p in m.named_parameters()}, "logits": logits}
    models.build("llama", 11).to(torch.bfloat16).save_pretrained(root / "llama_bf16", max_shard_size="40KB")
    assert (root / "llama" / "model.safetensors.index.json").exists()
    return out


@pytest.mark.parametrize("model,stage,dtype", [("llama", 3, "fp32"), ("llama", 1, "bf16"), ("gpt2", 3, "bf16"), ("gpt2", 0, "fp32")])
def test_from_pretrained_gives_transformers_values_each_rank_reading_its_part(
        job: Any, saved: Dict[str, Any], model: str, stage: int, dtype: str) -> None:
    res = job(2, "init_workers.pretrained", {"path": str(saved["root"] / model), "stage": stage, "dtype": dtype})
    want = saved[model]
    whole = sum(p.numel() * 4 for p in want["params"].values())
    files = len(list((saved["root"] / model).glob("*.safetensors")))
    requested = 0
    for rank, r in enumerate(res):
        assert r["held_before"] <= 4 * 64, r["held_before"]
        assert not r["training"], "from_pretrained returns the model in eval mode, as transformers does"
        for n, p in want["params"].items():
            assert torch.equal(r["params"][n], p.to(DTYPES[dtype]).float()), f"rank {rank}: {n}"
        if dtype == "fp32":
            assert torch.equal(r["logits"], want["logits"]), f"rank {rank}: logits differ from transformers'"
        rep = r["report"]
        slack = (len(want["params"]) + 4) * 8192
        assert rep["bytes_requested"] <= rep["bytes_read"] <= rep["bytes_requested"] + slack, rep
        requested += rep["bytes_requested"]
        # Stage 0 holds everything, so reads every file; else only the files of its part.
        assert 1 <= rep["files_opened"] <= files and (stage > 0 or rep["files_opened"] == files), (rep, files)
        assert 0 < rep["seconds"] < 60, rep
        if os.path.exists("/proc/self/status"):  # VmHWM: torch and transformers alone are far above 32 MiB
            assert 32 << 20 <= rep["peak_rss"] < 64 << 30, rep
        assert all(torch.isfinite(torch.tensor(x)) for x in r["losses"])
    if stage == 0:
        assert requested == 2 * whole
    else:
        assert whole <= requested < 1.5 * whole, (requested, whole)


def test_from_pretrained_errors_reach_every_rank_at_initialize(job: Any, saved: Dict[str, Any], tmp_path: Path) -> None:
    def damaged_on_rank_1(name: str, which: int, damage: Any) -> None:
        """Rank 1 loads a copy whose shard ``which`` ``damage`` changed: every rank fails,
        rank 1 naming the file, rank 0 naming rank 1."""
        bad = tmp_path / name
        shutil.copytree(saved["root"] / "llama", bad)
        shard = sorted(bad.glob("*.safetensors"))[which]
        damage(shard)
        res = job(2, "init_workers.pretrained",
                  {"path": str(saved["root"] / "llama"), "stage": 3, "dtype": "fp32", "paths": {"1": str(bad)}},
                  expect_ok=False)
        for r in res:
            assert r.get("exception") == "CheckpointError", r
        assert shard.name in res[1]["error"], res[1]["error"]
        assert "rank 1" in res[0]["error"], res[0]["error"]

    def truncate(shard: Path) -> None:
        with open(shard, "r+b") as f:
            f.truncate(os.path.getsize(shard) - 64)

    def garble_header(shard: Path) -> None:  # its JSON garbled, the length intact
        data = bytearray(shard.read_bytes())
        data[8] = ord("#")
        shard.write_bytes(bytes(data))

    damaged_on_rank_1("bad", -1, truncate)
    damaged_on_rank_1("garbled", 0, garble_header)
    # A shard the index names is missing.
    gone = tmp_path / "gone"
    shutil.copytree(saved["root"] / "llama", gone)
    lost = sorted(gone.glob("*.safetensors"))[0]
    lost.unlink()
    res = job(2, "init_workers.pretrained", {"path": str(gone), "stage": 3, "dtype": "fp32"}, expect_ok=False)
    for r in res:
        assert r.get("exception") == "CheckpointError", r
        assert lost.name in r["error"], r["error"]
    # Weights saved tied (no lm_head.weight) under an untied model's config.json.
    from transformers import LlamaConfig, LlamaForCausalLM

    tied = tmp_path / "tied"
    cfg = models.build_config("llama").to_dict()
    LlamaForCausalLM(LlamaConfig(**{**cfg, "tie_word_embeddings": True})).save_pretrained(tied)
    shutil.copy(saved["root"] / "llama" / "config.json", tied / "config.json")
    res = job(2, "init_workers.pretrained", {"path": str(tied), "stage": 2, "dtype": "fp32"}, expect_ok=False)
    for r in res:
        assert r.get("exception") == "CheckpointError", r
        assert "`lm_head.weight`" in r["error"] and "not in the checkpoint" in r["error"], r["error"]


@pytest.mark.parametrize("folder,stage,dtype,gas,clip,world,extra", [
    ("llama", 3, "fp32", 2, 1.0, 2, {}),
    ("gpt2", 0, "fp32", 1, 0.5, 1, {"model_class": "GPT2LMHeadModel"}),
    ("llama", 1, "bf16", 2, 0.0, 4, {}),
    ("gpt2", 2, "fp16", 2, 1.0, 2, {"torch_dtype": "float32"}),
    ("llama_bf16", 3, "bf16", 1, 1.0, 2, {}),
], ids=["llama-3-fp32-N2", "gpt2-0-fp32-N1-model_class", "llama-1-bf16-N4-fp32-file", "gpt2-2-fp16-N2-torch_dtype-fp32-file",
        "llama-3-bf16-N2-bf16-file"])
def test_from_pretrained_trains_to_the_bits_of_transformers_from_pretrained(
        job: Any, saved: Dict[str, Any], folder: str, stage: int, dtype: str, gas: int, clip: float, world: int,
        extra: Dict[str, str]) -> None:
    """``zero_torch.from_pretrained`` then ``initialize`` against the ordinary path
    (transformers' ``from_pretrained``, the whole model, then ``initialize``): the same
    initial values, logits, losses and trained parameters, bit for bit, with accumulation
    and clipping. A 16-bit run from float32 files makes its fp32 master weights from the
    values rounded to the model's dtype, as the ordinary path (and DeepSpeed) makes them
    from the 16-bit parameters; from a folder saved in bfloat16 there is nothing to round."""
    args = {"path": str(saved["root"] / folder), "stage": stage, "dtype": dtype, "gas": gas, "clip": clip,
            "steps": 3, **extra}
    got = job(world, "init_workers.pretrained", args)
    want = job(world, "init_workers.pretrained", {**args, "ordinary": True})
    made = DTYPES["fp32" if "torch_dtype" in extra else dtype]  # torch_dtype= wins over the config's
    for rank in range(world):
        g, w = got[rank], want[rank]
        assert g["held_before"] <= 4 * 64 and w["held_before"] > 4 * 64, (g["held_before"], w["held_before"])
        assert g["report"] is not None and w["report"] is None
        assert g["dtypes"] == [str(made)], g["dtypes"]
        assert g["class"] == w["class"] == extra.get("model_class", g["class"])
        _equal(g["params"], w["params"], f"rank {rank} initial values")
        assert torch.equal(g["logits"], w["logits"]), f"rank {rank}: logits differ"
        assert g["losses"] == w["losses"], (g["losses"], w["losses"])
        _equal(g["trained"], w["trained"], f"rank {rank} trained values")


def _rewrite(src: Path, dst: Path, tensor: str, change: Any) -> Path:
    """A copy of the folder ``src`` at ``dst`` where ``change(tensors)`` rewrote the
    safetensors file holding ``tensor`` (or the first file); returns that file."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    files = sorted(dst.glob("*.safetensors"))
    for f in files:
        tensors = load_file(str(f))
        if tensor in tensors:
            break
    else:
        f = files[0]
        tensors = load_file(str(f))
    change(tensors)
    save_file(tensors, str(f), metadata={"format": "pt"})
    return f


@pytest.mark.parametrize("kind,model,tensor,says", [
    ("unexpected", "gpt2", "transformer.extra.weight", "is not a parameter of the model"),
    ("shape", "llama", "model.layers.1.mlp.down_proj.weight", "has shape [31, 64] in the checkpoint and [32, 64]"),
    # Rank 1 alone holds (and reads) this tensor's elements at stage 3: rank 0 hears of it.
    ("dtype", "llama", "model.layers.1.mlp.down_proj.weight", "is I32"),
], ids=["unexpected", "shape", "dtype"])
def test_a_wrong_tensor_in_the_checkpoint_is_an_error_naming_it_and_its_file_on_every_rank(
        job: Any, saved: Dict[str, Any], tmp_path: Path, kind: str, model: str, tensor: str, says: str) -> None:
    def change(tensors: Dict[str, torch.Tensor]) -> None:
        if kind == "unexpected":
            tensors[tensor] = torch.zeros(3, 4)
        elif kind == "shape":
            tensors[tensor] = tensors[tensor][:-1].clone()
        else:
            tensors[tensor] = tensors[tensor].to(torch.int32)

    bad = tmp_path / "bad"
    file = _rewrite(saved["root"] / model, bad, tensor, change)
    res = job(2, "init_workers.pretrained", {"path": str(bad), "stage": 3, "dtype": "fp32"}, expect_ok=False)
    for rank, r in enumerate(res):
        # from_pretrained reads config.json only: the weights' errors come at initialize.
        assert r.get("exception") == "CheckpointError" and r.get("at") == "initialize", r
        assert f"`{tensor}`" in r["error"] and str(file) in r["error"], f"rank {rank}: {r['error']}"
        assert says in r["error"], f"rank {rank}: {r['error']}"
    if kind == "dtype":
        assert res[0]["error"].startswith("CheckpointError: rank 1 failed"), res[0]["error"]


@pytest.mark.parametrize("model,stage,dtype,save_dtype", [("llama", 3, "fp32", None), ("gpt2", 3, "bf16", None),
                                                          ("llama", 1, "bf16", "float32")])
def test_save_hf_checkpoint_is_read_by_transformers_and_from_pretrained(
        job: Any, tmp_path: Path, model: str, stage: int, dtype: str, save_dtype: Any) -> None:
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    res = job(2, "init_workers.save_hf", {"path": str(out), "stage": stage, "dtype": dtype, "save_dtype": save_dtype,
                                          "model": model})
    assert res[0]["params"].keys() == res[1]["params"].keys()
    assert (out / "config.json").exists() and (out / "model.safetensors.index.json").exists()
    shards = sorted(f.name for f in out.glob("model-*.safetensors"))
    assert len(shards) > 1, "40 KB shards"
    assert not list(tmp_path.glob("*.zt-saving")), "the staging folder is gone"
    # The ranks share the writing: shard k (from 1) by rank (k - 1) mod 2, the index by rank 0.
    assert res[0]["written"] == shards[0::2] + ["model.safetensors.index.json"], res[0]["written"]
    assert res[1]["written"] == shards[1::2], res[1]["written"]
    stored = {torch.float32: torch.float32, None: DTYPES[dtype]}[getattr(torch, save_dtype) if save_dtype else None]
    saved: Dict[str, torch.Tensor] = {}
    for f in out.glob("model-*.safetensors"):
        with safe_open(str(f), "pt") as st:
            for key in st.keys():
                saved[key] = st.get_tensor(key)
                assert saved[key].dtype == stored, key
    want = res[0]["params"]
    if stored == torch.float32 and dtype != "fp32":
        # fp32 from a 16-bit run: the fp32 master weights, which round to the parameters
        # (and hold more than them; the Rust test checks them against the masters bit for bit).
        finer = 0
        for n, p in want.items():
            assert torch.equal(saved[n].to(DTYPES[dtype]).float(), p), f"{n}: not the masters of the parameters"
            finer += int((saved[n] != p).sum())
        assert finer > 0, "the saved fp32 weights are only the 16-bit parameters widened"
        want = {n: saved[n] for n in want}
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    got = dict(loaded.named_parameters())
    for n, p in want.items():
        assert torch.equal(got[n].detach(), p), f"transformers read {n} differently"
    if dtype == "fp32":
        ids = models.batches(1, 2, 3)[0]
        with torch.no_grad():
            logits = loaded(input_ids=ids).logits.float()
        assert torch.equal(logits, res[0]["logits"]), "transformers' logits differ from the engine's"
    back = job(2, "init_workers.pretrained", {"path": str(out), "stage": 3, "dtype": "fp32", "steps": 0})
    for r in back:
        _equal(r["params"], want, "zero_torch.from_pretrained of the saved folder")


def test_a_failed_save_leaves_the_earlier_folder_and_fails_every_rank(job: Any, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    first = job(2, "init_workers.save_hf", {"path": str(out), "stage": 3, "dtype": "fp32", "steps": 1})
    files = {f.name: f.read_bytes() for f in out.iterdir()}
    res = job(2, "init_workers.save_hf", {"path": str(out), "stage": 3, "dtype": "fp32", "steps": 3,
                                          "fail_on_rank0": True}, expect_ok=False)
    for r in res:
        assert r.get("exception") == "CheckpointError", r
        assert "rank 0" in r["error"] and "injected" in r["error"], r["error"]
    assert not torch.equal(res[0]["params"]["lm_head.weight"], first[0]["params"]["lm_head.weight"])
    assert {f.name: f.read_bytes() for f in out.iterdir()} == files, "the earlier folder changed"
    assert not list(tmp_path.glob("*.zt-saving")), "the staging folder is gone"
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert torch.equal(loaded.lm_head.weight.detach(), first[0]["params"]["lm_head.weight"])


@pytest.mark.parametrize("stage", [2, 3])
def test_gathered_parameters_with_a_modifier_rank_work_on_an_init_model(job: Any, stage: int) -> None:
    res = job(2, "init_workers.modify_gathered", {"stage": stage})
    for rank, r in enumerate(res):
        embed = r["params"]["model.embed_tokens.weight"]
        # One AdamW step (lr 1e-2) from 0.5 moves each element by at most about lr.
        assert (embed - 0.5).abs().max() <= 0.011, f"rank {rank}: rank 0's values did not reach it"
        _equal(r["params"], res[0]["params"], f"rank {rank} against rank 0")


@pytest.mark.parametrize("stage", [1, 3])
def test_rank_0s_writes_before_initialize_keep_a_shard_per_rank_and_train_as_the_ordinary_path(
        job: Any, stage: int) -> None:
    """transformers' ZeRO-3 loading by hand (initializers off, rank 0 writing inside
    GatheredParameters): no rank holds the model, each keeps half of it, and training
    gives the ordinary path's bits."""
    got = job(2, "init_workers.written", {"stage": stage})
    want = job(2, "init_workers.written", {"stage": stage, "mode": "ordinary"})
    for rank in range(2):
        held = got[rank]["held"]
        assert held["storage_bytes"] <= 4 * held["params"], f"rank {rank} holds parameter storage: {held}"
        assert held["numel"] / 2 <= held["shard_numel"] <= held["numel"] / 2 + held["params"], held
        assert got[rank]["read_equal"], f"rank {rank}: a read-only gather did not give rank 0's values"
        assert got[rank]["losses"] == want[rank]["losses"], (got[rank]["losses"], want[rank]["losses"])
        _equal(got[rank]["params"], want[rank]["params"], f"rank {rank} trained values")


def test_a_parameter_not_written_before_initialize_is_an_error_naming_it_on_every_rank(job: Any) -> None:
    res = job(2, "init_workers.written", {"stage": 3, "mode": "partial"}, expect_ok=False)
    for r in res:
        assert r.get("exception") == "ZeroError", r
        assert "`model.norm.weight`" in r["error"] and "never written" in r["error"], r["error"]


def test_a_block_that_raises_on_rank_0_before_initialize_raises_on_every_rank_at_once(job: Any) -> None:
    res = job(2, "init_workers.written", {"stage": 3, "mode": "raise"}, expect_ok=False)
    assert res[0].get("exception") == "ValueError" and "model.norm" in res[0]["error"], res[0]
    assert res[1].get("exception") == "ZeroError", res[1]
    assert "rank(s) [0]" in res[1]["error"] and "no values were sent" in res[1]["error"], res[1]["error"]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the threshold is glibc's")
def test_a_model_built_inside_init_maps_freed_tensors_back_to_the_kernel(job: Any) -> None:
    """Entering zero.Init pins glibc's mmap threshold (1 MiB): a 4 MiB tensor after a freed
    8 MiB one is mapped (returned to the kernel when freed), where glibc's rising threshold
    would have put it in the heap, as it still does for a model built whole."""
    for r in job(1, "init_workers.heap_after_initialize", {"inside_init": True}):
        assert r["mapped"] >= 4 << 20, r
    for r in job(1, "init_workers.heap_after_initialize", {"inside_init": False}):
        assert r["mapped"] == 0, r


@pytest.mark.parametrize("stage,init,reentrant", [(3, True, False), (2, False, False), (2, False, True), (3, False, True)])
def test_a_module_used_more_often_than_in_the_first_forward(job: Any, stage: int, init: bool, reentrant: bool) -> None:
    """The first forward predicts one gradient per parameter in the first backward and the
    first backward teaches the count. A module used once in the first step and two, then
    three times later: autograd sums a leaf's uses before accumulating its gradient, so it
    still arrives once and the run trains as plain PyTorch. Used in more reentrant
    checkpoint segments than before (each accumulates its own gradient), it is an error
    naming the parameter, on every rank, in the step that does it."""
    res = job(2, "init_workers.reused", {"stage": stage, "init": init, "reentrant": reentrant, "times": [1, 2, 3]},
              expect_ok=not reentrant)
    for rank, r in enumerate(res):
        if reentrant:
            assert r.get("exception") == "OrderError" and r["step"] == 1, r
            if stage == 3:  # the second segment's recompute finds `sub` already reduced
                assert "module sub runs again" in r["error"], r["error"]
            else:
                assert "parameter sub." in r["error"] and "received its gradient 2 times" in r["error"], r["error"]
            continue
        assert r["params"].keys() == r["reference"].keys()
        worst = max((r["params"][n] - r["reference"][n]).abs().max().item() for n in r["reference"])
        assert worst <= 1e-5, f"rank {rank}: max |zero - torch| = {worst}"
        _equal(r["params"], res[0]["params"], f"rank {rank} against rank 0")
