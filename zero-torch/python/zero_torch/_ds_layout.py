"""DeepSpeed's checkpoint files, as tools written for DeepSpeed find them, for zero's
checkpoints.

Lightning's ``convert_zero_checkpoint_to_fp32_state_dict`` (and scripts like it) take the
weights from ``get_fp32_state_dict_from_zero_checkpoint`` and then open two of DeepSpeed's
files in the tag folder themselves: the first ``*_optim_states.pt`` (``get_optim_files``),
for ``["optimizer_state_dict"]["zero_stage"]``, and the model-states file
(``get_model_state_file``), for the client state saved beside DeepSpeed's own keys. A zero
checkpoint keeps that information in its manifest (``manifest.json``) and has no such
files. For a zero tag folder these helpers therefore write the two files DeepSpeed would
have written, holding only that information, into a temporary folder of this process
(removed at exit) and return their paths; the checkpoint itself is never written. For a
folder DeepSpeed saved they return its own files, as DeepSpeed's helpers do.

What the stand-in files hold:

- model states (``mp_rank_00_model_states.pt``, at stage 3
  ``zero_pp_rank_0_mp_rank_00_model_states.pt``): DeepSpeed's counters
  (``global_steps``, ``global_samples``, ``skipped_steps``), ``dp_world_size``,
  ``mp_world_size`` (1), ``ds_config``, ``ds_version``, ``lr_scheduler`` (a client
  scheduler's state, else ``None``), ``module`` and ``optimizer`` as ``None`` (the weights
  are read with ``get_fp32_state_dict_from_zero_checkpoint``), and the client state's keys
  at top level, as DeepSpeed saves them;
- optimizer states (``zero_pp_rank_0_mp_rank_00_optim_states.pt``):
  ``{"optimizer_state_dict": {"zero_stage": stage}, "ds_config": ..., "ds_version": ...}``.
"""

from __future__ import annotations

import atexit
import glob
import json
import os
import re
import shutil
import tempfile
from typing import Any, Dict, List, Optional, Union

import torch

from . import _client_state, _native

PathLike = Union[str, os.PathLike]

DS_VERSION = "0.19.8"
"""The DeepSpeed version zero_torch serves (the stand-in files' ``ds_version``)."""

MANIFEST = "manifest.json"
"""The file every zero tag folder has (and no DeepSpeed one)."""

_VIEWS: Dict[str, str] = {}
"""Tag folder (real path) → the temporary folder holding its stand-in files."""


def natural_keys(text: str) -> List[Any]:
    """Sort key that orders embedded numbers by value (``rank_10`` after ``rank_9``), as
    DeepSpeed's ``natural_keys``."""
    return [int(c) if c.isdigit() else c for c in re.split(r"(\d+)", text)]


def is_zero_tag_folder(folder: PathLike) -> bool:
    """Whether ``folder`` is one tag of a zero checkpoint."""
    return os.path.isfile(os.path.join(os.fspath(folder), MANIFEST))


def model_state_name(zero_stage: int) -> str:
    """The model-states file DeepSpeed reads first at ``zero_stage``."""
    return "mp_rank_00_model_states.pt" if zero_stage <= 2 else "zero_pp_rank_0_mp_rank_00_model_states.pt"


def checkpoint_files(checkpoint_dir: PathLike, glob_pattern: str) -> List[str]:
    """The files of tag folder ``checkpoint_dir`` matching ``glob_pattern``, in natural
    order (a zero tag folder: its stand-in files); ``FileNotFoundError`` if none, as
    DeepSpeed's ``get_checkpoint_files``."""
    folder = os.fspath(checkpoint_dir)
    base = _view(folder) if is_zero_tag_folder(folder) else folder
    found = sorted(glob.glob(os.path.join(base, glob_pattern)), key=natural_keys)
    if not found:
        raise FileNotFoundError(f"can't find {glob_pattern} files in directory '{folder}'")
    return found


def model_state_file(checkpoint_dir: PathLike, zero_stage: int) -> str:
    """DeepSpeed's ``get_model_state_file``: the model-states file of tag folder
    ``checkpoint_dir`` saved at ``zero_stage`` (a zero tag folder: its stand-in)."""
    folder = os.fspath(checkpoint_dir)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"Directory '{folder}' doesn't exist")
    base = _view(folder) if is_zero_tag_folder(folder) else folder
    path = os.path.join(base, model_state_name(zero_stage))
    if not os.path.exists(path):
        raise FileNotFoundError(f"can't find model states file at '{os.path.join(folder, model_state_name(zero_stage))}'")
    return path


def _view(folder: str) -> str:
    """The temporary folder with ``folder``'s stand-in files (written on first use)."""
    key = os.path.realpath(folder)
    made = _VIEWS.get(key)
    if made is not None and os.path.isdir(made):
        return made
    parent, tag = os.path.split(key)
    summary = json.loads(_native.read_checkpoint_summary(parent, tag))
    out = tempfile.mkdtemp(prefix="zero-deepspeed-files-")
    if not _VIEWS:
        atexit.register(_remove_views)
    _VIEWS[key] = out
    stage = int(summary["stage"])
    torch.save(model_states(summary), os.path.join(out, model_state_name(stage)))
    torch.save(
        {"optimizer_state_dict": {"zero_stage": stage}, "ds_config": summary["config"], "ds_version": DS_VERSION},
        os.path.join(out, "zero_pp_rank_0_mp_rank_00_optim_states.pt"),
    )
    return out


def model_states(summary: Dict[str, Any]) -> Dict[str, Any]:
    """The dict DeepSpeed's model-states file holds, from a zero checkpoint's summary
    (``_native.read_checkpoint_summary``)."""
    client, _buffers = _client_state.unpack(summary["client_state"])
    client = dict(client) if isinstance(client, dict) else ({} if client is None else {"client_state": client})
    scheduler: Optional[Any] = client.pop("__zero_lr_scheduler__", None)
    config = summary.get("config") or {}
    steps = summary["steps"]
    batch = config.get("train_batch_size") if isinstance(config, dict) else None
    out: Dict[str, Any] = {
        "module": None,
        "optimizer": None,
        "lr_scheduler": scheduler,
        "global_steps": int(steps["global"]),
        "global_samples": int(steps["global"]) * int(batch) if isinstance(batch, int) else None,
        "skipped_steps": int(steps["skipped"]),
        "dp_world_size": int(summary["world_size"]),
        "mp_world_size": 1,
        "ds_config": config,
        "ds_version": DS_VERSION,
    }
    out.update(client)
    return out


def _remove_views() -> None:
    for folder in _VIEWS.values():
        shutil.rmtree(folder, ignore_errors=True)
    _VIEWS.clear()


__all__ = [
    "checkpoint_files",
    "is_zero_tag_folder",
    "model_state_file",
    "model_state_name",
    "model_states",
    "natural_keys",
]
