"""The engine's Hugging Face checkpoint loading: a ``save_pretrained`` folder's weights into a
running engine, each rank reading only the byte ranges of the parameters it holds (the
Rust side parses the safetensors headers and reads the ranges), the model's buffers read
whole on every rank."""

from __future__ import annotations

import ctypes
import os
import shutil
import time
from typing import Any, Dict, List, Optional, Union

import torch

from . import _native
from .errors import CheckpointError

PathLike = Union[str, os.PathLike]

_STORED = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
"""safetensors' element type names as torch dtypes."""


_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def _shard_bytes(size: Union[int, str]) -> int:
    """A shard size as transformers reads it (``"5GB"`` = 5e9 bytes, ``"5GiB"`` = 5 x
    2**30, or an int of bytes)."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    if isinstance(size, str):
        text = size.strip().upper()
        for unit in sorted(_UNITS, key=len, reverse=True):
            if text.endswith(unit):
                number = text[: -len(unit)].strip()
                try:
                    value = float(number) * _UNITS[unit]
                except ValueError:
                    break
                if value > 0:
                    return int(value)
                break
    raise ValueError(f"max_shard_size={size!r}: give a positive number of bytes or a size such as \"5GB\"")


def _remove(path: str) -> None:
    """Removes a file or folder left at ``path``, if any."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _commit_folder(staging: str, target: str) -> None:
    """Puts the finished folder ``staging`` at ``target`` in one step: a rename where
    nothing is there, else an atomic exchange (``renameat2(RENAME_EXCHANGE)``; two renames
    where the kernel lacks it), then removes the old folder."""
    if not os.path.lexists(target):
        os.rename(staging, target)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    exchange = getattr(libc, "renameat2", None)
    at_fdcwd, rename_exchange = -100, 2
    if exchange is not None and exchange(at_fdcwd, staging.encode(), at_fdcwd, target.encode(), rename_exchange) == 0:
        _remove(staging)  # now the old folder
        return
    aside = target + ".zt-old"
    _remove(aside)
    os.rename(target, aside)
    os.rename(staging, target)
    _remove(aside)


def _peak_rss() -> int:
    """This process's peak resident bytes (``VmHWM``), 0 where /proc does not say."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class HfCheckpointMethods:
    """``load_hf_checkpoint`` and ``load_report`` (mixed into the engine)."""

    _load_report: Optional[Dict[str, Any]] = None

    def load_hf_checkpoint(self, path: PathLike, strict: bool = True) -> None:
        """Loads the weights of the Hugging Face checkpoint in ``path`` (``config.json``
        beside ``model.safetensors``, or shards with ``model.safetensors.index.json``, as
        ``save_pretrained`` writes them) into the engine. Every rank calls it, between
        optimizer steps; each reads only the byte ranges of what it holds (its partition of
        each bucket in stages 1-3, whole persistent and frozen parameters), widened from the
        file's dtype and rounded once to the engine's. Names follow transformers: tied
        weights stored once, and a checkpoint saved with or without the model's base prefix
        (``model.``) loads either way. The model's persistent buffers are read whole. The
        fp32 master weights take the file's values, rounded first to the training dtype in
        a bf16 or fp16 run (DeepSpeed's master weights of a 16-bit model loaded from the
        file); the optimizer's moments start again.

        With ``strict`` (the default) a parameter missing from the checkpoint, or a tensor of
        it that is neither a parameter nor a buffer, is an error; so is a wrong shape, or a
        damaged or missing file. Any error on any rank raises
        :class:`~zero_torch.CheckpointError` on every rank, naming the tensor and the file,
        and nothing changes. ``load_report()`` then says what this rank read."""
        self._load_hf(path, strict, self._dtype)  # type: ignore[attr-defined]

    def _load_hf(self, path: PathLike, strict: bool, model_dtype: Optional[torch.dtype]) -> None:
        """``load_hf_checkpoint``, the values rounded to ``model_dtype`` (the dtype of the
        model they load into, when 16-bit) before they become master weights."""
        rt = self._runtime  # type: ignore[attr-defined]
        rt.ensure_built()
        rt.sync_user_changes()
        t0 = time.perf_counter()
        model: torch.nn.Module = self.module  # type: ignore[attr-defined]
        prefix = getattr(model, "base_model_prefix", "") or None
        persistent = set(model.state_dict().keys())
        buffers = {n: b for n, b in model.named_buffers() if n in persistent}
        round_to = _DTYPE_NAMES.get(model_dtype) if model_dtype is not None else None
        stats = rt.native.load_hf_checkpoint(os.fspath(path), strict, prefix, list(buffers), round_to)
        read_buffers = self._load_hf_buffers(os.fspath(path), stats.left, buffers, prefix)
        rt.write_back()
        self._load_report = {
            "bytes_requested": stats.requested,
            "bytes_read": stats.read,
            "files_opened": stats.files,
            "buffers": read_buffers,
            "seconds": time.perf_counter() - t0,
            "peak_rss": _peak_rss(),
        }

    @staticmethod
    def _load_hf_buffers(path: str, left: List[str], buffers: Dict[str, torch.Tensor], prefix: Optional[str]) -> int:
        """Copies the checkpoint's tensors that are buffers of the model (by name, with or
        without the base prefix) into them; returns how many."""
        def candidates(name: str) -> List[str]:
            out = [name]
            if prefix:
                out.append(f"{prefix}.{name}")
                if name.startswith(prefix + "."):
                    out.append(name[len(prefix) + 1:])
            return out

        wanted = {}
        for name in buffers:
            for key in candidates(name):
                if key in left:
                    wanted[key] = name
                    break
        if not wanted:
            return 0
        for key, stored, shape, raw in _native.read_hf_tensors(path, list(wanted)):
            dtype = _STORED.get(stored)
            if dtype is None:
                raise CheckpointError(f"{path}: buffer `{key}` is {stored}, which zero_torch does not read")
            value = torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape) if raw else torch.empty(shape, dtype=dtype)
            target = buffers[wanted[key]]
            if tuple(target.shape) != tuple(shape):
                raise CheckpointError(
                    f"{path}: buffer `{key}` has shape {tuple(shape)} in the checkpoint and "
                    f"{tuple(target.shape)} in the model"
                )
            with torch.no_grad():
                target.copy_(value)
        return len(wanted)

    def save_hf_checkpoint(self, path: PathLike, max_shard_size: Union[int, str] = "5GB",
                           dtype: Optional[torch.dtype] = None) -> List[str]:
        """Writes the model as a Hugging Face folder that ``from_pretrained`` (transformers'
        or zero_torch's) and Python's ``safetensors`` read: ``config.json`` (the model's
        ``config``, where it has one), ``model-0000k-of-0000n.safetensors`` shards of at
        most ``max_shard_size`` (bytes, or a string as transformers takes it: ``"5GB"``,
        ``"500MiB"``) and ``model.safetensors.index.json``. Each parameter is whole, in
        ``dtype`` (default: the run's dtype; ``torch.float32`` from a 16-bit run writes
        the fp32 master weights, as DeepSpeed's ``zero_to_fp32`` recovers them, and frozen
        parameters widened), tied weights once under their first name, as ``save_pretrained``
        stores them. Every rank calls it: the ranks
        gather one bucket at a time, so no rank holds the model, and share the writing:
        shard ``k`` is written by rank ``k mod world_size``, the index and config by rank 0
        (so ``path`` must be a folder every rank sees: one host, or a shared filesystem).
        Returns the names of the files this rank wrote.

        The folder appears whole or not at all: the files go to ``path`` + ``.zt-saving``
        first and replace ``path`` in one rename (an exchange where the kernel has
        ``renameat2``) once every rank has written its shards. Any rank's failure raises on
        every rank and leaves an earlier ``path`` as it was."""
        from . import _dist

        rt = self._runtime  # type: ignore[attr-defined]
        rt.ensure_built()
        rt.sync_user_changes()
        target = os.path.abspath(os.fspath(path))
        staging = target + ".zt-saving"
        limit = _shard_bytes(max_shard_size)
        name = _DTYPE_NAMES.get(dtype if dtype is not None else self._dtype)  # type: ignore[attr-defined]
        if name is None:
            raise ValueError(f"save_hf_checkpoint(dtype={dtype}): the weights are saved as float32, bfloat16 or float16")
        rank = self.global_rank  # type: ignore[attr-defined]
        failure = ""
        if rank == 0:
            try:
                _remove(staging)
            except OSError as e:
                failure = f"rank 0 could not clear {staging}: {e}"
        # Every rank starts writing once the old staging folder is gone.
        failure = _dist.broadcast_text(failure)
        if failure:
            raise CheckpointError(failure)
        try:
            files = rt.native.save_hf_weights(staging, limit, name)
        except Exception:  # raised on every rank, once every rank has stopped writing
            if rank == 0:
                _remove(staging)
            raise
        if rank == 0:
            try:
                config = getattr(self.module, "config", None)  # type: ignore[attr-defined]
                if config is not None and hasattr(config, "save_pretrained"):
                    config.save_pretrained(staging)
                generation = getattr(self.module, "generation_config", None)  # type: ignore[attr-defined]
                if generation is not None and hasattr(generation, "save_pretrained"):
                    generation.save_pretrained(staging)
                _commit_folder(staging, target)
            except Exception as e:  # every rank must hear of it
                failure = f"rank 0 could not finish {target}: {type(e).__name__}: {e}"
                _remove(staging)
        failure = _dist.broadcast_text(failure)
        if failure:
            raise CheckpointError(failure)
        return [os.path.basename(f) for f in files]

    def load_report(self) -> Optional[Dict[str, Any]]:
        """What the last ``load_hf_checkpoint`` cost this rank: ``bytes_requested`` (the
        tensor bytes it needed), ``bytes_read`` (from the files, in whole 4 KiB blocks,
        headers included), ``files_opened``, ``buffers`` read, ``seconds``, and this
        process's ``peak_rss`` so far (``VmHWM``). ``None`` before any load."""
        return None if self._load_report is None else dict(self._load_report)
