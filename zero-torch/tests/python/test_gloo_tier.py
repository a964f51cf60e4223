"""``GlooRelay``, the byte transport of the CPU inter-node tier (docs/GLOO_TIER.md), on 3
gloo processes: every move (exchange, all-to-all with uneven and empty pieces, all-gather
even and uneven, broadcast, barrier) in ``float32`` and ``bfloat16``, on the world and on a
subgroup whose order is not torch's (torch ranks a group by global rank; the relay keeps
its own order). The engine's tiers over it are checked in ``test_shard_groups.py``."""

from __future__ import annotations

from typing import Any


def test_the_relay_moves_every_piece_to_its_place(job: Any) -> None:
    results = job(3, "gloo_tier_workers.relay_moves", {}, timeout=300)
    for rank, cases in enumerate(results):
        assert len(cases) == 4, (rank, cases)
        for case, r in cases.items():
            for move, want in r["want"].items():
                assert r["got"][move] == want, f"rank {rank}, {case}, {move}: {r['got'][move]} != {want}"
