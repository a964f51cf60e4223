"""``deepspeed.ops.adagrad.cpu_adagrad``: ``DeepSpeedCPUAdagrad``, DeepSpeed's Adagrad
(``sum += g*g; p -= lr * g / (sqrt(sum) + eps)``, weight decay added to the gradient), as
``torch.optim.Adagrad`` with DeepSpeed's arguments and defaults. Nothing is compiled; it
steps in plain PyTorch, on any device. Given to ``deepspeed.initialize`` it steps each
rank's fp32 shard (zero's external optimizer path); with ``offload_optimizer`` it is
refused (zero's offloaded optimizer is its fused Adam)."""

from __future__ import annotations

from typing import Any, Iterable

import torch

from ..._missing import module_getattr


class DeepSpeedCPUAdagrad(torch.optim.Adagrad):
    """``DeepSpeedCPUAdagrad(model_params, lr=1e-2, eps=1e-10, weight_decay=0,
    amsgrad=False, fp32_optimizer_states=True)``: ``torch.optim.Adagrad`` with no learning
    rate decay and a zero initial accumulator (DeepSpeed's kernel). With
    ``fp32_optimizer_states`` the squared-gradient sums of 16-bit parameters are kept in
    fp32, as DeepSpeed keeps them. ``amsgrad`` is recorded and ignored, as in DeepSpeed."""

    def __init__(
        self,
        model_params: Iterable[Any],
        lr: float = 1e-2,
        eps: float = 1e-10,
        weight_decay: float = 0,
        amsgrad: bool = False,
        fp32_optimizer_states: bool = True,
    ) -> None:
        super().__init__(
            model_params, lr=lr, lr_decay=0, weight_decay=weight_decay, initial_accumulator_value=0, eps=eps,
            foreach=False,
        )
        self.fp32_optimizer_states = fp32_optimizer_states
        self.defaults["amsgrad"] = amsgrad
        for group in self.param_groups:
            group["amsgrad"] = amsgrad
            if fp32_optimizer_states:
                for p in group["params"]:
                    state = self.state[p]
                    if "sum" in state and state["sum"].dtype != torch.float32:
                        state["sum"] = state["sum"].float()


__all__ = ["DeepSpeedCPUAdagrad"]
__getattr__ = module_getattr(__name__)
