"""``deepspeed.moe.utils``: DeepSpeed's helpers that split optimizer parameter groups into
MoE and non-MoE groups. zero has no MoE layers: for a model without MoE parameters these
return what DeepSpeed 0.19.8 returns; a MoE parameter (one marked ``allreduce = False``)
raises :class:`~zero_torch.errors.UnsupportedError`."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from torch import nn

from zero_torch.errors import UnsupportedError

from .._missing import message, module_getattr

ParamGroups = Union[Dict[str, Any], Tuple[Dict[str, Any], ...], List[Dict[str, Any]]]


def is_moe_param(param: torch.Tensor) -> bool:
    """Whether ``param`` is an expert parameter (DeepSpeed marks them ``allreduce = False``)."""
    return hasattr(param, "allreduce") and not param.allreduce


def _refuse_moe(param: torch.Tensor) -> None:
    if is_moe_param(param):
        raise UnsupportedError(
            message("deepspeed.moe.layer") + f" (a parameter of shape {tuple(param.shape)} is an expert parameter)"
        )


def has_moe_layers(m: nn.Module) -> Tuple[bool, int]:
    """``(False, 0)``: zero provides no MoE layer a model could hold."""
    return False, 0


def split_params_into_shared_and_expert_params(
    params: List[torch.nn.Parameter],
) -> Tuple[List[torch.nn.Parameter], List[torch.nn.Parameter]]:
    """``(params, [])``: every parameter is shared (a MoE parameter raises)."""
    shared = []
    for p in params:
        _refuse_moe(p)
        shared.append(p)
    return shared, []


def split_params_grads_into_shared_and_expert_params(
    group: List[torch.nn.Parameter],
) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """The gradients of ``group``'s parameters that have one, cast to the parameter's
    dtype, and ``[]`` for the experts (a MoE parameter raises)."""
    shared = []
    for p in group:
        _refuse_moe(p)
        if p.grad is not None:
            shared.append(p.grad.to(p.dtype))
    return shared, []


def split_params_into_different_moe_groups_for_optimizer(
    param_groups: ParamGroups, max_group_size: Union[int, float] = 178956971
) -> List[Dict[str, Any]]:
    """DeepSpeed's result for groups without MoE parameters: the groups as a list (a dict
    becomes a list of one, a tuple a list), each group's ``params`` replaced by a new list
    of the same parameters; nothing is added. A MoE parameter raises."""
    if isinstance(param_groups, tuple):
        param_groups = list(param_groups)
    elif isinstance(param_groups, dict):
        param_groups = [param_groups]
    elif not isinstance(param_groups, list):
        raise ValueError(f"Unknown param group type of {type(param_groups)}")
    for group in param_groups:
        params = list(group["params"])
        for p in params:
            _refuse_moe(p)
        group["params"] = params
    return param_groups


def is_moe_param_group(param_group: Dict[str, Any]) -> bool:
    """Whether the group was made for experts (``"moe": True``)."""
    return param_group.get("moe", False)


def configure_moe_param_groups(model_parameters: List[Any]) -> Optional[List[Any]]:
    """DeepSpeed's preparation of ``model_parameters`` for MoE: a list of parameters becomes
    one group named ``dense-params``; a list of groups goes through
    :func:`split_params_into_different_moe_groups_for_optimizer` unless one is already
    marked ``moe``."""
    assert isinstance(model_parameters, list), "model_parameters must be a list"
    for p in model_parameters:
        if not isinstance(p, (torch.Tensor, dict)):
            raise TypeError(
                "param argument that would be given to the optimizer should be "
                f"an iterable of Tensors or dicts, but got {type(p)}"
            )
    first = model_parameters[0]
    if isinstance(first, torch.nn.Parameter):
        return split_params_into_different_moe_groups_for_optimizer({"params": model_parameters, "name": "dense-params"})
    if isinstance(first, dict):
        if not any("moe" in group for group in model_parameters):
            return split_params_into_different_moe_groups_for_optimizer(model_parameters)
        return model_parameters
    return None  # a list of plain tensors: DeepSpeed returns nothing either


__all__ = [
    "is_moe_param",
    "has_moe_layers",
    "split_params_into_shared_and_expert_params",
    "split_params_grads_into_shared_and_expert_params",
    "split_params_into_different_moe_groups_for_optimizer",
    "is_moe_param_group",
    "configure_moe_param_groups",
]
__getattr__ = module_getattr(__name__)
