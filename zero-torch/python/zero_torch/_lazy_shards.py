"""Values written into ``zero.Init`` placeholders before ``initialize``, kept as one shard
per rank.

transformers loads a model under ZeRO-3 by writing each module's weights on rank 0 inside
``GatheredParameters(params, modifier_rank=0)``, before any engine exists. For a model
built without its parameters (the placeholders of :mod:`._placeholder`), the block
materializes only its own parameters; on exit rank ``r``'s values are *scattered*: each
rank keeps ``ceil(numel / world)`` elements of every parameter (its *shard*) and the
parameter is a placeholder again. So no rank ever holds more than the block's parameters
whole plus ``1/world`` of the rest, and the bytes crossing are the model's once. When the
engine is built it gathers one parameter at a time from the shards (every rank asks in the
same order: the collectives line up) and keeps the ranges it owns.

These shards are not the engine's partitions (ARCHITECTURE.md, "Words"): the engine's
partitions cut buckets whose layout follows the first forward's order and the bucket
sizes, and no engine exists yet when transformers writes the weights, so each parameter is
split alone here and read back by the engine's build parameter by parameter.

All collectives run on the CPU, over zero's host group (``_dist.host_group``: torch's
default group where it is gloo, else a gloo group over the same ranks), as bytes: one per
dtype per block."""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch
import torch.distributed as dist

from . import _dist, _placeholder


def _world() -> Tuple[int, int]:
    """(rank, world size) of torch's default group; (0, 1) without one."""
    if not dist.is_initialized():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def _chunk(n: int, world: int) -> int:
    """Elements of one rank's shard of an ``n``-element parameter."""
    return -(-n // world)


def _unique(params: List[torch.nn.Parameter]) -> List[torch.nn.Parameter]:
    seen: set = set()
    out = []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def _by_dtype(params: List[torch.nn.Parameter]) -> Dict[torch.dtype, List[torch.nn.Parameter]]:
    groups: Dict[torch.dtype, List[torch.nn.Parameter]] = {}
    for p in params:
        groups.setdefault(p.dtype, []).append(p)
    return groups


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype.is_floating_point or t.dtype == torch.bool else t


def gather(params: List[torch.nn.Parameter]) -> List[torch.Tensor]:
    """The whole values of written placeholders ``params`` (each has a shard), gathered
    from every rank's shard (a collective: every rank passes the same list)."""
    params = list(params)
    out: Dict[int, torch.Tensor] = {}
    _, world = _world()
    for ps in _by_dtype(_unique(params)).values():
        mine = torch.cat([_shard(p).reshape(-1) for p in ps])
        if world == 1:
            parts = [mine]
        else:
            parts = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather([_bytes(t) for t in parts], _bytes(mine), group=_dist.host_group())
        at = 0
        for p in ps:
            c = _chunk(p.numel(), world)
            flat = torch.cat([part[at:at + c] for part in parts])
            out[id(p)] = flat[: p.numel()].view(p.shape)
            at += c
    return [out[id(p)] for p in params]


def _shard(p: torch.nn.Parameter) -> torch.Tensor:
    shard = _placeholder.shard_of(p)
    assert shard is not None, "gather() takes written placeholders only"
    return shard


def materialize(params: List[torch.nn.Parameter]) -> None:
    """Points every placeholder in ``params`` at a whole tensor: its values gathered from
    the shards where it was written before, else NaN poison (what nothing writes stays
    detectable). A collective when any has shards."""
    params = _unique(params)
    written = [p for p in params if _placeholder.shard_of(p) is not None]
    values = dict(zip(map(id, written), gather(written))) if written else {}
    for p in params:
        if id(p) in values:
            p.data = values[id(p)]
        else:
            p.data = torch.full(tuple(p.shape), float("nan") if p.is_floating_point() else 0, dtype=p.dtype)


def keep_shards(params: List[torch.nn.Parameter], src: int) -> None:
    """Rank ``src``'s values of the materialized ``params``, scattered: each rank keeps
    its shard of each (a collective), and each is a placeholder again."""
    params = _unique(params)
    rank, world = _world()
    for ps in _by_dtype(params).values():
        chunks = [_chunk(p.numel(), world) for p in ps]
        if world == 1:
            mine = torch.cat([p.data.detach().reshape(-1) for p in ps]).clone()
        else:
            mine = torch.empty(sum(chunks), dtype=ps[0].dtype)
            pieces = None
            if rank == src:
                padded = [torch.cat([p.data.detach().reshape(-1), p.data.new_zeros(c * world - p.numel())])
                          for p, c in zip(ps, chunks)]
                pieces = [_bytes(torch.cat([f[r * c:(r + 1) * c] for f, c in zip(padded, chunks)]))
                          for r in range(world)]
            dist.scatter(_bytes(mine), pieces, src=src, group=_dist.host_group())
        at = 0
        for p, c in zip(ps, chunks):
            p._zero_shard = mine[at:at + c]  # type: ignore[attr-defined]
            at += c
    release(params)


def release(params: List[torch.nn.Parameter]) -> None:
    """Every parameter in ``params`` a placeholder again (its shard, if any, kept)."""
    for p in _unique(params):
        _placeholder.retype(p, p.dtype)
