"""torch's default process group, as DeepSpeed starts and uses it.

DeepSpeed's ``initialize`` (and ``deepspeed.init_distributed``) creates torch's default
group, so scripts can call ``torch.distributed.barrier()`` or build a
``DistributedSampler``. The engine's collectives do not go through it (the engine has its
own group: shared memory on the CPU, NCCL on GPUs), but zero creates it too, and uses it
for small host-side things: rank 0's initial parameters and buffers reach every rank,
``GatheredParameters`` before an engine exists (transformers' ZeRO-3 loading: a broadcast,
or the shards of ``_lazy_shards``), every rank's word on whether a block failed, and its
store hands the engine's ranks rank 0's id (:func:`id_exchange`: zero opens no port of
its own); ``deepspeed.comm`` delegates the script's own collectives to it.

NCCL's rule: its groups serve CUDA tensors only (a CPU tensor is an error, at world size 2
and above). zero's host-side tensors are CPU tensors, so they never go through a group
whose backend is not gloo: :func:`host_group` is torch's default group where that is
gloo, else a gloo group over the same ranks that zero creates once (``new_group``, on
every rank at the same point: the first host-side collective, which every rank reaches
in the same order). ``test_nccl_rules.py`` runs zero's host-side paths under a backend
that refuses what NCCL refuses.
"""

from __future__ import annotations

import atexit
import datetime
import os
import socket
import time
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist

from . import _native
from .errors import CommError

DEFAULT_PORT = 29500
"""DeepSpeed's and torch's default ``MASTER_PORT``."""
GLOO_RELEASE_S = 0.1
"""How long a process that used gloo waits at exit for gloo's workers (see ``_at_exit``)."""


def default_timeout() -> datetime.timedelta:
    """DeepSpeed's default process-group timeout: ``DEEPSPEED_TIMEOUT`` minutes (10)."""
    return datetime.timedelta(minutes=int(os.environ.get("DEEPSPEED_TIMEOUT", "10")))


def torch_uses_nccl() -> bool:
    """Whether torch's default process group runs on NCCL: then a script's own collectives
    and zero's (on zero's own NCCL communicator) share the GPU, and zero waits for its own
    before handing control back (issue 30, M3)."""
    return dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl"


def backend_for(device: torch.device) -> str:
    """DeepSpeed's accelerator's communication backend: NCCL for CUDA, gloo for the CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


def _set_launch_variables() -> None:
    """torch's ``env://`` reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT``; ``srun`` and ``mpirun`` set their own. Fill in what is missing from
    zero's reading of the launcher (what DeepSpeed's MPI discovery does, without mpi4py)."""
    launch = _native.launch_info()
    os.environ.setdefault("RANK", str(launch.rank))
    os.environ.setdefault("WORLD_SIZE", str(launch.world_size))
    os.environ.setdefault("LOCAL_RANK", str(launch.local_rank))
    if launch.local_world_size is not None:
        os.environ.setdefault("LOCAL_WORLD_SIZE", str(launch.local_world_size))
    os.environ.setdefault("MASTER_ADDR", launch.master_addr)


def init_distributed(
    dist_backend: Optional[str] = None,
    auto_mpi_discovery: bool = True,
    distributed_port: int = DEFAULT_PORT,
    verbose: bool = True,
    timeout: Optional[datetime.timedelta] = None,
    init_method: Optional[str] = None,
    dist_init_required: Optional[bool] = None,
    config: Any = None,
    rank: int = -1,
    world_size: int = -1,
) -> None:
    """DeepSpeed's ``deepspeed.init_distributed``: creates torch's default process group
    unless it exists (then it is used as it is, as DeepSpeed does).

    Without a launcher the job is a world of one (a free local port). Under ``torchrun``
    or the ``deepspeed`` launcher the group is created from their variables; under
    ``srun`` or ``mpirun`` the missing ``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` come from
    their own variables. The backend is ``dist_backend``, else gloo on the CPU and NCCL on
    a GPU (the accelerator's choice). ``dist_init_required=False`` with no group is an
    error, as in DeepSpeed."""
    del verbose, config, auto_mpi_discovery
    if dist.is_available() and dist.is_initialized():
        _leave_cleanly(own=False)
        return
    if dist_init_required is False:
        raise CommError(
            "Distributed backend is not initialized: dist_init_required=False needs torch's "
            "process group to exist already (call torch.distributed.init_process_group or "
            "deepspeed.init_distributed first)"
        )
    if not dist.is_available():
        raise CommError("torch.distributed is not available in this build of torch")
    launched = any(v in os.environ for v in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"))
    if launched:
        _set_launch_variables()
    elif init_method is None and rank < 0:
        # A world of one (a script run with plain `python`): a free port on this host.
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.setdefault("MASTER_PORT", str(distributed_port))
    backend = dist_backend or backend_for(_launch_device())
    kwargs: dict = {"backend": backend, "timeout": timeout or default_timeout()}
    if init_method is not None:
        kwargs["init_method"] = init_method
    if rank >= 0:
        kwargs["rank"] = rank
    if world_size >= 0:
        kwargs["world_size"] = world_size
    if backend == "nccl" and torch.cuda.is_available():
        kwargs["device_id"] = torch.device("cuda", _local_cuda_index())
    dist.init_process_group(**kwargs)
    _leave_cleanly(own=True)


_EXIT = {"registered": False, "own": False, "gloo": False}


def _leave_cleanly(own: bool) -> None:
    """Registers (once) what zero does at exit for torch's group: see :func:`_at_exit`.
    ``own``: zero created the group, and destroys it."""
    _EXIT["own"] = _EXIT["own"] or own
    _EXIT["gloo"] = _EXIT["gloo"] or (dist.is_initialized() and dist.get_backend() == "gloo")
    if not _EXIT["registered"]:
        _EXIT["registered"] = True
        atexit.register(_at_exit)


def _at_exit() -> None:
    """Before the interpreter's teardown: waits :data:`GLOO_RELEASE_S` for gloo's worker
    threads, then destroys the group if zero created it.

    torch 2.11's gloo workers release a finished collective's tensors just after the
    caller has seen it complete, and they never stop (``destroy_process_group`` does not
    join them). A worker that releases one after the teardown began cannot take the GIL,
    and the process aborts with "terminate called without an active exception". A plain
    torch script that trains and all-reduces just before it ends does this in about 1
    exit of 8, with or without DeepSpeed; the wait ended it in 60 runs of 60."""
    if not dist.is_available():
        return
    try:
        if _EXIT["gloo"]:
            time.sleep(GLOO_RELEASE_S)
        if _EXIT["own"] and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # already torn down by the script
        pass


def _launch_device() -> torch.device:
    """The device DeepSpeed's accelerator would pick before any model exists."""
    wanted = os.environ.get("DS_ACCELERATOR", "").strip().lower()
    if wanted == "cpu" or (wanted != "cuda" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", _local_cuda_index())


def _local_cuda_index() -> int:
    count = torch.cuda.device_count()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    return 0 if count <= 1 else local


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_default_group(device: torch.device, timeout: Optional[datetime.timedelta] = None) -> None:
    """Creates torch's default group for a model on ``device`` unless one exists (what
    ``deepspeed.initialize`` does)."""
    if dist.is_initialized():
        _leave_cleanly(own=False)
        return
    init_distributed(dist_backend=backend_for(device), timeout=timeout)


def world_size() -> int:
    """The default group's size (1 without one)."""
    return dist.get_world_size() if dist.is_initialized() else 1


_HOST_GROUP: List[Any] = []
"""The gloo group :func:`host_group` made (at most one; empty before)."""


def host_group() -> Any:
    """The group zero's host-side collectives (CPU tensors, pickled objects) use: ``None``
    (torch's default group) where its backend is gloo; otherwise a gloo group over every
    rank, made on first use (a collective: every rank calls this at the same point)."""
    if dist.get_backend() == "gloo":
        return None
    if not _HOST_GROUP:
        _HOST_GROUP.append(new_gloo_group(list(range(dist.get_world_size())), default_timeout()))
    return _HOST_GROUP[0]


def new_gloo_group(ranks: List[int], timeout: datetime.timedelta, local: bool = False) -> Any:
    """A gloo group over ``ranks`` (``local``: made by those ranks only,
    ``use_local_synchronization``); the process then waits for gloo's workers at exit
    (:func:`_at_exit`), whatever the default group's backend."""
    _EXIT["gloo"] = True
    _leave_cleanly(own=False)
    return dist.new_group(ranks=ranks, backend="gloo", timeout=timeout, use_local_synchronization=local)


IdExchange = Callable[[Optional[bytes], float], bytes]
"""``exchange(id, timeout_s)``: rank 0 passes its id (bytes), the others ``None``; every
rank gets rank 0's id back, or an exception within ``timeout_s`` seconds."""

_EXCHANGES = [0]
"""How many engines :func:`id_exchange` has served in this process (each gets its own key)."""


def id_exchange(scope: Optional[str] = None) -> Optional[IdExchange]:
    """How this engine's ranks hand each other rank 0's id (the shared-memory group's
    nonce, NCCL's unique id): through torch's store, the one torch's default group was
    made with, so zero opens no port of its own beside torch's (``torch.distributed``
    users meet one rendezvous, the launcher's). ``None`` in a world of one or without
    torch's group: then zero's own rendezvous runs, on the port the launcher's variables
    imply (``MASTER_PORT + 1`` under torchrun). No collective: every rank calls this once
    per engine, in the same order (the key counts engines); rank 0 sets the key, the others
    wait for it until the timeout, so a rank 0 that never comes is an error naming the key.

    ``scope`` (``"machine/M"``: ranks on several machines, :mod:`._gloo_tier`) gives each
    machine's shared-memory group its own key; its first rank is the group's rank 0."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    _EXCHANGES[0] += 1
    key = f"zero_torch/engine/{_EXCHANGES[0]}/" + (f"{scope}/" if scope else "") + "id"
    store = dist.distributed_c10d._get_default_store()

    def exchange(id: Optional[bytes], timeout_s: float) -> bytes:
        if id is not None:
            store.set(key, id)
            return id
        try:
            store.wait([key], datetime.timedelta(seconds=timeout_s))
        except Exception as e:  # torch's DistStoreError (a timeout), or the store gone
            raise CommError(f"rank 0 did not publish {key!r} in torch's store within {timeout_s:.0f} s "
                            f"(is rank 0 alive, and building the same engine?): {e}") from e
        return store.get(key)

    return exchange


def broadcast_text(text: str) -> str:
    """Rank 0's ``text`` on every rank (itself in a world of one)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return text
    box: List[str] = [text]
    dist.broadcast_object_list(box, src=0, group=host_group())
    return box[0]


def broadcast_model(module: torch.nn.Module) -> None:
    """Rank 0's parameters and buffers on every rank (DeepSpeed broadcasts parameters
    only; zero also broadcasts buffers, so a script that seeds per rank starts every rank
    from the same model). One collective per dtype and device: the tensors are flattened
    into one buffer each."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    # zero.Init's placeholders hold no values: their fill is the same on every rank.
    tensors = [p.data for p in module.parameters() if getattr(p, "_zero_lazy", None) is None]
    tensors += [b for b in module.buffers()]
    broadcast_tensors(tensors, 0)


def failed_ranks(failed: bool) -> List[int]:
    """Every rank's answer to "did this block fail here?" (a collective: every rank calls
    it), so that a failure on one rank stops the others' next collective instead of
    leaving them waiting in it. Only this rank's answer in a world of one."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [dist.get_rank() if dist.is_initialized() else 0] if failed else []
    flags = torch.zeros(dist.get_world_size(), dtype=torch.int32)
    flags[dist.get_rank()] = int(failed)
    dist.all_reduce(flags, group=host_group())
    return [r for r, f in enumerate(flags.tolist()) if f]


def broadcast_tensors(tensors: List[torch.Tensor], src: int) -> None:
    """Rank ``src``'s values of ``tensors`` (the same list, in the same order, on every
    rank) written into them on every rank; nothing in a world of one. One collective per
    dtype and device, over :func:`host_group`: the tensors are flattened into one host
    buffer each (a CUDA tensor crosses to the host and back)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    seen = set()
    groups: dict = {}
    for t in tensors:
        if id(t) in seen or t.numel() == 0:
            continue
        seen.add(id(t))
        groups.setdefault((t.dtype, t.device), []).append(t)
    group = host_group()
    for (dtype, device), ts in groups.items():
        flat = torch.cat([t.detach().reshape(-1).cpu() for t in ts])
        as_bytes = flat.view(torch.uint8) if dtype.is_floating_point or dtype == torch.bool else flat
        dist.broadcast(as_bytes, src=src, group=group)
        at = 0
        with torch.no_grad():
            for t in ts:
                n = t.numel()
                t.copy_(flat[at:at + n].view(t.shape))
                at += n
