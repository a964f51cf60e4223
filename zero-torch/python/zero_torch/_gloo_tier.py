"""The CPU inter-node tier (docs/GLOO_TIER.md): ranks on several machines train on the CPU
with zero's shared-memory group inside each machine and torch's gloo group between them.

gloo only moves bytes here: :class:`GlooRelay` is what zero_comm's ``RelayComm`` calls
(through the native ``PyRelay``) to run an all-to-all, an all-gather, a broadcast, a
barrier or a small exchange on DLPack views of the engine's buffers, and zero reduces in
its own fixed order, so a run whose machines talk over gloo gives the bits of the same
run on one machine.

:func:`cpu_tier` decides, once per engine and on every rank alike, whether the ranks span
machines: every rank's machine (its boot id and network namespace, which decide whether
it can map another rank's shared memory; its host name for messages) is all-gathered over
torch's group. ``ZERO_CPU_INTER_NODE=gloo`` takes the launcher's nodes as the machines
instead, so a launch of two ``torchrun`` agents on one box runs this tier too (the tests
compare it with the shared-memory runs bit for bit).
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch
import torch.distributed as dist

from . import _dist, _native
from .errors import CommError

INTER_NODE_VARIABLE = "ZERO_CPU_INTER_NODE"
"""``gloo``: every launcher node is a machine of its own (see the module docs)."""


def _bytes(capsule: Any) -> Tuple[torch.Tensor, int]:
    """The engine buffer a capsule views, as bytes (no copy; a capsule is read once), and
    the size of its elements."""
    t = torch.from_dlpack(capsule)
    return t.view(torch.uint8), t.element_size()


class GlooRelay:
    """One rank's byte transport over a gloo group (``ranks``: the members' global ranks, in
    this group's rank order). Counts are in elements of the buffers' dtype, one per rank.
    torch ranks a group's members by global rank; where this group's order differs, the
    pieces are put in this group's order here."""

    def __init__(self, group: Any, ranks: List[int], timeout: datetime.timedelta) -> None:
        self.group = group
        self.ranks = list(ranks)
        self.timeout = timeout
        self.rank = self.ranks.index(dist.get_rank())
        self.world_size = len(self.ranks)
        ordered = sorted(self.ranks)
        self._torch_pos = [ordered.index(g) for g in self.ranks]
        """Where each of this group's ranks sits in torch's order."""
        self._in_order = self._torch_pos == list(range(self.world_size))

    def _ours(self, pieces: List[Any]) -> List[Any]:
        """Pieces in torch's order, in this group's."""
        return pieces if self._in_order else [pieces[p] for p in self._torch_pos]

    def _torchs(self, pieces: List[Any]) -> List[Any]:
        """Pieces in this group's order, in torch's."""
        if self._in_order:
            return pieces
        out: List[Any] = [None] * self.world_size
        for i, p in enumerate(self._torch_pos):
            out[p] = pieces[i]
        return out

    def exchange(self, mine: bytes) -> List[bytes]:
        """Every rank's ``mine`` (equal lengths), in rank order."""
        n = len(mine)
        t = torch.tensor(list(mine), dtype=torch.uint8)
        out = torch.empty(n * self.world_size, dtype=torch.uint8)
        dist.all_gather_into_tensor(out, t, group=self.group)
        return self._ours([bytes(out[i * n:(i + 1) * n].tolist()) for i in range(self.world_size)])

    def all_to_all(self, send: Any, send_counts: List[int], recv: Any, recv_counts: List[int]) -> None:
        """Piece ``j`` of ``send`` to rank ``j``; rank ``j``'s piece for this rank into piece
        ``j`` of ``recv``."""
        (s, size), (r, _) = _bytes(send), _bytes(recv)
        s_sizes = [c * size for c in send_counts]
        r_sizes = [c * size for c in recv_counts]
        if self._in_order:
            dist.all_to_all_single(r, s, output_split_sizes=r_sizes, input_split_sizes=s_sizes, group=self.group)
            return
        s_pieces = self._torchs(list(torch.split(s, s_sizes)))
        r_tmp = torch.empty_like(r)
        torch_r_sizes = self._torchs(r_sizes)
        dist.all_to_all_single(r_tmp, torch.cat(s_pieces), output_split_sizes=torch_r_sizes,
                               input_split_sizes=self._torchs(s_sizes), group=self.group)
        torch.cat(self._ours(list(torch.split(r_tmp, torch_r_sizes))), out=r)

    def all_gather(self, send: Any, recv: Any, counts: List[int]) -> None:
        """Piece ``j`` of ``recv`` (split by ``counts``) becomes rank ``j``'s ``send``. gloo
        gathers equal sizes only: uneven pieces are padded to the longest."""
        (s, size), (r, _) = _bytes(send), _bytes(recv)
        sizes = [c * size for c in counts]
        longest = max(sizes, default=0)
        if self._in_order and all(n == longest for n in sizes):
            dist.all_gather_into_tensor(r, s, group=self.group)
            return
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[: s.numel()] = s
        out = torch.empty(longest * self.world_size, dtype=torch.uint8)
        dist.all_gather_into_tensor(out, padded, group=self.group)
        pieces = self._ours([out[i * longest:(i + 1) * longest] for i in range(self.world_size)])
        torch.cat([p[:n] for p, n in zip(pieces, sizes)], out=r)

    def broadcast(self, buf: Any, root: int) -> None:
        """Rank ``root``'s ``buf`` into every rank's."""
        dist.broadcast(_bytes(buf)[0], src=self.ranks[root], group=self.group)

    def barrier(self) -> None:
        """Returns once every rank has called it."""
        dist.barrier(group=self.group)

    def subgroup(self, ranks: List[int]) -> "GlooRelay":
        """The relay over ``ranks`` (this group's ranks, in the new group's order), made by
        those ranks only (``use_local_synchronization``)."""
        members = [self.ranks[r] for r in ranks]
        group = _dist.new_gloo_group(members, self.timeout, local=True)
        return GlooRelay(group, members, self.timeout)


@dataclass(frozen=True)
class CpuTier:
    """Ranks on several machines: every rank's machine (numbered by first appearance in
    rank order) and this rank's relay over every rank."""

    machines: List[int]
    relay: GlooRelay

    @property
    def machine(self) -> int:
        """This rank's machine."""
        return self.machines[dist.get_rank()]


def machine_identity() -> str:
    """What decides whether two ranks can share memory: the kernel's boot id and the
    network namespace (rank 0's socket that hands the segment out is an abstract one), with
    the host name to read; under ``ZERO_CPU_INTER_NODE=gloo`` the launcher's node."""
    mode = os.environ.get(INTER_NODE_VARIABLE, "").strip().lower()
    if mode == "gloo":
        launch = _native.launch_info()
        if launch.local_world_size is None:
            raise CommError(f"{INTER_NODE_VARIABLE}=gloo takes the launcher's nodes as machines, but the "
                            "launcher does not say how many ranks run per node (LOCAL_WORLD_SIZE)")
        return f"node {launch.rank // launch.local_world_size}"
    if mode not in ("", "auto"):
        raise CommError(f"{INTER_NODE_VARIABLE}={mode!r}: the values are 'gloo' (every launcher node "
                        "is a machine of its own) and 'auto' (the default: the machines are found)")
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        net = os.readlink("/proc/self/ns/net")
    except OSError as e:
        raise CommError(f"cannot tell which ranks share this machine (reading the boot id and network "
                        f"namespace): {e}") from e
    return f"{socket.gethostname()} (boot {boot}, {net})"


def cpu_tier(timeout_s: float) -> Optional[CpuTier]:
    """``None`` when every rank is on this machine (or in a world of one); otherwise the
    machines and this rank's relay, over a gloo group of every rank made now with the
    engine's timeout, so a dead rank fails the others' collectives within it. A collective
    of torch's group: every rank calls it once per CPU engine, in the same order."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    world = dist.get_world_size()
    names: List[Any] = [None] * world
    dist.all_gather_object(names, machine_identity(), group=_dist.host_group())
    if len(set(names)) == 1:
        return None
    first: dict = {}
    machines = [first.setdefault(n, len(first)) for n in names]
    timeout = datetime.timedelta(seconds=timeout_s)
    group = _dist.new_gloo_group(list(range(world)), timeout)
    return CpuTier(machines=machines, relay=GlooRelay(group, list(range(world)), timeout))
