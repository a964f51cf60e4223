//! `ZeroModule`: a part of a candle model whose parameters stage 3 gathers just before
//! use and frees right after.

use crate::ops::{PreBackward, Sink};
use candle_core::{Module, Tensor};
use std::sync::Arc;

/// A wrapped module (see `ZeroCandle::wrap`). In stage 3 its forward gathers its engine
/// modules and fills their candle storage, runs the inner module, puts a [`PreBackward`]
/// marker on the output (whose backward gathers them again before the inner module's
/// backward), and releases them, freeing the storage; the gradient taps release them after
/// backward. In stages 0–2 it is the inner module.
pub struct ZeroModule<M> {
    inner: M,
    modules: Vec<usize>,
    sink: Arc<dyn Sink>,
}

impl<M> ZeroModule<M> {
    pub(crate) fn new(inner: M, modules: Vec<usize>, sink: Arc<dyn Sink>) -> Self {
        Self {
            inner,
            modules,
            sink,
        }
    }

    /// The wrapped module.
    pub fn inner(&self) -> &M {
        &self.inner
    }

    /// Runs `f` on the inner module between gather and release (for a forward that takes
    /// more than one tensor).
    pub fn call(
        &self,
        f: impl FnOnce(&M) -> candle_core::Result<Tensor>,
    ) -> candle_core::Result<Tensor> {
        if self.modules.is_empty() {
            return f(&self.inner);
        }
        self.sink.fetch(&self.modules)?;
        let out = f(&self.inner).and_then(|y| {
            if y.track_op() {
                y.contiguous()?.apply_op1(PreBackward {
                    modules: self.modules.clone(),
                    sink: Arc::downgrade(&self.sink),
                })
            } else {
                Ok(y)
            }
        });
        let released = self.sink.release(&self.modules);
        let y = out?;
        released?;
        Ok(y)
    }
}

impl<M: Module> Module for ZeroModule<M> {
    fn forward(&self, xs: &Tensor) -> candle_core::Result<Tensor> {
        self.call(|m| m.forward(xs))
    }
}
