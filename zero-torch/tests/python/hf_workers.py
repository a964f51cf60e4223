"""What each rank runs for ``test_hf_checkpoint.py``: a Hugging Face checkpoint loaded into
a running engine, each rank reading only what it holds."""

from __future__ import annotations

from typing import Any, Dict

import torch

import models
import workers


def load(stage: int, dtype: str, path: str, paths: Dict[str, str] = None, steps: int = 1) -> Dict[str, Any]:
    """Builds a differently seeded model, loads the checkpoint in ``path`` (rank-specific
    ``paths`` override it), and returns the parameters, logits on a fixed batch, the load
    report and the losses of a few steps after it."""
    import zero_torch

    rank, world = workers.rank_world()
    m = models.build("llama", 5)
    engine, _, _, _ = zero_torch.initialize(model=m, config=workers.config(stage, dtype, 1, 2 * world))
    ids = models.batches(1, 2, 3)[0]
    with torch.no_grad():
        engine(input_ids=ids)  # builds the engine
    try:
        engine.load_hf_checkpoint((paths or {}).get(str(rank), path))
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}", "exception": type(e).__name__, "params": workers.gathered(engine)}
    params = workers.gathered(engine)
    with torch.no_grad():
        logits = engine(input_ids=ids).logits.float()
    losses = []
    for batch in models.batches(steps, 2 * world, 4):
        loss = models.loss_of(engine, models.shard(batch, rank, world))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return {"params": params, "logits": logits, "report": engine.load_report(), "losses": losses}
