"""DeepSpeed's CPU accelerator allows fp16 only where oneDNN computes it natively
(AVX512-FP16 or AMX-FP16: Intel Sapphire Rapids and newer). Elsewhere (AMD Zen 4, older
Intel) ``deepspeed.initialize`` refuses every fp16 config with "Type fp16 is not supported
on your device", so the DeepSpeed references of the fp16 cases could only run on some CI
machines. torch computes fp16 on every CPU, with the same kernels on both sides of a
comparison, so the reference processes open that gate. zero's own runs never ask it.

Installed as an import hook: it touches the real DeepSpeed's CPU accelerator only when that
module is imported (a process that never imports DeepSpeed is unchanged)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any, Optional, Sequence

TARGET = "deepspeed.accelerator.cpu_accelerator"


def _patch(module: Any) -> None:
    cls = getattr(module, "CPU_Accelerator", None)
    if cls is not None:
        cls.is_fp16_supported = lambda self: True


class _Finder(importlib.abc.MetaPathFinder):
    """Patches ``CPU_Accelerator.is_fp16_supported`` as the real module loads."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Any = None) -> Any:
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Lets the real DeepSpeed take fp16 configs on any CPU (this process only)."""
    if TARGET in sys.modules:
        _patch(sys.modules[TARGET])
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
