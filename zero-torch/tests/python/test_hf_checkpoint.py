"""``engine.load_hf_checkpoint``: a ``save_pretrained`` folder (sharded, or one file) loads
into a running engine at every stage with transformers' values and logits, each rank
reading only the byte ranges of what it holds; a checkpoint of another model, or a
damaged file on one rank, raises on every rank naming the tensor and the file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Dict

import pytest
import torch

import models

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: Any) -> Dict[str, Any]:
    """The reference model (seed 0) saved sharded and as one file, with its logits."""
    root = tmp_path_factory.mktemp("hf")
    m = models.build("llama", 0)
    m.save_pretrained(root / "sharded", max_shard_size="40KB")
    m.save_pretrained(root / "single")
    assert (root / "sharded" / "model.safetensors.index.json").exists()
    ids = models.batches(1, 2, 3)[0]
    with torch.no_grad():
        logits = m(input_ids=ids).logits.float()
    params = {n: p.detach().clone() for n, p in m.named_parameters()}
    sizes = {f.name: f.stat().st_size for f in (root / "sharded").glob("*.safetensors")}
    return {"root": root, "params": params, "logits": logits, "bytes": sum(sizes.values())}


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_every_stage_loads_transformers_values_reading_only_its_part(job: Any, saved: Dict[str, Any], stage: int, dtype: str) -> None:
    kind = "sharded" if stage % 2 == 0 else "single"
    res = job(2, "hf_workers.load", {"stage": stage, "dtype": dtype, "path": str(saved["root"] / kind)})
    requested = 0
    for rank, r in enumerate(res):
        for n, want in saved["params"].items():
            assert torch.equal(r["params"][n], want.to(DTYPES[dtype]).float()), f"rank {rank}: {n}"
        if dtype == "fp32":
            assert torch.equal(r["logits"], saved["logits"]), f"rank {rank}: logits differ from transformers'"
        rep = r["report"]
        assert rep["bytes_read"] <= rep["bytes_requested"] + (len(saved["params"]) + 4) * 8192, rep
        requested += rep["bytes_requested"]
        assert all(torch.isfinite(torch.tensor(x)) for x in r["losses"])
    whole = sum(p.numel() * 4 for p in saved["params"].values())
    if stage == 0:
        assert requested == 2 * whole
    else:  # each parameter byte once over the ranks, persistent ones by both
        assert whole <= requested < 1.5 * whole, (requested, whole)


def test_a_checkpoint_of_another_model_fails_every_rank_naming_the_tensor(job: Any, tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = models.llama(0).config
    tied = LlamaForCausalLM(LlamaConfig(**{**cfg.to_dict(), "tie_word_embeddings": True}))
    tied.save_pretrained(tmp_path / "tied")
    res = job(2, "hf_workers.load", {"stage": 3, "dtype": "bf16", "path": str(tmp_path / "tied")}, expect_ok=False)
    for r in res:
        assert r.get("exception") == "CheckpointError", r
        assert "`lm_head.weight`" in r["error"] and "not in the checkpoint" in r["error"], r["error"]


def test_a_damaged_file_on_one_rank_fails_every_rank_and_changes_nothing(job: Any, saved: Dict[str, Any], tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(saved["root"] / "sharded", bad)
    shard = sorted(bad.glob("*.safetensors"))[-1]
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 64)
    res = job(2, "hf_workers.load", {"stage": 2, "dtype": "fp32", "path": str(saved["root"] / "sharded"), "paths": {"1": str(bad)}}, expect_ok=False)
    assert shard.name in res[1]["error"], res[1]["error"]
    assert "rank 1" in res[0]["error"], res[0]["error"]
    import models as m

    fresh = {n: p.detach().float() for n, p in m.build("llama", 5).named_parameters()}
    for r in res:
        assert all(torch.equal(r["params"][n], v) for n, v in fresh.items()), "a failed load changed nothing"
