"""DeepSpeed's accelerator interface (``DeepSpeedAccelerator``) and what the CPU and CUDA
accelerators share."""

from __future__ import annotations

import abc
import contextlib
import os
from typing import Any, Dict, Iterator, List, Optional

import torch

from ..errors import UnsupportedError

SUPPORTED_ACCELERATOR_LIST = ["cuda", "cpu", "xpu", "npu", "mps", "hpu", "mlu", "sdaa", "supa", "klxpu"]
"""DeepSpeed 0.19.8's accelerator names (``DS_ACCELERATOR`` must be one of them)."""

SERVED_ACCELERATORS = ("cpu", "cuda")
"""The accelerators zero runs on."""


@contextlib.contextmanager
def noop_context() -> Iterator[None]:
    """A context that does nothing (DeepSpeed's ``deepspeed.runtime.utils.noop_context``)."""
    yield


def _no_op_builds(what: str) -> UnsupportedError:
    return UnsupportedError(
        f"{what}: zero compiles no DeepSpeed ops (no JIT build, no ninja, no CUDA toolkit); "
        "its engine, fused Adam and collectives are part of the zero_torch wheel"
    )


def _check_pin_backend() -> None:
    if os.environ.get("DS_PIN_MEMORY_BACKEND", "torch").strip().lower() == "native":
        raise UnsupportedError(
            "DS_PIN_MEMORY_BACKEND=native (DeepSpeed's pinned-memory op) is not provided: unset it "
            "to pin with torch"
        )


def _require_host(device: Any) -> None:
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"pin_empty allocates host memory; device must be cpu, got {device!r}") from err
    if dev.type != "cpu":
        raise ValueError(f"pin_empty allocates host memory; device must be cpu, got {device!r}")


class DeepSpeedAccelerator(abc.ABC):
    """The base of zero's accelerators (DeepSpeed's ``DeepSpeedAccelerator``): what every
    device shares, and the op-builder methods, which raise."""

    supports_nvtx_domain = False
    _torch_pins_host_memory = True

    def __init__(self) -> None:
        self._name: Optional[str] = None
        self._communication_backend_name: Optional[str] = None
        self._compile_backend: Optional[str] = None

    # ---- device ---------------------------------------------------------------------

    @abc.abstractmethod
    def device_name(self, device_index: Optional[int] = None) -> str:
        """``"cpu"``, ``"cuda"`` or ``"cuda:<index>"``."""

    @abc.abstractmethod
    def is_available(self) -> bool:
        """Whether the device can be used."""

    @abc.abstractmethod
    def is_synchronized_device(self) -> bool:
        """Whether work on the device completes before the host goes on (the CPU)."""

    def use_host_timers(self) -> bool:
        """Whether timers may use the host clock (as :meth:`is_synchronized_device`)."""
        return self.is_synchronized_device()

    def resolves_data_dependency(self) -> bool:
        """As :meth:`is_synchronized_device`."""
        return self.is_synchronized_device()

    def handles_memory_backpressure(self) -> bool:
        """As :meth:`is_synchronized_device`."""
        return self.is_synchronized_device()

    def is_fp64_supported(self) -> bool:
        """True (both devices compute in fp64)."""
        return True

    def prefer_triton_grouped_mm(self) -> bool:
        """False: zero runs no Triton kernels."""
        return False

    def is_current_stream_capturing(self) -> bool:
        """Whether a CUDA graph is being captured (never on the CPU)."""
        return False

    def communication_backend_name(self) -> Optional[str]:
        """The torch.distributed backend of this device (``gloo``, ``nccl``)."""
        return self._communication_backend_name

    def random(self) -> Any:
        """``torch.random``."""
        return torch.random

    # ---- memory pinning -----------------------------------------------------------------

    def _torch_pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.pin_memory()

    def _torch_empty_pinned(self, tensor: torch.Tensor, shape: Any) -> torch.Tensor:
        return tensor.new_empty(shape, pin_memory=True)

    def pin_memory(self, tensor: torch.Tensor, make_copy: bool = True, match_shape: bool = True) -> torch.Tensor:
        """A page-locked copy of ``tensor`` (with ``make_copy=False``: a fresh page-locked
        tensor of its shape, or of its element count without ``match_shape``)."""
        _check_pin_backend()
        if make_copy:
            return self._torch_pin_memory(tensor)
        shape = tensor.shape if match_shape else (tensor.numel(),)
        return self._torch_empty_pinned(tensor, shape)

    def pin_empty(self, *size: Any, dtype: torch.dtype, device: Any = "cpu") -> torch.Tensor:
        """A fresh page-locked host tensor of ``size`` and ``dtype``."""
        _check_pin_backend()
        _require_host(device)
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else tuple(size)
        return self._torch_empty_pinned(torch.empty(0, dtype=dtype, device=device), shape)

    def pin_empty_like(self, tensor: torch.Tensor, device: Any = "cpu", dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """A fresh page-locked host tensor shaped as ``tensor``."""
        _check_pin_backend()
        _require_host(device)
        template = tensor.new_empty((0,), dtype=tensor.dtype if dtype is None else dtype, device=device)
        return self._torch_empty_pinned(template, tuple(tensor.shape))

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        """``tensor.is_pinned()``."""
        return tensor.is_pinned()

    def unpin_memory(self, tensor: torch.Tensor) -> None:
        """Nothing to undo (torch frees pinned memory with the tensor)."""
        return None

    def register_host_memory(self, address: int, num_bytes: int) -> bool:
        """False: host memory is not registered with the device (DeepSpeed's default)."""
        return False

    def unregister_host_memory(self, address: int) -> None:
        """Nothing to unregister."""
        return None

    def pin_memory_alignment(self) -> int:
        """1: no alignment is required."""
        return 1

    # ---- op builders: zero has none ----------------------------------------------------

    def op_builder_dir(self) -> str:
        """Raises: zero has no op builders."""
        raise _no_op_builds("get_accelerator().op_builder_dir()")

    def create_op_builder(self, class_name: str) -> Any:
        """Raises: zero has no op builders."""
        raise _no_op_builds(f"get_accelerator().create_op_builder({class_name!r})")

    def get_op_builder(self, class_name: str) -> Any:
        """Raises: zero has no op builders."""
        raise _no_op_builds(f"get_accelerator().get_op_builder({class_name!r})")

    def build_extension(self) -> Any:
        """Raises: zero has no op builders."""
        raise _no_op_builds("get_accelerator().build_extension()")

    # ---- environment and compile -----------------------------------------------------

    def visible_devices_envs(self) -> List[str]:
        """``["CUDA_VISIBLE_DEVICES"]`` (DeepSpeed's answer for the CPU too)."""
        return ["CUDA_VISIBLE_DEVICES"]

    def set_visible_devices_envs(self, current_env: Dict[str, str], local_accelerator_ids: List[int]) -> None:
        """Writes ``local_accelerator_ids`` into ``current_env``'s visible-devices variables."""
        for env in self.visible_devices_envs():
            current_env[env] = ",".join(map(str, local_accelerator_ids))

    def get_compile_backend(self) -> Optional[str]:
        """The torch.compile backend (``inductor``)."""
        return self._compile_backend

    def set_compile_backend(self, backend: str) -> None:
        """Sets the torch.compile backend; one torch does not know is a ``ValueError``."""
        supported = torch._dynamo.list_backends(exclude_tags=())
        if backend not in supported:
            raise ValueError(f"{backend} not supported by {self.device_name()}. Supported Backends are {supported}")
        self._compile_backend = backend
