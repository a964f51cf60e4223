//! Where each parameter and gradient lives, for a trainer on any device: the buffer and
//! the element range inside it. A GPU trainer launches its kernels on these; the `f32`
//! copies below are the convenience path every device supports.

use super::Engine;
use crate::device::Device;
use crate::plan::ParamLoc;
use crate::EngineError;
use std::ops::Range;
use zero_comm::Communicator;

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// The buffer and range holding parameter `k` of module `m` (frozen or trainable).
    /// In stage 3 the module must be fetched first.
    pub fn param_buffer(
        &self,
        m: usize,
        k: usize,
    ) -> Result<(&C::Buffer, Range<usize>), EngineError> {
        let module = self.module(m)?;
        let spec = module.params.get(k).ok_or_else(|| EngineError::GradShape {
            module: module.name.clone(),
            detail: format!("no parameter {k}: the module has {}", module.params.len()),
        })?;
        match self.plan.locs[self.plan.param_id(m, k)] {
            ParamLoc::Frozen { offset } => Ok((&self.frozen, offset..offset + spec.numel())),
            ParamLoc::Bucket { bucket, index } => {
                let state = &self.buckets[bucket];
                let buf = if self.params_sharded(bucket) {
                    state
                        .gather
                        .ready()
                        .ok_or_else(|| EngineError::NotFetched(module.name.clone()))?
                } else {
                    state.params.get()?
                };
                Ok((buf, self.plan.buckets[bucket].layout.tensor_range(index)))
            }
        }
    }

    /// Writes parameter `id`'s whole values (rounded) where this rank holds them: the
    /// frozen buffer, its whole bucket, or (stage 3) its shards of the owned partition.
    pub(super) fn upload_param(&mut self, id: usize, values: &[f32]) -> Result<(), EngineError> {
        for r in self.held_ranges(id)? {
            self.upload_held(id, r.clone(), &values[r])?;
        }
        Ok(())
    }

    /// The elements of parameter `id` (ranges of its flattened values) this rank holds:
    /// all of them, or, where its bucket is partitioned (stage 3), the pieces that fall in
    /// this rank's partition (possibly none).
    pub(super) fn held_ranges(&self, id: usize) -> Result<Vec<Range<usize>>, EngineError> {
        match self.plan.locs[id] {
            ParamLoc::Bucket { bucket, index } if self.params_sharded(bucket) => {
                Ok(self.plan.buckets[bucket]
                    .layout
                    .tensor_shards(index)?
                    .into_iter()
                    .filter(|s| s.rank == self.shard.rank && !s.tensor_range.is_empty())
                    .map(|s| s.tensor_range)
                    .collect())
            }
            _ => Ok(std::iter::once(0..self.param_spec(id).numel()).collect()),
        }
    }

    /// Writes `values`, elements `range` of parameter `id` (within one of its
    /// [`held_ranges`](Self::held_ranges)), where this rank holds them (rounded).
    pub(super) fn upload_held(
        &mut self,
        id: usize,
        range: Range<usize>,
        values: &[f32],
    ) -> Result<(), EngineError> {
        match self.plan.locs[id] {
            ParamLoc::Frozen { offset } => {
                self.dev
                    .upload_f32(&mut self.frozen, offset + range.start, values)
            }
            ParamLoc::Bucket { bucket, index } => {
                let layout = &self.plan.buckets[bucket].layout;
                let at = layout.tensor_range(index).start + range.start;
                if self.params_sharded(bucket) {
                    let part = layout.partition_range(self.shard.rank)?.start;
                    self.upload_owned_f32(bucket, at - part, values)
                } else {
                    let params = self.buckets[bucket].params.get_mut()?;
                    self.dev.upload_f32(params, at, values)
                }
            }
        }
    }

    /// Every buffer that holds parameters now: each bucket's parameters (whole, or the
    /// owned partition in stage 3), stage 3's gathered buckets, and the frozen parameters.
    /// A front-end whose tensors view these (zero-torch on the CPU) checks against them
    /// that its parameters live in the engine.
    pub fn param_buffers(&self) -> Vec<&C::Buffer> {
        let mut out: Vec<&C::Buffer> = self
            .buckets
            .iter()
            .flat_map(|s| s.params.held().into_iter().chain(s.gather.ready()))
            .collect();
        out.push(&self.frozen);
        out
    }

    /// The gradient buffer and range of trainable parameter `k` of module `m` (counting
    /// trainable parameters only). Add the gradient in, then call [`Engine::grads_ready`]:
    /// it holds zeros at the start of a micro-step, or, where
    /// [`Engine::grads_accumulate_in_place`], the earlier micro-steps' sum.
    pub fn grad_buffer_mut(
        &mut self,
        m: usize,
        k: usize,
    ) -> Result<(&mut C::Buffer, Range<usize>), EngineError> {
        self.begin_backward(m)?;
        let (bucket, index) =
            self.trainable_locs(m)?
                .get(k)
                .copied()
                .ok_or_else(|| EngineError::GradShape {
                    module: self.modules[m].name.clone(),
                    detail: format!("no trainable parameter {k}"),
                })?;
        let range = self.plan.buckets[bucket].layout.tensor_range(index);
        self.buckets[bucket].released = 0; // written from here on
        let buf = self.written(bucket)?;
        Ok((buf, range))
    }

    /// `(bucket, index in bucket)` of each trainable parameter of module `m`.
    pub(super) fn trainable_locs(&self, m: usize) -> Result<Vec<(usize, usize)>, EngineError> {
        let module = self.module(m)?;
        Ok((0..module.params.len())
            .filter_map(|k| match self.plan.locs[self.plan.param_id(m, k)] {
                ParamLoc::Bucket { bucket, index } if !self.plan.buckets[bucket].frozen => {
                    Some((bucket, index))
                }
                _ => None,
            })
            .collect())
    }

    /// Module `m`'s parameters converted to `f32` (a copy), in registration order.
    pub fn params_f32(&self, m: usize) -> Result<Vec<Vec<f32>>, EngineError> {
        (0..self.module(m)?.params.len())
            .map(|k| {
                let (buf, range) = self.param_buffer(m, k)?;
                self.dev.download_f32(buf, range)
            })
            .collect()
    }

    /// Adds `grad` into the gradient of trainable parameter `k` of module `m` (counting
    /// trainable parameters only), rounding to the gradient dtype: for a trainer whose
    /// backward produces one parameter's gradient at a time (the candle adapter).
    pub fn add_grad_f32(&mut self, m: usize, k: usize, grad: &[f32]) -> Result<(), EngineError> {
        let locs = self.trainable_locs(m)?;
        let &loc = locs.get(k).ok_or_else(|| EngineError::GradShape {
            module: self.modules[m].name.clone(),
            detail: format!("no trainable parameter {k}: the module has {}", locs.len()),
        })?;
        self.check_grad_len(m, k, loc, grad)?;
        self.begin_backward(m)?;
        self.add_into_grads(loc, grad)
    }

    /// Adds `grads` (one `f32` slice per trainable parameter of `m`, in registration
    /// order) into the module's gradients, rounding to the gradient dtype.
    pub fn add_grads_f32(&mut self, m: usize, grads: &[&[f32]]) -> Result<(), EngineError> {
        let locs = self.trainable_locs(m)?;
        if locs.len() != grads.len() {
            return Err(EngineError::GradShape {
                module: self.module(m)?.name.clone(),
                detail: format!(
                    "{} gradients given for {} trainable parameters",
                    grads.len(),
                    locs.len()
                ),
            });
        }
        for (i, (&loc, g)) in locs.iter().zip(grads).enumerate() {
            self.check_grad_len(m, i, loc, g)?;
        }
        self.begin_backward(m)?;
        for (&loc, g) in locs.iter().zip(grads) {
            self.add_into_grads(loc, g)?;
        }
        Ok(())
    }

    /// Checks that gradient `i` of module `m`, for the parameter at `(bucket, index)`, has
    /// the parameter's length.
    fn check_grad_len(
        &self,
        m: usize,
        i: usize,
        (bucket, index): (usize, usize),
        g: &[f32],
    ) -> Result<(), EngineError> {
        let len = self.plan.buckets[bucket].layout.sizes()[index];
        if len == g.len() {
            return Ok(());
        }
        Err(EngineError::GradShape {
            module: self.module(m)?.name.clone(),
            detail: format!(
                "gradient {i} has {} elements, the parameter has {len}",
                g.len()
            ),
        })
    }

    /// Adds `g` into the gradient buffer of the parameter at `(bucket, index)`.
    fn add_into_grads(
        &mut self,
        (bucket, index): (usize, usize),
        g: &[f32],
    ) -> Result<(), EngineError> {
        let start = self.plan.buckets[bucket].layout.tensor_range(index).start;
        self.buckets[bucket].released = 0;
        self.written(bucket)?;
        let Self {
            dev, pool, buckets, ..
        } = self;
        let buf = match pool.lent_mut(bucket) {
            Some(staging) => staging,
            None => buckets[bucket].grads.whole_mut(bucket)?,
        };
        dev.add_f32(buf, start, g)
    }
}
