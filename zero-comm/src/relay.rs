//! `RelayComm`: a group whose bytes move over someone else's transport (torch.distributed's
//! gloo group, in zero_torch) while zero does the arithmetic: the first piece of the CPU
//! inter-node tier of docs/GLOO_TIER.md.
//!
//! A [`Relay`] only moves bytes (all-to-all, all-gather, broadcast, barrier, an exchange of
//! small equal-length messages). [`RelayComm`] builds zero's collectives from them and
//! reduces with the one reduction core of every host group (`reduce.rs`: rank order,
//! `f32`, `Avg` divided once, rounded once), so it gives [`HostGroup`](crate::HostGroup)'s
//! and [`ShmComm`](crate::ShmComm)'s bits at the same world size, whatever order the
//! transport would have summed in:
//!
//! | collective | over the relay | then |
//! |---|---|---|
//! | `reduce_scatter` | `all_to_all`: piece `j` (`even_split`) of the input to rank `j` | the `N` received pieces reduced in rank order |
//! | `all_reduce` | the reduce-scatter above, then `all_gather` of the reduced pieces | |
//! | `all_gather`, `broadcast`, `barrier` | the same | |
//!
//! Before each collective the ranks `exchange` a fixed 32-byte description of it (kind,
//! dtype, length, op, root, whether the rank's own argument checks passed), so a rank that
//! issues something else, or bad arguments, fails every rank with
//! [`CommError::Mismatch`] or [`CommError::InvalidArgument`] instead of leaving the
//! transport to hang or misread. A transport failure (gloo's timeout when a rank died) is
//! [`CommError::Backend`] naming the collective; the group is broken from then on, as
//! every backend's is. Collectives run in the calling thread; the handle is ready.
//!
//! [`CpuComm`](crate::CpuComm) puts it under the host engine for ranks on several
//! machines; zero_torch's relay is torch's gloo group (docs/GLOO_TIER.md).

use crate::buffer::{HostBuffer, HostElement};
use crate::op::{even_split, split_members, split_message, Issued, OpDesc};
use crate::reduce::reduce_into;
use crate::{CommError, CommStats, Communicator, Completion, OpKind, ReduceOp};
use half::{bf16, f16};
use std::cell::{Cell, RefCell};
use zero_kernels::DType;

/// A transport that moves bytes among a fixed group of ranks, in the calling thread. Every
/// rank calls the same methods in the same order ([`RelayComm`] checks that first).
/// Counts are in elements of the buffers' dtype, one per rank, in rank order. Errors are
/// the transport's message.
pub trait Relay: Send {
    /// This rank, in `0..world_size()`.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// Every rank's `mine` (the same length on every rank), in rank order.
    fn exchange(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, String>;
    /// Sends piece `j` of `send` (split by `send_counts`) to rank `j`, and receives rank
    /// `j`'s piece for this rank as piece `j` of `recv` (split by `recv_counts`).
    fn all_to_all(
        &self,
        send: &HostBuffer,
        send_counts: &[usize],
        recv: &mut HostBuffer,
        recv_counts: &[usize],
    ) -> Result<(), String>;
    /// Piece `j` of `recv` (split by `counts`) becomes rank `j`'s `send`.
    fn all_gather(
        &self,
        send: &HostBuffer,
        recv: &mut HostBuffer,
        counts: &[usize],
    ) -> Result<(), String>;
    /// `root`'s `buf` into every rank's.
    fn broadcast(&self, buf: &mut HostBuffer, root: usize) -> Result<(), String>;
    /// Returns once every rank called it.
    fn barrier(&self) -> Result<(), String>;
    /// A new transport over `ranks` of this group (in that order, this rank among them),
    /// called by those ranks only.
    fn subgroup(&self, ranks: &[usize]) -> Result<Box<dyn Relay>, String>;
}

/// One rank of a group over a [`Relay`] (see the module docs).
pub struct RelayComm {
    relay: Box<dyn Relay>,
    seq: Cell<u64>,
    broken: RefCell<Option<CommError>>,
    stats: Cell<CommStats>,
}

impl std::fmt::Debug for RelayComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayComm")
            .field("rank", &self.relay.rank())
            .field("world", &self.relay.world_size())
            .finish()
    }
}

/// A collective of a [`RelayComm`]: done when issued.
#[derive(Debug)]
pub struct RelayWork<T>(T);

impl<T> Completion for RelayWork<T> {
    type Output = T;
    fn wait(self) -> Result<T, CommError> {
        Ok(self.0)
    }
    fn is_complete(&self) -> bool {
        true
    }
}

/// Bytes of one description in the agreement exchange.
const DESC_BYTES: usize = 32;

/// The dtypes and reduce ops in a description, numbered from 1 (0: none).
const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
const OPS: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max];

fn code<T: PartialEq>(table: &[T], v: Option<T>) -> u8 {
    v.and_then(|v| table.iter().position(|t| *t == v))
        .map_or(0, |i| i as u8 + 1)
}

fn entry<T: Copy>(table: &[T], code: u8) -> Option<T> {
    usize::from(code)
        .checked_sub(1)
        .and_then(|i| table.get(i).copied())
}

fn encode(desc: &OpDesc, ok: bool) -> [u8; DESC_BYTES] {
    let mut b = [0u8; DESC_BYTES];
    b[0] = code(&OpKind::ALL, Some(desc.kind));
    b[1] = code(&DTYPES, desc.dtype);
    b[2] = code(&OPS, desc.reduce);
    b[3] = u8::from(desc.split);
    b[4] = u8::from(ok);
    b[8..16].copy_from_slice(&(desc.count as u64).to_le_bytes());
    b[16..24].copy_from_slice(&desc.root.map_or(u64::MAX, |r| r as u64).to_le_bytes());
    b
}

/// The description `b` encodes (for a mismatch's message), if it is one.
fn decode(b: &[u8]) -> Option<OpDesc> {
    if b.len() != DESC_BYTES {
        return None;
    }
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(w)
    };
    Some(OpDesc {
        kind: entry(&OpKind::ALL, b[0])?,
        dtype: entry(&DTYPES, b[1]),
        count: word(8) as usize,
        reduce: entry(&OPS, b[2]),
        root: (word(16) != u64::MAX).then(|| word(16) as usize),
        split: b[3] == 1,
    })
}

fn split_counts(n: usize, world: usize) -> Vec<usize> {
    (0..world).map(|r| even_split(n, world, r).len()).collect()
}

impl RelayComm {
    /// A group over `relay`.
    pub fn new(relay: Box<dyn Relay>) -> Self {
        RelayComm {
            relay,
            seq: Cell::new(0),
            broken: RefCell::new(None),
            stats: Cell::new(CommStats::default()),
        }
    }

    fn fail(&self, e: CommError) -> CommError {
        *self.broken.borrow_mut() = Some(e.clone());
        e
    }

    fn backend(&self, seq: u64, desc: &OpDesc, reason: String) -> CommError {
        self.fail(CommError::Backend {
            seq,
            op: desc.to_string(),
            reason,
        })
    }

    /// Agrees on `desc` with every rank (one exchange); every rank fails alike where the
    /// descriptions differ or a rank's own checks failed. Returns the collective's position.
    fn agree(&self, desc: &OpDesc, check: Result<(), String>) -> Result<u64, CommError> {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        if let Some(e) = self.broken.borrow().clone() {
            return Err(e);
        }
        let me = self.relay.rank();
        let all = self
            .relay
            .exchange(&encode(desc, check.is_ok()))
            .map_err(|reason| self.backend(seq, desc, reason))?;
        if let Err(reason) = check {
            return Err(self.fail(CommError::InvalidArgument {
                rank: me,
                op: desc.to_string(),
                reason,
            }));
        }
        if let Some(bad) = all.iter().position(|b| b.get(4) != Some(&1)) {
            return Err(self.fail(CommError::InvalidArgument {
                rank: bad,
                op: desc.to_string(),
                reason: "its arguments failed its own checks (its error names them)".into(),
            }));
        }
        let mine = encode(desc, true);
        if all.iter().any(|b| b[..] != mine[..]) {
            let detail = all
                .iter()
                .enumerate()
                .map(|(r, b)| match decode(b) {
                    Some(d) => format!("rank {r}: {d}"),
                    None => format!("rank {r}: {} bytes, not a description", b.len()),
                })
                .collect::<Vec<_>>()
                .join(", ");
            return Err(self.fail(CommError::Mismatch { seq, detail }));
        }
        Ok(seq)
    }

    /// Agrees, counts and runs `f` on the relay.
    fn issue(
        &self,
        (desc, check): Issued,
        f: impl FnOnce(&dyn Relay) -> Result<(), String>,
    ) -> Result<(), CommError> {
        let seq = self.agree(&desc, check)?;
        let mut stats = self.stats.get();
        stats.count(&desc, self.relay.rank(), self.relay.world_size());
        self.stats.set(stats);
        f(self.relay.as_ref()).map_err(|reason| self.backend(seq, &desc, reason))
    }
}

impl RelayComm {
    /// A split's first half: agrees with every rank that it splits, then exchanges
    /// `(color, key)`; returns the split's position and every rank's
    /// [`split_message`], in rank order (for `split_members`).
    pub(crate) fn split_messages(
        &self,
        color: usize,
        key: usize,
    ) -> Result<(u64, Vec<Vec<u8>>), CommError> {
        let desc = OpDesc::split();
        let seq = self.agree(&desc, Ok(()))?;
        let all = self
            .relay
            .exchange(&split_message(color, key))
            .map_err(|reason| self.backend(seq, &desc, reason))?;
        Ok((seq, all))
    }

    /// A split's second half: the group of `ranks` (this group's ranks, in the new
    /// group's order, this one among them) over a relay subgroup, made by those ranks only.
    pub(crate) fn subgroup(&self, seq: u64, ranks: &[usize]) -> Result<RelayComm, CommError> {
        let relay = self
            .relay
            .subgroup(ranks)
            .map_err(|reason| self.backend(seq, &OpDesc::split(), reason))?;
        Ok(RelayComm::new(relay))
    }
}

/// The `world` pieces received in `recv` (each `len` long) reduced in rank order into `out`.
fn reduce_pieces<T: HostElement>(
    recv: &HostBuffer,
    out: &mut HostBuffer,
    len: usize,
    world: usize,
    op: ReduceOp,
) {
    let (Some(all), Some(out)) = (T::slice(recv), T::slice_mut(out)) else {
        return;
    };
    let inputs: Vec<&[T]> = (0..world).map(|j| &all[j * len..(j + 1) * len]).collect();
    reduce_into(out, &inputs, op, world);
}

/// This rank's piece of `input` reduced across the relay's ranks into `out`.
fn relay_reduce_scatter(
    relay: &dyn Relay,
    input: &HostBuffer,
    out: &mut HostBuffer,
    op: ReduceOp,
) -> Result<(), String> {
    let (world, rank) = (relay.world_size(), relay.rank());
    let len = even_split(input.len(), world, rank).len();
    let mut recv = HostBuffer::zeros(input.dtype(), len * world);
    relay.all_to_all(
        input,
        &split_counts(input.len(), world),
        &mut recv,
        &vec![len; world],
    )?;
    match input.dtype() {
        DType::F32 => reduce_pieces::<f32>(&recv, out, len, world, op),
        DType::F16 => reduce_pieces::<f16>(&recv, out, len, world, op),
        DType::BF16 => reduce_pieces::<bf16>(&recv, out, len, world, op),
    }
    Ok(())
}

#[allow(clippy::type_complexity)]
impl Communicator for RelayComm {
    type Buffer = HostBuffer;
    type Pending<T: Send + 'static> = RelayWork<T>;

    fn rank(&self) -> usize {
        self.relay.rank()
    }

    fn world_size(&self) -> usize {
        self.relay.world_size()
    }

    fn all_reduce(
        &self,
        mut buf: HostBuffer,
        op: ReduceOp,
    ) -> Result<RelayWork<HostBuffer>, CommError> {
        self.issue(OpDesc::all_reduce(&buf, op), |relay| {
            let (world, rank) = (relay.world_size(), relay.rank());
            let mut piece =
                HostBuffer::zeros(buf.dtype(), even_split(buf.len(), world, rank).len());
            relay_reduce_scatter(relay, &buf, &mut piece, op)?;
            let counts = split_counts(buf.len(), world);
            relay.all_gather(&piece, &mut buf, &counts)
        })?;
        Ok(RelayWork(buf))
    }

    fn reduce_scatter(
        &self,
        input: HostBuffer,
        mut output: HostBuffer,
        op: ReduceOp,
    ) -> Result<RelayWork<(HostBuffer, HostBuffer)>, CommError> {
        let (world, rank) = (self.world_size(), self.rank());
        let issued = OpDesc::reduce_scatter(&input, &output, op, world, rank);
        self.issue(issued, |relay| {
            relay_reduce_scatter(relay, &input, &mut output, op)
        })?;
        Ok(RelayWork((input, output)))
    }

    fn all_gather(
        &self,
        input: HostBuffer,
        mut output: HostBuffer,
    ) -> Result<RelayWork<(HostBuffer, HostBuffer)>, CommError> {
        let (world, rank) = (self.world_size(), self.rank());
        let issued = OpDesc::all_gather(&input, &output, world, rank);
        self.issue(issued, |relay| {
            let counts = split_counts(output.len(), world);
            relay.all_gather(&input, &mut output, &counts)
        })?;
        Ok(RelayWork((input, output)))
    }

    fn broadcast(
        &self,
        mut buf: HostBuffer,
        root: usize,
    ) -> Result<RelayWork<HostBuffer>, CommError> {
        let issued = OpDesc::broadcast(&buf, root, self.world_size());
        self.issue(issued, |relay| relay.broadcast(&mut buf, root))?;
        Ok(RelayWork(buf))
    }

    fn barrier(&self) -> Result<RelayWork<()>, CommError> {
        self.issue(OpDesc::barrier(), |relay| relay.barrier())?;
        Ok(RelayWork(()))
    }

    fn split(&self, color: usize, key: usize) -> Result<Self, CommError> {
        let (seq, all) = self.split_messages(color, key)?;
        self.subgroup(seq, &split_members(&all, color))
    }

    fn stats(&self) -> CommStats {
        self.stats.get()
    }

    fn reset_stats(&self) {
        self.stats.set(CommStats::default());
    }
}
