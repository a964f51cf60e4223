//! Operation kinds, reduce ops, and how a buffer splits across ranks.

use crate::CommBuffer;
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
    /// A [`Communicator::split`](crate::Communicator::split) (kind `Barrier`, no data):
    /// its own collective for matching, counted nowhere.
    pub split: bool,
}

/// A collective's description and the checks one rank can make alone (an error there is
/// reported before anything is issued), shared by every backend.
pub(crate) type Issued = (OpDesc, Result<(), String>);

impl OpDesc {
    fn new(kind: OpKind, dtype: Option<DType>, count: usize) -> Self {
        OpDesc {
            kind,
            dtype,
            count,
            reduce: None,
            root: None,
            split: false,
        }
    }

    pub(crate) fn all_reduce<B: CommBuffer>(buf: &B, op: ReduceOp) -> Issued {
        let mut d = Self::new(OpKind::AllReduce, Some(buf.dtype()), buf.len());
        d.reduce = Some(op);
        (d, Ok(()))
    }

    pub(crate) fn reduce_scatter<B: CommBuffer>(
        input: &B,
        output: &B,
        op: ReduceOp,
        world: usize,
        rank: usize,
    ) -> Issued {
        let n = input.len();
        let check = same_dtype(input, output)
            .and_then(|_| expect_len("output", even_split(n, world, rank).len(), output.len()));
        let mut d = Self::new(OpKind::ReduceScatter, Some(input.dtype()), n);
        d.reduce = Some(op);
        (d, check)
    }

    pub(crate) fn all_gather<B: CommBuffer>(
        input: &B,
        output: &B,
        world: usize,
        rank: usize,
    ) -> Issued {
        let n = output.len();
        let check = same_dtype(input, output)
            .and_then(|_| expect_len("input", even_split(n, world, rank).len(), input.len()));
        (Self::new(OpKind::AllGather, Some(output.dtype()), n), check)
    }

    pub(crate) fn broadcast<B: CommBuffer>(buf: &B, root: usize, world: usize) -> Issued {
        let check = if root < world {
            Ok(())
        } else {
            Err(format!("root {root} is not a rank of a group of {world}"))
        };
        let mut d = Self::new(OpKind::Broadcast, Some(buf.dtype()), buf.len());
        d.root = Some(root);
        (d, check)
    }

    pub(crate) fn barrier() -> Issued {
        (Self::new(OpKind::Barrier, None, 0), Ok(()))
    }

    /// A split: matched like a collective (every rank must issue it at the same position),
    /// moves no buffer.
    pub(crate) fn split() -> OpDesc {
        let mut d = Self::new(OpKind::Barrier, None, 0);
        d.split = true;
        d
    }
}

/// A split's message from one rank, for the backends that split by exchanging bytes
/// (`ShmComm`, `RelayComm`): `color` then `key`, 8 little-endian bytes each (a backend may
/// append more).
pub(crate) fn split_message(color: usize, key: usize) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..8].copy_from_slice(&(color as u64).to_le_bytes());
    m[8..].copy_from_slice(&(key as u64).to_le_bytes());
    m
}

/// Word `i` of one rank's [`split_message`] (0: the colour, 1: the key); `None` for a
/// message of fewer than 16 bytes.
fn split_word(b: &[u8], i: usize) -> Option<u64> {
    let word = b.get(..16)?.get(8 * i..8 * i + 8)?;
    Some(u64::from_le_bytes(word.try_into().ok()?))
}

/// The colour in one rank's [`split_message`] (`None` for fewer than 16 bytes).
pub(crate) fn split_color(b: &[u8]) -> Option<u64> {
    split_word(b, 0)
}

/// The new group of `color` from every rank's [`split_message`] (in rank order): the
/// parent ranks of its members, ordered by key, ties by parent rank.
pub(crate) fn split_members(all: &[Vec<u8>], color: usize) -> Vec<usize> {
    let mut members: Vec<(u64, usize)> = all
        .iter()
        .enumerate()
        .filter(|(_, b)| split_word(b, 0) == Some(color as u64))
        .filter_map(|(r, b)| Some((split_word(b, 1)?, r)))
        .collect();
    members.sort_unstable();
    members.into_iter().map(|(_, r)| r).collect()
}

fn same_dtype<B: CommBuffer>(a: &B, b: &B) -> Result<(), String> {
    if a.dtype() == b.dtype() {
        Ok(())
    } else {
        Err(format!(
            "input is {} but output is {}",
            a.dtype(),
            b.dtype()
        ))
    }
}

fn expect_len(what: &str, expected: usize, actual: usize) -> Result<(), String> {
    if expected == actual {
        Ok(())
    } else {
        Err(format!("{what} has {actual} elements, expected {expected}"))
    }
}

impl fmt::Display for OpDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.split {
            return f.write_str("split");
        }
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
