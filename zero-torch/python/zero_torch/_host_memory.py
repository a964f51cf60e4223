"""The host allocator a model bigger than one rank shares with torch's tensors."""

from __future__ import annotations

import os

from . import _native

HEAP_THRESHOLD = 1 << 20
"""Host allocations of at least this many bytes are mapped (and unmapped when freed) once a
``zero.Init`` block was entered: :func:`pin_heap`."""

_MALLOC_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def pin_heap() -> bool:
    """Pins glibc malloc's mmap threshold at :data:`HEAP_THRESHOLD`: freed tensors of 1 MiB
    or more go back to the kernel at once instead of staying in the heap, where glibc's
    rising threshold otherwise leaves them. Entering ``zero.Init`` (and so
    ``from_pretrained``) pins it, before the model is built: that is the path of a model
    bigger than one rank, where memory comes first. Measured (docs/BENCHMARKS.md): 60-100
    MiB less peak RSS per rank on a 135M-parameter Llama at stage 3 (no change in its step
    time), 0.7 GiB less on an 85M GPT-2 at batch 8 x 64 whose step then takes about 24%
    longer (every tensor of 1 MiB or more is fresh pages). An ordinary stage-3 run keeps
    glibc's default; set ``MALLOC_MMAP_THRESHOLD_=1048576`` for the same effect. Left alone
    where the user tuned malloc through its environment variables or ``GLIBC_TUNABLES``.
    Whether it was set."""
    if any(v in os.environ for v in _MALLOC_VARS) or "malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    return bool(_native.pin_mmap_threshold(HEAP_THRESHOLD))
