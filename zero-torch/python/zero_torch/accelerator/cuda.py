"""DeepSpeed 0.19.8's ``CUDA_Accelerator`` (``deepspeed/accelerator/cuda_accelerator.py``)."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, Dict, List, Optional

import torch

from .base import DeepSpeedAccelerator


def _cuda_tensor(dtype: torch.dtype) -> Any:
    """A read-only property: ``torch.tensor`` with ``dtype`` on ``cuda``."""
    return property(
        lambda self: functools.partial(torch.tensor, dtype=dtype, device="cuda"),
        doc=f"``torch.tensor`` with ``dtype={dtype}, device=\"cuda\"``.",
    )


class CUDA_Accelerator(DeepSpeedAccelerator):
    """DeepSpeed 0.19.8's CUDA accelerator: torch.cuda's devices, streams, events, memory
    statistics and RNG; NCCL."""

    supports_nvtx_domain = True

    def __init__(self) -> None:
        super().__init__()
        self._name = "cuda"
        self._communication_backend_name = "nccl" if sys.platform != "win32" else "gloo"
        self._compile_backend = "inductor"
        self._nvtx_domains: Dict[str, Any] = {}
        self._nvml: Any = _load_nvml()

    def is_synchronized_device(self) -> bool:
        """False: kernels run asynchronously."""
        return False

    def device_name(self, device_index: Optional[int] = None) -> str:
        """``"cuda"``, or ``"cuda:<index>"``."""
        return "cuda" if device_index is None else f"cuda:{device_index}"

    def communication_backend_version(self) -> Any:
        """NCCL's version, as torch reports it."""
        return torch.cuda.nccl.version()

    def device(self, device_index: Optional[int] = None) -> torch.device:
        """``torch.device("cuda", device_index)``."""
        return torch.device("cuda", device_index)

    def set_device(self, device_index: Any) -> None:
        """``torch.cuda.set_device``."""
        torch.cuda.set_device(device_index)

    def current_device(self) -> int:
        """``torch.cuda.current_device()``."""
        return torch.cuda.current_device()

    def current_device_name(self) -> str:
        """``"cuda:<current device>"``."""
        return f"cuda:{torch.cuda.current_device()}"

    def device_count(self) -> int:
        """``torch.cuda.device_count()``."""
        return torch.cuda.device_count()

    def synchronize(self, device_index: Optional[int] = None) -> None:
        """``torch.cuda.synchronize``."""
        return torch.cuda.synchronize(device_index)

    def is_available(self) -> bool:
        """``torch.cuda.is_available()``."""
        return torch.cuda.is_available()

    # ---- RNG ---------------------------------------------------------------------------

    def set_rng_state(self, new_state: torch.Tensor, device_index: Optional[int] = None) -> None:
        """``torch.cuda.set_rng_state``."""
        if device_index is None:
            return torch.cuda.set_rng_state(new_state)
        return torch.cuda.set_rng_state(new_state, device_index)

    def get_rng_state(self, device_index: Optional[int] = None) -> torch.Tensor:
        """``torch.cuda.get_rng_state``."""
        if device_index is None:
            return torch.cuda.get_rng_state()
        return torch.cuda.get_rng_state(device_index)

    def manual_seed(self, seed: int) -> Any:
        """``torch.cuda.manual_seed``."""
        return torch.cuda.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> Any:
        """``torch.cuda.manual_seed_all``."""
        return torch.cuda.manual_seed_all(seed)

    def initial_seed(self) -> int:
        """``torch.cuda.initial_seed()``."""
        return torch.cuda.initial_seed()

    def default_generator(self, device_index: int) -> torch.Generator:
        """``torch.cuda.default_generators[device_index]``."""
        return torch.cuda.default_generators[device_index]

    # ---- streams and events ----------------------------------------------------------

    @property
    def Stream(self) -> Any:
        """``torch.cuda.Stream``."""
        return torch.cuda.Stream

    def stream(self, stream: Any) -> Any:
        """``torch.cuda.stream(stream)``."""
        return torch.cuda.stream(stream)

    def current_stream(self, device_index: Optional[int] = None) -> Any:
        """``torch.cuda.current_stream``."""
        return torch.cuda.current_stream(device_index)

    def default_stream(self, device_index: Optional[int] = None) -> Any:
        """``torch.cuda.default_stream``."""
        return torch.cuda.default_stream(device_index)

    @property
    def Event(self) -> Any:
        """``torch.cuda.Event``."""
        return torch.cuda.Event

    # ---- memory ----------------------------------------------------------------------

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``."""
        return torch.cuda.empty_cache()

    def memory_allocated(self, device_index: Optional[int] = None) -> int:
        """``torch.cuda.memory_allocated``."""
        return torch.cuda.memory_allocated(device_index)

    def max_memory_allocated(self, device_index: Optional[int] = None) -> int:
        """``torch.cuda.max_memory_allocated``."""
        return torch.cuda.max_memory_allocated(device_index)

    def reset_max_memory_allocated(self, device_index: Optional[int] = None) -> None:
        """``torch.cuda.reset_max_memory_allocated``."""
        return torch.cuda.reset_max_memory_allocated(device_index)

    def memory_cached(self, device_index: Optional[int] = None) -> int:
        """``torch.cuda.memory_cached``."""
        return torch.cuda.memory_cached(device_index)

    def max_memory_cached(self, device_index: Optional[int] = None) -> int:
        """``torch.cuda.max_memory_cached``."""
        return torch.cuda.max_memory_cached(device_index)

    def reset_max_memory_cached(self, device_index: Optional[int] = None) -> None:
        """``torch.cuda.reset_max_memory_cached``."""
        return torch.cuda.reset_max_memory_cached(device_index)

    def memory_stats(self, device_index: Optional[int] = None) -> Dict[str, Any]:
        """``torch.cuda.memory_stats``."""
        return torch.cuda.memory_stats(device_index)

    def reset_peak_memory_stats(self, device_index: Optional[int] = None) -> None:
        """``torch.cuda.reset_peak_memory_stats``."""
        return torch.cuda.reset_peak_memory_stats(device_index)

    def memory_reserved(self, device_index: Optional[int] = None) -> int:
        """``torch.cuda.memory_reserved``."""
        return torch.cuda.memory_reserved(device_index)

    def max_memory_reserved(self, device_index: Optional[int] = None) -> int:
        """``torch.cuda.max_memory_reserved``."""
        return torch.cuda.max_memory_reserved(device_index)

    def total_memory(self, device_index: Optional[int] = None) -> int:
        """The device's memory (``get_device_properties(...).total_memory``)."""
        return torch.cuda.get_device_properties(device_index).total_memory

    def available_memory(self, device_index: Optional[int] = None) -> int:
        """Free device memory: NVML's answer where pynvml is installed, else the total less
        what torch has allocated (as DeepSpeed)."""
        if self._nvml is not None:
            if device_index is None:
                device_index = self.current_device()
            handle = self._nvml.nvmlDeviceGetHandleByIndex(_nvml_index(device_index))
            return int(self._nvml.nvmlDeviceGetMemoryInfo(handle).free)
        return self.total_memory(device_index) - self.memory_allocated(device_index)

    # ---- dtypes ----------------------------------------------------------------------

    def is_bf16_supported(self) -> bool:
        """``torch.cuda.is_bf16_supported()`` (True without a device, as DeepSpeed)."""
        if not torch.cuda.is_available():
            return True
        return torch.cuda.is_bf16_supported()

    def is_fp16_supported(self) -> bool:
        """Compute capability 7 or newer (6 with ``DS_ALLOW_DEPRECATED_FP16=1``; True without
        a device, as DeepSpeed)."""
        if not torch.cuda.is_available():
            return True
        major, _ = torch.cuda.get_device_capability()
        return major >= 7 or (major == 6 and os.environ.get("DS_ALLOW_DEPRECATED_FP16", "0") == "1")

    def supported_dtypes(self) -> List[torch.dtype]:
        """fp32, and fp16 / bf16 where supported."""
        dtypes = [torch.float]
        if self.is_fp16_supported():
            dtypes.append(torch.half)
        if self.is_bf16_supported():
            dtypes.append(torch.bfloat16)
        return dtypes

    # ---- misc ----------------------------------------------------------------------

    def range_push(self, msg: str, domain: Any = None, category: Any = None) -> Any:
        """Opens an NVTX range (the ``nvtx`` package's domain where given and installed)."""
        nvtx_domain = self._nvtx_domain(domain)
        if nvtx_domain is not None:
            return nvtx_domain.push_range(message=msg, category=category)
        return torch.cuda.nvtx.range_push(msg)

    def range_pop(self, domain: Any = None) -> Any:
        """Closes the innermost NVTX range."""
        nvtx_domain = self._nvtx_domain(domain)
        if nvtx_domain is not None:
            return nvtx_domain.pop_range()
        return torch.cuda.nvtx.range_pop()

    def _nvtx_domain(self, domain: Any) -> Any:
        if domain is None:
            return None
        try:
            import nvtx  # type: ignore[import-not-found]
        except ImportError:
            return None
        if domain not in self._nvtx_domains:
            self._nvtx_domains[domain] = nvtx.get_domain(domain)
        return self._nvtx_domains[domain]

    def lazy_call(self, callback: Callable[[], Any]) -> Any:
        """``torch.cuda._lazy_call(callback)``: runs when CUDA is initialized."""
        return torch.cuda._lazy_call(callback)

    def is_triton_supported(self) -> bool:
        """Compute capability 8 or newer."""
        if not self.is_available():
            return False
        return torch.cuda.get_device_capability()[0] >= 8

    def is_current_stream_capturing(self) -> bool:
        """``torch.cuda.is_current_stream_capturing()``."""
        return torch.cuda.is_current_stream_capturing()

    def create_graph(self) -> Any:
        """``torch.cuda.CUDAGraph()``."""
        return torch.cuda.CUDAGraph()

    def capture_to_graph(self, graph: Any, pool: Any = None, stream: Any = None) -> Any:
        """``torch.cuda.graph(graph, pool, stream)``."""
        return torch.cuda.graph(graph, pool, stream)

    def replay_graph(self, graph: Any) -> None:
        """``graph.replay()``."""
        graph.replay()

    # DeepSpeed's `<Type>Tensor` properties: torch.tensor with that dtype, on cuda.
    BFloat16Tensor = _cuda_tensor(torch.bfloat16)
    ByteTensor = _cuda_tensor(torch.uint8)
    DoubleTensor = _cuda_tensor(torch.double)
    FloatTensor = _cuda_tensor(torch.float)
    HalfTensor = _cuda_tensor(torch.half)
    IntTensor = _cuda_tensor(torch.int)
    LongTensor = _cuda_tensor(torch.long)

    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is on a CUDA device."""
        return str(tensor.device).startswith("cuda:")

    def export_envs(self) -> List[str]:
        """``["NCCL"]``: the launcher exports NCCL's variables."""
        return ["NCCL"]


def _load_nvml() -> Any:
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    return pynvml


def _nvml_index(torch_index: int) -> int:
    """NVML's index of torch's device ``torch_index`` (NVML ignores CUDA_VISIBLE_DEVICES)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return torch_index
    return list(map(int, visible.split(",")))[torch_index]
