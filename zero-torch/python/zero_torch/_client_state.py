"""What a zero_torch checkpoint keeps beside the engine's state: the script's
``client_state`` and the model's persistent buffers (BatchNorm statistics and the like),
pickled by ``torch.save`` as DeepSpeed pickles them, and stored inside the engine's
manifest so that one commit makes the whole checkpoint visible (a failed save leaves the
previous one loadable, client state included)."""

from __future__ import annotations

import base64
import io
from typing import Any, Dict, Tuple

import torch

from .errors import CheckpointError

FORMAT = "zero_torch.pickle/1"
"""The manifest's ``client_state`` is ``{"format": FORMAT, "data": <base64>}``."""


def persistent_buffers(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """The model's buffers that its ``state_dict`` holds (non-persistent ones excluded)."""
    return {name: t.detach().clone() for name, t in persistent_buffers_live(model).items()}


def pack(client_state: Any, buffers: Dict[str, torch.Tensor]) -> Dict[str, str]:
    """The JSON value the engine stores for ``client_state`` and ``buffers``."""
    out = io.BytesIO()
    try:
        torch.save({"client_state": client_state, "buffers": buffers}, out)
    except Exception as e:  # pickling errors come in many types
        raise CheckpointError(f"client_state cannot be saved: {type(e).__name__}: {e}") from None
    return {"format": FORMAT, "data": base64.b64encode(out.getvalue()).decode("ascii")}


def unpack(stored: Any) -> Tuple[Any, Dict[str, torch.Tensor]]:
    """``(client_state, buffers)`` from what :func:`pack` stored; a checkpoint saved by a
    Rust program (its client state plain JSON) gives that JSON and no buffers."""
    if not (isinstance(stored, dict) and stored.get("format") == FORMAT):
        return stored, {}
    try:
        raw = base64.b64decode(stored["data"])
        # DeepSpeed loads its client state with weights_only=False too: the checkpoint is
        # the user's own.
        got = torch.load(io.BytesIO(raw), weights_only=False, map_location="cpu")
    except Exception as e:
        raise CheckpointError(f"the checkpoint's client state cannot be read: {type(e).__name__}: {e}") from None
    return got.get("client_state"), got.get("buffers", {})


def load_buffers(model: torch.nn.Module, buffers: Dict[str, torch.Tensor], strict: bool) -> None:
    """Copies saved buffers into the model's (``strict``: the names must match)."""
    mine = persistent_buffers_live(model)
    if strict:
        missing = sorted(set(mine) - set(buffers))
        unexpected = sorted(set(buffers) - set(mine))
        if missing or unexpected:
            raise CheckpointError(
                f"the checkpoint's buffers do not match the model's: missing {missing}, "
                f"unexpected {unexpected} (load_module_strict=False skips them)"
            )
    with torch.no_grad():
        for name, value in buffers.items():
            if name in mine:
                mine[name].copy_(value)


def persistent_buffers_live(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """The model's persistent buffers themselves (not copies)."""
    params = {id(p) for p in model.parameters()}
    return {n: t for n, t in model.state_dict(keep_vars=True).items() if id(t) not in params}
