//! Stage 3: parameters are gathered bucket by bucket just before use and freed right after.
//!
//! The first micro-step records the order of `fetch` calls (the trace). Later passes use it
//! to prefetch the next buckets, up to `stage3_prefetch_bucket_size` elements ahead and
//! never more than `stage3_max_live_parameters` gathered at once, and to keep a released
//! bucket whose next use is close: a bucket is kept if the elements of the other buckets
//! the trace gathers from now up to its next use are at most `stage3_max_reuse_distance`
//! (DeepSpeed's parameters between two uses), so a bucket whose next module is one of its
//! own stays gathered (a bucket spans several modules: freeing it would only gather it
//! again at once); 0 keeps none, DeepSpeed's "no reuse" (each module of a bucket then
//! gathers it again). If a pass departs from the trace, the trace is dropped: no
//! prefetch, no reuse, until it is recorded again. Persistent buckets are never gathered
//! or freed. A module with frozen parameters over the threshold has a frozen bucket too
//! (see [`crate::plan`]): it is fetched, prefetched and released with the trainable one.

use super::gather_state::{Source, Waited};
use super::{Engine, W2};
use crate::device::Device;
use crate::EngineError;
use std::time::Instant;
use zero_comm::{Communicator, Completion};

/// Elements of the buckets gathered whole now (in flight or ready), and the most at once
/// (the memory report's `gathered` and `peak_gathered`).
#[derive(Debug, Default)]
pub(super) struct Live {
    pub(super) now: usize,
    pub(super) peak: usize,
}

impl Live {
    fn add(&mut self, n: usize) {
        self.now += n;
        self.peak = self.peak.max(self.now);
    }

    fn remove(&mut self, n: usize) {
        self.now -= n;
    }
}

/// The recorded order of `fetch` calls in one pass (forward and backward).
#[derive(Debug, Default)]
pub(super) struct Trace {
    modules: Vec<usize>,
    valid: bool,
    /// Index of the next `fetch` in the pass.
    pos: usize,
    /// Times a pass departed from the trace.
    pub invalidations: u64,
}

impl Trace {
    /// The pass under way had no backward: its fetches are not a pass to follow (a trace
    /// being recorded starts over; a valid one is kept).
    fn abandon_pass(&mut self) {
        if !self.valid {
            self.modules.clear();
        }
        self.pos = 0;
    }

    pub fn end_pass(&mut self) {
        if !self.modules.is_empty() {
            self.valid = true;
        }
        self.pos = 0;
    }

    fn observe(&mut self, m: usize) {
        if self.valid {
            if self.modules.get(self.pos) != Some(&m) {
                // Re-record from here on: the new order becomes the trace at the pass end.
                self.valid = false;
                self.invalidations += 1;
                self.modules.truncate(self.pos);
                self.modules.push(m);
            }
        } else {
            self.modules.push(m);
        }
        self.pos += 1;
    }
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// Makes module `m`'s parameters available, before its forward and again before its
    /// backward. Stages 0–2: nothing to do. Stage 3: gathers the module's bucket (waiting
    /// for a prefetch if one is in flight) and prefetches the next ones.
    pub fn fetch(&mut self, m: usize) -> Result<(), EngineError> {
        self.module(m)?;
        self.timings.touch();
        if self.pass.fetch(m) {
            self.timings.backward_started();
        }
        if !self.policy.shards_parameters() {
            return Ok(());
        }
        if self.trace.pos == 0 && !self.trace.valid {
            self.trace.modules.clear();
        }
        self.trace.observe(m);
        let buckets = self.plan.fetch_buckets[m].clone();
        if buckets.is_empty() {
            return Ok(());
        }
        let t0 = Instant::now();
        for &b in &buckets {
            self.issue_gather(b)?;
        }
        for &b in &buckets {
            self.wait_gather(b)?;
        }
        self.prefetch()?;
        self.timings.add_gather(t0.elapsed());
        Ok(())
    }

    /// Ends a forward pass that will have no backward (under `torch.no_grad()`, in
    /// evaluation, or whose loss was dropped): every bucket it gathered or prefetched is
    /// freed, and its fetches neither start the backward phase nor become the trace.
    /// Gradients of the micro-step, if any, are untouched.
    pub fn abandon_pass(&mut self) -> Result<(), EngineError> {
        self.pass.forget_fetches();
        self.trace.abandon_pass();
        if self.policy.shards_parameters() {
            self.free_all_gathered()?;
        }
        Ok(())
    }

    /// Whether parameter `k` of module `m` is kept whole on every rank (stage 3 keeps
    /// parameters at or under `stage3_param_persistence_threshold` whole, frozen or not;
    /// stages 0–2 keep every parameter whole).
    pub fn param_persistent(&self, m: usize, k: usize) -> Result<bool, EngineError> {
        Ok(match self.plan.locs[self.param_id(m, k)?] {
            crate::plan::ParamLoc::Frozen { .. } => true,
            crate::plan::ParamLoc::Bucket { bucket, .. } => !self.params_sharded(bucket),
        })
    }

    /// Declares module `m` done for now. Stage 3 frees its gathered bucket unless the
    /// trace says it is reused soon (see the module docs).
    pub fn release(&mut self, m: usize) -> Result<(), EngineError> {
        self.module(m)?;
        if !self.policy.shards_parameters() {
            return Ok(());
        }
        for b in self.plan.fetch_buckets[m].clone() {
            if self.reused_soon(b) {
                continue;
            }
            self.wait_gather(b)?;
            self.free_gathered(b);
        }
        Ok(())
    }

    fn reused_soon(&self, b: usize) -> bool {
        if !self.trace.valid || self.cfg.zero.max_reuse_distance == 0 {
            return false;
        }
        // The elements of the other buckets gathered before b's next use, each once: b's
        // own do not count (kept, it is not gathered again), so a bucket whose next use
        // comes before any other bucket's stays gathered.
        let mut distance = 0u64;
        let mut between: Vec<usize> = Vec::new();
        for &m in &self.trace.modules[self.trace.pos.min(self.trace.modules.len())..] {
            for &next in &self.plan.fetch_buckets[m] {
                if next == b {
                    return distance <= self.cfg.zero.max_reuse_distance;
                }
                if !between.contains(&next) {
                    between.push(next);
                    distance += self.plan.buckets[next].layout.total_len() as u64;
                    if distance > self.cfg.zero.max_reuse_distance {
                        return false;
                    }
                }
            }
        }
        false
    }

    fn issue_gather(&mut self, b: usize) -> Result<(), EngineError> {
        if !self.buckets[b].gather.is_idle() {
            return Ok(());
        }
        let (part, total) = (
            self.plan.buckets[b].layout.partition_len(),
            self.plan.buckets[b].layout.total_len(),
        );
        let output = self.dev.zeros(self.dtype, total)?;
        if let Some(piece) = self.buckets[b].secondary.take() {
            // hpZ: inside the node, from the pieces the micro-step's first gather left.
            let work = self.issue(
                |c| &mut c.param_gather,
                |comm| comm.secondary_all_gather(piece, output),
            )?;
            self.buckets[b].gather.start(work, Source::Secondary);
        } else {
            let input = self.shard_input(b)?;
            debug_assert_eq!(self.dev.len(&input), part);
            let work = self.issue_all_gather(input, output)?;
            self.buckets[b].gather.start(work, Source::Primary);
        }
        self.live.add(total);
        Ok(())
    }

    fn wait_gather(&mut self, b: usize) -> Result<(), EngineError> {
        match self.buckets[b].gather.wait()? {
            Waited::Nothing => {}
            Waited::Secondary(piece) => self.buckets[b].secondary = Some(piece),
            Waited::Primary => self.keep_secondary(b)?,
        }
        Ok(())
    }

    /// hpZ: keeps this rank's piece `even_split(n, H, h)` of bucket `b`, just gathered,
    /// for the micro-step's later gathers (nothing without hpZ).
    fn keep_secondary(&mut self, b: usize) -> Result<(), EngineError> {
        let Some((h, size)) = self.comm.secondary() else {
            return Ok(());
        };
        let Some(full) = self.buckets[b].gather.ready() else {
            return Ok(());
        };
        let range = zero_comm::even_split(self.dev.len(full), size, h);
        let mut piece = self.dev.zeros(self.dtype, range.len())?;
        self.dev.copy(full, range, &mut piece, 0)?;
        self.buckets[b].secondary = Some(piece);
        Ok(())
    }

    /// hpZ: drops every secondary piece (a micro-step ended, or the parameters changed):
    /// the next gather of each bucket reads the partitions again.
    pub(super) fn drop_secondaries(&mut self) {
        for state in self.buckets.iter_mut() {
            state.secondary = None;
        }
    }

    fn free_gathered(&mut self, b: usize) {
        if self.buckets[b].gather.release() {
            self.live.remove(self.plan.buckets[b].layout.total_len());
        }
    }

    fn prefetch(&mut self) -> Result<(), EngineError> {
        if !self.trace.valid {
            return Ok(());
        }
        let (budget, max_live) = (
            self.cfg.zero.prefetch_bucket_size,
            self.cfg.zero.max_live_parameters,
        );
        let upcoming: Vec<usize> = self.trace.modules
            [self.trace.pos.min(self.trace.modules.len())..]
            .iter()
            .flat_map(|&m| self.plan.fetch_buckets[m].iter().copied())
            .collect();
        self.gather_window(&upcoming, budget, max_live)?;
        // Past the window, NVMe's parameter blocks are read ahead in the trace's order.
        if let Some(tier) = self.param_tier.as_mut() {
            let buckets = &self.buckets;
            tier.read_ahead(
                upcoming
                    .iter()
                    .copied()
                    .filter(|&b| buckets[b].gather.is_idle()),
            )?;
        }
        Ok(())
    }

    /// Issues the gathers of `upcoming`'s first `budget` elements, never past `max_live`
    /// gathered. The window counts buckets already gathered or in flight (each once):
    /// otherwise every fetch would reach a budget further, and a pass would end with the
    /// whole model gathered.
    fn gather_window(
        &mut self,
        upcoming: &[usize],
        budget: u64,
        max_live: u64,
    ) -> Result<(), EngineError> {
        let mut ahead = 0u64;
        let mut seen = Vec::new();
        for &b in upcoming {
            if ahead >= budget {
                break;
            }
            if seen.contains(&b) {
                continue;
            }
            seen.push(b);
            let total = self.plan.buckets[b].layout.total_len();
            ahead += total as u64;
            if !self.buckets[b].gather.is_idle() {
                continue;
            }
            if (self.live.now + total) as u64 > max_live {
                break;
            }
            self.issue_gather(b)?;
        }
        Ok(())
    }

    /// Bucket `b` whole, gathered now on every rank (a collective, outside the fetch
    /// machinery: for a save), where its parameters are partitioned; `None` where this
    /// rank holds them whole.
    pub(super) fn gather_if_sharded(&mut self, b: usize) -> Result<Option<C::Buffer>, EngineError> {
        if !self.params_sharded(b) {
            return Ok(None);
        }
        let input = self.shard_input(b)?;
        let output = self
            .dev
            .zeros(self.dtype, self.plan.buckets[b].layout.total_len())?;
        let work = self.issue_all_gather(input, output)?;
        Ok(Some(work.wait()?.1))
    }

    /// The shard group's all-gather of a bucket's partition `input` into `output`: in two
    /// steps, across the nodes and then inside the node, where
    /// `mics_hierarchical_params_gather` applies (through a block of `total / G` elements
    /// held until the gather is waited for), else in one.
    fn issue_all_gather(
        &mut self,
        input: C::Buffer,
        output: C::Buffer,
    ) -> Result<W2<C>, EngineError> {
        let block = match self.comm.gather_block_len(self.dev.len(&output)) {
            Some(len) => Some(self.dev.zeros(self.dtype, len)?),
            None => None,
        };
        self.issue(
            |c| &mut c.param_gather,
            |comm| match block {
                Some(block) => comm.hierarchical_all_gather(input, block, output),
                None => comm.all_gather(input, output),
            },
        )
    }

    /// Waits for every gather in flight (the buckets stay gathered).
    pub(super) fn wait_all_gathers(&mut self) -> Result<(), EngineError> {
        for b in 0..self.buckets.len() {
            self.wait_gather(b)?;
        }
        Ok(())
    }

    /// Frees every gathered bucket (their contents are stale after a step), and hpZ's
    /// secondary pieces.
    pub(super) fn free_all_gathered(&mut self) -> Result<(), EngineError> {
        for b in 0..self.buckets.len() {
            self.wait_gather(b)?;
            self.free_gathered(b);
        }
        self.drop_secondaries();
        Ok(())
    }
}
