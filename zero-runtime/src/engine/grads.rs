//! Gradients: buckets filled in backward order and reduced as soon as they are complete.
//!
//! - Stages 0–1 keep whole-bucket gradients and reduce at the accumulation boundary:
//!   stage 0 all-reduces, stage 1 reduce-scatters into the owned partition. Gradients
//!   summed in their own dtype (`data_types.grad_accum_dtype`'s default) sum the
//!   micro-steps in place (the next micro-step adds to them), as DeepSpeed's accumulate in
//!   `.grad`; 16-bit gradients summed in fp32 go through an fp32 accumulator.
//! - Stages 2–3 reduce-scatter every micro-step from a recycled staging buffer straight
//!   into the owned partition (`grad_shard`). Summing a window in the gradients' dtype
//!   (`grad_accum_dtype`'s default), the shard is the sum: its window's first reduction
//!   writes it, each later one goes to a recycled scratch output that is then added in,
//!   as DeepSpeed's stage 3 copies, then adds, each reduced partition into its buffer.
//!   fp32 sums of 16-bit gradients add every reduced shard into an fp32 accumulator.
//!   The pool keeps as many staging buffers as the last micro-step had in use at once, so
//!   a pass that held many (every bucket, when the trainer declares modules ready only at
//!   the end) does not keep them for the rest of the run.
//!
//! With shard groups (`mics_shard_size`) the reduce-scatters of stages 2–3 run inside the
//! shard group, and the window's sum is all-reduced across the replicas once, when the
//! step opens (`sync_replicas`, as DeepSpeed's MiCS does at the accumulation boundary):
//! the inter-node tier carries the partition once per optimizer step, not once per
//! micro-step. With the partition in host memory (`offload_optimizer`) the window's sum
//! there crosses back to the device in chunks for that all-reduce when the window has
//! several reductions (accumulation); with one per step, each reduction is all-reduced
//! across the replicas before it crosses.
//!
//! With `overlap_comm` a reduction is left in flight while backward goes on; it is waited
//! for only when its buffers are needed again, or at `step()`.
//!
//! With `offload_optimizer` at stages 2–3 the reduced partition lives in host memory
//! (`offload::HostGrads`): each reduce-scatter writes a recycled scratch output that
//! crosses there when the reduction is finished, and at most [`HOST_INFLIGHT`] are in
//! flight. The outputs are kept per partition length: with buckets of one size (a model
//! cut by `reduce_bucket_size`) the device holds a few bucket partitions, not the rank's
//! partition; a model whose buckets all differ in length keeps one per length (at most
//! the partition, as before it crossed).

use super::{Dest, Engine, Reduction};
use crate::device::Device;
use crate::EngineError;
use std::time::Instant;
use zero_comm::{Communicator, Completion, ReduceOp};
use zero_kernels::DType;

/// Reductions into host partitions (`offload_optimizer` at stages 2–3) left in flight at
/// once with `overlap_comm`: one crossing while the next reduces.
const HOST_INFLIGHT: usize = 2;

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// Makes sure module `m`'s buckets have gradient buffers (called before the trainer
    /// writes gradients).
    pub(super) fn begin_backward(&mut self, m: usize) -> Result<(), EngineError> {
        self.require_optimizer("backward")?;
        let name = &self.module(m)?.name;
        if self.pass.is_ready(m) {
            return Err(EngineError::Order(format!(
                "module `{name}` already reported its gradients ready in this micro-step"
            )));
        }
        self.timings.backward_started();
        for b in self.plan.module_buckets[m].clone() {
            self.written(b)?;
        }
        Ok(())
    }

    /// The buffer the backward writes bucket `b`'s gradients into: stages 0–1's whole
    /// gradients (a reduction of them still in flight is finished first), stages 2–3's
    /// staging buffer (lent by the pool at the bucket's first gradient of a pass).
    pub(super) fn written(&mut self, b: usize) -> Result<&mut C::Buffer, EngineError> {
        if self.policy.shards_gradients() {
            return self.staging(b);
        }
        self.settle(b)?;
        self.buckets[b].grads.whole_mut(b)
    }

    /// Finishes reductions, oldest first (the order every rank issued them in), until
    /// bucket `b` holds its gradient buffers again. One still lent afterwards went with a
    /// collective that failed: reading it is [`EngineError::Lost`].
    pub(super) fn settle(&mut self, b: usize) -> Result<(), EngineError> {
        while self.buckets[b].grads.any_lent() && self.finish_oldest()? {}
        Ok(())
    }

    /// Declares module `m`'s gradients complete for this micro-step. When every module of
    /// a bucket is complete, the bucket's reduction is issued.
    pub fn grads_ready(&mut self, m: usize) -> Result<(), EngineError> {
        self.begin_backward(m)?;
        let trainable = !self.plan.module_buckets[m].is_empty();
        let last = self.pass.mark_ready(m, trainable);
        if !trainable {
            return Ok(());
        }
        for b in self.plan.module_buckets[m].clone() {
            self.buckets[b].pending -= 1;
            if self.buckets[b].pending == 0 {
                self.bucket_ready(b)?;
            }
        }
        if last {
            self.end_micro_step();
        }
        Ok(())
    }

    fn end_micro_step(&mut self) {
        self.pool.trim();
        self.drop_secondaries();
        self.window.end_micro_step();
        self.pass.reset();
        for (b, plan) in self.plan.trainable().iter().enumerate() {
            self.buckets[b].pending = plan.modules.len();
        }
        self.timings.micro_step_ended();
        self.trace.end_pass();
    }

    /// Reopens the last micro-step: the gradients of the next pass (every trainable
    /// module reports `grads_ready` again) are added to those of the micro-step that just
    /// ended, as a second `backward()` before `step()` adds to the first in DeepSpeed.
    /// Call it between passes, before `step()`.
    ///
    /// Before the accumulation boundary this is one more pass into the same accumulator.
    /// At the boundary the micro-step's reductions have run: their result is added into
    /// an fp32 *carry* per bucket, the gradient buffers start again from zero, and the
    /// step reads the carry plus the new pass's reduced gradients (reduction is linear,
    /// so this is the reduction of the sum, up to rounding).
    pub fn reopen_micro_step(&mut self) -> Result<(), EngineError> {
        if self.window.ended() == 0 || self.pass.ready_count() != 0 || self.external.is_some() {
            return Err(EngineError::Order(format!(
                "reopen_micro_step() needs a micro-step that ended and no step begun ({} micro-steps done, {} modules of the current one)",
                self.window.ended(),
                self.pass.ready_count()
            )));
        }
        if !self.window.last_ended_window() {
            self.window.reopen();
            return Ok(());
        }
        self.finish_all()?;
        self.add_into_carry(true)?;
        for state in self.buckets.iter_mut() {
            state.released = 0;
            for buf in state.grads.buffers_mut() {
                let n = self.dev.len(buf);
                self.dev.zero(buf, 0..n)?;
            }
        }
        if let Some(host) = self.host_grads_mut() {
            host.zero()?;
        }
        self.window.reopen();
        Ok(())
    }

    /// Adds what this micro-step's reductions produced into each bucket's carry: into
    /// the buckets that have one (before a step), or into every bucket, allocating the
    /// carries (`create`: a micro-step reopened after its reductions).
    pub(super) fn add_into_carry(&mut self, create: bool) -> Result<(), EngineError> {
        if let Some(host) = self.host_grads_mut() {
            return host.add_into_carry(create);
        }
        for b in self.trainable_range() {
            if self.buckets[b].carry.is_none() && !create {
                continue;
            }
            let (len, range) = {
                let (raw, range) = self.raw_step_grads(b)?;
                (self.dev.len(raw), range)
            };
            // Stage 0 steps whole buckets; the other stages the range the step reads.
            let range = if self.policy.shards_optimizer() {
                range
            } else {
                0..self.plan.buckets[b].layout.total_len()
            };
            let mut carry = match self.buckets[b].carry.take() {
                Some(c) => c,
                None => self.dev.zeros(DType::F32, len)?,
            };
            let r = self
                .raw_step_grads(b)
                .and_then(|(raw, _)| self.dev.accumulate(&mut carry, range.start, raw, range));
            self.buckets[b].carry = Some(carry);
            r?;
        }
        Ok(())
    }

    /// Stages 2–3: the staging buffer bucket `b` holds, lent from the pool if it holds
    /// none yet.
    fn staging(&mut self, b: usize) -> Result<&mut C::Buffer, EngineError> {
        let (buf, cap) = match self.pool.take_lent(b) {
            Some(held) => held,
            None => self.idle_staging(b)?,
        };
        Ok(self.pool.hold(b, buf, cap))
    }

    /// A zeroed staging buffer that fits bucket `b`, with its capacity: the smallest idle
    /// one, else one a reduction in flight gives back, else a new one.
    fn idle_staging(&mut self, b: usize) -> Result<(C::Buffer, usize), EngineError> {
        let total = self.plan.buckets[b].layout.total_len();
        loop {
            if let Some((mut buf, cap)) = self.pool.take_idle(total) {
                self.dev.resize(&mut buf, total)?;
                self.dev.zero(&mut buf, 0..total)?;
                return Ok((buf, cap));
            }
            if !self.finish_oldest()? {
                let buf = self.dev.zeros(self.dtype, total)?;
                self.pool.add(buf, total);
            }
        }
    }

    fn bucket_ready(&mut self, b: usize) -> Result<(), EngineError> {
        let t0 = Instant::now();
        let boundary = self.window.pass_ends_window();
        let part = self.plan.buckets[b].layout.partition_len();
        let reduction = if !self.policy.shards_gradients() {
            let total = self.plan.buckets[b].layout.total_len();
            let (grads, accum) = self.buckets[b].grads.whole_and_accum(b)?;
            match accum {
                // 16-bit gradients summed in fp32: each micro-step's go into the accumulator,
                // whose sum the reduction takes at the window's end.
                Some(accum) => {
                    self.dev.accumulate(accum, 0, grads, 0..total)?;
                    self.dev.zero(grads, 0..total)?;
                    if !boundary {
                        return Ok(());
                    }
                    self.dev.copy(accum, 0..total, grads, 0)?;
                }
                // (Summed in place: the next micro-step adds to the gradients.)
                None if !boundary => return Ok(()),
                None => {}
            }
            let grads = self.buckets[b].grads.lend_whole(b)?;
            if self.policy.stage == 0 {
                let work = self.issue(
                    |c| &mut c.grad_reduce,
                    |comm| comm.all_reduce(grads, ReduceOp::Avg),
                )?;
                Reduction::AllReduce { bucket: b, work }
            } else {
                let out = self.dev.zeros(self.dtype, part)?;
                let work = self.issue(
                    |c| &mut c.grad_reduce,
                    |comm| comm.reduce_scatter(grads, out, ReduceOp::Avg),
                )?;
                Reduction::ReduceScatter {
                    bucket: b,
                    work,
                    dest: Dest::Shard,
                    cap: 0, // (stage 1's whole-bucket buffer, not pooled)
                }
            }
        } else {
            // (Lent by `begin_backward`.)
            let (grads, cap) = match self.pool.take_lent(b) {
                Some(held) => held,
                None => self.idle_staging(b)?,
            };
            let later = !self.buckets[b].grads.fresh();
            let (dest, out) = if self.host_grads().is_some() {
                // Every reduction of a window is added into an fp32 accumulator; summed in
                // the gradients' dtype, the window's first is copied and the later added.
                let add = self.accumulates_apart() || (self.sums_in_shard() && later);
                self.buckets[b].grads.set_fresh(false);
                // Each reduction in flight holds a scratch output on the device until it
                // crosses: at most HOST_INFLIGHT at once, or the outputs of a whole
                // backward would add up to the partition the host now holds.
                while self.inflight.len() >= HOST_INFLIGHT && self.finish_oldest()? {}
                (Dest::Host { add }, self.take_scratch(part)?)
            } else if self.sums_in_shard() && later {
                (Dest::AddToShard, self.take_scratch(part)?)
            } else {
                self.settle(b)?;
                self.buckets[b].released = 0;
                (Dest::Shard, self.buckets[b].grads.lend_shard(b)?)
            };
            // Inside the shard group only, unless the partition crosses to the host: the
            // replicas all-reduce the window's sum once, at the step (`sync_replicas`).
            let at_step = self.replicas_reduce_at_step();
            let work = self.issue(
                |c| &mut c.grad_reduce,
                |comm| {
                    if at_step {
                        comm.shard_reduce_scatter(grads, out, ReduceOp::Avg)
                    } else {
                        comm.reduce_scatter(grads, out, ReduceOp::Avg)
                    }
                },
            )?;
            Reduction::ReduceScatter {
                bucket: b,
                work,
                dest,
                cap,
            }
        };
        self.inflight.push_back(reduction);
        if !self.cfg.zero.overlap_comm {
            self.finish_all()?;
        }
        self.timings.add_reduce(t0.elapsed());
        Ok(())
    }

    /// An output of `len` elements for a reduction added into a shard: an idle one of that
    /// length, else a new one (partitions of a plan's buckets have few distinct lengths).
    fn take_scratch(&mut self, len: usize) -> Result<C::Buffer, EngineError> {
        let dev = &self.dev;
        if let Some(buf) = self.pool.take_scratch(len, |b| dev.len(b)) {
            return Ok(buf);
        }
        self.pool.note_scratch(len);
        self.dev.zeros(self.dtype, len)
    }

    /// Waits for the oldest reduction and puts its buffers where they belong; `false` when
    /// none was in flight.
    pub(super) fn finish_oldest(&mut self) -> Result<bool, EngineError> {
        let Some(r) = self.inflight.pop_front() else {
            return Ok(false);
        };
        match r {
            Reduction::AllReduce { bucket, work } => {
                self.buckets[bucket].grads.put_back_whole(work.wait()?);
            }
            Reduction::ReduceScatter {
                bucket,
                work,
                dest,
                cap,
            } => {
                let (mut input, output) = work.wait()?;
                let part = self.plan.buckets[bucket].layout.partition_len();
                match dest {
                    Dest::Host { add } => {
                        let host = self
                            .offload
                            .as_mut()
                            .and_then(|o| o.host_grads.as_mut())
                            .ok_or_else(|| {
                                EngineError::Internal("no host gradient partitions".into())
                            })?;
                        host.receive(&self.dev, bucket, &output, add)?;
                        self.pool.give_back_scratch(output);
                        self.pool.give_back(input, cap);
                    }
                    Dest::AddToShard => {
                        // (An earlier reduction into this shard was issued first, so it is
                        // back.)
                        let shard = self.buckets[bucket].grads.shard_mut(bucket)?;
                        self.dev.accumulate(shard, 0, &output, 0..part)?;
                        self.pool.give_back_scratch(output);
                        self.pool.give_back(input, cap);
                    }
                    Dest::Shard if self.policy.shards_gradients() => {
                        let dev = &self.dev;
                        self.buckets[bucket]
                            .grads
                            .put_back_shard(output, |accum, shard| {
                                dev.accumulate(accum, 0, shard, 0..part)
                            })?;
                        self.pool.give_back(input, cap);
                    }
                    Dest::Shard => {
                        // Stage 1: the reduced partition goes back into the whole-bucket
                        // buffer.
                        let start = self.plan.buckets[bucket]
                            .layout
                            .partition_range(self.shard.rank)?
                            .start;
                        self.dev.copy(&output, 0..part, &mut input, start)?;
                        self.buckets[bucket].grads.put_back_whole(input);
                    }
                }
            }
        }
        Ok(true)
    }

    /// Waits for every collective this engine has in flight: reductions left running by
    /// `overlap_comm`, and stage 3's prefetched gathers (which stay gathered). For a
    /// trainer about to issue collectives of its own on another communicator of the same
    /// devices (two NCCL communicators interleaving collectives can deadlock).
    pub fn wait_collectives(&mut self) -> Result<(), EngineError> {
        self.finish_all()?;
        self.wait_all_gathers()
    }

    /// Waits for every reduction in flight.
    pub(super) fn finish_all(&mut self) -> Result<(), EngineError> {
        let t0 = Instant::now();
        while self.finish_oldest()? {}
        self.timings.add_reduce(t0.elapsed());
        Ok(())
    }
}
