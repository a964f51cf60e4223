"""zero_torch's host-side collectives under torch's default group of ``backend`` (``gloo``,
or ``nccl_rules.NAME``, which refuses CPU tensors as NCCL does), for
``test_nccl_rules.py``: one process per rank, a tiny GPT-2 seeded per rank, through the
compat line. Every path that crosses torch's group on zero's behalf runs:
``GatheredParameters(modifier_rank=0)`` before an engine exists (a broadcast),
``initialize`` (rank 0's model to every rank; rank 0's id through torch's store), training,
``GatheredParameters(modifier_rank=0)`` after, ``save_checkpoint``/``load_checkpoint``,
``save_hf_checkpoint`` (every rank's word on the write), the consolidated 16-bit state
dict, and transformers' ZeRO-3 loading (``HfDeepSpeedConfig`` + ``from_pretrained``,
which writes each module on rank 0 inside ``GatheredParameters(modifier_rank=0)``)."""

from __future__ import annotations

import os
from typing import Any, Dict, List

import torch

import models
import nccl_rules

STEPS = 2


def _rank_world() -> tuple:
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def _train(engine: Any, steps: int) -> List[float]:
    rank, world = _rank_world()
    losses = []
    for ids in models.batches(steps, 4 * world):
        mine = models.shard(ids, rank, world)
        loss = engine(input_ids=mine, labels=mine).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def _whole(deepspeed: Any, model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        return {n: p.detach().clone() for n, p in model.named_parameters()}


def run(backend: str, stage: int, work: str) -> Dict[str, Any]:
    import zero_torch.deepspeed_compat  # noqa: F401
    import deepspeed
    import torch.distributed as dist

    nccl_rules.install()
    dist.init_process_group(backend=backend)
    rank, world = _rank_world()
    out: Dict[str, Any] = {"backend": dist.get_backend()}
    try:
        dist.all_reduce(torch.ones(1))
        out["cpu_collective"] = "ran"
    except RuntimeError as e:
        out["cpu_collective"] = str(e)
    config = {"train_batch_size": 4 * world, "zero_optimization": {
        "stage": stage, "stage3_gather_16bit_weights_on_model_save": True, "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}}
    model = models.gpt2(seed=rank)  # every rank its own values: the broadcasts matter
    with deepspeed.zero.GatheredParameters([model.lm_head.weight, None], modifier_rank=0):
        if rank == 0:
            with torch.no_grad():
                model.transformer.wpe.weight.mul_(0.5)  # not in the block: a whole model's
                model.lm_head.weight.add_(0.01)         # parameter, broadcast on exit
    engine, _, _, _ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
    out["losses"] = _train(engine, STEPS)
    with deepspeed.zero.GatheredParameters([model.transformer.ln_f.weight], modifier_rank=0):
        if rank == 0:
            with torch.no_grad():
                model.transformer.ln_f.weight.fill_(1.5)
    ckpt = os.path.join(work, "ckpt")
    engine.save_checkpoint(ckpt)
    out["losses"] += _train(engine, 1)
    engine.load_checkpoint(ckpt)
    out["losses"] += _train(engine, 1)
    engine.save_hf_checkpoint(os.path.join(work, "hf"))
    state = engine._zero3_consolidated_16bit_state_dict()
    out["consolidated"] = {n: (str(t.device), tuple(t.shape)) for n, t in state.items()}
    out["params"] = _whole(deepspeed, model)

    # transformers' ZeRO-3 loading of what was just saved.
    from transformers import AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    hf = HfDeepSpeedConfig(dict(config, zero_optimization=dict(config["zero_optimization"], stage=3)))
    loaded = AutoModelForCausalLM.from_pretrained(os.path.join(work, "hf"))
    # Built without its values whatever the backend: each rank kept its shard of rank 0's.
    out["loaded_placeholders"] = all(getattr(p, "_zero_lazy", None) is not None for p in loaded.parameters())
    engine2, _, _, _ = deepspeed.initialize(model=loaded, config=dict(config, zero_optimization=dict(
        config["zero_optimization"], stage=3)), model_parameters=loaded.parameters())
    out["loaded"] = _whole(deepspeed, loaded)
    out["losses_loaded"] = _train(engine2, 1)
    del hf
    return out
