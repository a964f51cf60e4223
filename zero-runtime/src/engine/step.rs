//! The optimizer step at the accumulation boundary.
//!
//! 1. Wait for every reduction.
//! 2. Each rank takes the non-finite flag and Σg² of its owned partition of every bucket,
//!    in bucket order, and the ranks all-gather these partials; the global sum is taken in
//!    rank order. The partitions are the same in every stage, so is this order.
//! 3. Overflow anywhere: every rank skips (parameters and optimizer state untouched), the
//!    loss scaler moves as DeepSpeed's does, the LR schedule does not advance.
//! 4. Otherwise clip as DeepSpeed does (`clip = (‖g‖/scale + 1e-6) / max_norm`, applied
//!    if > 1), fold unscale and clip into Adam's `grad_scale`, run the fused Adam over the
//!    owned range, and (stages 1–2, and stage 3's persistent buckets) all-gather the
//!    updated parameters.

use super::{CommCounters, Engine, StepOutcome};
use crate::device::Device;
use crate::EngineError;
use std::time::Instant;
use zero_comm::{Communicator, Completion};
use zero_kernels::{AdamConfig, DType, GradStats};

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// Takes the optimizer step; call it after `gradient_accumulation_steps` micro-steps.
    pub fn step(&mut self) -> Result<StepOutcome, EngineError> {
        let k = self.cfg.gradient_accumulation_steps;
        if self.micro_done != k || self.ready_count != 0 {
            return Err(EngineError::Order(format!(
                "step() after {} of {k} micro-steps (and {} modules of the current one): every trainable module must call grads_ready in each micro-step",
                self.micro_done, self.ready_count
            )));
        }
        let t0 = Instant::now();
        self.finish_all()?;
        let (sum_sq, overflow) = self.global_stats()?;
        let scale = self.scaler.scale();
        self.global_steps += 1;
        let outcome = if overflow {
            let change = self.scaler.update(true)?;
            self.skipped_steps += 1;
            StepOutcome {
                skipped: true,
                grad_norm: f64::NAN,
                loss_scale: scale,
                lr: self.schedule.lr(),
                scale_change: change,
            }
        } else {
            let norm = sum_sq.sqrt() / scale;
            let max_norm = self.cfg.gradient_clipping;
            let clip = if max_norm > 0.0 {
                (norm + 1e-6) / max_norm
            } else {
                1.0
            };
            let combined = if clip > 1.0 { scale * clip } else { scale };
            let lr = self.schedule.lr();
            let adam = AdamConfig {
                lr: lr as f32,
                ..self.cfg.optimizer.adam
            };
            self.optimizer_steps += 1;
            self.update_parameters(&adam, (1.0 / combined) as f32)?;
            self.schedule.advance();
            let change = self.scaler.update(false)?;
            StepOutcome {
                skipped: false,
                grad_norm: norm,
                loss_scale: scale,
                lr,
                scale_change: change,
            }
        };
        self.clear_gradients()?;
        if self.policy.shards_parameters() {
            self.free_all_gathered()?;
        }
        self.micro_done = 0;
        self.timings.step_ended(t0.elapsed());
        self.last_step_comm = diff(self.counters, self.counters_at_step_start);
        self.counters_at_step_start = self.counters;
        if self.cfg.wall_clock_breakdown
            && self.rank == 0
            && self.global_steps % self.cfg.steps_per_print.max(1) == 0
        {
            println!("[zero] step {}: {}", self.global_steps, self.timings.last());
        }
        Ok(outcome)
    }

    /// The sum of squares and overflow flag over every rank's owned gradients.
    fn global_stats(&mut self) -> Result<(f64, bool), EngineError> {
        let mut mine = GradStats::EMPTY;
        for b in 0..self.buckets.len() {
            let (buf, range) = self.step_grads(b)?;
            mine = mine.merge(self.dev.stats(buf, range)?);
        }
        let mut input = self.dev.zeros(DType::F32, 2)?;
        self.dev.upload_f32(
            &mut input,
            0,
            &[mine.sum_sq as f32, if mine.non_finite { 1.0 } else { 0.0 }],
        )?;
        let output = self.dev.zeros(DType::F32, 2 * self.world)?;
        let work = self.issue(|c| &mut c.control, |comm| comm.all_gather(input, output))?;
        let (_, all) = work.wait()?;
        let partials = self.dev.download_f32(&all, 0..2 * self.world)?;
        let mut sum = 0f64;
        let mut overflow = false;
        for pair in partials.chunks_exact(2) {
            sum += pair[0] as f64;
            overflow |= pair[1] != 0.0;
        }
        Ok((sum, overflow || !sum.is_finite()))
    }

    /// Where the gradients the optimizer reads for bucket `b` are, and this rank's range.
    pub(super) fn step_grads(
        &self,
        b: usize,
    ) -> Result<(&C::Buffer, std::ops::Range<usize>), EngineError> {
        let state = &self.buckets[b];
        let layout = &self.plan.buckets[b].layout;
        let missing = || EngineError::Internal(format!("bucket {b}'s gradients are missing"));
        Ok(if !self.policy.shards_gradients() {
            (
                state.grads.as_ref().ok_or_else(missing)?,
                layout.partition_range(self.rank)?,
            )
        } else if let Some(accum) = state.accum.as_ref() {
            (accum, 0..layout.partition_len())
        } else {
            (
                state.grad_shard.as_ref().ok_or_else(missing)?,
                0..layout.partition_len(),
            )
        })
    }

    fn update_parameters(&mut self, adam: &AdamConfig, grad_scale: f32) -> Result<(), EngineError> {
        let step = self.optimizer_steps;
        let mut gathers = Vec::new();
        if self.offload.is_some() {
            // The state lives off the device: the same Adam, sub-group by sub-group, then
            // the same gathers.
            self.offloaded_adam(adam, grad_scale)?;
            return self.publish_params();
        }
        for b in 0..self.buckets.len() {
            let layout = self.plan.buckets[b].layout.clone();
            let part = layout.partition_range(self.rank)?;
            let (grads_range, params_offset) = if self.policy.shards_optimizer() {
                let (_, r) = self.step_grads(b)?;
                let offset = if self.params_sharded(b) {
                    0
                } else {
                    part.start
                };
                (r, offset)
            } else {
                (0..layout.total_len(), 0)
            };
            // The optimizer reads the gradients in place; take the buffers it writes out.
            let mut params = self.take_params(b)?;
            let mut opt = std::mem::replace(
                &mut self.buckets[b].opt,
                crate::device::AdamState {
                    master: self.dev.zeros(DType::F32, 0)?,
                    exp_avg: self.dev.zeros(DType::F32, 0)?,
                    exp_avg_sq: self.dev.zeros(DType::F32, 0)?,
                },
            );
            let result = {
                let (grads, _) = self.step_grads(b)?;
                self.dev.adam(
                    adam,
                    step,
                    grad_scale,
                    &mut opt,
                    grads,
                    grads_range,
                    &mut params,
                    params_offset,
                )
            };
            self.buckets[b].opt = opt;
            if let Err(e) = result {
                self.put_params(b, params)?;
                return Err(e);
            }
            self.return_params(b, params, part, &mut gathers)?;
        }
        self.finish_gathers(gathers)
    }

    /// Puts bucket `b`'s parameters back after this rank wrote its owned range `part`:
    /// where the stage keeps the bucket whole (stages 1–2, stage 3's persistent buckets)
    /// the ranges are all-gathered, and the work joins `gathers`.
    pub(super) fn return_params(
        &mut self,
        b: usize,
        params: C::Buffer,
        part: std::ops::Range<usize>,
        gathers: &mut Vec<(usize, super::W2<C>)>,
    ) -> Result<(), EngineError> {
        if self.policy.shards_optimizer() && !self.params_sharded(b) {
            let mut input = self.dev.zeros(self.dtype, part.len())?;
            self.dev.copy(&params, part, &mut input, 0)?;
            let work = self.issue(
                |c| &mut c.param_gather,
                |comm| comm.all_gather(input, params),
            )?;
            gathers.push((b, work));
            Ok(())
        } else {
            self.put_params(b, params)
        }
    }

    /// After this rank wrote its owned range of every bucket's parameters in place (the
    /// offloaded Adam, a load with offload): the same gathers as after a device step.
    pub(super) fn publish_params(&mut self) -> Result<(), EngineError> {
        let mut gathers = Vec::new();
        for b in 0..self.buckets.len() {
            if self.params_sharded(b) {
                continue; // written in place, nothing to gather
            }
            let part = self.plan.buckets[b].layout.partition_range(self.rank)?;
            let params = self.take_params(b)?;
            self.return_params(b, params, part, &mut gathers)?;
        }
        self.finish_gathers(gathers)
    }

    /// Waits for the gathers of [`return_params`](Self::return_params).
    pub(super) fn finish_gathers(
        &mut self,
        gathers: Vec<(usize, super::W2<C>)>,
    ) -> Result<(), EngineError> {
        for (b, work) in gathers {
            let (_, full) = work.wait()?;
            self.buckets[b].params = Some(full);
        }
        Ok(())
    }

    /// Discards every gradient of the current step (all micro-steps so far), waiting for
    /// reductions in flight first. Call it on every rank at the same point, as with any
    /// collective: the reductions it waits for are shared.
    pub fn zero_grad(&mut self) -> Result<(), EngineError> {
        self.finish_all()?;
        self.clear_gradients()?;
        self.micro_done = 0;
        self.ready_count = 0;
        self.ready.iter_mut().for_each(|r| *r = false);
        self.fetched.iter_mut().for_each(|f| *f = false);
        for (b, plan) in self.plan.buckets.iter().enumerate() {
            self.buckets[b].pending = plan.modules.len();
            if let Some(g) = self.buckets[b].grad_shard.as_mut() {
                self.dev.zero(g, 0..plan.layout.partition_len())?;
            }
        }
        Ok(())
    }

    fn clear_gradients(&mut self) -> Result<(), EngineError> {
        for (b, plan) in self.plan.buckets.iter().enumerate() {
            let state = &mut self.buckets[b];
            if let Some(g) = state.grads.as_mut() {
                self.dev.zero(g, 0..plan.layout.total_len())?;
            }
            if let Some(a) = state.accum.as_mut() {
                let n = self.dev.len(a);
                self.dev.zero(a, 0..n)?;
            }
        }
        Ok(())
    }
}

fn diff(a: CommCounters, b: CommCounters) -> CommCounters {
    CommCounters {
        grad_reduce: a.grad_reduce - b.grad_reduce,
        param_gather: a.param_gather - b.param_gather,
        control: a.control - b.control,
    }
}
