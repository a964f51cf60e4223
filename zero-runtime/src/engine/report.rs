//! What the engine reports: memory by category, communication by purpose, time by phase.

use super::tiers::TierCounters;
use super::{CommCounters, Engine};
use crate::device::Device;
use crate::scaler::ScaleChange;
use std::fmt;
use std::time::{Duration, Instant};
use zero_comm::Communicator;

/// What `step()` did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepOutcome {
    /// Whether the step was skipped because some gradient was not finite.
    pub skipped: bool,
    /// The unscaled global gradient norm before clipping (NaN when skipped).
    pub grad_norm: f64,
    /// The loss scale the gradients carried.
    pub loss_scale: f64,
    /// The learning rate used (or that would have been used).
    pub lr: f64,
    /// What the loss scaler did.
    pub scale_change: ScaleChange,
}

/// Bytes one rank keeps in a memory tier off the device (host RAM or NVMe), by category.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TierBytes {
    /// 16-bit parameters (`offload_param`).
    pub params: usize,
    /// fp32 master weights.
    pub master: usize,
    /// fp32 first moments.
    pub exp_avg: usize,
    /// fp32 second moments.
    pub exp_avg_sq: usize,
    /// Stages 2–3 with `offload_optimizer`: the reduced gradient partitions the step
    /// reads, in the gradients' dtype.
    pub grads: usize,
    /// The same partitions where a window of 16-bit gradients is summed in fp32
    /// (`data_types.grad_accum_dtype`): the fp32 accumulators, which the step reads.
    pub grad_accum: usize,
    /// Staging and pipeline buffers: one sub-group's gradients and parameters crossing
    /// to and from the device, and the NVMe pipeline's blocks.
    pub buffers: usize,
}

impl TierBytes {
    /// Everything in the tier.
    pub fn total(&self) -> usize {
        self.params
            + self.master
            + self.exp_avg
            + self.exp_avg_sq
            + self.grads
            + self.grad_accum
            + self.buffers
    }
}

/// Bytes one rank holds, by category. The top-level fields are device memory (what the
/// ZeRO paper's formula counts); [`host`](Self::host) and [`nvme`](Self::nvme) are what
/// offloading moved off the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryReport {
    /// 16-bit (or fp32) parameters: whole buckets, or owned partitions in stage 3.
    pub params: usize,
    /// Gradients kept for the step: whole buckets (stages 0–1) or owned partitions.
    pub grads: usize,
    /// fp32 master weights (none apart when fp32 parameters are their own).
    pub master: usize,
    /// fp32 first moments.
    pub exp_avg: usize,
    /// fp32 second moments.
    pub exp_avg_sq: usize,
    /// Gradient accumulation buffers (only with accumulation > 1), in
    /// `data_types.grad_accum_dtype`.
    pub grad_accum: usize,
    /// Staging buffers of gradient buckets (stages 2–3).
    pub buckets: usize,
    /// Gathered whole buckets right now (stage 3).
    pub gathered: usize,
    /// The most gathered at once so far (stage 3).
    pub peak_gathered: usize,
    /// hpZ's secondary pieces held now (stage 3, `zero_hpz_partition_size` H): this rank's
    /// `1/H` of each bucket gathered in the micro-step, at most `(Ψ' + Φ')/H` elements.
    pub hpz_secondary: usize,
    /// Frozen parameters on the device: whole on every rank, except stage 3's frozen
    /// buckets, of which this rank holds its partitions (on the host with
    /// `offload_param`: in `host`).
    pub frozen: usize,
    /// Bytes counted here or in [`host`](Self::host) that are not resident: the
    /// gradients (stages 2–3's shards, on the device or, with `offload_optimizer`, in
    /// host memory; stages 0–1's whole buckets), whose host pages go back to the kernel
    /// when a step ends and return as the next backward writes them (as DeepSpeed frees
    /// its gradients between steps). Device memory stays allocated: on a GPU this counts
    /// only the host partitions.
    pub released: usize,
    /// Host memory the communicator keeps for its collectives (the shared-memory group's
    /// windows).
    pub comm: usize,
    /// Ψ: trainable parameters.
    pub numel: usize,
    /// Ψ': trainable parameters with alignment padding.
    pub padded_numel: usize,
    /// The ZeRO paper's model-state bytes for this stage, Ψ' and world size (all on the
    /// device, as without offload).
    pub formula: usize,
    /// Host RAM taken by offloading.
    pub host: TierBytes,
    /// NVMe taken by offloading (swap files).
    pub nvme: TierBytes,
    /// What the device's allocator counts in use by the process (CUDA: the default memory
    /// pool's used bytes, every zero buffer of every engine in the process; `None` on the
    /// host). With one engine it should match [`device_total`](Self::device_total): the
    /// report's check.
    pub allocator_used: Option<usize>,
    /// The most [`allocator_used`](Self::allocator_used) ever was in this process (CUDA:
    /// the default pool's high-water mark; `None` on the host): a run's peak.
    pub allocator_peak: Option<usize>,
    /// Issue 48 item 2's bound on the engine's device memory at any moment of a step,
    /// the first included: the buffers at rest ([`device_total`](Self::device_total) less
    /// [`gathered`](Self::gathered)), plus the most gathered at once
    /// ([`peak_gathered`](Self::peak_gathered), at most `stage3_max_live_parameters`),
    /// plus their partitions copied as the all-gathers' inputs (`peak_gathered / N`),
    /// plus, with `mics_hierarchical_params_gather` on nodes of `G` ranks, the blocks
    /// those gathers fill across the nodes first (`peak_gathered / G`),
    /// plus one gathered bucket whose release the stream has not reached yet (a freed
    /// buffer returns to the pool when the device runs the free, in stream order), plus
    /// the inputs of the all-gathers after a step (the partitions of the buckets kept
    /// whole: stages 1–2, stage 3's persistent ones) and stage 1's reduce-scatter outputs
    /// (its partition), plus, with shard groups and `offload_optimizer` at accumulation,
    /// the chunk through which the host partitions cross for the replicas' all-reduce
    /// at the step. What a trainer holds (activations, its own copies) comes on top.
    /// Checked against the pool's high-water mark at stage 3 (`big_model_gpu.rs` on the
    /// stand-in).
    pub device_bound: usize,
}

impl MemoryReport {
    /// Parameters + gradients + master + moments on the device: what the paper's formula
    /// counts.
    pub fn model_states(&self) -> usize {
        self.params + self.grads + self.master + self.exp_avg + self.exp_avg_sq
    }

    /// Every category held on the device: model states, accumulation buffers, gradient
    /// staging, gathered buckets, hpZ's pieces and frozen parameters.
    pub fn device_total(&self) -> usize {
        self.model_states()
            + self.grad_accum
            + self.buckets
            + self.gathered
            + self.hpz_secondary
            + self.frozen
    }

    /// Model states in every tier: device, host and NVMe (equal to the formula when
    /// offloading only moves them).
    pub fn model_states_all_tiers(&self) -> usize {
        let off = |t: &TierBytes| t.params + t.grads + t.master + t.exp_avg + t.exp_avg_sq;
        self.model_states() + off(&self.host) + off(&self.nvme)
    }
}

/// Elements sent by this rank, by purpose.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommReport {
    /// Since the engine started.
    pub total: CommCounters,
    /// During the last call to `step()` and the micro-steps before it.
    pub last_step: CommCounters,
    /// Ψ': what one step's volume is measured in.
    pub padded_numel: usize,
    /// Φ': the frozen elements stage 3 partitions (with padding), gathered with their
    /// modules; 0 below stage 3.
    pub frozen_padded_numel: usize,
    /// The paper's elements per optimizer step per rank for this stage and `K` micro-steps
    /// of gradient accumulation, gradient reduction plus parameter gathers: stages 0–1
    /// reduce once per step, 2Ψ'(N−1)/N; stage 2 reduce-scatters every micro-step and
    /// gathers once, (K+1)Ψ'(N−1)/N; stage 3 gathers twice and reduce-scatters once every
    /// micro-step, 3KΨ'(N−1)/N. With K = 1: 2Ψ and 3Ψ, the paper's. Stage 3 gathers the
    /// frozen buckets in the forward and the backward, 2KΦ'(N−1)/N more (a frozen module
    /// the backward never reaches, an embedding of token ids, is gathered once: the
    /// counters then show less than this figure).
    pub theory: u64,
    /// [`theory`](Self::theory) as a formula, e.g. `(K+1)Ψ(N-1)/N, K = 3`; with shard
    /// groups or hpZ, by tier (`engine/tiers.rs`).
    pub theory_formula: String,
    /// [`last_step`](Self::last_step) by tier: groups inside one node, groups across nodes
    /// (on one node, everything is intra-node).
    pub last_step_tiers: TierCounters,
    /// [`theory`](Self::theory)'s intra-node part.
    pub theory_intra_node: u64,
    /// [`theory`](Self::theory)'s inter-node part.
    pub theory_inter_node: u64,
}

/// Time by phase.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Timings {
    /// From a micro-step's first engine call to the start of backward (a module's second
    /// `fetch` in the micro-step, or its first gradient view, whichever comes first).
    pub forward: Duration,
    /// From the start of backward to the last `grads_ready`.
    pub backward: Duration,
    /// Issuing and waiting for gradient reductions.
    pub reduce: Duration,
    /// Stage 3: issuing and waiting for parameter gathers.
    pub gather: Duration,
    /// Inside `step()`.
    pub step: Duration,
}

impl fmt::Display for Timings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        write!(
            f,
            "time (ms) | forward: {:.2} | backward: {:.2} | reduce: {:.2} | gather: {:.2} | step: {:.2}",
            ms(self.forward),
            ms(self.backward),
            ms(self.reduce),
            ms(self.gather),
            ms(self.step)
        )
    }
}

/// Phase clock, inferred from the order of engine calls.
#[derive(Debug, Default)]
pub(super) struct Clock {
    micro_start: Option<Instant>,
    backward_start: Option<Instant>,
    current: Timings,
    last: Timings,
    total: Timings,
}

impl Clock {
    pub fn touch(&mut self) {
        self.micro_start.get_or_insert_with(Instant::now);
    }
    pub fn backward_started(&mut self) {
        self.touch();
        if self.backward_start.is_none() {
            let now = Instant::now();
            self.current.forward += now - self.micro_start.unwrap_or(now);
            self.backward_start = Some(now);
        }
    }
    pub fn micro_step_ended(&mut self) {
        if let Some(b) = self.backward_start.take() {
            self.current.backward += b.elapsed();
        }
        self.micro_start = None;
    }
    pub fn add_reduce(&mut self, d: Duration) {
        self.current.reduce += d;
    }
    pub fn add_gather(&mut self, d: Duration) {
        self.current.gather += d;
    }
    pub fn step_ended(&mut self, d: Duration) {
        self.current.step += d;
        self.last = std::mem::take(&mut self.current);
        for (t, l) in [
            (&mut self.total.forward, self.last.forward),
            (&mut self.total.backward, self.last.backward),
            (&mut self.total.reduce, self.last.reduce),
            (&mut self.total.gather, self.last.gather),
            (&mut self.total.step, self.last.step),
        ] {
            *t += l;
        }
    }
    pub fn last(&self) -> Timings {
        self.last
    }
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// With `offload_param` on NVMe: how many parameter blocks were opened from a read
    /// ahead (stage 3's prefetch reads the trace's next blocks into spare buffers) and how
    /// many were read when opened, `(ahead, waited)`; `None` without an NVMe tier.
    pub fn param_block_reads(&self) -> Option<(u64, u64)> {
        let r = self.param_tier.as_ref()?.block_reads()?;
        Some((r.ahead, r.waited))
    }

    /// This rank's bytes by category, beside the paper's formula for the stage.
    ///
    /// Formula, with `p` bytes per parameter (2 for fp16/bf16, 4 for fp32) and `N` ranks:
    /// stage 0 `(2p+12)Ψ'`, stage 1 `2pΨ' + 12Ψ'/N`, stage 2 `pΨ' + (p+12)Ψ'/N`, stage 3
    /// `(2p+12)Ψ'/N` — with p = 2: 16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N. fp32 parameters are
    /// their own master weights (unless offloaded), so 12 becomes 8 for p = 4: stage 0
    /// keeps 16Ψ, as DeepSpeed. Gradient accumulation in the gradients' own dtype
    /// (`data_types.grad_accum_dtype`'s default) adds no buffer: stages 0–1 sum in place,
    /// stages 2–3 add each later reduction (through a bucket-sized scratch output, counted
    /// in `buckets`) into the shard. fp32 sums of 16-bit gradients add an fp32 buffer
    /// (`grad_accum`): 4Ψ' in stages 0–1, 4Ψ'/N in stages 2–3.
    pub fn memory_report(&self) -> MemoryReport {
        let size = |b: &C::Buffer| self.dev.len(b) * self.dev.dtype(b).size_of();
        let opt_size = |o: Option<&C::Buffer>| o.map_or(0, size);
        let mut r = MemoryReport::default();
        for s in &self.buckets[self.trainable_range().end..] {
            r.frozen += opt_size(s.params.held());
        }
        for s in &self.buckets[self.trainable_range()] {
            r.params += opt_size(s.params.held());
            r.grads += opt_size(s.grads.kept());
            r.master += opt_size(s.opt.master.as_ref());
            r.exp_avg += size(&s.opt.exp_avg);
            r.exp_avg_sq += size(&s.opt.exp_avg_sq);
            r.grad_accum += opt_size(s.grads.accum());
            r.released += s.released;
        }
        let p = self.dtype.size_of();
        r.buckets = self.pool.allocated_elements() * p;
        r.gathered = self.live.now * p;
        r.peak_gathered = self.live.peak * p;
        let largest_gathered = (0..self.plan.buckets.len())
            .filter(|&b| self.params_sharded(b))
            .map(|b| self.plan.buckets[b].layout.total_len())
            .max()
            .unwrap_or(0);
        r.frozen += size(&self.frozen);
        r.hpz_secondary = self
            .buckets
            .iter()
            .map(|s| opt_size(s.secondary.as_ref()))
            .sum();
        // At most every gathered bucket's piece at once (by a micro-step's end).
        let hpz_most: usize = match self.comm.secondary() {
            Some((h, size)) => (0..self.plan.buckets.len())
                .filter(|&b| self.params_sharded(b))
                .map(|b| {
                    zero_comm::even_split(self.plan.buckets[b].layout.total_len(), size, h).len()
                })
                .sum(),
            None => 0,
        };
        r.comm = self.comm.held_bytes();
        r.allocator_used = self.dev.allocator_used();
        r.allocator_peak = self.dev.allocator_peak();
        if let Some(off) = &self.offload {
            r.released += off.report(&mut r.host, &mut r.nvme, self.dtype);
        }
        if let Some(tier) = &self.param_tier {
            tier.report(&mut r.host, &mut r.nvme);
        }
        let partitions = |keep: &dyn Fn(usize) -> bool| -> usize {
            self.trainable_range()
                .filter(|&b| keep(b))
                .map(|b| self.plan.buckets[b].layout.partition_len())
                .sum()
        };
        // After the step, the buckets kept whole (stages 1–2, stage 3's persistent ones)
        // all-gather their updated partitions, each from an input of its own, all issued
        // before the first is waited for; stage 1 reduce-scatters each bucket into an
        // output of its own, all in flight at once with overlap_comm.
        let step_inputs = if self.policy.shards_optimizer() {
            partitions(&|b| !self.params_sharded(b))
        } else {
            0
        };
        let stage1_outputs = if self.policy.stage == 1 {
            partitions(&|_| true)
        } else {
            0
        };
        // `mics_hierarchical_params_gather`: each gather in flight holds a block of its
        // bucket's 1/G (this place's pieces of every node) until it is waited for.
        let hierarchical_blocks = self.comm.gather_block_len(r.peak_gathered).unwrap_or(0);
        r.device_bound = r.device_total() - r.gathered - r.hpz_secondary
            + hpz_most * p
            + r.peak_gathered
            + r.peak_gathered / self.shard.size
            + hierarchical_blocks
            + self.host_sync_bytes()
            + (largest_gathered + step_inputs + stage1_outputs) * p;
        r.numel = self.plan.numel();
        r.padded_numel = self.plan.padded_numel();
        let (psi, n) = (r.padded_numel, self.shard.size);
        // Optimizer state bytes per parameter: master weights (unless the parameters are
        // them) and two moments.
        let o = if Self::keeps_master_apart(
            self.dtype,
            self.offload.is_some(),
            self.param_tier.is_some(),
        ) {
            12
        } else {
            8
        };
        r.formula = match self.policy.stage {
            0 => (2 * p + o) * psi,
            1 => 2 * p * psi + o * psi / n,
            2 => p * psi + (p + o) * psi / n,
            _ => (2 * p + o) * psi / n,
        };
        r
    }

    /// Elements sent by purpose, and the paper's per-step figure for this stage.
    pub fn comm_report(&self) -> CommReport {
        let psi = self.plan.padded_numel() as u64;
        let n = self.shard.size as u64;
        let k = self.cfg.gradient_accumulation_steps.max(1);
        let (factor, formula) = match self.policy.stage {
            0 | 1 => (2, "2Ψ(N-1)/N".to_string()),
            2 if k == 1 => (2, "2Ψ(N-1)/N".to_string()),
            2 => (k + 1, format!("(K+1)Ψ(N-1)/N, K = {k}")),
            _ if k == 1 => (3, "3Ψ(N-1)/N".to_string()),
            _ => (3 * k, format!("3KΨ(N-1)/N, K = {k}")),
        };
        let phi = self.plan.frozen_bucket_padded_numel() as u64;
        let (theory, formula) = if phi == 0 {
            (factor * psi * (n - 1) / n, formula)
        } else {
            let formula = match formula.split_once(", K = ") {
                Some((f, k)) => format!("{f} + 2KΦ(N-1)/N, K = {k}"),
                None => format!("{formula} + 2Φ(N-1)/N"),
            };
            ((factor * psi + 2 * k * phi) * (n - 1) / n, formula)
        };
        let (intra, inter, tier_formula) = self.tier_theory(theory, &formula);
        let layout = self.comm.layout();
        let flat = layout.replicas() == 1 && self.comm.secondary().is_none();
        CommReport {
            total: self.books.total,
            last_step: self.books.last_step,
            padded_numel: psi as usize,
            frozen_padded_numel: phi as usize,
            theory: intra + inter,
            theory_formula: if flat { formula } else { tier_formula },
            last_step_tiers: self.books.last_step_tiers,
            theory_intra_node: intra,
            theory_inter_node: inter,
        }
    }

    /// Time by phase in the last step.
    pub fn timings(&self) -> Timings {
        self.timings.last()
    }

    /// Time by phase since the engine started.
    pub fn total_timings(&self) -> Timings {
        self.timings.total
    }
}
