//! Elements sent by tier (inside a node, across nodes) and the formulas beside them, for
//! flat ZeRO, shard groups (`mics_shard_size`) and hpZ (`zero_hpz_partition_size`).
//!
//! Per optimizer step of `K` micro-steps, on a rank of shard group size `S`, `R = N/S`
//! replicas, hpZ groups of `H`, with Ψ' the padded trainable elements and Φ' stage 3's
//! padded frozen-bucket elements (`n_b` a bucket's, `p_b = n_b / S` its partition, and
//! `own_W(n, w)` the `even_split(n, W, w)` share of rank `w` of `W`):
//!
//! | traffic | tier | elements |
//! |---|---|---|
//! | the stage's reductions and gathers inside the shard group | the shard group's | the flat formula with `N → S` (`3KΨ'(S−1)/S` at stage 3) |
//! | hpZ: each micro-step's second gather of a bucket reads the node's `H` ranks instead | intra-node | `K·Σ_b (n_b − own_H(n_b, h))` added, `K(Ψ'+Φ')(S−1)/S` taken off the shard group's |
//! | `mics_hierarchical_params_gather` (a shard group of `k` whole nodes, `G` ranks each): each shard-group gather of a bucket across the nodes (a block of `n_b/G`), then inside the node | intra-node | `n_b − n_b/G` of each gather's `n_b − n_b/S` moved off the shard group's (inter-node) tier, which keeps `n_b/G − n_b/S`; `2K` gathers per step, `K` with hpZ |
//! | each bucket's reduced partition all-reduced across the replicas | the replica group's | `2·Σ_b (p_b − own_R(p_b, ρ))` once per step (`≈ 2Ψ'(R−1)/(RS)`): stage 1 reduces once per step, stages 2–3 sum the window's reduce-scatters inside the shard group and all-reduce the sum when the step opens ([`Engine::sync_replicas`]); with `offload_optimizer` too, whose window sum in host memory crosses back to the device in chunks for it (without accumulation the one reduction is all-reduced before it crosses) |
//!
//! A group is intra-node when all its ranks sit on one node (`ranks_per_node`), else
//! inter-node.

use super::grad_state::ReducedIn;
use super::offload::HostGrads;
use super::{CommCounters, Engine};
use crate::device::Device;
use crate::EngineError;
use zero_comm::{even_split, Communicator, Completion, ReduceOp, Tier, TierStats};
use zero_kernels::DType;

/// Counters of elements sent, by purpose, for each tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierCounters {
    /// Groups whose ranks all sit on one node.
    pub intra_node: CommCounters,
    /// Groups that span nodes.
    pub inter_node: CommCounters,
}

impl TierCounters {
    /// The counters of `tier`.
    pub fn tier_mut(&mut self, tier: Tier) -> &mut CommCounters {
        match tier {
            Tier::IntraNode => &mut self.intra_node,
            Tier::InterNode => &mut self.inter_node,
        }
    }

    /// Books what `after − before` sent, under `category`, per tier.
    pub(super) fn book(
        &mut self,
        category: fn(&mut CommCounters) -> &mut u64,
        before: TierStats,
        after: TierStats,
    ) {
        *category(&mut self.intra_node) +=
            after.intra_node.total_elements() - before.intra_node.total_elements();
        *category(&mut self.inter_node) +=
            after.inter_node.total_elements() - before.inter_node.total_elements();
    }

    /// `self − other`, field by field.
    pub(super) fn since(self, other: TierCounters) -> TierCounters {
        TierCounters {
            intra_node: self.intra_node.since(other.intra_node),
            inter_node: self.inter_node.since(other.inter_node),
        }
    }
}

impl CommCounters {
    /// `self − other`, field by field.
    pub(super) fn since(self, other: CommCounters) -> CommCounters {
        CommCounters {
            grad_reduce: self.grad_reduce - other.grad_reduce,
            param_gather: self.param_gather - other.param_gather,
            control: self.control - other.control,
        }
    }
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// The gradient reductions and parameter gathers of one step, by tier `(intra, inter)`,
    /// from `flat`, the stage's formula inside the shard group (see the module docs), and
    /// the formula's words.
    pub(super) fn tier_theory(&self, flat: u64, flat_formula: &str) -> (u64, u64, String) {
        let layout = self.comm.layout();
        let k = self.cfg.gradient_accumulation_steps.max(1);
        let mut tiers = [0u64; 2];
        let at = |t: Tier| match t {
            Tier::IntraNode => 0,
            Tier::InterNode => 1,
        };
        tiers[at(layout.shard_tier())] += flat;
        let mut formula = flat_formula.replace("(N-1)/N", "(S-1)/S");
        if let Some((h, size)) = self.comm.secondary() {
            let s = self.shard.size;
            let (mut moved, mut added) = (0u64, 0u64);
            for b in (0..self.plan.buckets.len()).filter(|&b| self.params_sharded(b)) {
                let n = self.plan.buckets[b].layout.total_len();
                moved += (n - even_split(n, s, self.shard.rank).len()) as u64;
                added += (n - even_split(n, size, h).len()) as u64;
            }
            tiers[at(layout.shard_tier())] -= k * moved;
            tiers[at(Tier::IntraNode)] += k * added;
            formula.push_str(&format!(
                "; hpZ (H = {size}): the second gather of each micro-step inside the node, K(Ψ+Φ)(H-1)/H intra-node in place of K(Ψ+Φ)(S-1)/S"
            ));
        }
        if let Some(nodes) = self.comm.hierarchical_nodes() {
            // mics_hierarchical_params_gather: each shard-group gather of a bucket sends
            // its block's n/G − n/S across the nodes, then n − n/G inside the node, instead
            // of n − n/S across.
            let gathers = k * if self.comm.secondary().is_some() {
                1
            } else {
                2
            };
            let mut moved = 0u64;
            for b in (0..self.plan.buckets.len()).filter(|&b| self.params_sharded(b)) {
                let n = self.plan.buckets[b].layout.total_len();
                if let Some(block) = self.comm.gather_block_len(n) {
                    moved += (n - block) as u64;
                }
            }
            if moved > 0 {
                tiers[at(layout.shard_tier())] -= gathers * moved;
                tiers[at(Tier::IntraNode)] += gathers * moved;
                formula.push_str(&format!(
                    "; hierarchical gathers (k = {nodes} nodes per shard group, across the nodes first): each sends (Ψ+Φ)(k-1)/S inter-node and (Ψ+Φ)(G-1)/G intra-node"
                ));
            }
        }
        if layout.replicas() > 1 {
            let (rho, r) = (layout.replica(), layout.replicas());
            // Once per step: stage 1 reduces once, stages 2–3 all-reduce the window's sum
            // (`sync_replicas`), or without accumulation the step's one reduction.
            let mut per = 0u64;
            for plan in self.plan.trainable() {
                let p = plan.layout.partition_len();
                per += 2 * (p - even_split(p, r, rho).len()) as u64;
            }
            tiers[at(layout.replica_tier())] += per;
            formula.push_str(&format!(
                "; replicas (R = {r}): the step's reduced partition all-reduced once, 2Ψ(R-1)/(RS)"
            ));
        }
        (tiers[0], tiers[1], formula)
    }
}

/// Elements of a host partition that cross to the device for the replicas' all-reduce at
/// a time (the offloaded step's chunk, [`stage_elements`](super::offload::stage_elements)).
fn host_sync_chunk(len: usize) -> usize {
    super::offload::stage_elements().min(len).max(1)
}

/// Where the sum a step reads of a bucket sits while its replicas all-reduce it.
enum WindowSum {
    /// The fp32 carry of a reopened micro-step.
    Carry,
    /// The gradient buffer the optimizer reads.
    Reduced(ReducedIn),
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// Whether stages 2–3's reduce-scatters stay inside the shard group and the window's
    /// sum crosses the replicas once, in [`sync_replicas`](Self::sync_replicas): with the
    /// partitions on the device, and in host memory (`offload_optimizer`) when the window
    /// adds its reductions there (accumulation). Without accumulation a host partition
    /// takes one reduction per step, all-reduced across the replicas before it crosses
    /// (as many elements, and no crossing back).
    pub(super) fn replicas_reduce_at_step(&self) -> bool {
        self.policy.shards_gradients() && self.host_grads().is_none_or(|h| h.adds())
    }

    /// The second half of stages 2–3's reductions with shard groups: each trainable
    /// bucket's window sum (its carry when a micro-step was reopened, else its reduced
    /// partition) all-reduced across the replicas, bucket by bucket in the same order on
    /// every rank. Called when the step opens, after every reduce-scatter of the window
    /// finished inside the shard group. Nothing to do without replicas, at stages 0–1
    /// (whose one reduction per step is chained across the replicas already) and with the
    /// partitions in host memory (each reduction was all-reduced before it crossed).
    pub(super) fn sync_replicas(&mut self) -> Result<(), EngineError> {
        if !self.comm.has_replicas() || !self.replicas_reduce_at_step() {
            return Ok(());
        }
        // (Taken out while its partitions cross, and put back whatever happens.)
        if let Some(mut host) = self.offload.as_mut().and_then(|o| o.host_grads.take()) {
            let synced = self.sync_host_replicas(&mut host);
            if let Some(o) = self.offload.as_mut() {
                o.host_grads = Some(host);
            }
            return synced;
        }
        // Every bucket's all-reduce is issued before the first is waited for (they run
        // together where the group is asynchronous, NCCL's), and put back in bucket order.
        let mut issued = Vec::with_capacity(self.plan.trainable_buckets);
        for b in self.trainable_range() {
            let state = &mut self.buckets[b];
            let (buf, at) = match state.carry.take() {
                Some(carry) => (carry, WindowSum::Carry),
                None => {
                    let (buf, at) = state.grads.lend_reduced(b)?;
                    (buf, WindowSum::Reduced(at))
                }
            };
            let work = self.issue(
                |c| &mut c.grad_reduce,
                |comm| comm.replicas_all_reduce(buf, ReduceOp::Avg),
            )?;
            issued.push((b, at, work));
        }
        for (b, at, work) in issued {
            let buf = work.wait()?;
            let state = &mut self.buckets[b];
            match at {
                WindowSum::Carry => state.carry = Some(buf),
                WindowSum::Reduced(at) => state.grads.put_reduced(buf, at),
            }
        }
        Ok(())
    }

    /// Device bytes [`sync_host_replicas`](Self::sync_host_replicas) holds while it runs:
    /// one chunk of the largest partition, in fp32 at most (a reopened micro-step's carry).
    pub(super) fn host_sync_bytes(&self) -> usize {
        if !self.comm.has_replicas()
            || !self.replicas_reduce_at_step()
            || self.host_grads().is_none()
        {
            return 0;
        }
        let largest = self
            .plan
            .trainable()
            .iter()
            .map(|b| b.layout.partition_len())
            .max()
            .unwrap_or(0);
        host_sync_chunk(largest) * DType::F32.size_of()
    }

    /// [`sync_replicas`](Self::sync_replicas) with the partitions in host memory
    /// (`offload_optimizer` with accumulation): each bucket's window sum (its fp32 carry
    /// when a micro-step was reopened, else its partition, in the accumulator's dtype)
    /// crosses to the device in chunks of at most [`host_sync_chunk`] elements, is
    /// all-reduced across the replicas there (NCCL serves device memory only) and crosses
    /// back: every rank issues the same chunks in the same order, a partition's length
    /// being the same on every replica. One chunk is on the device at a time.
    fn sync_host_replicas(&mut self, host: &mut HostGrads) -> Result<(), EngineError> {
        let mut staging: Option<C::Buffer> = None;
        for b in self.trainable_range() {
            let (dtype, len) = {
                let g = host.step_grads(b)?;
                (g.dtype(), g.len())
            };
            let chunk = host_sync_chunk(len);
            for at in (0..len).step_by(chunk) {
                let n = chunk.min(len - at);
                let mut buf = match staging.take() {
                    Some(buf) if self.dev.dtype(&buf) == dtype && self.dev.len(&buf) == n => buf,
                    _ => self.dev.zeros(dtype, n)?,
                };
                self.dev
                    .copy_from_host(host.step_grads(b)?, at..at + n, &mut buf, 0)?;
                let work = self.issue(
                    |c| &mut c.grad_reduce,
                    |comm| comm.replicas_all_reduce(buf, ReduceOp::Avg),
                )?;
                let buf = work.wait()?;
                self.dev
                    .copy_to_host(&buf, 0..n, host.step_grads_mut(b)?, at)?;
                staging = Some(buf);
            }
        }
        Ok(())
    }
}
