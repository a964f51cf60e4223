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

use super::{Engine, StepOutcome};
use crate::device::Device;
use crate::EngineError;
use std::time::Instant;
use zero_comm::{Communicator, Completion};
use zero_kernels::{DType, GradStats};

/// The first half of a step that was not skipped: how the gradients are to be scaled.
#[derive(Debug, Clone, Copy)]
pub(super) struct External {
    /// What every gradient is multiplied by (unscale and clip, folded).
    grad_scale: f32,
    /// The unscaled global norm before clipping.
    norm: f64,
    /// The loss scale the gradients carried.
    loss_scale: f64,
    /// When the step began.
    t0: Instant,
}

/// Which array [`Engine::external_read`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExternalArray {
    /// The fp32 master weights of the group's held elements.
    Master,
    /// Their reduced gradients, unscaled and clipped, as fp32 (during an external step).
    Grad,
    /// The engine's own first moments (what `import_state` put there, for an external
    /// Adam to start from).
    ExpAvg,
    /// The engine's own second moments.
    ExpAvgSq,
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// Takes the optimizer step; call it after `gradient_accumulation_steps` micro-steps.
    pub fn step(&mut self) -> Result<StepOutcome, EngineError> {
        let optimizer = self.require_optimizer("step()")?;
        optimizer.adam().map_err(|e| {
            EngineError::Config(crate::ConfigError::Unsupported {
                key: "optimizer.type".into(),
                reason: format!("{e}; call step_external_begin / step_external_finish"),
            })
        })?;
        let pending = match self.open_step()? {
            Ok(p) => p,
            Err(skipped) => return Ok(skipped),
        };
        self.steps.optimizer += 1;
        self.update_parameters(pending.grad_scale)?;
        self.close_taken_step(pending)
    }

    /// The optimizer the config names, or an error naming `what` (DeepSpeed trains only
    /// with an optimizer, from the config or passed in code).
    pub(super) fn require_optimizer(
        &self,
        what: &str,
    ) -> Result<&crate::config::OptimizerConfig, EngineError> {
        self.cfg.optimizer.as_ref().ok_or_else(|| {
            EngineError::NoOptimizer(format!(
                "{what} needs an optimizer, and the config has no `optimizer` section (give one there, or pass an optimizer in code); without one the engine runs forward passes only, as DeepSpeed's"
            ))
        })
    }

    /// Checks the boundary, waits for the reductions and decides: `Err(outcome)` when
    /// the step is skipped (everything a skip does is done), else how to scale.
    fn open_step(&mut self) -> Result<Result<External, StepOutcome>, EngineError> {
        let k = self.cfg.gradient_accumulation_steps;
        if !self.window.is_complete() || self.pass.ready_count() != 0 {
            return Err(EngineError::Order(format!(
                "step() after {} of {k} micro-steps (and {} modules of the current one): every trainable module must call grads_ready in each micro-step",
                self.window.ended(),
                self.pass.ready_count()
            )));
        }
        if self.external.is_some() {
            return Err(EngineError::Order(
                "a step handed to an external optimizer is not finished: call step_external_finish or step_external_abort".into(),
            ));
        }
        let t0 = Instant::now();
        self.finish_all()?;
        self.add_into_carry(false)?;
        self.sync_replicas()?;
        let (sum_sq, overflow) = self.global_stats()?;
        let scale = self.scaler.scale();
        self.steps.global += 1;
        if overflow {
            let change = self.scaler.update(true)?;
            self.steps.skipped += 1;
            let outcome = StepOutcome {
                skipped: true,
                grad_norm: f64::NAN,
                loss_scale: scale,
                lr: self.lr(),
                scale_change: change,
            };
            self.close_step(t0)?;
            return Ok(Err(outcome));
        }
        let norm = sum_sq.sqrt() / scale;
        let max_norm = self.cfg.gradient_clipping;
        let clip = if max_norm > 0.0 {
            (norm + 1e-6) / max_norm
        } else {
            1.0
        };
        let combined = if clip > 1.0 { scale * clip } else { scale };
        Ok(Ok(External {
            grad_scale: (1.0 / combined) as f32,
            norm,
            loss_scale: scale,
            t0,
        }))
    }

    /// After the parameters were updated: the schedule and the scaler move on.
    fn close_taken_step(&mut self, p: External) -> Result<StepOutcome, EngineError> {
        let lr = self.lr();
        self.schedule.advance();
        let change = self.scaler.update(false)?;
        self.close_step(p.t0)?;
        Ok(StepOutcome {
            skipped: false,
            grad_norm: p.norm,
            loss_scale: p.loss_scale,
            lr,
            scale_change: change,
        })
    }

    /// What every step ends with, taken or skipped.
    fn close_step(&mut self, t0: Instant) -> Result<(), EngineError> {
        self.clear_gradients()?;
        if self.policy.shards_parameters() {
            self.free_all_gathered()?;
        }
        self.window.close();
        self.timings.step_ended(t0.elapsed());
        self.books.close_step();
        if self.cfg.wall_clock_breakdown
            && self.shard.rank == 0
            && self.steps.global % self.cfg.steps_per_print.max(1) == 0
        {
            println!("[zero] step {}: {}", self.steps.global, self.timings.last());
        }
        Ok(())
    }

    /// The first half of a step for an optimizer the engine does not run itself (a
    /// front-end's, such as a `torch.optim` optimizer over the rank's fp32 shard, as
    /// DeepSpeed steps an untested client optimizer): waits for the reductions, decides
    /// overflow and clipping like [`step`](Self::step). Returns the outcome when the step
    /// is skipped (nothing else to do); otherwise `None`: read each group's master weights
    /// and gradients with [`external_read`](Self::external_read), step them, and hand the
    /// new master weights to [`step_external_finish`](Self::step_external_finish) (or
    /// call [`step_external_abort`](Self::step_external_abort)).
    pub fn step_external_begin(&mut self) -> Result<Option<StepOutcome>, EngineError> {
        self.require_optimizer("step_external_begin()")?;
        if self.offload.is_some() {
            return Err(EngineError::Config(crate::ConfigError::Unsupported {
                key: "zero_optimization.offload_optimizer".into(),
                reason: "the offloaded optimizer is zero's fused Adam; an external optimizer cannot be offloaded".into(),
            }));
        }
        match self.open_step()? {
            Err(skipped) => Ok(Some(skipped)),
            Ok(p) => {
                self.steps.optimizer += 1;
                self.external = Some(p);
                Ok(None)
            }
        }
    }

    /// The number of elements of group `g` this rank steps: its held elements of every
    /// bucket, in bucket order (alignment padding included: its gradient is zero).
    pub fn external_group_len(&self, g: usize) -> usize {
        self.groups
            .runs
            .iter()
            .flatten()
            .filter(|(_, rg)| *rg == g)
            .map(|(r, _)| r.len())
            .sum()
    }

    /// Reads group `g`'s master weights, moments, or (during a step begun by
    /// [`step_external_begin`](Self::step_external_begin)) gradients, unscaled and clipped,
    /// into `out` (of [`external_group_len`](Self::external_group_len) elements).
    pub fn external_read(
        &mut self,
        g: usize,
        what: ExternalArray,
        out: &mut [f32],
    ) -> Result<(), EngineError> {
        let scale = match (what, self.external) {
            (ExternalArray::Grad, None) => {
                return Err(EngineError::Order(
                    "external_read of gradients outside a step begun by step_external_begin".into(),
                ))
            }
            (_, p) => p.map(|p| p.grad_scale).unwrap_or(1.0),
        };
        if self.offload.is_some() {
            return Err(EngineError::Order(
                "external_read: the optimizer state is offloaded (an external optimizer cannot be)"
                    .into(),
            ));
        }
        self.check_external_len(g, out.len())?;
        let mut at = 0;
        for b in self.trainable_range() {
            for (r, rg) in self.groups.runs[b].clone() {
                if rg != g {
                    continue;
                }
                let dst = &mut out[at..at + r.len()];
                match what {
                    ExternalArray::Master | ExternalArray::ExpAvg | ExternalArray::ExpAvgSq => {
                        let kind = match what {
                            ExternalArray::Master => 0,
                            ExternalArray::ExpAvg => 1,
                            _ => 2,
                        };
                        let (buf, at) = self.held_array(b, kind)?;
                        self.dev
                            .download_f32_into(buf, Self::held_range(at, r.clone()), dst)?
                    }
                    ExternalArray::Grad => {
                        let (buf, start) = self.held_grads(b)?;
                        let first = start + r.start;
                        self.dev
                            .download_f32_into(buf, first..first + r.len(), dst)?;
                        for x in dst.iter_mut() {
                            *x *= scale;
                        }
                    }
                }
                at += r.len();
            }
        }
        Ok(())
    }

    fn check_external_len(&self, g: usize, len: usize) -> Result<(), EngineError> {
        self.group(g)?;
        let want = self.external_group_len(g);
        if len != want {
            return Err(EngineError::InvalidModel(format!(
                "parameter group {g}: {len} values given, this rank steps {want}"
            )));
        }
        Ok(())
    }

    /// The second half of an external step: `masters[g]` are group `g`'s new master
    /// weights (as read, in the same order). They replace the held master weights, the
    /// 16-bit parameters are rounded from them and gathered where the stage keeps them
    /// whole, and the schedule and loss scaler move on. On an error nothing is written.
    pub fn step_external_finish(&mut self, masters: &[&[f32]]) -> Result<StepOutcome, EngineError> {
        let p = self.external.ok_or_else(|| {
            EngineError::Order("step_external_finish without step_external_begin".into())
        })?;
        if masters.len() != self.groups.adam.len() {
            return Err(EngineError::InvalidModel(format!(
                "{} groups of master weights given, the model has {} parameter groups",
                masters.len(),
                self.groups.adam.len()
            )));
        }
        for (g, m) in masters.iter().enumerate() {
            self.check_external_len(g, m.len())?;
        }
        self.external = None;
        let mut at = vec![0usize; masters.len()];
        for b in self.trainable_range() {
            for (r, g) in self.groups.runs[b].clone() {
                let vals = &masters[g][at[g]..at[g] + r.len()];
                at[g] += r.len();
                let (dev, master, held) = self.master_mut(b)?;
                dev.upload_f32(master, held + r.start, vals)?;
            }
        }
        self.params_from_master()?;
        self.close_taken_step(p)
    }

    /// Gives up a step begun by [`step_external_begin`](Self::step_external_begin)
    /// (the external optimizer failed): parameters and master weights stay as they were,
    /// the gradients of the step are dropped, and the step is not counted.
    pub fn step_external_abort(&mut self) -> Result<(), EngineError> {
        let Some(p) = self.external.take() else {
            return Ok(());
        };
        self.steps.optimizer -= 1;
        self.steps.global -= 1;
        self.close_step(p.t0)
    }

    /// The sum of squares and overflow flag over every rank's owned gradients.
    fn global_stats(&mut self) -> Result<(f64, bool), EngineError> {
        let mut mine = GradStats::EMPTY;
        for b in self.trainable_range() {
            let stats = match self.host_grads() {
                Some(host) => host.stats(b)?,
                None => {
                    let (buf, range) = self.step_grads(b)?;
                    self.dev.stats(buf, range)?
                }
            };
            mine = mine.merge(stats);
        }
        let mut input = self.dev.zeros(DType::F32, 2)?;
        self.dev.upload_f32(
            &mut input,
            0,
            &[mine.sum_sq as f32, if mine.non_finite { 1.0 } else { 0.0 }],
        )?;
        let output = self.dev.zeros(DType::F32, 2 * self.shard.size)?;
        let work = self.issue(|c| &mut c.control, |comm| comm.all_gather(input, output))?;
        let (_, all) = work.wait()?;
        let partials = self.dev.download_f32(&all, 0..2 * self.shard.size)?;
        let mut sum = 0f64;
        let mut overflow = false;
        for pair in partials.chunks_exact(2) {
            sum += pair[0] as f64;
            overflow |= pair[1] != 0.0;
        }
        Ok((sum, overflow || !sum.is_finite()))
    }

    /// Where the gradients the optimizer reads for bucket `b` are, and this rank's range:
    /// the carried sum when a micro-step was reopened, else the reduced gradients.
    pub(super) fn step_grads(
        &self,
        b: usize,
    ) -> Result<(&C::Buffer, std::ops::Range<usize>), EngineError> {
        let (raw, range) = self.raw_step_grads(b)?;
        Ok(match self.buckets[b].carry.as_ref() {
            Some(carry) => (carry, range),
            None => (raw, range),
        })
    }

    /// Bucket `b`'s gradients as the optimizer reads them, and where its held element 0
    /// is in them (stage 0 holds whole buckets; the range of `step_grads` is then the
    /// rank's partition, for the norm).
    fn held_grads(&self, b: usize) -> Result<(&C::Buffer, usize), EngineError> {
        let (buf, range) = self.step_grads(b)?;
        Ok((
            buf,
            if self.policy.shards_optimizer() {
                range.start
            } else {
                0
            },
        ))
    }

    /// [`step_grads`](Self::step_grads) without the carried sum: where this micro-step's
    /// reductions put the gradients.
    pub(super) fn raw_step_grads(
        &self,
        b: usize,
    ) -> Result<(&C::Buffer, std::ops::Range<usize>), EngineError> {
        let layout = &self.plan.buckets[b].layout;
        let range = if self.policy.shards_gradients() {
            0..layout.partition_len()
        } else {
            layout.partition_range(self.shard.rank)?
        };
        Ok((self.buckets[b].grads.reduced(b)?, range))
    }

    fn update_parameters(&mut self, grad_scale: f32) -> Result<(), EngineError> {
        let step = self.steps.optimizer;
        let mut gathers = Vec::new();
        // The state lives off the device: the same Adam, sub-group by sub-group, then the
        // same gathers.
        if let Some(stepped) = self.with_offload(|e, off| e.offloaded_adam(off, grad_scale)) {
            stepped?;
            return self.publish_params();
        }
        for b in self.trainable_range() {
            let layout = self.plan.buckets[b].layout.clone();
            let part = layout.partition_range(self.shard.rank)?;
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
            let runs = self.adam_runs(b);
            // The optimizer reads the gradients and writes the state and the parameters in
            // place (an offloaded partition through a device copy).
            let mut tier_copy = self.tier_params_on_device(b)?;
            let super::BucketState {
                params,
                grads,
                carry,
                opt,
                ..
            } = &mut self.buckets[b];
            let grads = match carry.as_ref() {
                Some(carry) => carry,
                None => grads.reduced(b)?,
            };
            let params = match tier_copy.as_mut() {
                Some(copy) => copy,
                None => params.get_mut()?,
            };
            let result = self.dev.adam(
                &runs,
                step,
                grad_scale,
                opt,
                grads,
                grads_range,
                params,
                params_offset,
            );
            if let Some(copy) = &tier_copy {
                self.tier_params_back(b, copy)?;
            }
            result?;
            self.gather_whole(b, part, &mut gathers)?;
        }
        self.finish_gathers(gathers)
    }

    /// Where the stage keeps bucket `b` whole (stages 1–2, stage 3's persistent buckets),
    /// all-gathers the owned ranges `part` this rank wrote into its parameters: the
    /// parameters are lent to the gather, and the work joins `gathers`.
    pub(super) fn gather_whole(
        &mut self,
        b: usize,
        part: std::ops::Range<usize>,
        gathers: &mut Vec<(usize, super::W2<C>)>,
    ) -> Result<(), EngineError> {
        if !self.policy.shards_optimizer() || self.params_sharded(b) {
            return Ok(()); // updated in place, nothing to gather
        }
        let mut input = self.dev.zeros(self.dtype, part.len())?;
        self.dev
            .copy(self.buckets[b].params.get()?, part, &mut input, 0)?;
        let params = self.buckets[b].params.lend()?;
        let work = self.issue(
            |c| &mut c.param_gather,
            |comm| comm.all_gather(input, params),
        )?;
        gathers.push((b, work));
        Ok(())
    }

    /// After this rank wrote its owned range of every bucket's parameters in place (the
    /// offloaded Adam, a load with offload): the same gathers as after a device step.
    pub(super) fn publish_params(&mut self) -> Result<(), EngineError> {
        let mut gathers = Vec::new();
        for b in self.trainable_range() {
            let part = self.plan.buckets[b]
                .layout
                .partition_range(self.shard.rank)?;
            self.gather_whole(b, part, &mut gathers)?;
        }
        self.finish_gathers(gathers)
    }

    /// Waits for the gathers of [`gather_whole`](Self::gather_whole): each bucket's
    /// parameters come back.
    pub(super) fn finish_gathers(
        &mut self,
        gathers: Vec<(usize, super::W2<C>)>,
    ) -> Result<(), EngineError> {
        for (b, work) in gathers {
            let (_, full) = work.wait()?;
            self.buckets[b].params.put_back(full);
        }
        Ok(())
    }

    /// Discards every gradient of the current step (all micro-steps so far), waiting for
    /// reductions in flight first. Call it on every rank at the same point, as with any
    /// collective: the reductions it waits for are shared. The pass's gradient counts
    /// start over, and the front-end's window too (no pass since `step()`; `micro_steps`
    /// back at the window's start).
    pub fn zero_grad(&mut self) -> Result<(), EngineError> {
        self.step_external_abort()?;
        self.finish_all()?;
        self.clear_gradients()?;
        self.arrivals.reset();
        self.discard_window();
        self.pass.reset();
        for (b, plan) in self.plan.trainable().iter().enumerate() {
            self.buckets[b].pending = plan.modules.len();
            if let Some(g) = self.buckets[b].grads.held_shard_mut() {
                self.buckets[b].released = self.dev.zero_discarding(g)?;
            }
        }
        Ok(())
    }

    /// Drops the window's gradients: the next reduction writes each shard afresh, so a
    /// shard's host pages go back to the kernel until then (DeepSpeed's stage 2 likewise
    /// frees its gradient partition between steps); stages 0–1's whole-bucket gradients
    /// are zeroed the same way where the device can (a mapping's pages read as zero).
    fn clear_gradients(&mut self) -> Result<(), EngineError> {
        if let Some(host) = self.host_grads_mut() {
            host.clear()?;
        }
        for (b, state) in self.buckets.iter_mut().enumerate() {
            state.carry = None;
            state.grads.set_fresh(true);
            if let Some(g) = state.grads.held_shard_mut() {
                state.released = self.dev.discard(g)?;
            }
            if let Some(g) = state.grads.held_whole_mut() {
                state.released = self.dev.zero_discarding(g)?;
            }
            if let Some(a) = state.grads.held_accum_mut() {
                let n = self.dev.len(a);
                self.dev.zero(a, 0..n)?;
            }
            // Stages 2–3: a staging buffer a pass left unreduced (`zero_grad` in a
            // pass) goes back to the pool, which zeroes a buffer when it lends it.
            if let Some((buf, cap)) = self.pool.take_lent(b) {
                self.pool.give_back(buf, cap);
            }
        }
        Ok(())
    }
}
