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
from typing import Any, Dict, List, Optional, Union

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


OUTPUT_DTYPE_NAMES: Dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}
"""The output dtypes :func:`convert_zero_checkpoint_to_state_dict` takes by name (DeepSpeed's)."""


def output_dtype(dtype: Union[str, torch.dtype]) -> torch.dtype:
    """``dtype`` (a torch floating dtype of :data:`OUTPUT_DTYPE_NAMES`, or its name, with or
    without ``torch.``) as a torch dtype; ``ValueError`` naming the choices otherwise."""
    resolved: Any = dtype
    if isinstance(dtype, str):
        name = dtype[6:] if dtype.startswith("torch.") else dtype
        resolved = OUTPUT_DTYPE_NAMES.get(name.lower())
    if resolved not in set(OUTPUT_DTYPE_NAMES.values()):
        raise ValueError(f"Unsupported output dtype {dtype!r}. Choose one of: {', '.join(sorted(OUTPUT_DTYPE_NAMES))}")
    return resolved


def convert_zero_checkpoint_to_state_dict(
    checkpoint_dir: PathLike,
    output_dir: PathLike,
    dtype: Union[str, torch.dtype] = torch.float32,
    max_shard_size: Union[int, str, None] = "5GB",
    safe_serialization: bool = False,
    tag: Optional[str] = None,
    exclude_frozen_parameters: bool = False,
) -> None:
    """Writes :func:`get_fp32_state_dict_from_zero_checkpoint`'s state dict into
    ``output_dir`` as DeepSpeed does, its floating tensors in ``dtype`` (the others keep
    theirs): ``pytorch_model.bin`` (``torch.save``), or ``model.safetensors`` with
    ``safe_serialization``, split into shards of at most ``max_shard_size`` with an index
    file when larger (Hugging Face's layout)."""
    to = output_dtype(dtype)
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters)
    converted: Dict[int, torch.Tensor] = {}
    for name, t in state.items():
        if t.is_floating_point() and t.dtype != to:
            # Tied names share one tensor: converted once, still shared.
            state[name] = converted.setdefault(id(t), t.to(to))
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


def convert_zero_checkpoint_to_fp32_state_dict(
    checkpoint_dir: PathLike,
    output_dir: PathLike,
    max_shard_size: Union[int, str, None] = "5GB",
    safe_serialization: bool = False,
    tag: Optional[str] = None,
    exclude_frozen_parameters: bool = False,
) -> None:
    """:func:`convert_zero_checkpoint_to_state_dict` in fp32."""
    convert_zero_checkpoint_to_state_dict(
        checkpoint_dir, output_dir, torch.float32, max_shard_size, safe_serialization, tag, exclude_frozen_parameters
    )


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


RECOVERY_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")
"""The scripts ``save_checkpoint`` writes beside the tags, as DeepSpeed writes its own."""


def write_recovery_scripts(save_dir: PathLike) -> None:
    """Puts :data:`RECOVERY_SCRIPTS` into ``save_dir`` (each written whole under a temporary
    name, then renamed; executable), as DeepSpeed's ``_copy_recovery_script`` does."""
    import shutil
    import stat

    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_recovery")
    for name in RECOVERY_SCRIPTS:
        dst = os.path.join(os.fspath(save_dir), name)
        tmp = dst + ".tmp"
        shutil.copyfile(os.path.join(here, name), tmp)
        os.chmod(tmp, os.stat(tmp).st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)
        os.replace(tmp, dst)


def _cli(description: str, with_dtype: bool, argv: Optional[List[str]]) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("checkpoint_dir", type=str, help="the folder save_checkpoint saved into (holding `latest` and the tags)")
    parser.add_argument("output_dir", type=str, help="where to write the consolidated state dict")
    if with_dtype:
        parser.add_argument("--dtype", type=str, choices=sorted(OUTPUT_DTYPE_NAMES), required=True,
                            help="the output tensors' dtype")
    parser.add_argument("--max_shard_size", type=str, default="5GB",
                        help="the largest file before the state dict is split into shards (like 5GB or 500MB)")
    parser.add_argument("--safe_serialization", default=False, action="store_true",
                        help="write safetensors instead of torch.save's pickle")
    parser.add_argument("-t", "--tag", type=str, default=None,
                        help="the checkpoint's tag, e.g. global_step1 (default: the one `latest` names)")
    parser.add_argument("--exclude_frozen_parameters", action="store_true", help="leave the frozen parameters out")
    parser.add_argument("-d", "--debug", action="store_true", help="accepted, as DeepSpeed's (prints nothing more)")
    args = parser.parse_args(argv)
    convert_zero_checkpoint_to_state_dict(
        args.checkpoint_dir,
        args.output_dir,
        dtype=args.dtype if with_dtype else torch.float32,
        max_shard_size=args.max_shard_size,
        safe_serialization=args.safe_serialization,
        tag=args.tag,
        exclude_frozen_parameters=args.exclude_frozen_parameters,
    )


def zero_to_fp32_main(argv: Optional[List[str]] = None) -> None:
    """The command line of the ``zero_to_fp32.py`` script in every checkpoint folder
    (DeepSpeed's arguments)."""
    _cli("Consolidate a zero_torch checkpoint into fp32 PyTorch weights.", False, argv)


def zero_to_torch_main(argv: Optional[List[str]] = None) -> None:
    """The command line of the ``zero_to_torch.py`` script in every checkpoint folder
    (DeepSpeed's arguments, ``--dtype`` required)."""
    _cli("Consolidate a zero_torch checkpoint into float32, float16 or bfloat16 PyTorch weights.", True, argv)


__all__ = [
    "OUTPUT_DTYPE_NAMES",
    "output_dtype",
    "write_recovery_scripts",
    "zero_to_fp32_main",
    "zero_to_torch_main",
    "get_fp32_state_dict_from_zero_checkpoint",
    "convert_zero_checkpoint_to_state_dict",
    "convert_zero_checkpoint_to_fp32_state_dict",
    "load_state_dict_from_zero_checkpoint",
]
