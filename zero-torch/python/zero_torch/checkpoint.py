"""Consolidated fp32 weights from a zero checkpoint, without an engine or a launcher:
DeepSpeed's ``deepspeed.utils.zero_to_fp32`` functions, with their signatures, for
checkpoints saved by ``ZeroEngine.save_checkpoint`` at any stage and world size.

.. code-block:: python

    from zero_torch.checkpoint import get_fp32_state_dict_from_zero_checkpoint

    state_dict = get_fp32_state_dict_from_zero_checkpoint("ckpt")  # the `latest` tag
    model.load_state_dict(state_dict)
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from typing import Dict, Optional, Union

import torch

from . import _client_state, _native

PathLike = Union[str, os.PathLike]


def get_fp32_state_dict_from_zero_checkpoint(
    checkpoint_dir: PathLike,
    tag: Optional[str] = None,
    exclude_frozen_parameters: bool = False,
    lazy_mode: bool = False,
) -> "OrderedDict[str, torch.Tensor]":
    """The model's ``state_dict`` from checkpoint ``tag`` (default: ``latest``) of
    ``checkpoint_dir``: every parameter whole, in fp32 (the master weights of trained
    parameters, the saved values of frozen ones), tied weights under each of their names
    (one tensor), and the persistent buffers saved with it. ``lazy_mode`` is accepted and
    ignored (the tensors are read at once)."""
    del lazy_mode
    out: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    for names, shape, trained, data in _native.read_fp32_state(os.fspath(checkpoint_dir), tag):
        if exclude_frozen_parameters and not trained:
            continue
        t = torch.frombuffer(bytearray(data), dtype=torch.float32).reshape(shape)
        for name in names:
            out[name] = t
    stored = json.loads(_native.read_client_state(os.fspath(checkpoint_dir), tag))
    _, buffers = _client_state.unpack(stored)
    for name, value in buffers.items():
        out[name] = value
    return out


def convert_zero_checkpoint_to_fp32_state_dict(
    checkpoint_dir: PathLike,
    output_dir: PathLike,
    max_shard_size: Union[int, str, None] = "5GB",
    safe_serialization: bool = False,
    tag: Optional[str] = None,
    exclude_frozen_parameters: bool = False,
) -> None:
    """Writes :func:`get_fp32_state_dict_from_zero_checkpoint`'s state dict into
    ``output_dir`` as DeepSpeed does: ``pytorch_model.bin`` (``torch.save``), or
    ``model.safetensors`` with ``safe_serialization``, split into shards of at most
    ``max_shard_size`` with an index file when larger (Hugging Face's layout)."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters)
    weights = "model.safetensors" if safe_serialization else "pytorch_model.bin"
    shards: Dict[str, list] = {weights: list(state)}
    index = None
    if max_shard_size is not None:
        from huggingface_hub import split_torch_state_dict_into_shards

        pattern = weights.replace(".bin", "{suffix}.bin").replace(".safetensors", "{suffix}.safetensors")
        split = split_torch_state_dict_into_shards(state, filename_pattern=pattern, max_shard_size=max_shard_size)
        shards = split.filename_to_tensors
        if split.is_sharded:
            index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
    os.makedirs(output_dir, exist_ok=True)
    for file, names in shards.items():
        part = {n: state[n] for n in names}
        path = os.path.join(output_dir, file)
        if safe_serialization:
            from safetensors.torch import save_file

            # safetensors refuses tensors that share storage (tied weights): one copy each.
            save_file({n: t.clone().contiguous() for n, t in part.items()}, path, metadata={"format": "pt"})
        else:
            torch.save(part, path)
    if index is not None:
        name = "model.safetensors.index.json" if safe_serialization else "pytorch_model.bin.index.json"
        with open(os.path.join(output_dir, name), "w", encoding="utf-8") as f:
            f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")


def load_state_dict_from_zero_checkpoint(
    model: torch.nn.Module, checkpoint_dir: PathLike, tag: Optional[str] = None
) -> torch.nn.Module:
    """Loads the checkpoint's fp32 weights into ``model`` (moved to the CPU, as DeepSpeed
    does) with ``strict=False``, and returns it. The model is then a plain torch model:
    build a new engine to train it further."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(state, strict=False)
    return model


__all__ = [
    "get_fp32_state_dict_from_zero_checkpoint",
    "convert_zero_checkpoint_to_fp32_state_dict",
    "load_state_dict_from_zero_checkpoint",
]
