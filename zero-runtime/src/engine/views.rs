//! Host views: the parameters and gradients a trainer on the CPU reads and writes, as
//! typed slices straight into the engine's flat buffers (no copy).

use super::Engine;
use crate::device::HostDevice;
use crate::EngineError;
use zero_comm::{Communicator, HostBuffer, HostElement};
use zero_kernels::tensor_views_mut;

impl<C: Communicator<Buffer = HostBuffer>> Engine<C, HostDevice> {
    /// Views of module `m`'s parameters (trainable and frozen, in registration order).
    /// In stage 3 the module must be fetched first.
    pub fn params<T: HostElement>(&self, m: usize) -> Result<Vec<&[T]>, EngineError> {
        (0..self.module(m)?.params.len())
            .map(|k| {
                let (buf, range) = self.param_buffer(m, k)?;
                let typed = buf.as_slice::<T>().ok_or(EngineError::WrongDType {
                    requested: T::DTYPE,
                    actual: self.dtype,
                })?;
                Ok(&typed[range])
            })
            .collect()
    }

    /// Mutable views of module `m`'s gradients (trainable parameters only, in registration
    /// order), inside the bucket they are reduced from. They hold zeros at the start of a
    /// micro-step; add the gradient in, then call [`Engine::grads_ready`].
    pub fn grads_mut<T: HostElement>(&mut self, m: usize) -> Result<Vec<&mut [T]>, EngineError> {
        self.begin_backward(m)?;
        let dtype = self.dtype;
        let wanted = self.trainable_locs(m)?;
        let mut slots: Vec<Option<&mut [T]>> = (0..wanted.len()).map(|_| None).collect();
        for (b, state) in self.buckets.iter_mut().enumerate() {
            if !wanted.iter().any(|w| w.0 == b) {
                continue;
            }
            state.released = 0; // written from here on
            let buf = state.grads.written(b)?;
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
                if w.0 == b {
                    slots[slot] = views[w.1].take();
                }
            }
        }
        slots
            .into_iter()
            .map(|s| s.ok_or_else(|| EngineError::Internal("gradient view missing".into())))
            .collect()
    }
}
