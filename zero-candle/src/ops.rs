//! The candle ops the adapter puts in a model's graph, and the in-place writes into
//! candle's storage.
//!
//! - [`GradTap`]: every parameter the model holds is `tap(anchor)`, where `anchor` is one
//!   1-element variable shared by all. candle's backward accumulates each parameter's
//!   gradient over all its uses and calls the tap's backward once with the sum: the tap
//!   hands it to the engine (never to candle's `GradStore`) and returns no gradient for
//!   the anchor. The tap's own output storage is the parameter's values, written in place
//!   after each step.
//! - [`PreBackward`]: an identity at a stage-3 module's output; its backward runs before
//!   the module's own backward ops and gathers the module's parameters again.

use crate::error::to_candle;
use candle_core::{CpuStorage, CustomOp1, InplaceOp1, Layout, Shape, Tensor};
use std::ops::Range;
use std::sync::Weak;
use zero_runtime::Device;

/// Where the ops report to: the adapter's shared state.
pub(crate) trait Sink: Send + Sync {
    /// Parameter `slot`'s fully accumulated gradient.
    fn gradient(&self, slot: usize, grad: &Tensor) -> candle_core::Result<()>;
    /// Stage 3: gather `modules` (before a wrapped forward, and again before its backward)
    /// and fill their storage.
    fn fetch(&self, modules: &[usize]) -> candle_core::Result<()>;
    /// Stage 3: release `modules` and free their storage.
    fn release(&self, modules: &[usize]) -> candle_core::Result<()>;
}

pub(crate) fn gone() -> candle_core::Error {
    to_candle("the adapter was dropped while its model was still in use")
}

/// The identity between the shared anchor and parameter `slot` (see the module docs).
pub(crate) struct GradTap {
    pub slot: usize,
    pub shape: Shape,
    pub sink: Weak<dyn Sink>,
}

impl CustomOp1 for GradTap {
    fn name(&self) -> &'static str {
        "zero-grad-tap"
    }

    fn cpu_fwd(
        &self,
        _anchor: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        Ok((
            CpuStorage::F32(vec![0.0; self.shape.elem_count()]),
            self.shape.clone(),
        ))
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        self.sink
            .upgrade()
            .ok_or_else(gone)?
            .gradient(self.slot, grad)?;
        Ok(None)
    }
}

/// The identity at a stage-3 module's output (see the module docs).
pub(crate) struct PreBackward {
    pub modules: Vec<usize>,
    pub sink: Weak<dyn Sink>,
}

impl CustomOp1 for PreBackward {
    fn name(&self) -> &'static str {
        "zero-pre-backward"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(v) = s else {
            return Err(to_candle(
                "a wrapped module must return f32 (zero-candle trains f32 candle models)",
            ));
        };
        let out: Vec<f32> = match l.contiguous_offsets() {
            Some((a, b)) => v[a..b].to_vec(),
            None => return Err(to_candle("a wrapped module's output must be contiguous")),
        };
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }

    fn bwd(&self, _: &Tensor, _: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        self.sink.upgrade().ok_or_else(gone)?.fetch(&self.modules)?;
        Ok(Some(grad.clone()))
    }
}

/// Writes a parameter's values from an engine buffer into candle's storage, reusing the
/// allocation (allocating it again only after [`Empty`]).
struct Fill<'a, D: Device> {
    dev: &'a D,
    buf: &'a D::Buffer,
    range: Range<usize>,
}

impl<D: Device> InplaceOp1 for Fill<'_, D> {
    fn name(&self) -> &'static str {
        "zero-fill"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        let CpuStorage::F32(v) = storage else {
            return Err(to_candle("parameters are f32 in candle storage"));
        };
        v.resize(self.range.len(), 0.0);
        self.dev
            .download_f32_into(self.buf, self.range.clone(), v)
            .map_err(to_candle)
    }
}

/// Frees a parameter's candle storage (stage 3, between uses).
struct Empty;

impl InplaceOp1 for Empty {
    fn name(&self) -> &'static str {
        "zero-empty"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        if let CpuStorage::F32(v) = storage {
            *v = Vec::new();
        }
        Ok(())
    }
}

/// Writes `buf[range]` into `t`'s storage.
pub(crate) fn fill_storage<D: Device>(
    t: &Tensor,
    dev: &D,
    buf: &D::Buffer,
    range: Range<usize>,
) -> candle_core::Result<()> {
    t.inplace_op1(&Fill { dev, buf, range })
}

/// Frees `t`'s storage.
pub(crate) fn empty_storage(t: &Tensor) -> candle_core::Result<()> {
    t.inplace_op1(&Empty)
}
