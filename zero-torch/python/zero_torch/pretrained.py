"""``zero_torch.from_pretrained``: a Hugging Face model folder made ready for
:func:`~zero_torch.initialize` without any rank holding the whole model. The model is built
from its ``config.json`` inside :class:`zero_torch.zero.Init` (no parameter holds values),
and when the engine is built each rank reads only the byte ranges of the parameters it
holds from ``model.safetensors`` (or the shards its index names)."""

from __future__ import annotations

import os
from typing import Any, Optional, Union

import torch

from .errors import CheckpointError
from .zero import Init, _config_dtype

PathLike = Union[str, os.PathLike]


def from_pretrained(
    path: PathLike,
    model_class: Any = None,
    *,
    config: Any = None,
    torch_dtype: Optional[torch.dtype] = None,
) -> torch.nn.Module:
    """The model saved in the local folder ``path`` (as ``save_pretrained`` writes it:
    ``config.json`` beside ``model.safetensors``, or shards with
    ``model.safetensors.index.json``), in eval mode as transformers returns it, ready for
    :func:`~zero_torch.initialize`. Its parameters are filled when the engine is built
    (at ``initialize``), each rank reading only what it holds; a missing or unexpected
    tensor, a wrong shape or a damaged file then raises
    :class:`~zero_torch.CheckpointError` on every rank, naming the tensor and the file.

    ``model_class``: a transformers class (``AutoModelForCausalLM`` by default, or a
    concrete ``PreTrainedModel`` subclass). ``config``: the run's DeepSpeed config (dict or
    path), whose ``bf16``/``fp16`` section gives the dtype the model is made in;
    ``torch_dtype`` overrides it (default float32, whatever the files hold: the engine
    casts once while reading)."""
    import transformers

    folder = os.path.abspath(os.fspath(path))
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise CheckpointError(f"{folder}: no config.json (from_pretrained takes a local save_pretrained folder)")
    hf_config = transformers.AutoConfig.from_pretrained(folder)
    cls = model_class if model_class is not None else transformers.AutoModelForCausalLM
    dtype = torch_dtype or _config_dtype(config) or torch.float32
    with Init(dtype=dtype, checkpoint=folder):
        if hasattr(cls, "from_config"):
            model = cls.from_config(hf_config)
        else:
            model = cls(hf_config)
    model.eval()
    return model
