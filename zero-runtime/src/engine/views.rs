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
        // Each trainable parameter's (bucket, index in the bucket), in the answer's order.
        let wanted = self.trainable_locs(m)?;
        let mut views: Vec<(usize, &mut [T])> = Vec::with_capacity(wanted.len());
        let Self {
            buckets,
            plan,
            pool,
            ..
        } = self;
        // Only the buckets between the module's first and last (a gradient's write calls
        // this: every bucket of a large model would cost each one a walk).
        let (Some(lo), Some(hi)) = (
            wanted.iter().map(|w| w.0).min(),
            wanted.iter().map(|w| w.0).max(),
        ) else {
            return Ok(Vec::new());
        };
        let states = buckets[lo..=hi].iter_mut().zip(pool.lent_mut_in(lo..=hi));
        for (b, (state, staging)) in (lo..=hi).zip(states) {
            if !wanted.iter().any(|w| w.0 == b) {
                continue;
            }
            state.released = 0; // written from here on
                                // (begin_backward made the buffer ready: held, or lent by the pool.)
            let buf = match staging {
                Some(staging) => staging,
                None => state.grads.whole_mut(b)?,
            };
            let typed = buf.as_mut_slice::<T>().ok_or(EngineError::WrongDType {
                requested: T::DTYPE,
                actual: dtype,
            })?;
            for (index, view) in tensor_views_mut(&plan.buckets[b].layout, typed)?
                .into_iter()
                .enumerate()
            {
                if let Some(slot) = wanted.iter().position(|&w| w == (b, index)) {
                    views.push((slot, view));
                }
            }
        }
        views.sort_unstable_by_key(|(slot, _)| *slot);
        Ok(views.into_iter().map(|(_, v)| v).collect())
    }
}
