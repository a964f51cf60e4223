//! Per-operation counters that make communication volume measurable.
//!
//! Volume is what this rank *sends* under the standard ring algorithms, the quantity the
//! ZeRO paper's 2Ψ / 3Ψ figures count. For a length-`n` collective over `N` ranks, with
//! `own = even_split(n, N, rank).len()`:
//!
//! | op | elements sent by this rank |
//! |---|---|
//! | reduce_scatter (input `n`) | `n − own` |
//! | all_gather (output `n`) | `n − own` |
//! | all_reduce (`n`) | `2 · (n − own)` (a reduce-scatter, then an all-gather) |
//! | broadcast (`n`) | `n`, except the rank just before the root in the ring: 0 |
//! | barrier | 0 |
//!
//! When `N` divides `n` these are exactly `n(N−1)/N` and `2n(N−1)/N`. With one rank all are 0.

use crate::op::{even_split, OpKind};

/// Counters of one operation kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpStats {
    /// Collectives issued.
    pub calls: u64,
    /// Elements sent by this rank (see the module docs).
    pub elements: u64,
    /// Bytes sent by this rank.
    pub bytes: u64,
}

/// Counters of every operation kind, for one rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommStats {
    /// Indexed like [`OpKind::ALL`].
    pub per_op: [OpStats; 5],
}

impl CommStats {
    /// The counters of one kind.
    pub fn op(&self, kind: OpKind) -> OpStats {
        self.per_op[kind as usize]
    }

    /// Elements sent, summed over kinds.
    pub fn total_elements(&self) -> u64 {
        self.per_op.iter().map(|s| s.elements).sum()
    }

    /// Bytes sent, summed over kinds.
    pub fn total_bytes(&self) -> u64 {
        self.per_op.iter().map(|s| s.bytes).sum()
    }

    /// Counts the collective `desc` issued by `rank` of `world` (every backend's one call).
    pub(crate) fn count(&mut self, desc: &crate::op::OpDesc, rank: usize, world: usize) {
        let size = desc.dtype.map_or(0, |d| d.size_of());
        self.record(
            desc.kind,
            desc.count,
            size,
            rank,
            world,
            desc.root.unwrap_or(0),
        );
    }

    /// Counts one collective of `count` elements of `elem_size` bytes.
    pub(crate) fn record(
        &mut self,
        kind: OpKind,
        count: usize,
        elem_size: usize,
        rank: usize,
        world: usize,
        root: usize,
    ) {
        let elements = sent_elements(kind, count, rank, world, root) as u64;
        let s = &mut self.per_op[kind as usize];
        s.calls += 1;
        s.elements += elements;
        s.bytes += elements * elem_size as u64;
    }
}

/// Elements this rank sends for one collective (the table in the module docs).
pub(crate) fn sent_elements(
    kind: OpKind,
    n: usize,
    rank: usize,
    world: usize,
    root: usize,
) -> usize {
    if world <= 1 {
        return 0;
    }
    let others = n - even_split(n, world, rank).len();
    match kind {
        OpKind::ReduceScatter | OpKind::AllGather => others,
        OpKind::AllReduce => 2 * others,
        OpKind::Broadcast if (rank + 1) % world == root => 0,
        OpKind::Broadcast => n,
        OpKind::Barrier => 0,
    }
}
