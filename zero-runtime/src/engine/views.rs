//! Host views: the parameters and gradients a trainer on the CPU reads and writes, as
//! typed slices straight into the engine's flat buffers (no copy).

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
}
