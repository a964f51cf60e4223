"""DeepSpeed 0.19.8's ``CPU_Accelerator`` (``deepspeed/accelerator/cpu_accelerator.py``)."""

from __future__ import annotations

import os
import subprocess
from typing import Any, Callable, Dict, List, Optional

import torch

from .base import DeepSpeedAccelerator, _check_pin_backend, _no_op_builds, noop_context


def _rss() -> int:
    """This process's resident set size in bytes (what psutil's ``memory_info().rss`` says)."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _host_memory() -> Dict[str, int]:
    """Total and available host memory in bytes (psutil's ``virtual_memory()``)."""
    try:
        import psutil

        vm = psutil.virtual_memory()
        return {"total": int(vm.total), "available": int(vm.available)}
    except ImportError:
        pass
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            fields[key] = int(rest.split()[0]) * 1024
    return {"total": fields["MemTotal"], "available": fields.get("MemAvailable", fields["MemFree"])}


def _numa_core_lists() -> List[List[int]]:
    """``numactl --hardware``'s cores per NUMA node (empty without numactl)."""
    try:
        output = subprocess.check_output(["numactl", "--hardware"]).decode("utf-8")
    except (FileNotFoundError, subprocess.SubprocessError):
        return []
    lines = output.split("\n")
    count = 0
    for line in lines:
        if line.startswith("available:"):
            count = int(line.split(" ")[1])
            break
    cores = []
    for node in range(count):
        for line in lines:
            if line.startswith(f"node {node} cpus:"):
                cores.append([int(c) for c in line.split(" ")[3:] if c])
    return cores


def _torch_type(name: str) -> Any:
    """A read-only property: ``torch.<name>``."""
    return property(lambda self: getattr(torch, name), doc=f"``torch.{name}``.")


class CPU_Accelerator(DeepSpeedAccelerator):
    """DeepSpeed 0.19.8's CPU accelerator: memory is the process's resident set size,
    streams and events do not exist (``None``), synchronization is a no-op."""

    _torch_pins_host_memory = False

    def __init__(self) -> None:
        super().__init__()
        self._name = "cpu"
        self._compile_backend = "inductor"
        self._communication_backend_name = "gloo"
        self.max_mem = _rss()

    def is_synchronized_device(self) -> bool:
        """True."""
        return True

    def device_name(self, device_index: Optional[int] = None) -> str:
        """``"cpu"``."""
        return "cpu"

    def device(self, device_index: Optional[int] = None) -> None:
        """``None`` (as DeepSpeed's CPU accelerator)."""
        return None

    def set_device(self, device_index: Any) -> None:
        """Nothing to set."""
        return None

    def current_device(self) -> Any:
        """``LOCAL_RANK`` as the environment holds it (a string), else ``0``."""
        return os.environ.get("LOCAL_RANK", 0)

    def current_device_name(self) -> str:
        """``"cpu"``."""
        return "cpu"

    def device_count(self) -> int:
        """``LOCAL_SIZE`` if set, else the NUMA nodes with cores (1 without numactl)."""
        local_size = int(os.environ.get("LOCAL_SIZE", 0))
        if local_size > 0:
            return local_size
        lists = _numa_core_lists()
        if not lists:
            return 1
        count, previous = 0, None
        for cores in lists:
            if cores and cores != previous:
                count += 1
                previous = cores
        return count

    def synchronize(self, device_index: Optional[int] = None) -> None:
        """Nothing to wait for."""
        return None

    def is_available(self) -> bool:
        """True."""
        return True

    # ---- RNG ---------------------------------------------------------------------------

    def set_rng_state(self, new_state: torch.Tensor, device_index: Optional[int] = None) -> None:
        """``torch.set_rng_state``."""
        if device_index is None:
            return torch.set_rng_state(new_state)
        return torch.set_rng_state(new_state, device_index)  # type: ignore[call-arg]

    def get_rng_state(self, device_index: Optional[int] = None) -> torch.Tensor:
        """``torch.get_rng_state()``."""
        return torch.get_rng_state()

    def manual_seed(self, seed: int) -> Any:
        """``torch.manual_seed``."""
        return torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> Any:
        """``torch.manual_seed`` (one generator on the CPU)."""
        return torch.manual_seed(seed)

    def initial_seed(self) -> int:
        """``torch.initial_seed()``."""
        return torch.initial_seed()

    def default_generator(self, device_index: int) -> torch.Generator:
        """``torch.default_generator``."""
        return torch.default_generator

    # ---- streams and events: none on the CPU -------------------------------------------

    @property
    def Stream(self) -> None:
        """``None``: the CPU has no streams."""
        return None

    def stream(self, stream: Any) -> Any:
        """A context that does nothing."""
        return noop_context()

    def current_stream(self, device_index: Optional[int] = None) -> None:
        """``None``."""
        return None

    def default_stream(self, device_index: Optional[int] = None) -> None:
        """``None``."""
        return None

    @property
    def Event(self) -> None:
        """``None``: the CPU has no events."""
        return None

    # ---- memory: the process's resident set --------------------------------------------

    def empty_cache(self) -> None:
        """Nothing to free."""
        return None

    def get_rss(self) -> int:
        """The resident set size now (and the peak updated)."""
        mem = _rss()
        if mem > self.max_mem:
            self.max_mem = mem
        return mem

    def reset_rss(self) -> int:
        """Resets the peak to the resident set size now."""
        self.max_mem = _rss()
        return self.max_mem

    def memory_allocated(self, device_index: Optional[int] = None) -> int:
        """The resident set size."""
        return self.get_rss()

    def max_memory_allocated(self, device_index: Optional[int] = None) -> int:
        """The peak resident set size seen."""
        self.get_rss()
        return self.max_mem

    def reset_max_memory_allocated(self, device_index: Optional[int] = None) -> None:
        """Resets the peak."""
        self.reset_rss()

    def memory_cached(self, device_index: Optional[int] = None) -> int:
        """The resident set size."""
        return self.get_rss()

    def max_memory_cached(self, device_index: Optional[int] = None) -> int:
        """The peak resident set size seen."""
        self.get_rss()
        return self.max_mem

    def reset_max_memory_cached(self, device_index: Optional[int] = None) -> None:
        """Resets the peak."""
        self.reset_rss()

    def memory_stats(self, device_index: Optional[int] = None) -> Dict[str, int]:
        """``allocated_bytes.all.current`` and ``.peak``."""
        mem = self.get_rss()
        return {"allocated_bytes.all.current": mem, "allocated_bytes.all.peak": self.max_mem}

    def reset_peak_memory_stats(self, device_index: Optional[int] = None) -> None:
        """Resets the peak."""
        self.reset_rss()

    def memory_reserved(self, device_index: Optional[int] = None) -> int:
        """The resident set size."""
        return self.get_rss()

    def max_memory_reserved(self, device_index: Optional[int] = None) -> int:
        """The peak resident set size seen."""
        self.get_rss()
        return self.max_mem

    def total_memory(self, device_index: Optional[int] = None) -> int:
        """The host's memory."""
        return _host_memory()["total"]

    def available_memory(self, device_index: Optional[int] = None) -> int:
        """The host's available memory."""
        return _host_memory()["available"]

    # ---- misc ----------------------------------------------------------------------

    def range_push(self, msg: str, domain: Any = None, category: Any = None) -> None:
        """Nothing (DeepSpeed's CPU accelerator marks no ranges)."""
        return None

    def range_pop(self, domain: Any = None) -> None:
        """Nothing."""
        return None

    def lazy_call(self, callback: Callable[[], Any]) -> Any:
        """Calls ``callback`` now."""
        return callback()

    def is_triton_supported(self) -> bool:
        """False."""
        return False

    def is_bf16_supported(self) -> bool:
        """True."""
        return True

    def is_fp16_supported(self) -> bool:
        """Whether oneDNN computes fp16 on this CPU."""
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
        except Exception:
            return False

    def supported_dtypes(self) -> List[torch.dtype]:
        """fp32, bf16, and fp16 where supported."""
        dtypes = [torch.float, torch.bfloat16]
        if self.is_fp16_supported():
            dtypes.append(torch.float16)
        return dtypes

    def create_graph(self) -> None:
        """``None``: no graphs on the CPU."""
        return None

    def capture_to_graph(self, graph: Any, pool: Any = None, stream: Any = None) -> Any:
        """A context that does nothing."""
        return noop_context()

    def replay_graph(self, graph: Any) -> None:
        """Nothing."""
        return None

    # DeepSpeed's `<Type>Tensor` properties: torch's own legacy constructors.
    BFloat16Tensor = _torch_type("BFloat16Tensor")
    ByteTensor = _torch_type("ByteTensor")
    DoubleTensor = _torch_type("DoubleTensor")
    FloatTensor = _torch_type("FloatTensor")
    HalfTensor = _torch_type("HalfTensor")
    IntTensor = _torch_type("IntTensor")
    LongTensor = _torch_type("LongTensor")

    def pin_memory(self, tensor: torch.Tensor, make_copy: bool = True, match_shape: bool = True) -> torch.Tensor:
        """``tensor`` itself: torch cannot page-lock memory for the CPU."""
        _check_pin_backend()
        return tensor

    def _torch_pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def _torch_empty_pinned(self, tensor: torch.Tensor, shape: Any) -> torch.Tensor:
        return tensor.new_empty(shape)

    def create_op_builder(self, op_name: str) -> Any:
        """Raises: zero has no op builders."""
        raise _no_op_builds(f"get_accelerator().create_op_builder({op_name!r})")

    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is on the CPU."""
        return str(tensor.device).startswith("cpu")

    def export_envs(self) -> List[str]:
        """No variables for the launcher to export."""
        return []
