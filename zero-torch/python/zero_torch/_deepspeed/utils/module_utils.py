"""``deepspeed.utils.module_utils``: ``recursive_getattr`` and ``recursive_setattr``, which
reach a submodule by its dotted name (DeepSpeed-Chat's LoRA conversion uses them)."""

from __future__ import annotations

from typing import Any

from .._missing import module_getattr


def recursive_getattr(model: Any, module_name: str) -> Any:
    """``model``'s attribute at the dotted path ``module_name`` (``"a.b.c"``)."""
    out = model
    for name in module_name.split("."):
        out = getattr(out, name)
    return out


def recursive_setattr(model: Any, module_name: str, module: Any) -> None:
    """Sets ``model``'s attribute at the dotted path ``module_name`` to ``module`` (through
    the owner's ``__setattr__``, so a ``torch.nn.Module`` registers it)."""
    *path, last = module_name.split(".")
    owner = model
    for name in path:
        owner = getattr(owner, name)
    owner.__setattr__(last, module)


__all__ = ["recursive_getattr", "recursive_setattr"]
__getattr__ = module_getattr(__name__)
