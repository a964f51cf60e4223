//! The typed allocation behind a device buffer: one `cudarc` slice of the three element
//! types, and the element types' typed access to it. A leaf: [`GpuBuffer`](super::GpuBuffer)
//! and the leases over it both hold a [`GpuData`].

use crate::Element;
use half::{bf16, f16};
use std::sync::Arc;
use zero_sys::cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};

/// The allocation behind a [`GpuBuffer`](super::GpuBuffer).
#[derive(Debug)]
pub enum GpuData {
    /// `f32` elements.
    F32(CudaSlice<f32>),
    /// `f16` elements.
    F16(CudaSlice<f16>),
    /// `bf16` elements.
    BF16(CudaSlice<bf16>),
}

impl GpuData {
    /// The stream the allocation was made on (and is freed on).
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        match self {
            GpuData::F32(s) => s.stream(),
            GpuData::F16(s) => s.stream(),
            GpuData::BF16(s) => s.stream(),
        }
    }
}

/// Element types the kernels take, with their kernel-name suffix and typed access to a
/// [`GpuBuffer`](super::GpuBuffer).
pub trait GpuElement: Element + DeviceRepr + ValidAsZeroBits + Unpin {
    /// `f32`, `f16` or `bf16`.
    const SUFFIX: &'static str;
    /// The typed allocation, if `d` holds this type.
    fn slice(d: &GpuData) -> Option<&CudaSlice<Self>>;
    /// The typed allocation, mutably, if `d` holds this type.
    fn slice_mut(d: &mut GpuData) -> Option<&mut CudaSlice<Self>>;
    /// Wraps an allocation.
    fn wrap(s: CudaSlice<Self>) -> GpuData;
}

macro_rules! gpu_element {
    ($t:ty, $suffix:literal, $variant:ident) => {
        impl GpuElement for $t {
            const SUFFIX: &'static str = $suffix;
            fn slice(d: &GpuData) -> Option<&CudaSlice<Self>> {
                match d {
                    GpuData::$variant(s) => Some(s),
                    _ => None,
                }
            }
            fn slice_mut(d: &mut GpuData) -> Option<&mut CudaSlice<Self>> {
                match d {
                    GpuData::$variant(s) => Some(s),
                    _ => None,
                }
            }
            fn wrap(s: CudaSlice<Self>) -> GpuData {
                GpuData::$variant(s)
            }
        }
    };
}
gpu_element!(f32, "f32", F32);
gpu_element!(f16, "f16", F16);
gpu_element!(bf16, "bf16", BF16);
