"""What ``test_gloo_tier.py`` runs on each of 3 gloo ranks: ``GlooRelay``'s byte moves on
the world and on a subgroup ranked against torch's order, each rank's results beside what
they must be."""

from __future__ import annotations

import datetime
from typing import Any, Dict, List

import torch
import torch.distributed as dist


def _values(g: int, at: List[int], dtype: torch.dtype) -> torch.Tensor:
    """Global rank ``g``'s values at positions ``at`` (distinct per rank and position)."""
    return torch.tensor([g * 1000.0 + i + 0.25 for i in at], dtype=torch.float32).to(dtype)


def _count(src: int, dst: int) -> int:
    """Elements group rank ``src`` sends group rank ``dst`` in the all-to-all (0 included)."""
    return (src + 2 * dst) % 3


def relay_moves() -> Dict[str, Any]:
    from zero_torch._gloo_tier import GlooRelay

    dist.init_process_group("gloo")
    me_global = dist.get_rank()
    world = GlooRelay(None, list(range(dist.get_world_size())), datetime.timedelta(seconds=60))
    out: Dict[str, Any] = {}
    # Group rank i of "against torch" is global rank [2, 0, 1][i]: torch ranks it 0, 1, 2.
    for name, relay in [("world", world), ("against torch", world.subgroup([2, 0, 1]))]:
        me, n, ranks = relay.rank, relay.world_size, relay.ranks
        assert ranks[me] == me_global
        for dtype in (torch.float32, torch.bfloat16):
            got: Dict[str, Any] = {}
            want: Dict[str, Any] = {}
            got["exchange"] = relay.exchange(bytes([me_global]) * 5)
            want["exchange"] = [bytes([g]) * 5 for g in ranks]
            send_counts = [_count(me, j) for j in range(n)]
            recv_counts = [_count(j, me) for j in range(n)]
            send = torch.cat([_values(me_global, [100 * j + k for k in range(c)], dtype)
                              for j, c in enumerate(send_counts)])
            recv = torch.full((sum(recv_counts),), -7.0, dtype=dtype)
            relay.all_to_all(send, send_counts, recv, recv_counts)
            got["all_to_all"] = recv.float().tolist()
            want["all_to_all"] = torch.cat([_values(ranks[j], [100 * me + k for k in range(c)], dtype)
                                            for j, c in enumerate(recv_counts)]).float().tolist()
            counts = [3, 0, 2]
            recv = torch.full((sum(counts),), -7.0, dtype=dtype)
            relay.all_gather(_values(me_global, list(range(counts[me])), dtype), recv, counts)
            got["all_gather uneven"] = recv.float().tolist()
            want["all_gather uneven"] = torch.cat([_values(ranks[j], list(range(c)), dtype)
                                                   for j, c in enumerate(counts)]).float().tolist()
            recv = torch.full((2 * n,), -7.0, dtype=dtype)
            relay.all_gather(_values(me_global, [0, 1], dtype), recv, [2] * n)
            got["all_gather"] = recv.float().tolist()
            want["all_gather"] = torch.cat([_values(g, [0, 1], dtype) for g in ranks]).float().tolist()
            buf = _values(me_global, list(range(4)), dtype)
            relay.broadcast(buf, 1)
            got["broadcast"] = buf.float().tolist()
            want["broadcast"] = _values(ranks[1], list(range(4)), dtype).float().tolist()
            relay.barrier()
            out[f"{name}, {dtype}"] = {"got": got, "want": want}
    dist.destroy_process_group()
    return out
