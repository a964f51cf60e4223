"""The ways PyTorch models use their modules, trained on 2 processes under stages 1 and 3
and compared with plain PyTorch on the whole batch (fp32, ``torch.optim.AdamW`` with the
same hyperparameters): a module called twice per forward, activation checkpointing
(non-reentrant and reentrant), a layer that gets no gradient on some micro-steps, a frozen
layer, and gradient accumulation over 3 micro-steps.

A parameter that gets no gradient in a step is stepped with a zero gradient (its momentum
and weight decay still act), as DeepSpeed's ZeRO optimizers do; ``torch.optim.AdamW``
skips such a parameter, so the reference gives it a zero gradient too.

Tolerance: the ranks' gradients are averaged across 2 processes instead of computed on the
whole batch at once, a few fp32 roundings per step; 1e-5 after 4 optimizer steps.
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
import torch

import models
import workers

STEPS = 4
BATCH = 12
WORLD = 2
CASES = [(p, 1) for p in ["plain", "twice", "ckpt", "ckpt_reentrant", "unused", "frozen"]] + [("plain", 3), ("ckpt", 3)]
STAGES = [1, 3]


def reference(pattern: str, gas: int) -> Dict[str, Any]:
    model = models.Toy(pattern)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    for step, (x, y) in enumerate(models.regression(STEPS, BATCH)):
        for k in range(gas):
            loss = model(models.micro(x, k, gas), models.micro(y, k, gas)) / gas
            loss.backward()
        for p in model.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad()
        if step == 0:
            with torch.no_grad():  # the workers' evaluation (it counts as a call)
                model(x, y)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def runs(job: Any) -> List[Dict[str, Any]]:
    todo = [
        {"pattern": p, "stage": s, "gas": g, "steps": STEPS, "global_batch": BATCH}
        for p, g in CASES
        for s in STAGES
    ]
    results = job(WORLD, "pattern_many", {"runs": todo})
    return [dict(zip(("args", "rank0", "rank1"), t)) for t in zip(todo, results[0]["runs"], results[1]["runs"])]


@pytest.mark.parametrize("pattern,gas", CASES)
@pytest.mark.parametrize("stage", STAGES)
def test_pattern_trains_as_pytorch(runs: List[Dict[str, Any]], pattern: str, gas: int, stage: int) -> None:
    run = next(r for r in runs if r["args"]["pattern"] == pattern and r["args"]["gas"] == gas and r["args"]["stage"] == stage)
    ref = reference(pattern, gas)
    got = run["rank0"]["params"]
    assert set(got) == set(ref)
    worst = max((got[n] - ref[n]).abs().max().item() for n in ref)
    print(f"{pattern} gas {gas} stage {stage}: max |zero - torch| = {worst:.3g}")
    assert worst <= 1e-5, worst
    for n in ref:  # every rank ends with the same parameters
        assert torch.equal(run["rank0"]["params"][n], run["rank1"]["params"][n]), n
    if pattern == "frozen":
        initial = dict(models.Toy("frozen").named_parameters())
        for n in ("inp.weight", "inp.bias"):
            assert torch.equal(got[n], initial[n].detach()), f"frozen {n} changed"
    r0 = run["rank0"]
    assert r0["boundaries"] == ([False] * (gas - 1) + [True]) * STEPS
    assert not r0["moved_off_boundary"], "parameters changed between micro-steps of one accumulation"
    if stage == 3:
        # After each backward and after a no_grad evaluation the partitioned parameters
        # hold no storage.
        assert r0["held_after_backward"] == [0] * (STEPS * gas)
        assert r0["held_after_eval"] == 0
