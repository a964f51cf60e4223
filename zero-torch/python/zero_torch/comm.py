"""``zero_torch.comm``: DeepSpeed's ``deepspeed.comm``, delegated to ``torch.distributed``.

Every function has DeepSpeed 0.19.8's signature (``deepspeed/comm/comm.py``), including
its profiling keywords (``prof``, ``log_name``, ``debug``), and calls the same
``torch.distributed`` function DeepSpeed's torch backend calls. The group is torch's
default group, created by :func:`init_distributed` (or by ``deepspeed.initialize``).

Differences from DeepSpeed 0.19.8, stated plainly:

- "initialized" means torch's default group exists, however it was created (DeepSpeed also
  wants its own backend object, made by ``init_distributed`` or ``initialize``);
- functions that need the group raise :class:`~zero_torch.errors.DistNotInitializedError`
  (an ``AssertionError``, as DeepSpeed's ``assert``) before it exists;
- ``get_global_rank(None, r)`` and ``get_all_ranks_from_group(None)`` mean the default
  group (DeepSpeed hands ``None`` to torch, which refuses it, so they return an error and
  ``[]``), and ``get_all_ranks_from_group`` returns the group's ranks for any group;
- the communication logger (``comms_logger`` in the config, ``configure(enabled=True)``)
  is not provided: enabling it raises :class:`~zero_torch.errors.UnsupportedError`;
  ``log_summary`` and the other logger queries answer for a logger that recorded nothing;
- tensors are not staged through the host for backends that cannot reach the device
  (DeepSpeed's ``stage_on_cpu``), and DeepSpeed's shared-memory all-reduce op is not used.
"""

from __future__ import annotations

import datetime
import os
from enum import Enum
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as _td

from ._dist import init_distributed
from .errors import DistNotInitializedError, UnsupportedError


class ReduceOp(Enum):
    """DeepSpeed's reduction operators (``deepspeed.comm.ReduceOp``); torch's
    ``torch.distributed.ReduceOp`` is accepted wherever these are."""

    SUM = 0
    PRODUCT = 1
    MIN = 2
    MAX = 3
    BAND = 4
    BOR = 5
    BXOR = 6
    AVG = 7
    UNUSED = 8


_TORCH_OPS = {
    ReduceOp.SUM: "SUM",
    ReduceOp.PRODUCT: "PRODUCT",
    ReduceOp.MIN: "MIN",
    ReduceOp.MAX: "MAX",
    ReduceOp.BAND: "BAND",
    ReduceOp.BOR: "BOR",
    ReduceOp.BXOR: "BXOR",
    ReduceOp.AVG: "AVG",
}


def _torch_op(op: Any) -> Any:
    """torch's operator for DeepSpeed's ``op`` (torch's own operators pass through)."""
    if isinstance(op, ReduceOp):
        if op not in _TORCH_OPS:
            raise ValueError(f"{op} is not a reduction")
        return getattr(_td.ReduceOp, _TORCH_OPS[op])
    return op


def _require_group() -> None:
    if not is_initialized():
        raise DistNotInitializedError(
            "DeepSpeed backend not set, please initialize it using init_process_group(): "
            "torch.distributed's default group does not exist yet (call "
            "deepspeed.init_distributed() or deepspeed.initialize() first)"
        )


# ---- state -------------------------------------------------------------------------


def is_initialized() -> bool:
    """Whether torch's default process group exists."""
    return _td.is_available() and _td.is_initialized()


def is_available() -> bool:
    """True: the package is available (as DeepSpeed answers)."""
    return True


def get_world_size(group: Optional[Any] = None) -> int:
    """The number of ranks in ``group`` (the default group when ``None``)."""
    _require_group()
    return _td.get_world_size(group=group)


def get_rank(group: Optional[Any] = None) -> int:
    """This process's rank in ``group`` (the default group when ``None``)."""
    _require_group()
    return _td.get_rank(group=group)


def get_local_rank() -> int:
    """The rank on this node: ``LOCAL_RANK``, else ``OMPI_COMM_WORLD_LOCAL_RANK``, else 0."""
    _require_group()
    local = os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", 0))
    return int(local)


def get_global_rank(group: Optional[Any] = None, group_rank: int = 0) -> int:
    """The global rank of ``group``'s rank ``group_rank`` (``None``: the default group)."""
    _require_group()
    return _td.get_global_rank(_td.group.WORLD if group is None else group, group_rank)


def get_all_ranks_from_group(group: Optional[Any] = None) -> List[int]:
    """The global ranks of ``group`` (``None``: the default group), in group order."""
    _require_group()
    return list(_td.get_process_group_ranks(_td.group.WORLD if group is None else group))


def get_world_group() -> Any:
    """torch's default group (``torch.distributed.group.WORLD``)."""
    _require_group()
    return _td.group.WORLD


def new_group(ranks: List[int]) -> Any:
    """``torch.distributed.new_group(ranks)`` (a collective: every rank calls it)."""
    _require_group()
    return _td.new_group(ranks)


def destroy_process_group(group: Optional[Any] = None) -> None:
    """``torch.distributed.destroy_process_group(group)``."""
    _require_group()
    return _td.destroy_process_group(group=group)


# ---- collectives -------------------------------------------------------------------


def broadcast(tensor: torch.Tensor, src: int, group: Any = None, async_op: bool = False, prof: bool = False,
              log_name: str = "broadcast", debug: Any = None) -> Any:
    """``torch.distributed.broadcast``."""
    _require_group()
    return _td.broadcast(tensor=tensor, src=src, group=group, async_op=async_op)


def broadcast_object_list(object_list: List[Any], src: int, group: Any = None, device: Any = None,
                          prof: bool = False, log_name: str = "broadcast_object_list", debug: Any = None) -> Any:
    """``torch.distributed.broadcast_object_list``."""
    _require_group()
    return _td.broadcast_object_list(object_list=object_list, src=src, group=group, device=device)


def all_reduce(tensor: torch.Tensor, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False,
               prof: bool = False, log_name: str = "all_reduce", debug: Any = None) -> Any:
    """``torch.distributed.all_reduce``."""
    _require_group()
    return _td.all_reduce(tensor, op=_torch_op(op), group=group, async_op=async_op)


def inference_all_reduce(tensor: torch.Tensor, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False,
                         prof: bool = False, log_name: str = "all_reduce", debug: Any = None) -> Any:
    """A synchronous all-reduce (``tensor`` itself in a world of one), as DeepSpeed's
    without its shared-memory kernel."""
    _require_group()
    if _td.get_world_size(group=group) <= 1:
        return tensor
    return _td.all_reduce(tensor, op=_torch_op(op), group=group, async_op=False)


def all_reduce_coalesced(tensors: List[torch.Tensor], op: Any = ReduceOp.SUM, group: Any = None,
                         async_op: bool = False, prof: bool = False, log_name: str = "all_reduce",
                         debug: Any = None) -> Any:
    """``torch.distributed.all_reduce_coalesced``."""
    _require_group()
    return _td.all_reduce_coalesced(tensors, op=_torch_op(op), group=group, async_op=async_op)


def reduce(tensor: torch.Tensor, dst: int, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False,
           prof: bool = False, log_name: str = "reduce", debug: Any = None) -> Any:
    """``torch.distributed.reduce``."""
    _require_group()
    return _td.reduce(tensor, dst=dst, op=_torch_op(op), group=group, async_op=async_op)


def all_gather(tensor_list: List[torch.Tensor], tensor: torch.Tensor, group: Any = None, async_op: bool = False,
               prof: bool = False, log_name: str = "all_gather", debug: Any = None) -> Any:
    """``torch.distributed.all_gather``."""
    _require_group()
    return _td.all_gather(tensor_list, tensor, group=group, async_op=async_op)


def all_gather_object(object_list: List[Any], obj: Any, group: Any = None, prof: bool = False,
                      log_name: str = "all_gather_object", debug: Any = None) -> Any:
    """``torch.distributed.all_gather_object``."""
    _require_group()
    return _td.all_gather_object(object_list, obj, group=group)


def all_gather_into_tensor(output_tensor: torch.Tensor, tensor: torch.Tensor, group: Any = None,
                           async_op: bool = False, prof: bool = False, log_name: str = "all_gather_into_tensor",
                           debug: Any = None) -> Any:
    """``torch.distributed.all_gather_into_tensor``."""
    _require_group()
    return _td.all_gather_into_tensor(output_tensor, tensor, group=group, async_op=async_op)


def allgather_fn(output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any = None, async_op: bool = False,
                 debug: Any = None) -> Any:
    """:func:`all_gather_into_tensor` (DeepSpeed's helper)."""
    _require_group()
    return all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


def all_gather_coalesced(output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor], group: Any = None,
                         async_op: bool = False) -> Any:
    """One :func:`all_gather_into_tensor` per pair; with ``async_op``, a handle whose
    ``wait()`` waits for all of them."""
    _require_group()
    if len(output_tensors) != len(input_tensors):
        raise ValueError("all_gather_coalesced needs as many outputs as inputs")
    works = [
        _td.all_gather_into_tensor(out, inp, group=group, async_op=async_op)
        for out, inp in zip(output_tensors, input_tensors)
    ]
    return _Works(works) if async_op else None


class _Works:
    """Several requests waited for as one."""

    def __init__(self, works: List[Any]) -> None:
        self.works = [w for w in works if w is not None]

    def wait(self) -> bool:
        """Waits for every request."""
        for w in self.works:
            w.wait()
        return True

    def is_completed(self) -> bool:
        """Whether every request has completed."""
        return all(w.is_completed() for w in self.works)


def reduce_scatter(output: torch.Tensor, input_list: List[torch.Tensor], op: Any = ReduceOp.SUM, group: Any = None,
                   async_op: bool = False, prof: bool = False, log_name: str = "reduce_scatter",
                   debug: Any = None) -> Any:
    """``torch.distributed.reduce_scatter``."""
    _require_group()
    return _td.reduce_scatter(output, input_list, op=_torch_op(op), group=group, async_op=async_op)


def reduce_scatter_tensor(output_tensor: torch.Tensor, tensor: torch.Tensor, op: Any = ReduceOp.SUM,
                          group: Any = None, async_op: bool = False, prof: bool = False,
                          log_name: str = "reduce_scatter_tensor", debug: Any = None) -> Any:
    """``torch.distributed.reduce_scatter_tensor``."""
    _require_group()
    return _td.reduce_scatter_tensor(output_tensor, tensor, op=_torch_op(op), group=group, async_op=async_op)


def reduce_scatter_fn(output_tensor: torch.Tensor, tensor: torch.Tensor, op: Any = ReduceOp.SUM, group: Any = None,
                      async_op: bool = False, prof: bool = False, debug: Any = None) -> Any:
    """:func:`reduce_scatter_tensor` (DeepSpeed's helper)."""
    _require_group()
    return reduce_scatter_tensor(output_tensor, tensor, op=op, group=group, async_op=async_op)


def all_to_all_single(output: torch.Tensor, tensor: torch.Tensor, output_split_sizes: Optional[List[int]] = None,
                      input_split_sizes: Optional[List[int]] = None, group: Any = None, async_op: bool = False,
                      prof: bool = False, log_name: str = "all_to_all_single", debug: Any = None) -> Any:
    """``torch.distributed.all_to_all_single``."""
    _require_group()
    return _td.all_to_all_single(output, tensor, output_split_sizes=output_split_sizes,
                                 input_split_sizes=input_split_sizes, group=group, async_op=async_op)


def all_to_all(output_tensor_list: List[torch.Tensor], input_tensor_list: List[torch.Tensor], group: Any = None,
               async_op: bool = False, prof: bool = False, log_name: str = "all_to_all", debug: Any = None) -> Any:
    """``torch.distributed.all_to_all``."""
    _require_group()
    return _td.all_to_all(output_tensor_list, input_tensor_list, group=group, async_op=async_op)


def gather(tensor: torch.Tensor, gather_list: Optional[List[torch.Tensor]] = None, dst: int = 0, group: Any = None,
           async_op: bool = False, prof: bool = False, log_name: str = "gather", debug: Any = None) -> Any:
    """``torch.distributed.gather``."""
    _require_group()
    return _td.gather(tensor, gather_list=gather_list, dst=dst, group=group, async_op=async_op)


def scatter(tensor: torch.Tensor, scatter_list: Optional[List[torch.Tensor]] = None, src: int = 0, group: Any = None,
            async_op: bool = False, prof: bool = False, log_name: str = "scatter", debug: Any = None) -> Any:
    """``torch.distributed.scatter``."""
    _require_group()
    return _td.scatter(tensor, scatter_list=scatter_list, src=src, group=group, async_op=async_op)


def barrier(group: Any = None, async_op: bool = False, device_ids: Optional[List[int]] = None, prof: bool = False,
            log_name: str = "barrier", debug: Any = None) -> Any:
    """``torch.distributed.barrier`` (on the default group when ``group`` is ``None``)."""
    _require_group()
    return _td.barrier(group=_td.group.WORLD if group is None else group, async_op=async_op, device_ids=device_ids)


def monitored_barrier(group: Any = None, timeout: Optional[datetime.timedelta] = None, wait_all_ranks: bool = False,
                      prof: bool = False, log_name: str = "monitored_barrier", debug: Any = None) -> Any:
    """``torch.distributed.monitored_barrier`` (gloo only, as in torch)."""
    _require_group()
    return _td.monitored_barrier(group=_td.group.WORLD if group is None else group, timeout=timeout,
                                 wait_all_ranks=wait_all_ranks)


# ---- point to point ----------------------------------------------------------------


def send(tensor: torch.Tensor, dst: int, group: Any = None, tag: int = 0, prof: bool = False,
         log_name: str = "send", debug: Any = None) -> Any:
    """``torch.distributed.send``."""
    _require_group()
    return _td.send(tensor, dst=dst, group=group, tag=tag)


def recv(tensor: torch.Tensor, src: Optional[int] = None, group: Any = None, tag: int = 0, prof: bool = False,
         log_name: str = "recv", debug: Any = None) -> Any:
    """``torch.distributed.recv``."""
    _require_group()
    return _td.recv(tensor, src=src, group=group, tag=tag)


def isend(tensor: torch.Tensor, dst: int, group: Any = None, tag: int = 0, prof: bool = False,
          log_name: str = "isend", debug: Any = None) -> Any:
    """``torch.distributed.isend`` (returns the request)."""
    _require_group()
    return _td.isend(tensor, dst=dst, group=group, tag=tag)


def irecv(tensor: torch.Tensor, src: Optional[int] = None, group: Any = None, tag: int = 0, prof: bool = False,
          log_name: str = "irecv", debug: Any = None) -> Any:
    """``torch.distributed.irecv`` (returns the request)."""
    _require_group()
    return _td.irecv(tensor, src=src, group=group, tag=tag)


class P2POp:
    """A point-to-point operation for :func:`batch_isend_irecv`: ``op`` is :func:`isend`
    or :func:`irecv`, ``peer`` the other global rank."""

    def __init__(self, op: Any, tensor: torch.Tensor, peer: int, group: Any = None, tag: int = 0) -> None:
        if op not in (isend, irecv):
            raise AssertionError("op must be deepspeed.comm.isend or deepspeed.comm.irecv")
        self.op = "isend" if op is isend else "irecv"
        self.tensor = tensor
        self.peer = peer
        self.group = group
        self.tag = tag


def batch_isend_irecv(p2p_op_list: List[P2POp], prof: bool = False, log_name: str = "batch_isend_irecv",
                      debug: Any = None) -> Any:
    """``torch.distributed.batch_isend_irecv`` of the ops (returns the requests)."""
    _require_group()
    ops = [_td.P2POp(getattr(_td, o.op), o.tensor, o.peer, o.group, o.tag) for o in p2p_op_list]
    return _td.batch_isend_irecv(ops)


# ---- what the torch backend has ----------------------------------------------------


def has_all_gather_into_tensor() -> bool:
    """True (torch has ``all_gather_into_tensor``)."""
    _require_group()
    return hasattr(_td, "all_gather_into_tensor")


def has_reduce_scatter_tensor() -> bool:
    """True (torch has ``reduce_scatter_tensor``)."""
    _require_group()
    return hasattr(_td, "reduce_scatter_tensor")


def has_all_reduce_coalesced() -> bool:
    """Whether torch has ``all_reduce_coalesced``."""
    _require_group()
    return hasattr(_td, "all_reduce_coalesced")


def has_coalescing_manager() -> bool:
    """Whether torch has its coalescing manager."""
    _require_group()
    return hasattr(_td, "_coalescing_manager")


# ---- the communication logger: not provided -------------------------------------


def _logger_enabled(deepspeed_config: Any) -> bool:
    if deepspeed_config is None:
        return False
    params = getattr(deepspeed_config, "_param_dict", deepspeed_config)
    if not isinstance(params, dict):
        comms = getattr(deepspeed_config, "comms_config", None)
        return bool(getattr(comms, "comms_logger_enabled", False))
    section = params.get("comms_logger") or {}
    return bool(section.get("enabled", False)) if isinstance(section, dict) else False


def configure(deepspeed_config: Any = None, enabled: Optional[bool] = None, prof_all: Optional[bool] = None,
              prof_ops: Optional[List[str]] = None, verbose: Optional[bool] = None,
              debug: Optional[bool] = None) -> None:
    """DeepSpeed's communication-logger switches. zero does not provide that logger: with
    it disabled (the default) the call changes nothing; enabling it (``enabled=True`` or a
    config whose ``comms_logger.enabled`` is true) raises."""
    if enabled or _logger_enabled(deepspeed_config):
        raise UnsupportedError(
            "DeepSpeed's communication logger (comms_logger) is not provided: leave it disabled; "
            "engine.comm_report() gives zero's traffic, or use torch.profiler"
        )


def log_summary(show_straggler: bool = False, return_dict: bool = False) -> Optional[Dict[str, Any]]:
    """The logger's summary: nothing was recorded (the logger is never enabled). Like
    DeepSpeed's, a barrier on every rank when the group exists; with ``return_dict``, the
    summary's dictionary with no operations."""
    if is_initialized():
        barrier()
    if not return_dict:
        return None
    return {
        "summary": {},
        "straggler_analysis": {} if show_straggler else None,
        "metadata": {
            "world_size": get_world_size() if is_initialized() else 1,
            "rank": get_rank() if is_initialized() else 0,
            "timestamp": datetime.datetime.now().isoformat(),
        },
    }


def reset_log() -> None:
    """Nothing recorded, nothing to clear."""
    return None


def has_comm_data() -> bool:
    """False: the logger recorded nothing."""
    return False


def get_comm_operation_count() -> int:
    """0: the logger recorded nothing."""
    return 0


def get_logged_comm_ops() -> List[str]:
    """``[]``: the logger recorded nothing."""
    return []


__all__ = [
    "ReduceOp",
    "init_distributed",
    "is_initialized",
    "is_available",
    "get_world_size",
    "get_rank",
    "get_local_rank",
    "get_global_rank",
    "get_all_ranks_from_group",
    "get_world_group",
    "new_group",
    "destroy_process_group",
    "broadcast",
    "broadcast_object_list",
    "all_reduce",
    "inference_all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "all_gather",
    "all_gather_object",
    "all_gather_into_tensor",
    "allgather_fn",
    "all_gather_coalesced",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_fn",
    "all_to_all_single",
    "all_to_all",
    "gather",
    "scatter",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    "isend",
    "irecv",
    "P2POp",
    "batch_isend_irecv",
    "has_all_gather_into_tensor",
    "has_reduce_scatter_tensor",
    "has_all_reduce_coalesced",
    "has_coalescing_manager",
    "configure",
    "log_summary",
    "reset_log",
    "has_comm_data",
    "get_comm_operation_count",
    "get_logged_comm_ops",
]
