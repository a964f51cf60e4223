"""What ``test_shard_groups.py`` runs on each rank of a 2-node launch (two ``torchrun``
agents on one machine): several trainings of the tiny Llama at stage 1-3 with shard
groups (``mics_shard_size``) and hpZ (``zero_hpz_partition_size``), with accumulation
(``gas``: each rank's share of a batch in that many micro-batches), clipping, offload and
fp16 where a run says so (``mics_init``: the model built inside
``deepspeed.zero.MiCS_Init``), through the compat
line (``zero``) or DeepSpeed itself (``deepspeed``); each rank pickles its results to
``OUT/rank{R}.pkl``."""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any, Dict, List

import torch

sys.path.insert(0, str(Path(__file__).parent))
import models  # noqa: E402
from workers import config  # noqa: E402


def run(engine_kind: str, runs: List[Dict[str, Any]], steps: int, batch: int) -> List[Dict[str, Any]]:
    if engine_kind == "zero":
        import zero_torch.deepspeed_compat  # noqa: F401  (the one added line)
    else:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    if engine_kind == "deepspeed":
        deepspeed.init_distributed(dist_backend="gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out = []
    for r in runs:
        gas = r.get("gas", 1)
        cfg = config(r["stage"], r.get("dtype", "fp32"), gas, batch, clip=r.get("clip", 0.0),
                     extra={"zero_optimization": r.get("zero", {})})
        if r.get("mics_init"):
            # A script written for DeepSpeed's MiCS (0.18 and before) builds its model so.
            with deepspeed.zero.MiCS_Init(config_dict_or_path=cfg):
                m = models.build("llama")
        else:
            m = models.build("llama")
        if engine_kind == "deepspeed":
            cfg["optimizer"]["params"]["torch_adam"] = True
        engine, _, _, _ = deepspeed.initialize(model=m, config=cfg, model_parameters=m.parameters())
        losses = []
        for ids in models.batches(steps, batch, 1):
            mine = models.shard(ids, rank, world)
            for k in range(gas):
                loss = models.loss_of(engine, models.micro(mine, k, gas))
                engine.backward(loss)
                engine.step()
                losses.append(loss.item())
        params = list(engine.module.parameters())
        with deepspeed.zero.GatheredParameters(params, enabled=r["stage"] == 3):
            whole = {n: p.detach().float().clone() for n, p in engine.module.named_parameters()}
        comm = engine.comm_report() if engine_kind == "zero" else None
        # The machines zero found (None: one machine, every rank over shared memory).
        tier = getattr(engine, "_cpu_tier", None)
        out.append({"losses": losses, "params": whole, "comm": comm,
                    "machines": None if tier is None else tier.machines})
        if hasattr(engine, "destroy"):
            engine.destroy()
    return out


if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    result = run(args["engine"], args["runs"], args["steps"], args["batch"])
    with open(Path(args["out"]) / f"rank{os.environ['RANK']}.pkl", "wb") as f:
        pickle.dump(result, f)
