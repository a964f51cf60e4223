//! Host views: the parameters and gradients a trainer on the CPU reads and writes, as
//! slices straight into the engine's flat buffers.

use super::Engine;
use crate::device::HostDevice;
use crate::plan::ParamLoc;
use crate::EngineError;
use zero_comm::{Communicator, HostBuffer, HostElement};
use zero_kernels::tensor_views_mut;

impl<C: Communicator<Buffer = HostBuffer>> Engine<C, HostDevice> {
    /// Views of module `m`'s parameters (trainable and frozen, in registration order).
    /// In stage 3 the module must be fetched first.
    pub fn params<T: HostElement>(&self, m: usize) -> Result<Vec<&[T]>, EngineError> {
        let module = self.module(m)?;
        let mut out = Vec::with_capacity(module.params.len());
        for k in 0..module.params.len() {
            let (buf, range) = match self.plan.locs[self.first_param[m] + k] {
                ParamLoc::Frozen { offset } => {
                    (&self.frozen, offset..offset + module.params[k].numel())
                }
                ParamLoc::Bucket { bucket, index } => {
                    let plan = &self.plan.buckets[bucket];
                    let state = &self.buckets[bucket];
                    let buf = if self.params_sharded(bucket) {
                        state
                            .gathered
                            .as_ref()
                            .ok_or_else(|| EngineError::NotFetched(module.name.clone()))?
                    } else {
                        state
                            .params
                            .as_ref()
                            .ok_or_else(|| EngineError::Internal("parameters in flight".into()))?
                    };
                    (buf, plan.layout.tensor_range(index))
                }
            };
            let typed = buf.as_slice::<T>().ok_or(EngineError::WrongDType {
                requested: T::DTYPE,
                actual: self.dtype,
            })?;
            out.push(&typed[range]);
        }
        Ok(out)
    }

    /// Module `m`'s parameters converted to `f32` (a copy), in registration order.
    pub fn params_f32(&self, m: usize) -> Result<Vec<Vec<f32>>, EngineError> {
        fn widen<T: HostElement>(v: Vec<&[T]>) -> Vec<Vec<f32>> {
            v.into_iter()
                .map(|s| s.iter().map(|x| x.to_f32()).collect())
                .collect()
        }
        Ok(match self.dtype {
            zero_kernels::DType::F32 => widen(self.params::<f32>(m)?),
            zero_kernels::DType::F16 => widen(self.params::<half::f16>(m)?),
            zero_kernels::DType::BF16 => widen(self.params::<half::bf16>(m)?),
        })
    }

    /// Mutable views of module `m`'s gradients (trainable parameters only, in registration
    /// order), inside the bucket they are reduced from. They hold zeros at the start of a
    /// micro-step; add the gradient in, then call [`Engine::grads_ready`].
    pub fn grads_mut<T: HostElement>(&mut self, m: usize) -> Result<Vec<&mut [T]>, EngineError> {
        self.begin_backward(m)?;
        let dtype = self.dtype;
        let wanted: Vec<(usize, usize, usize)> = (0..self.modules[m].params.len())
            .filter_map(|k| match self.plan.locs[self.first_param[m] + k] {
                ParamLoc::Bucket { bucket, index } => Some((k, bucket, index)),
                ParamLoc::Frozen { .. } => None,
            })
            .collect();
        let mut slots: Vec<Option<&mut [T]>> = (0..wanted.len()).map(|_| None).collect();
        for (b, state) in self.buckets.iter_mut().enumerate() {
            if !wanted.iter().any(|w| w.1 == b) {
                continue;
            }
            let buf = state.grads.as_mut().ok_or_else(|| {
                EngineError::Internal(format!("bucket {b} has no gradient buffer"))
            })?;
            let typed = buf.as_mut_slice::<T>().ok_or(EngineError::WrongDType {
                requested: T::DTYPE,
                actual: dtype,
            })?;
            let mut views: Vec<Option<&mut [T]>> =
                tensor_views_mut(&self.plan.buckets[b].layout, typed)?
                    .into_iter()
                    .map(Some)
                    .collect();
            for (slot, w) in wanted.iter().enumerate() {
                if w.1 == b {
                    slots[slot] = views[w.2].take();
                }
            }
        }
        slots
            .into_iter()
            .map(|s| s.ok_or_else(|| EngineError::Internal("gradient view missing".into())))
            .collect()
    }

    /// Adds `grads` (one `f32` slice per trainable parameter of `m`, in registration
    /// order) into the module's gradient views, rounding to the gradient dtype.
    pub fn add_grads_f32(&mut self, m: usize, grads: &[&[f32]]) -> Result<(), EngineError> {
        fn add<T: HostElement>(
            views: Vec<&mut [T]>,
            grads: &[&[f32]],
            name: &str,
        ) -> Result<(), EngineError> {
            if views.len() != grads.len() {
                return Err(EngineError::GradShape {
                    module: name.to_string(),
                    detail: format!(
                        "{} gradients given for {} trainable parameters",
                        grads.len(),
                        views.len()
                    ),
                });
            }
            for (i, (v, g)) in views.into_iter().zip(grads).enumerate() {
                if v.len() != g.len() {
                    return Err(EngineError::GradShape {
                        module: name.to_string(),
                        detail: format!(
                            "gradient {i} has {} elements, the parameter has {}",
                            g.len(),
                            v.len()
                        ),
                    });
                }
                for (d, s) in v.iter_mut().zip(g.iter()) {
                    *d = T::from_f32(d.to_f32() + *s);
                }
            }
            Ok(())
        }
        let name = self.module(m)?.name.clone();
        match self.dtype {
            zero_kernels::DType::F32 => add(self.grads_mut::<f32>(m)?, grads, &name),
            zero_kernels::DType::F16 => add(self.grads_mut::<half::f16>(m)?, grads, &name),
            zero_kernels::DType::BF16 => add(self.grads_mut::<half::bf16>(m)?, grads, &name),
        }
    }
}
