"""DeepSpeed's Adam classes (``deepspeed.ops.adam.FusedAdam``, ``DeepSpeedCPUAdam``) as
torch optimizers.

Given to ``initialize`` (or named by a config's ``optimizer`` section), they are not run
by torch at all: the engine steps its fused Adam with their hyper-parameters, read from
their ``param_groups`` at every step. Outside an engine they step like torch's Adam, in
plain PyTorch (nothing is compiled, so there is no JIT build to fail), with DeepSpeed's
arguments and defaults: weight decay 0, decoupled (AdamW) unless ``adam_w_mode`` /
``adamw_mode`` is false, bias correction optional.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Optional, Tuple

import torch

from .errors import UnsupportedError


class _DeepSpeedAdam(torch.optim.Optimizer):
    """Adam / AdamW with DeepSpeed's arguments (the base of both classes)."""

    decoupled_key = "adam_w_mode"

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        decoupled: bool = True,
    ) -> None:
        if amsgrad:
            raise UnsupportedError(f"{type(self).__name__}(amsgrad=True) is not supported (DeepSpeed's Adam has no AMSGrad)")
        defaults: Dict[str, Any] = dict(
            lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps, weight_decay=weight_decay
        )
        defaults[self.decoupled_key] = decoupled
        super().__init__(params, defaults)

    def decoupled(self, group: Dict[str, Any]) -> bool:
        """Whether ``group`` decays its weights AdamW's way."""
        return bool(group.get(self.decoupled_key, True))

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One Adam step over every parameter with a gradient (used outside an engine)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.float()
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                state["step"] += 1
                w = p.float()
                if group["weight_decay"] != 0:
                    if self.decoupled(group):
                        w.mul_(1 - group["lr"] * group["weight_decay"])
                    else:
                        g = g.add(w, alpha=group["weight_decay"])
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                t = state["step"]
                bc1 = 1 - b1**t if group["bias_correction"] else 1.0
                bc2 = 1 - b2**t if group["bias_correction"] else 1.0
                denom = (v.sqrt() / (bc2**0.5)).add_(group["eps"])
                w.addcdiv_(m, denom, value=-group["lr"] / bc1)
                p.copy_(w)
        return loss


class FusedAdam(_DeepSpeedAdam):
    """``deepspeed.ops.adam.FusedAdam``: ``FusedAdam(params, lr=1e-3, bias_correction=True,
    betas=(0.9, 0.999), eps=1e-8, adam_w_mode=True, weight_decay=0.0, amsgrad=False,
    set_grad_none=True)``."""

    decoupled_key = "adam_w_mode"

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        adam_w_mode: bool = True,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        set_grad_none: bool = True,
    ) -> None:
        del set_grad_none
        super().__init__(params, lr, bias_correction, betas, eps, weight_decay, amsgrad, adam_w_mode)


class DeepSpeedCPUAdam(_DeepSpeedAdam):
    """``deepspeed.ops.adam.DeepSpeedCPUAdam``: ``DeepSpeedCPUAdam(model_params, lr=1e-3,
    bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False,
    adamw_mode=True, fp32_optimizer_states=True)``: what DeepSpeed's optimizer offload
    steps, and what zero's offloaded fused Adam steps here."""

    decoupled_key = "adamw_mode"

    def __init__(
        self,
        model_params: Iterable[Any],
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        adamw_mode: bool = True,
        fp32_optimizer_states: bool = True,
    ) -> None:
        if not fp32_optimizer_states:
            raise UnsupportedError("DeepSpeedCPUAdam(fp32_optimizer_states=False) is not supported: zero keeps fp32 moments")
        super().__init__(model_params, lr, bias_correction, betas, eps, weight_decay, amsgrad, adamw_mode)


ADAM_CLASSES = (FusedAdam, DeepSpeedCPUAdam)
"""The DeepSpeed Adam classes the engine steps with its fused Adam."""
