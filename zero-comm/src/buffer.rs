//! Host buffers: owned, typed, moved through collectives. Their memory is a
//! [`HostVec`]: a framework's tensors may view it through a [`Lease`] (zero-torch's
//! parameters live in the engine's buffers), and a collective writes it in place.

use half::{bf16, f16};
use zero_kernels::{DType, Element};
pub use zero_sys::host_vec::{HostVec, Lease, Leased};

/// What a collective needs to know of a buffer, whatever memory it lives in.
pub trait CommBuffer: Send + 'static {
    /// The element type.
    fn dtype(&self) -> DType;
    /// Number of elements.
    fn len(&self) -> usize;
    /// Whether it holds no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl CommBuffer for HostBuffer {
    fn dtype(&self) -> DType {
        HostBuffer::dtype(self)
    }
    fn len(&self) -> usize {
        HostBuffer::len(self)
    }
}

impl CommBuffer for zero_kernels::cuda::GpuBuffer {
    fn dtype(&self) -> DType {
        zero_kernels::cuda::GpuBuffer::dtype(self)
    }
    fn len(&self) -> usize {
        zero_kernels::cuda::GpuBuffer::len(self)
    }
}

/// An owned host buffer of one of the three element types.
#[derive(Debug, Clone, PartialEq)]
pub enum HostBuffer {
    /// `f32` elements.
    F32(HostVec<f32>),
    /// `f16` elements.
    F16(HostVec<f16>),
    /// `bf16` elements.
    BF16(HostVec<bf16>),
}

impl HostBuffer {
    /// A buffer of `len` zeros of `dtype`.
    pub fn zeros(dtype: DType, len: usize) -> Self {
        match dtype {
            DType::F32 => HostBuffer::F32(HostVec::zeroed(len)),
            DType::F16 => HostBuffer::F16(HostVec::zeroed(len)),
            DType::BF16 => HostBuffer::BF16(HostVec::zeroed(len)),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            HostBuffer::F32(_) => DType::F32,
            HostBuffer::F16(_) => DType::F16,
            HostBuffer::BF16(_) => DType::BF16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            HostBuffer::F32(v) => v.len(),
            HostBuffer::F16(v) => v.len(),
            HostBuffer::BF16(v) => v.len(),
        }
    }

    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.len() * self.dtype().size_of()
    }

    /// The elements as `T`, if that is what it holds.
    pub fn as_slice<T: HostElement>(&self) -> Option<&[T]> {
        T::slice(self)
    }

    /// The elements as mutable `T`, if that is what it holds.
    pub fn as_mut_slice<T: HostElement>(&mut self) -> Option<&mut [T]> {
        T::slice_mut(self)
    }

    /// The `f32` vector, if that is what it holds (a copy).
    pub fn into_f32(self) -> Option<Vec<f32>> {
        match self {
            HostBuffer::F32(v) => Some(v.into_vec()),
            _ => None,
        }
    }

    /// The `f16` vector, if that is what it holds (a copy).
    pub fn into_f16(self) -> Option<Vec<f16>> {
        match self {
            HostBuffer::F16(v) => Some(v.into_vec()),
            _ => None,
        }
    }

    /// The `bf16` vector, if that is what it holds (a copy).
    pub fn into_bf16(self) -> Option<Vec<bf16>> {
        match self {
            HostBuffer::BF16(v) => Some(v.into_vec()),
            _ => None,
        }
    }

    /// A lease on the buffer's memory, for a framework's tensor to view it (see
    /// [`HostVec`]): the memory stays allocated while the lease lives, even after the
    /// buffer is dropped.
    pub fn lease(&self) -> Lease {
        match self {
            HostBuffer::F32(v) => v.lease(),
            HostBuffer::F16(v) => v.lease(),
            HostBuffer::BF16(v) => v.lease(),
        }
    }

    /// Zeroes a mapped buffer by handing its pages back to the kernel (see
    /// [`HostVec::release_pages`]); returns the bytes handed back, 0 for a buffer from the
    /// heap, which is left as it is.
    pub fn release_pages(&mut self) -> usize {
        match self {
            HostBuffer::F32(v) => v.release_pages(),
            HostBuffer::F16(v) => v.release_pages(),
            HostBuffer::BF16(v) => v.release_pages(),
        }
    }

    /// How many leases on its memory are alive.
    pub fn leases(&self) -> usize {
        match self {
            HostBuffer::F32(v) => v.leases(),
            HostBuffer::F16(v) => v.leases(),
            HostBuffer::BF16(v) => v.leases(),
        }
    }

    /// Changes the length, zero-filling new elements; refused when it would move a leased
    /// allocation.
    pub fn resize(&mut self, len: usize) -> Result<(), Leased> {
        match self {
            HostBuffer::F32(v) => v.resize(len, 0.0),
            HostBuffer::F16(v) => v.resize(len, f16::ZERO),
            HostBuffer::BF16(v) => v.resize(len, bf16::ZERO),
        }
    }
}

/// Element types a [`HostBuffer`] can hold, with typed access to it.
pub trait HostElement: Element {
    /// The typed slice, if `b` holds this type.
    fn slice(b: &HostBuffer) -> Option<&[Self]>;
    /// The typed mutable slice, if `b` holds this type.
    fn slice_mut(b: &mut HostBuffer) -> Option<&mut [Self]>;
}

macro_rules! host_element {
    ($t:ty, $variant:ident) => {
        impl HostElement for $t {
            fn slice(b: &HostBuffer) -> Option<&[Self]> {
                match b {
                    HostBuffer::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn slice_mut(b: &mut HostBuffer) -> Option<&mut [Self]> {
                match b {
                    HostBuffer::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
        impl From<Vec<$t>> for HostBuffer {
            fn from(v: Vec<$t>) -> Self {
                HostBuffer::$variant(v.into())
            }
        }
    };
}
host_element!(f32, F32);
host_element!(f16, F16);
host_element!(bf16, BF16);
