//! What a rank called: the descriptor each rank publishes before a collective exchanges
//! any data, so that every rank can check that all called the same thing.

use super::{DType, RedOp};
use std::fmt;

/// The collective called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallKind {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
}

impl CallKind {
    const ALL: [CallKind; 4] = [
        CallKind::AllReduce,
        CallKind::ReduceScatter,
        CallKind::AllGather,
        CallKind::Broadcast,
    ];

    /// The NCCL entry point's name.
    pub fn name(self) -> &'static str {
        match self {
            CallKind::AllReduce => "ncclAllReduce",
            CallKind::ReduceScatter => "ncclReduceScatter",
            CallKind::AllGather => "ncclAllGather",
            CallKind::Broadcast => "ncclBroadcast",
        }
    }
}

/// One rank's call: what every rank must agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Desc {
    pub kind: CallKind,
    /// Elements: of the buffer (all-reduce, broadcast), of each rank's block
    /// (reduce-scatter's `recvcount`, all-gather's `sendcount`).
    pub count: u64,
    pub dtype: DType,
    pub op: Option<RedOp>,
    pub root: Option<usize>,
}

impl fmt::Display for Desc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({} x {}", self.kind.name(), self.count, self.dtype)?;
        if matches!(self.kind, CallKind::ReduceScatter | CallKind::AllGather) {
            write!(f, " per rank")?;
        }
        if let Some(op) = self.op {
            write!(f, ", {op}")?;
        }
        if let Some(root) = self.root {
            write!(f, ", root {root}")?;
        }
        write!(f, ")")
    }
}

/// Words of an encoded descriptor.
pub(crate) const DESC_WORDS: usize = 5;
const NONE: u64 = u64::MAX;

impl Desc {
    /// The descriptor as words for the segment.
    pub fn encode(&self) -> [u64; DESC_WORDS] {
        let code = |i: Option<usize>| i.map_or(NONE, |i| i as u64);
        [
            code(CallKind::ALL.iter().position(|k| *k == self.kind)),
            self.count,
            code(DType::ALL.iter().position(|d| *d == self.dtype)),
            code(
                self.op
                    .and_then(|op| RedOp::ALL.iter().position(|o| *o == op)),
            ),
            code(self.root),
        ]
    }

    /// The descriptor read back from the segment; `None` if the words are not one (a peer
    /// wrote garbage).
    pub fn decode(w: &[u64; DESC_WORDS]) -> Option<Desc> {
        let get = |v: u64| usize::try_from(v).ok();
        Some(Desc {
            kind: *CallKind::ALL.get(get(w[0])?)?,
            count: w[1],
            dtype: *DType::ALL.get(get(w[2])?)?,
            op: match w[3] {
                NONE => None,
                v => Some(*RedOp::ALL.get(get(v)?)?),
            },
            root: match w[4] {
                NONE => None,
                v => Some(get(v)?),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip_and_read_like_the_call() {
        let all = [
            Desc {
                kind: CallKind::AllReduce,
                count: 1024,
                dtype: DType::BF16,
                op: Some(RedOp::Sum),
                root: None,
            },
            Desc {
                kind: CallKind::ReduceScatter,
                count: (5u64 << 40) + 7,
                dtype: DType::U64,
                op: Some(RedOp::Avg),
                root: None,
            },
            Desc {
                kind: CallKind::AllGather,
                count: 0,
                dtype: DType::I8,
                op: None,
                root: None,
            },
            Desc {
                kind: CallKind::Broadcast,
                count: 3,
                dtype: DType::F16,
                op: None,
                root: Some(1),
            },
        ];
        for d in all {
            assert_eq!(Desc::decode(&d.encode()), Some(d));
        }
        assert_eq!(all[0].to_string(), "ncclAllReduce(1024 x bf16, sum)");
        assert_eq!(all[3].to_string(), "ncclBroadcast(3 x f16, root 1)");
        assert_eq!(all[2].to_string(), "ncclAllGather(0 x i8 per rank)");
        assert_eq!(Desc::decode(&[9, 0, 0, NONE, NONE]), None);
        assert_eq!(Desc::decode(&[0, 0, 77, NONE, NONE]), None);
    }
}
