"""A torch.distributed backend that keeps NCCL's rules on a machine without a GPU, for the
tests of zero_torch's host-side collectives (``test_nccl_rules.py``).

``zero_nccl_rules`` is gloo registered for the ``cuda`` device type only
(``Backend.register_backend(..., devices=["cuda"])``), as torch registers NCCL: a
collective on a CPU tensor over it fails as it fails on NCCL ("No backend type associated
with device type cpu"), and since CI has no CUDA tensors, every tensor collective over it
fails there. (NCCL's ``barrier`` works on a GPU; here it fails too: zero's code calls none.)
A rank whose tensors sit on another rank's GPU cannot be made without GPUs: that rule is
the stand-in's (``zero-gpusim``'s NCCL checks).

Call :func:`install` before ``torch.distributed.init_process_group(backend=NAME)``."""

from __future__ import annotations

import torch.distributed as dist

NAME = "zero_nccl_rules"


def _gloo_for_cuda(store, rank, size, timeout):  # type: ignore[no-untyped-def]
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def install() -> None:
    """Registers the backend (once per process)."""
    if NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(NAME, _gloo_for_cuda, devices=["cuda"])
