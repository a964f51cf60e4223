//! `CpuComm`: the host engine's communicator, on one machine or on several.
//!
//! Ranks that all sit on one machine are one [`ShmComm`]. Ranks on several machines are a
//! [`RelayComm`] (zero_torch's relay is torch's gloo group) that also holds this machine's
//! `ShmComm` and every rank's machine: a [`split`](Communicator::split) whose new group
//! lies on one machine becomes a split of that machine's shared-memory group, and only a
//! group that spans machines stays on the relay. So [`Tiered`](crate::Tiered)'s node
//! groups, one-node shard groups and hpZ's secondary groups run over shared memory, and
//! only the replica and cross-node groups cross the machines' link (docs/GLOO_TIER.md).
//!
//! Every group reduces with the one host reduction core (rank order, `f32`, `Avg`
//! divided once), so which of the two a group runs on changes no bit.
//!
//! A spanning split, on every rank of the parent:
//! 1. the relay agrees that every rank splits and exchanges `(color, key)`;
//! 2. if any rank of this machine joins a group that lies on this machine, every rank of
//!    the machine splits the machine's `ShmComm` (a rank whose group spans machines passes
//!    a colour of its own and drops the group of one it gets);
//! 3. a rank whose group spans machines makes the relay subgroup of its members (those
//!    ranks only).

use crate::op::{split_color, split_members};
use crate::relay::RelayWork;
use crate::shm::ShmWork;
use crate::{
    CommError, CommStats, Communicator, Completion, HostBuffer, ReduceOp, RelayComm, ShmComm,
};

/// One rank's group of the host engine (see the module docs).
#[derive(Debug)]
pub enum CpuComm {
    /// Every rank of the group on this machine: the shared-memory group.
    Shm(ShmComm),
    /// The group spans machines: the relay, and (for the groups a split keeps on one
    /// machine) this machine's shared-memory group.
    Relay(Spanning),
}

/// A group over machines (see [`CpuComm::spanning`]).
#[derive(Debug)]
pub struct Spanning {
    relay: RelayComm,
    /// Boxed: a group over machines holds two groups, where `Shm` holds one.
    machine: Option<Box<Machine>>,
}

/// This machine's ranks of a spanning group.
#[derive(Debug)]
struct Machine {
    /// Their shared-memory group, ranked as in the spanning group.
    shm: ShmComm,
    /// Every rank's machine, by rank of the spanning group.
    of_rank: Vec<usize>,
}

/// A collective of a [`CpuComm`]: both kinds finish in the calling thread.
#[derive(Debug)]
pub enum CpuWork<T> {
    /// On shared memory.
    Shm(ShmWork<T>),
    /// On the relay.
    Relay(RelayWork<T>),
}

impl<T> Completion for CpuWork<T> {
    type Output = T;
    fn wait(self) -> Result<T, CommError> {
        match self {
            CpuWork::Shm(w) => w.wait(),
            CpuWork::Relay(w) => w.wait(),
        }
    }
    fn is_complete(&self) -> bool {
        match self {
            CpuWork::Shm(w) => w.is_complete(),
            CpuWork::Relay(w) => w.is_complete(),
        }
    }
}

/// The colours this module gives the machine split's ranks whose group spans machines
/// (one each, from the top of the range): a group's own colour must lie below.
const OWN_COLOURS_FROM: usize = usize::MAX / 2;

/// The ranks of `machines` (every rank's machine) on `rank`'s machine, in rank order: the
/// members of its machine's shared-memory group, whose rank there is its place here.
pub fn machine_ranks(machines: &[usize], rank: usize) -> Vec<usize> {
    let mine = machines.get(rank);
    (0..machines.len())
        .filter(|&r| machines.get(r) == mine)
        .collect()
}

impl CpuComm {
    /// The group of ranks on several machines: `relay` over all of them, `machine` this
    /// machine's ranks (ranked in `relay`'s order) over shared memory, and `machines` every
    /// rank's machine (any numbering: ranks with the same number share a machine). Checks
    /// that the three agree on this rank.
    pub fn spanning(
        relay: RelayComm,
        machine: ShmComm,
        machines: Vec<usize>,
    ) -> Result<Self, CommError> {
        let (rank, world) = (relay.rank(), relay.world_size());
        let bad = |reason: String| CommError::InvalidArgument {
            rank,
            op: "start-up of a group over several machines".into(),
            reason,
        };
        if machines.len() != world {
            return Err(bad(format!(
                "{} machines named for a group of {world} ranks",
                machines.len()
            )));
        }
        let here = machine_ranks(&machines, rank);
        let position = here.iter().position(|&r| r == rank).unwrap_or(usize::MAX);
        if machine.world_size() != here.len() || machine.rank() != position {
            return Err(bad(format!(
                "this machine's shared-memory group is rank {} of {}, but the machines say rank {position} of {} (ranks {here:?})",
                machine.rank(),
                machine.world_size(),
                here.len()
            )));
        }
        Ok(CpuComm::Relay(Spanning {
            relay,
            machine: Some(Box::new(Machine {
                shm: machine,
                of_rank: machines,
            })),
        }))
    }

    /// Whether this group runs over shared memory (all its ranks on this machine).
    pub fn over_shared_memory(&self) -> bool {
        matches!(self, CpuComm::Shm(_))
    }
}

impl Spanning {
    fn split(&self, color: usize, key: usize) -> Result<CpuComm, CommError> {
        let (seq, all) = self.relay.split_messages(color, key)?;
        let members = split_members(&all, color);
        let Some(machine) = &self.machine else {
            return Ok(CpuComm::Relay(Spanning {
                relay: self.relay.subgroup(seq, &members)?,
                machine: None,
            }));
        };
        let me = self.relay.rank();
        let of = &machine.of_rank;
        let colour_of = |r: usize| split_color(&all[r]).map(|c| c as usize);
        // Whether rank r's new group lies on its own machine.
        let local = |r: usize| {
            colour_of(r).is_some_and(|c| {
                split_members(&all, c)
                    .iter()
                    .all(|&q| of.get(q) == of.get(r))
            })
        };
        if let Some(r) =
            (0..all.len()).find(|&r| colour_of(r).is_none_or(|c| c >= OWN_COLOURS_FROM))
        {
            // Every rank sees the same messages, so every rank fails here alike.
            return Err(CommError::InvalidArgument {
                rank: r,
                op: "split".into(),
                reason: format!(
                    "colour {:?}: a group over several machines takes colours below {OWN_COLOURS_FROM}",
                    colour_of(r)
                ),
            });
        }
        let here = machine_ranks(of, me);
        if here.iter().any(|&r| local(r)) {
            let position = here.iter().position(|&r| r == me).unwrap_or(0);
            let own = if local(me) {
                color
            } else {
                OWN_COLOURS_FROM + position
            };
            let group = machine.shm.split(own, key)?;
            if local(me) {
                return Ok(CpuComm::Shm(group));
            }
        }
        Ok(CpuComm::Relay(Spanning {
            relay: self.relay.subgroup(seq, &members)?,
            machine: None,
        }))
    }
}

/// Runs `$body` on the group's communicator, wrapping its handle.
macro_rules! either {
    ($self:expr, $c:ident => $body:expr) => {
        match $self {
            CpuComm::Shm($c) => $body.map(CpuWork::Shm),
            CpuComm::Relay(Spanning { relay: $c, .. }) => $body.map(CpuWork::Relay),
        }
    };
}

#[allow(clippy::type_complexity)]
impl Communicator for CpuComm {
    type Buffer = HostBuffer;
    type Pending<T: Send + 'static> = CpuWork<T>;

    fn rank(&self) -> usize {
        match self {
            CpuComm::Shm(c) => c.rank(),
            CpuComm::Relay(s) => s.relay.rank(),
        }
    }

    fn world_size(&self) -> usize {
        match self {
            CpuComm::Shm(c) => c.world_size(),
            CpuComm::Relay(s) => s.relay.world_size(),
        }
    }

    fn all_reduce(&self, buf: HostBuffer, op: ReduceOp) -> Result<CpuWork<HostBuffer>, CommError> {
        either!(self, c => c.all_reduce(buf, op))
    }

    fn reduce_scatter(
        &self,
        input: HostBuffer,
        output: HostBuffer,
        op: ReduceOp,
    ) -> Result<CpuWork<(HostBuffer, HostBuffer)>, CommError> {
        either!(self, c => c.reduce_scatter(input, output, op))
    }

    fn all_gather(
        &self,
        input: HostBuffer,
        output: HostBuffer,
    ) -> Result<CpuWork<(HostBuffer, HostBuffer)>, CommError> {
        either!(self, c => c.all_gather(input, output))
    }

    fn broadcast(&self, buf: HostBuffer, root: usize) -> Result<CpuWork<HostBuffer>, CommError> {
        either!(self, c => c.broadcast(buf, root))
    }

    fn barrier(&self) -> Result<CpuWork<()>, CommError> {
        either!(self, c => c.barrier())
    }

    fn split(&self, color: usize, key: usize) -> Result<Self, CommError> {
        match self {
            CpuComm::Shm(c) => c.split(color, key).map(CpuComm::Shm),
            CpuComm::Relay(s) => s.split(color, key),
        }
    }

    fn stats(&self) -> CommStats {
        match self {
            CpuComm::Shm(c) => c.stats(),
            CpuComm::Relay(s) => s.relay.stats(),
        }
    }

    fn held_bytes(&self) -> usize {
        match self {
            CpuComm::Shm(c) => c.held_bytes(),
            CpuComm::Relay(s) => s.machine.as_ref().map_or(0, |m| m.shm.held_bytes()),
        }
    }

    fn reset_stats(&self) {
        match self {
            CpuComm::Shm(c) => c.reset_stats(),
            CpuComm::Relay(s) => s.relay.reset_stats(),
        }
    }
}
