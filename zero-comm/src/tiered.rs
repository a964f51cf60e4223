//! Hierarchical sharding (DeepSpeed's MiCS, FSDP2's HSDP, ZeRO++'s hpZ): the groups one
//! rank talks to, behind the one [`Communicator`] trait.
//!
//! A world of `N` ranks sits on nodes of `G` consecutive ranks. It is cut into *shard
//! groups* of `S` consecutive ranks (`S` divides `N`), each holding the whole model
//! partitioned over its `S` ranks and replicated across the `R = N / S` groups: the
//! *replica group* of a rank is the `R` ranks with its position in their shard group. hpZ
//! adds the *secondary group*: the `H` consecutive ranks of a node (`H` divides `G`).
//!
//! [`Tiered`] is a communicator whose rank and world are the shard group's, so an engine
//! partitions over `S` ranks without knowing of the others. Its collectives:
//!
//! | collective | spans |
//! |---|---|
//! | `all_reduce`, `reduce_scatter` | the shard group, then (when it completes) an all-reduce of the result across the replica group with the same op: every rank's data counts, as in a flat reduction. Reduce-scatter first: the inter-node all-reduce then carries `n/S` elements per rank instead of `n` |
//! | `all_gather`, `broadcast`, `barrier` | the shard group (what it gathers is replicated across the replicas) |
//! | [`Tiered::shard_reduce_scatter`] | the shard group only: an engine that sums several reductions before the replicas see them (the accumulation window) all-reduces the sum once, with [`Tiered::replicas_all_reduce`] |
//! | [`Tiered::replicas_all_reduce`] | the replica group: every replica's buffer summed (or averaged) into each |
//! | [`Tiered::replicas_broadcast`] | the replica group: one replica's buffer to the others |
//! | [`Tiered::secondary_all_gather`] | the secondary group (hpZ) |
//! | [`Tiered::hierarchical_all_gather`] | a shard group of `k` whole nodes, in two steps (`mics_hierarchical_params_gather`): the `k` ranks with the same place `g` in their nodes gather their pieces into a block (inter-node, `n/G` elements), then the node's `G` ranks gather the blocks (intra-node). The shard group's ranks are ordered `g·k + j` (place `g` on node `j`, [`Layout::shard_key`]), so place `g`'s ranks hold consecutive partitions, its block is the output's `g`-th `n/G` elements, and the second step writes the output in order: no copy, the bits `all_gather` gives. Only `n(k−1)/S` of each gather crosses nodes, `G` times less than in one step |
//!
//! The replica all-reduce is issued when the reduce-scatter's handle is waited for, so
//! every rank issues it in the order it waits, which an engine makes the same on every
//! rank (it finishes reductions in the order it issued them).
//!
//! Elements sent are booked when a collective is issued (the replica half too), by tier: a
//! group whose ranks all sit on one node is intra-node, one that spans nodes inter-node
//! (its ring crosses the slow link).

use crate::{CommBuffer, CommError, CommStats, Communicator, Completion, OpKind, ReduceOp};
use std::cell::Cell;
use std::sync::{Arc, Mutex};

/// Where a rank sits: the sizes that decide its groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// This rank in the world.
    pub rank: usize,
    /// Ranks in the world (`N`).
    pub world: usize,
    /// Consecutive ranks per node (`G`).
    pub ranks_per_node: usize,
    /// Consecutive ranks per shard group (`S`; `N` when flat).
    pub shard_size: usize,
    /// Consecutive ranks per hpZ secondary group (`H`; 1 without hpZ).
    pub secondary_size: usize,
}

impl Layout {
    /// Checks the sizes: `S` and `H` divide `N`, `H` divides `G`; `G` at least 1 (a node
    /// size over the world is clamped to it).
    pub fn new(
        rank: usize,
        world: usize,
        ranks_per_node: usize,
        shard_size: usize,
        secondary_size: usize,
    ) -> Result<Self, CommError> {
        let bad = |reason: String| {
            Err(CommError::InvalidArgument {
                rank,
                op: "split into shard groups".into(),
                reason,
            })
        };
        if world == 0 || rank >= world {
            return bad(format!("rank {rank} of a world of {world}"));
        }
        let g = ranks_per_node.clamp(1, world);
        if shard_size == 0 || world % shard_size != 0 {
            return bad(format!(
                "a shard group of {shard_size} ranks (mics_shard_size) must divide the world size {world}"
            ));
        }
        if secondary_size == 0 || g % secondary_size != 0 || world % secondary_size != 0 {
            return bad(format!(
                "an hpZ group of {secondary_size} ranks (zero_hpz_partition_size) must divide the ranks per node ({g}) and the world size ({world})"
            ));
        }
        Ok(Self {
            rank,
            world,
            ranks_per_node: g,
            shard_size,
            secondary_size,
        })
    }

    /// Shard groups (`R`): how many times the model's state is held.
    pub fn replicas(&self) -> usize {
        self.world / self.shard_size
    }

    /// This rank's shard group, which is its index in its replica group.
    pub fn replica(&self) -> usize {
        self.rank / self.shard_size
    }

    fn node(&self, rank: usize) -> usize {
        rank / self.ranks_per_node
    }

    /// The tier of the shard group (consecutive ranks).
    pub fn shard_tier(&self) -> Tier {
        let first = self.replica() * self.shard_size;
        self.tier_of(first, first + self.shard_size - 1)
    }

    /// The tier of the replica group (ranks `S` apart).
    pub fn replica_tier(&self) -> Tier {
        let first = self.rank % self.shard_size;
        self.tier_of(first, first + (self.replicas() - 1) * self.shard_size)
    }

    /// Whether a hierarchical gather has two steps to take: the shard group spans nodes,
    /// and whole ones (`S` a multiple of `G`, `G` > 1).
    pub fn hierarchical_applies(&self) -> bool {
        let g = self.ranks_per_node;
        g > 1 && self.shard_size > g && self.shard_size % g == 0
    }

    /// This rank's place in its shard group, which is the partition it holds: its place
    /// among the group's consecutive ranks, `j·G + g` for place `g` on the group's node
    /// `j`; with `hierarchical` (gathers across the nodes first) `g·k + j`, `k` nodes per
    /// group, so that the `k` ranks of place `g` hold consecutive partitions.
    pub fn shard_key(&self, hierarchical: bool) -> usize {
        let at = self.rank % self.shard_size;
        if !hierarchical {
            return at;
        }
        let g = self.ranks_per_node;
        (at % g) * (self.shard_size / g) + at / g
    }

    /// The tier of the secondary group (consecutive ranks inside a node).
    pub fn secondary_tier(&self) -> Tier {
        Tier::IntraNode
    }

    fn tier_of(&self, first: usize, last: usize) -> Tier {
        if self.node(first) == self.node(last) {
            Tier::IntraNode
        } else {
            Tier::InterNode
        }
    }
}

/// Which links a group's collectives cross.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// Every rank of the group on one node (NVLink, shared memory).
    IntraNode,
    /// The group spans nodes (InfiniBand, Ethernet).
    InterNode,
}

/// Elements sent per tier (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Collectives of groups inside one node.
    pub intra_node: CommStats,
    /// Collectives of groups that span nodes.
    pub inter_node: CommStats,
}

impl TierStats {
    fn tier_mut(&mut self, tier: Tier) -> &mut CommStats {
        match tier {
            Tier::IntraNode => &mut self.intra_node,
            Tier::InterNode => &mut self.inter_node,
        }
    }

    /// Both tiers summed.
    pub fn total(&self) -> CommStats {
        let mut sum = self.intra_node;
        for (s, o) in sum.per_op.iter_mut().zip(self.inter_node.per_op) {
            s.calls += o.calls;
            s.elements += o.elements;
            s.bytes += o.bytes;
        }
        sum
    }
}

/// One rank's groups (see the module docs).
pub struct Tiered<C: Communicator> {
    /// `mics_hierarchical_params_gather` on a shard group that spans nodes: the node's
    /// ranks of the shard group, and the shard group's ranks with this rank's place in
    /// their node.
    hierarchical: Option<Box<(C, C)>>,
    layout: Layout,
    shard: C,
    replicas: Option<Arc<Mutex<C>>>,
    secondary: Option<Box<C>>,
    /// The world the groups were split from, kept alive while they are used.
    _world: Option<Box<C>>,
    stats: Cell<TierStats>,
}

impl<C: Communicator> std::fmt::Debug for Tiered<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tiered")
            .field("layout", &self.layout)
            .finish()
    }
}

impl<C: Communicator> Tiered<C> {
    /// One flat group: every collective spans `comm`, booked under its tier on nodes of
    /// `ranks_per_node` ranks.
    pub fn flat(comm: C, ranks_per_node: usize) -> Result<Self, CommError> {
        let (rank, world) = (comm.rank(), comm.world_size());
        let layout = Layout::new(rank, world, ranks_per_node, world, 1)?;
        Ok(Self {
            hierarchical: None,
            layout,
            shard: comm,
            replicas: None,
            secondary: None,
            _world: None,
            stats: Cell::new(TierStats::default()),
        })
    }

    /// Splits `world` into shard groups of `shard_size` ranks, their replica groups, and
    /// (`secondary_size` > 1) hpZ's secondary groups, on nodes of `ranks_per_node`; with
    /// `hierarchical_gather` (`mics_hierarchical_params_gather`) and a shard group that
    /// spans whole nodes, the two groups of [`hierarchical_all_gather`](Self::hierarchical_all_gather),
    /// and the shard group's ranks in the order that gather needs ([`Layout::shard_key`]).
    /// A collective of `world`: every rank calls it with the same sizes. Sizes that leave
    /// one flat group split nothing.
    pub fn split(
        world: C,
        ranks_per_node: usize,
        shard_size: usize,
        secondary_size: usize,
        hierarchical_gather: bool,
    ) -> Result<Self, CommError> {
        let layout = Layout::new(
            world.rank(),
            world.world_size(),
            ranks_per_node,
            shard_size,
            secondary_size,
        )?;
        let r = layout.rank;
        let secondary = if secondary_size > 1 {
            Some(Box::new(world.split(r / secondary_size, r)?))
        } else {
            None
        };
        let hierarchical = hierarchical_gather && layout.hierarchical_applies();
        let hierarchical_groups = if hierarchical {
            let g = layout.ranks_per_node;
            let node = world.split(r / g, r)?;
            let cross = world.split((r / shard_size) * g + r % g, r)?;
            Some(Box::new((node, cross)))
        } else {
            None
        };
        let (shard, replicas, kept) = if shard_size < layout.world || hierarchical {
            let shard = world.split(r / shard_size, layout.shard_key(hierarchical))?;
            let replicas = (shard_size < layout.world)
                .then(|| world.split(r % shard_size, r))
                .transpose()?
                .map(|c| Arc::new(Mutex::new(c)));
            (shard, replicas, Some(Box::new(world)))
        } else {
            (world, None, None)
        };
        Ok(Self {
            hierarchical: hierarchical_groups,
            layout,
            shard,
            replicas,
            secondary,
            _world: kept,
            stats: Cell::new(TierStats::default()),
        })
    }

    /// The sizes this rank's groups were made with.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Elements sent so far, by tier.
    pub fn tier_stats(&self) -> TierStats {
        self.stats.get()
    }

    /// hpZ's secondary group: this rank in it and its size (`None` without hpZ).
    pub fn secondary(&self) -> Option<(usize, usize)> {
        self.secondary.as_ref().map(|s| (s.rank(), s.world_size()))
    }

    /// Concatenates the secondary group's pieces (hpZ: each rank's `even_split(n, H, h)` of
    /// a bucket gathered earlier) into `output`.
    pub fn secondary_all_gather(
        &self,
        input: C::Buffer,
        output: C::Buffer,
    ) -> Result<TieredWork<C, BufferPair<C>>, CommError> {
        let sec = self
            .secondary
            .as_ref()
            .ok_or_else(|| CommError::InvalidArgument {
                rank: self.layout.rank,
                op: "all_gather (hpZ)".into(),
                reason: "no hpZ group: zero_hpz_partition_size is 1".into(),
            })?;
        self.book(
            Tier::IntraNode,
            OpKind::AllGather,
            &output,
            sec.rank(),
            sec.world_size(),
            0,
        );
        Ok(TieredWork::Direct(sec.all_gather(input, output)?))
    }

    /// The shard group's reduce-scatter alone, with no all-reduce across the replicas
    /// after it: the caller all-reduces what it sums of such results with
    /// [`replicas_all_reduce`](Self::replicas_all_reduce). Without replicas this is
    /// `reduce_scatter`.
    pub fn shard_reduce_scatter(
        &self,
        input: C::Buffer,
        output: C::Buffer,
        op: ReduceOp,
    ) -> Result<TieredWork<C, BufferPair<C>>, CommError> {
        self.book_shard(OpKind::ReduceScatter, &input, 0);
        Ok(TieredWork::Direct(
            self.shard.reduce_scatter(input, output, op)?,
        ))
    }

    /// All-reduces `buf` across the replica group with `op` (nothing to do without
    /// replicas): the second half of a reduction whose first half was
    /// [`shard_reduce_scatter`](Self::shard_reduce_scatter).
    pub fn replicas_all_reduce(
        &self,
        buf: C::Buffer,
        op: ReduceOp,
    ) -> Result<TieredWork<C, C::Buffer>, CommError> {
        let Some(reps) = &self.replicas else {
            return Ok(TieredWork::Ready(buf));
        };
        self.book_replicas(&buf, buf.len());
        let work = lock(reps)?.all_reduce(buf, op)?;
        Ok(TieredWork::Direct(work))
    }

    /// Whether there are replicas (shard groups smaller than the world).
    pub fn has_replicas(&self) -> bool {
        self.replicas.is_some()
    }

    /// The nodes `k` of this rank's shard group where its gathers go across the nodes
    /// first (the size of the cross-node group), or `None` where they have one step.
    pub fn hierarchical_nodes(&self) -> Option<usize> {
        self.hierarchical
            .as_deref()
            .map(|(_, cross)| cross.world_size())
    }

    /// The block a [`hierarchical_all_gather`](Self::hierarchical_all_gather) of `total`
    /// elements needs (`total / G`, `G` ranks per node: the `k` pieces of this rank's
    /// place in each node), or `None` where the gather has one step.
    pub fn gather_block_len(&self, total: usize) -> Option<usize> {
        self.hierarchical
            .as_deref()
            .map(|(node, _)| total / node.world_size())
    }

    /// The shard group's all-gather of `input` into `output` across the nodes first, then
    /// inside the node (see the module docs), through `block` (of
    /// [`gather_block_len`](Self::gather_block_len) elements); an `all_gather` where the
    /// gather has one step (`block` is then dropped). The cross-node step is waited for
    /// here, before the node's is issued: both are issued in the caller's order on every
    /// rank.
    pub fn hierarchical_all_gather(
        &self,
        input: C::Buffer,
        block: C::Buffer,
        output: C::Buffer,
    ) -> Result<TieredWork<C, BufferPair<C>>, CommError> {
        let Some(groups) = self.hierarchical.as_deref() else {
            return self.all_gather(input, output);
        };
        let (node, cross) = (&groups.0, &groups.1);
        if block.len() * node.world_size() != output.len() {
            return Err(CommError::InvalidArgument {
                rank: self.layout.rank,
                op: "all_gather (across nodes first)".into(),
                reason: format!(
                    "a block of {} elements for {} ranks per node does not make an output of {}",
                    block.len(),
                    node.world_size(),
                    output.len()
                ),
            });
        }
        self.book(
            self.layout.shard_tier(),
            OpKind::AllGather,
            &block,
            cross.rank(),
            cross.world_size(),
            0,
        );
        self.book(
            Tier::IntraNode,
            OpKind::AllGather,
            &output,
            node.rank(),
            node.world_size(),
            0,
        );
        let (input, block) = cross.all_gather(input, block)?.wait()?;
        let work = node.all_gather(block, output)?;
        Ok(TieredWork::Deferred(Box::new(move || {
            let (_block, output) = work.wait()?;
            Ok((input, output))
        })))
    }

    /// Copies replica `root`'s `buf` to every replica (nothing to do without replicas).
    pub fn replicas_broadcast(
        &self,
        buf: C::Buffer,
        root: usize,
    ) -> Result<TieredWork<C, C::Buffer>, CommError> {
        let Some(reps) = &self.replicas else {
            return Ok(TieredWork::Ready(buf));
        };
        let tier = self.layout.replica_tier();
        let replicas = self.layout.replicas();
        self.book(
            tier,
            OpKind::Broadcast,
            &buf,
            self.layout.replica(),
            replicas,
            root,
        );
        let work = lock(reps)?.broadcast(buf, root)?;
        Ok(TieredWork::Direct(work))
    }

    fn book(
        &self,
        tier: Tier,
        kind: OpKind,
        buf: &C::Buffer,
        rank: usize,
        world: usize,
        root: usize,
    ) {
        let mut s = self.stats.get();
        s.tier_mut(tier)
            .record(kind, buf.len(), buf.dtype().size_of(), rank, world, root);
        self.stats.set(s);
    }

    fn book_shard(&self, kind: OpKind, buf: &C::Buffer, root: usize) {
        let (rank, world) = (self.shard.rank(), self.shard.world_size());
        self.book(self.layout.shard_tier(), kind, buf, rank, world, root);
    }

    fn book_replicas(&self, like: &C::Buffer, len: usize) {
        // The replica all-reduce of `len` elements of `like`'s dtype.
        let (rank, world) = (self.layout.replica(), self.layout.replicas());
        let mut s = self.stats.get();
        s.tier_mut(self.layout.replica_tier()).record(
            OpKind::AllReduce,
            len,
            like.dtype().size_of(),
            rank,
            world,
            0,
        );
        self.stats.set(s);
    }
}

impl<C: Communicator> Tiered<C> {
    /// The shard group's reduction `first`, followed (with replicas) by `finish`: the
    /// all-reduce of its result across the replicas, when it is waited for.
    fn then_replicas<T: Send + 'static>(
        &self,
        first: C::Pending<T>,
        op: ReduceOp,
        finish: fn(T, &Mutex<C>, ReduceOp) -> Result<T, CommError>,
    ) -> TieredWork<C, T> {
        match &self.replicas {
            None => TieredWork::Direct(first),
            Some(reps) => TieredWork::Then {
                first,
                replicas: reps.clone(),
                op,
                finish,
            },
        }
    }
}

fn lock<C>(m: &Mutex<C>) -> Result<std::sync::MutexGuard<'_, C>, CommError> {
    m.lock().map_err(|_| CommError::InvalidArgument {
        rank: usize::MAX,
        op: "all_reduce (replicas)".into(),
        reason: "the replica group was poisoned by a panic on another thread".into(),
    })
}

/// Finishes a reduce-scatter: the reduced piece all-reduced across the replicas.
fn replica_reduce_pair<C: Communicator>(
    (input, output): (C::Buffer, C::Buffer),
    reps: &Mutex<C>,
    op: ReduceOp,
) -> Result<(C::Buffer, C::Buffer), CommError> {
    let work = lock(reps)?.all_reduce(output, op)?;
    Ok((input, work.wait()?))
}

/// Finishes an all-reduce: the result all-reduced across the replicas.
fn replica_reduce<C: Communicator>(
    buf: C::Buffer,
    reps: &Mutex<C>,
    op: ReduceOp,
) -> Result<C::Buffer, CommError> {
    let work = lock(reps)?.all_reduce(buf, op)?;
    work.wait()
}

/// A gather's or reduce-scatter's `(input, output)`, handed back.
pub type BufferPair<C> = (<C as Communicator>::Buffer, <C as Communicator>::Buffer);

/// A collective of a [`Tiered`] communicator.
pub enum TieredWork<C: Communicator, T: Send + 'static> {
    /// One group's collective.
    Direct(C::Pending<T>),
    /// A shard group's reduction whose result is then all-reduced across the replicas.
    Then {
        /// The shard group's reduction.
        first: C::Pending<T>,
        /// The replica group.
        replicas: Arc<Mutex<C>>,
        /// The reduction's op.
        op: ReduceOp,
        /// Issues and waits for the replica all-reduce of `first`'s result.
        finish: fn(T, &Mutex<C>, ReduceOp) -> Result<T, CommError>,
    },
    /// Nothing to wait for.
    Ready(T),
    /// A collective whose result is rearranged when it is waited for (the second step of
    /// a node-first gather, which hands back the first step's input).
    Deferred(Box<dyn FnOnce() -> Result<T, CommError> + Send>),
}

impl<C: Communicator, T: Send + 'static> Completion for TieredWork<C, T> {
    type Output = T;

    fn wait(self) -> Result<T, CommError> {
        match self {
            Self::Direct(w) => w.wait(),
            Self::Then {
                first,
                replicas,
                op,
                finish,
            } => finish(first.wait()?, &replicas, op),
            Self::Ready(t) => Ok(t),
            Self::Deferred(f) => f(),
        }
    }

    /// A reduction across replicas reports `false` until waited for (its second half is
    /// issued then).
    fn is_complete(&self) -> bool {
        match self {
            Self::Direct(w) => w.is_complete(),
            Self::Then { .. } | Self::Deferred(_) => false,
            Self::Ready(_) => true,
        }
    }
}

#[allow(clippy::type_complexity)]
impl<C: Communicator> Communicator for Tiered<C> {
    type Buffer = C::Buffer;
    type Pending<T: Send + 'static> = TieredWork<C, T>;

    fn rank(&self) -> usize {
        self.shard.rank()
    }

    fn world_size(&self) -> usize {
        self.shard.world_size()
    }

    fn all_reduce(
        &self,
        buf: Self::Buffer,
        op: ReduceOp,
    ) -> Result<Self::Pending<Self::Buffer>, CommError> {
        self.book_shard(OpKind::AllReduce, &buf, 0);
        if self.replicas.is_some() {
            // (The same elements cross the replicas: the whole buffer.)
            self.book_replicas(&buf, buf.len());
        }
        let first = self.shard.all_reduce(buf, op)?;
        Ok(self.then_replicas(first, op, replica_reduce::<C>))
    }

    fn reduce_scatter(
        &self,
        input: Self::Buffer,
        output: Self::Buffer,
        op: ReduceOp,
    ) -> Result<Self::Pending<(Self::Buffer, Self::Buffer)>, CommError> {
        self.book_shard(OpKind::ReduceScatter, &input, 0);
        if self.replicas.is_some() {
            self.book_replicas(&output, output.len());
        }
        let first = self.shard.reduce_scatter(input, output, op)?;
        Ok(self.then_replicas(first, op, replica_reduce_pair::<C>))
    }

    fn all_gather(
        &self,
        input: Self::Buffer,
        output: Self::Buffer,
    ) -> Result<Self::Pending<(Self::Buffer, Self::Buffer)>, CommError> {
        self.book_shard(OpKind::AllGather, &output, 0);
        Ok(TieredWork::Direct(self.shard.all_gather(input, output)?))
    }

    fn broadcast(
        &self,
        buf: Self::Buffer,
        root: usize,
    ) -> Result<Self::Pending<Self::Buffer>, CommError> {
        self.book_shard(OpKind::Broadcast, &buf, root);
        Ok(TieredWork::Direct(self.shard.broadcast(buf, root)?))
    }

    fn barrier(&self) -> Result<Self::Pending<()>, CommError> {
        let mut s = self.stats.get();
        let (rank, world) = (self.shard.rank(), self.shard.world_size());
        s.tier_mut(self.layout.shard_tier())
            .record(OpKind::Barrier, 0, 0, rank, world, 0);
        self.stats.set(s);
        Ok(TieredWork::Direct(self.shard.barrier()?))
    }

    fn split(&self, color: usize, key: usize) -> Result<Self, CommError> {
        // A sub-group of the shard group, flat.
        let comm = self.shard.split(color, key)?;
        Tiered::flat(comm, self.layout.ranks_per_node)
    }

    fn stats(&self) -> CommStats {
        self.stats.get().total()
    }

    fn held_bytes(&self) -> usize {
        let reps = self
            .replicas
            .as_ref()
            .and_then(|r| r.lock().ok().map(|r| r.held_bytes()))
            .unwrap_or(0);
        self.shard.held_bytes()
            + reps
            + self.secondary.as_ref().map_or(0, |s| s.held_bytes())
            + self._world.as_ref().map_or(0, |w| w.held_bytes())
    }

    fn reset_stats(&self) {
        self.stats.set(TierStats::default());
    }
}
