"""``deepspeed.runtime.config``: ``DeepSpeedConfig`` read by zero's config parser, and
DeepSpeed's optimizer-name constants."""

from __future__ import annotations

import base64
import binascii
import json
import os
from typing import Any, Dict, Union

import torch.distributed as _td

from zero_torch import _native
from zero_torch.errors import ConfigError, NotProvidedAttributeError, UnsupportedError

from .._missing import message, module_getattr

DeepSpeedConfigError = ConfigError
"""DeepSpeed's config error is zero's :class:`~zero_torch.errors.ConfigError` (what zero's
parser raises for a bad config: an unknown or misspelt key, a wrong type, a batch size
that does not add up)."""

ADAGRAD_OPTIMIZER = "adagrad"
ADAM_OPTIMIZER = "adam"
ADAMW_OPTIMIZER = "adamw"
LAMB_OPTIMIZER = "lamb"
MUADAM_OPTIMIZER = "muadam"
MUADAMW_OPTIMIZER = "muadamw"
MUSGD_OPTIMIZER = "musgd"
LION_OPTIMIZER = "lion"
MUON_OPTIMIZER = "muon"
DEEPSPEED_OPTIMIZERS = [
    ADAGRAD_OPTIMIZER, ADAM_OPTIMIZER, ADAMW_OPTIMIZER, LAMB_OPTIMIZER, MUADAM_OPTIMIZER,
    MUADAMW_OPTIMIZER, MUSGD_OPTIMIZER, LION_OPTIMIZER, MUON_OPTIMIZER,
]
"""The optimizer names DeepSpeed 0.19.8 knows (zero's engine steps ``adam``/``adamw``)."""

_DTYPE_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def _read(config: Union[str, os.PathLike, Dict[str, Any]]) -> Dict[str, Any]:
    """The config as a dict: a dict as is, a path's JSON, or base64-encoded JSON (the three
    forms DeepSpeed accepts)."""
    if isinstance(config, dict):
        return config
    if isinstance(config, (str, os.PathLike)) and os.path.exists(config):
        with open(config) as f:
            try:
                return json.load(f)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{os.fspath(config)} is not valid JSON: {e}") from None
    try:
        return json.loads(base64.urlsafe_b64decode(config).decode("utf-8"))
    except (UnicodeDecodeError, AttributeError, TypeError, ValueError, binascii.Error):
        raise ValueError(
            "Expected a string path to an existing deepspeed config, or a dictionary or a valid "
            f"base64. Received: {config}"
        ) from None


class _PrecisionConfig:
    """``float16_config`` / ``bfloat16_config``: whether the precision is ``enabled``
    (DeepSpeed's other fields of these sections are not provided)."""

    def __init__(self, section: str, enabled: bool) -> None:
        self._section = section
        self.enabled = enabled

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotProvidedAttributeError(message(f"deepspeed.DeepSpeedConfig.{self._section}.{name}"), name=name, obj=self)

    def __repr__(self) -> str:
        return f"{self._section}(enabled={self.enabled})"


class DeepSpeedConfig:
    """DeepSpeed's ``DeepSpeedConfig(config, mpu=None, mesh_device=None)``: the config (a
    dict, a path to JSON, or base64 JSON) resolved by zero's parser for this job's data
    parallel size (the default group's size, 1 before it exists), as DeepSpeed resolves it.

    Attributes: ``train_batch_size``, ``train_micro_batch_size_per_gpu``,
    ``gradient_accumulation_steps``, ``fp16_enabled``, ``bfloat16_enabled``,
    ``zero_optimization_stage``, ``zero_enabled``, ``gradient_clipping``, ``global_rank``,
    ``world_size``, ``_param_dict`` (the config as given), and ``float16_config.enabled`` /
    ``bfloat16_config.enabled`` (DeepSpeed 0.19.8's names; ``fp16_enabled`` and
    ``bfloat16_enabled`` are its older ones, which scripts still read). DeepSpeed's other attributes
    raise :class:`~zero_torch.errors.NotProvidedAttributeError`. Unknown or misspelt keys
    raise :class:`~zero_torch.errors.ConfigError` (DeepSpeed ignores unknown top-level
    keys)."""

    def __init__(self, config: Union[str, os.PathLike, Dict[str, Any]], mpu: Any = None, mesh_device: Any = None) -> None:
        if mpu is not None:
            raise UnsupportedError("DeepSpeedConfig(mpu=...): model parallelism is not part of zero")
        if mesh_device is not None:
            raise UnsupportedError("DeepSpeedConfig(mesh_device=...): device meshes are not part of zero")
        self._param_dict: Dict[str, Any] = _read(config)
        initialized = _td.is_available() and _td.is_initialized()
        self.global_rank: int = _td.get_rank() if initialized else 0
        self.world_size: int = _td.get_world_size() if initialized else 1
        resolved = _native.resolve_config(json.dumps(self._param_dict), self.world_size)
        self._resolved: _native.ResolvedConfig = resolved
        self.train_batch_size: int = resolved.train_batch_size
        self.train_micro_batch_size_per_gpu: int = resolved.train_micro_batch_size_per_gpu
        self.gradient_accumulation_steps: int = resolved.gradient_accumulation_steps
        self.fp16_enabled: bool = resolved.dtype == "float16"
        self.bfloat16_enabled: bool = resolved.dtype == "bfloat16"
        self.float16_config = _PrecisionConfig("float16_config", self.fp16_enabled)
        self.bfloat16_config = _PrecisionConfig("bfloat16_config", self.bfloat16_enabled)
        self.zero_optimization_stage: int = resolved.stage
        self.zero_enabled: bool = self.zero_optimization_stage > 0
        self.gradient_clipping: float = resolved.gradient_clipping

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotProvidedAttributeError(message(f"deepspeed.DeepSpeedConfig.{name}"), name=name, obj=self)

    def __repr__(self) -> str:
        precision = _DTYPE_NAMES.get(self._resolved.dtype, self._resolved.dtype)
        return (
            f"DeepSpeedConfig(train_batch_size={self.train_batch_size}, "
            f"micro_batch={self.train_micro_batch_size_per_gpu}, gas={self.gradient_accumulation_steps}, "
            f"{precision}, zero stage {self.zero_optimization_stage}, world_size={self.world_size})"
        )


__all__ = ["DeepSpeedConfig", "DeepSpeedConfigError", "DEEPSPEED_OPTIMIZERS"]
__getattr__ = module_getattr(__name__)
