"""Plain-PyTorch references for zero_torch's tests."""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch

import models

BETAS = (0.9, 0.95)
EPS = 1e-8
WEIGHT_DECAY = 0.01
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def mixed_precision(
    name: str, dtype: str, steps: int, batch: int, lr: float, gas: int = 1, split: int = 1, snapshot_at: int = -1
) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor], List[float]]:
    """What mixed-precision training means (DeepSpeed's bf16 optimizer): a model in
    ``dtype``, fp32 master weights started from its rounded values and stepped by
    ``torch.optim.AdamW`` on the 16-bit gradients, rounded back into the model after every
    step. Each micro-batch's gradient is the mean of ``split`` parts' gradients (as
    ``split`` data-parallel ranks compute them). Returns the final parameters, those after
    step ``snapshot_at``, and each step's mean loss, all as fp32."""
    # Parameters in the 16-bit dtype, buffers (rotary frequencies) as they are: DeepSpeed's
    # (and zero's) mixed-precision cast.
    model = models.build(name)
    for p in model.parameters():
        p.data = p.data.to(DTYPES[dtype])
    master = models.build(name)
    with torch.no_grad():
        for pm, pb in zip(master.parameters(), model.parameters()):
            pm.copy_(pb.float())
    opt = torch.optim.AdamW(master.parameters(), lr=lr, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    losses: List[float] = []
    snapshot: Dict[str, torch.Tensor] = {}
    for step, ids in enumerate(models.batches(steps, batch, 1)):
        acc = [torch.zeros_like(p) for p in master.parameters()]
        total = 0.0
        for k in range(gas):
            mb = models.micro(ids, k, gas)
            for r in range(split):
                loss = models.loss_of(model, models.shard(mb, r, split))
                loss.backward()
                total += loss.item() / (gas * split)
                for a, p in zip(acc, model.parameters()):
                    if p.grad is not None:
                        a += p.grad.float() / (gas * split)
                    p.grad = None
        losses.append(total)
        for pm, a in zip(master.parameters(), acc):
            pm.grad = a
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            for pm, pb in zip(master.parameters(), model.parameters()):
                pb.copy_(pm)
        if step + 1 == snapshot_at:
            snapshot = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    final = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    return final, snapshot, losses
