//! Operation kinds, reduce ops, and how a buffer splits across ranks.

use std::fmt;
use std::ops::Range;
use zero_kernels::DType;

/// How elements are combined across ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum in rank order, accumulated in `f32`.
    Sum,
    /// The sum divided by the world size (one `f32` division at the end).
    Avg,
    /// The maximum; NaN wins (so a non-finite flag is never lost).
    Max,
}

/// The collectives, for errors and counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// [`Communicator::all_reduce`](crate::Communicator::all_reduce).
    AllReduce,
    /// [`Communicator::reduce_scatter`](crate::Communicator::reduce_scatter).
    ReduceScatter,
    /// [`Communicator::all_gather`](crate::Communicator::all_gather).
    AllGather,
    /// [`Communicator::broadcast`](crate::Communicator::broadcast).
    Broadcast,
    /// [`Communicator::barrier`](crate::Communicator::barrier).
    Barrier,
}

impl OpKind {
    /// Every kind, in counter order.
    pub const ALL: [OpKind; 5] = [
        OpKind::AllReduce,
        OpKind::ReduceScatter,
        OpKind::AllGather,
        OpKind::Broadcast,
        OpKind::Barrier,
    ];

    /// snake_case name.
    pub const fn name(self) -> &'static str {
        match self {
            OpKind::AllReduce => "all_reduce",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::AllGather => "all_gather",
            OpKind::Broadcast => "broadcast",
            OpKind::Barrier => "barrier",
        }
    }
}

/// Rank `rank`'s piece of a length-`n` buffer split across `world` ranks: pieces are
/// contiguous, in rank order, and the first `n % world` ranks get one extra element.
pub fn even_split(n: usize, world: usize, rank: usize) -> Range<usize> {
    let (q, rem) = (n / world, n % world);
    let start = rank * q + rank.min(rem);
    start..start + q + usize::from(rank < rem)
}

/// What one rank issued, compared across ranks before anything runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpDesc {
    pub kind: OpKind,
    pub dtype: Option<DType>,
    /// The collective's length: the buffer for all-reduce and broadcast, the input for
    /// reduce-scatter, the output for all-gather.
    pub count: usize,
    pub reduce: Option<ReduceOp>,
    pub root: Option<usize>,
}

impl fmt::Display for OpDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.name())?;
        if let Some(op) = self.reduce {
            write!(f, "({op:?})")?;
        }
        if let Some(root) = self.root {
            write!(f, "(root {root})")?;
        }
        if let Some(dt) = self.dtype {
            write!(f, " of {} {dt}", self.count)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_split_covers_the_buffer_in_rank_order() {
        for n in 0..40 {
            for world in 1..9 {
                let mut next = 0;
                for r in 0..world {
                    let p = even_split(n, world, r);
                    assert_eq!(p.start, next);
                    assert!(p.len() == n / world || p.len() == n / world + 1);
                    next = p.end;
                }
                assert_eq!(next, n);
            }
        }
    }
}
