"""One rank against ``torch.optim.AdamW`` with the same hyperparameters, on a tiny
``LlamaForCausalLM`` and a tiny ``GPT2LMHeadModel`` (tied weights), 20 steps.

- fp32: at one rank the gradients are torch's own, bit for bit, so the only difference is
  the optimizer's arithmetic: zero's fused AdamW and torch's round the same formula in a
  different order, a few ulps of ``|theta| + lr`` per step. The bound, 32 ulps of 1.0
  (3.8e-6) after 20 steps, leaves room for that to compound through the loss.
  One slice is left out: GPT-2's key bias (the middle third of ``c_attn.bias``). Softmax
  ignores a shift shared by every key, so its exact gradient is zero and the computed one
  is rounding noise (~1e-9); Adam divides by the noise's own size and turns it into steps
  of order ``lr``, so two correct implementations that round differently once drift apart
  there by ~1e-4, without effect on anything else (the forward ignores it).
- bf16: the reference is what mixed precision means (DeepSpeed's bf16 optimizer): fp32
  master weights, started from the bf16-rounded values, stepped by ``torch.optim.AdamW`` on
  the bf16 gradients and rounded into the bf16 model after every step. The master weights
  differ by fp32 ulps as above, which flips a bf16 rounding now and then; from then on the
  two runs compute different bf16 gradients and drift apart like any two runs of a chaotic
  map (measured on the tiny Llama: 0 ulps after 4 steps, 2 after 10, 9 after 20). So the
  parameters are compared after 4 steps, to within 1 bf16 ulp of each parameter's largest
  element (one flipped rounding); the 20 losses to within 1e-3 relative (they differ by
  ~1e-4). GPT-2 is compared after 2 steps: its key bias's noise steps (below), rounded
  into bf16, change the forward's roundings, and from the third step on the two runs
  differ in thousands of elements.
"""

from __future__ import annotations

import math
from typing import Dict, List, Tuple

import pytest
import torch

import models
import references
import workers

STEPS = 20
BATCH = 4
LR = 1e-2
BF16_SNAPSHOT = {"llama": 4, "gpt2": 2}
"""After how many steps the bf16 parameters are compared (see the module's doc)."""


def torch_fp32(name: str) -> torch.nn.Module:
    m = models.build(name)
    opt = torch.optim.AdamW(m.parameters(), lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    for ids in models.batches(STEPS, BATCH, 1):
        models.loss_of(m, ids).backward()
        opt.step()
        opt.zero_grad()
    return m


def bf16_ulp(x: float) -> float:
    """The spacing of bf16 numbers at ``x`` (8 significant bits)."""
    return math.ldexp(1.0, math.frexp(x)[1] - 8)


def difference(name: str, got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``|got - ref|`` elementwise, zero on GPT-2's key bias (see the module's doc)."""
    d = (got - ref.detach().float()).abs()
    if name.endswith("attn.c_attn.bias"):
        width = d.shape[0] // 3
        d[width:2 * width] = 0
    return d


@pytest.mark.parametrize("name", ["llama", "gpt2"])
@pytest.mark.parametrize("stage", [0, 3])
def test_fp32_matches_torch_adamw(name: str, stage: int) -> None:
    ref = dict(torch_fp32(name).named_parameters())
    got = workers.train_one(name, stage, "fp32", 1, STEPS, BATCH, lr=LR)["params"]
    assert set(got) == set(ref)
    worst = max(difference(n, got[n], ref[n]).max().item() for n in ref)
    print(f"{name} stage {stage} fp32: max |zero - torch| = {worst:.3g} after {STEPS} steps")
    assert worst <= 32 * 2.0**-23, worst
    # A wrong bias correction (step + 1) is caught by this bound.
    assert worst < 1e-4


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_bf16_matches_mixed_precision_adamw(name: str) -> None:
    _, ref, ref_losses = references.mixed_precision(name, "bf16", STEPS, BATCH, LR, snapshot_at=BF16_SNAPSHOT[name])
    run = workers.train_one(name, 3, "bf16", 1, STEPS, BATCH, lr=LR, snapshot_at=BF16_SNAPSHOT[name])
    got = run["snapshot"]
    worst = 0.0
    for n, r in ref.items():
        bound = bf16_ulp(r.abs().max().item())
        d = difference(n, got[n], r).max().item()
        worst = max(worst, d / bound)
        assert d <= bound, f"{n}: {d} > {bound} after {BF16_SNAPSHOT[name]} steps"
    rel = max(abs(a - b) / b for a, b in zip(run["losses"], ref_losses))
    print(
        f"{name} bf16: worst difference {worst:.2f} ulps after {BF16_SNAPSHOT[name]} steps; "
        f"losses within {rel:.2g} relative over {STEPS} steps"
    )
    assert rel <= 1e-3, (run["losses"], ref_losses)
