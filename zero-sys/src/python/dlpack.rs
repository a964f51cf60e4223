//! Memory zero owns, handed to a Python framework as a tensor through DLPack: a
//! `"dltensor"` capsule over a lease (a [`Lease`] of host memory, or any owner of device
//! memory: [`SharedMemory`]), which `torch.from_dlpack` turns into a tensor that views the
//! memory (no copy) and keeps the lease until its storage is freed.
//!
//! DLPack is the framework-neutral way to share a tensor's memory (data API standard,
//! `torch.utils.dlpack`); the capsule protocol is the pre-1.0 one every framework still
//! accepts: the consumer renames a capsule it took to `"used_dltensor"` and calls the
//! managed tensor's deleter when done; a capsule nobody took calls it when collected.

use crate::host_vec::Lease;
use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_void, CStr};

/// An element type a capsule can describe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DlElement {
    /// IEEE float32.
    F32,
    /// IEEE float16.
    F16,
    /// bfloat16.
    BF16,
}

impl DlElement {
    fn size(self) -> usize {
        match self {
            DlElement::F32 => 4,
            DlElement::F16 | DlElement::BF16 => 2,
        }
    }

    fn dl(self) -> DLDataType {
        let (code, bits) = match self {
            DlElement::F32 => (K_DL_FLOAT, 32),
            DlElement::F16 => (K_DL_FLOAT, 16),
            DlElement::BF16 => (K_DL_BFLOAT, 16),
        };
        DLDataType {
            code,
            bits,
            lanes: 1,
        }
    }
}

// dlpack.h (v0.8): the structs a "dltensor" capsule points to.
const K_DL_CPU: i32 = 1;
const K_DL_CUDA: i32 = 2;
const K_DL_FLOAT: u8 = 2;
const K_DL_BFLOAT: u8 = 4;
const CAPSULE_NAME: &CStr = c"dltensor";

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// Where a capsule's memory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DlDevice {
    /// Host memory.
    Cpu,
    /// Device memory of the CUDA GPU with this ordinal.
    Cuda(usize),
}

/// Memory a capsule describes: its address and size, where it is, and what keeps it
/// alive (dropped, on any thread, once the framework's tensor is freed).
pub struct SharedMemory {
    /// The address of the memory's first byte (a device address for [`DlDevice::Cuda`]).
    pub addr: u64,
    /// Its size in bytes.
    pub bytes: usize,
    /// Where it is.
    pub device: DlDevice,
    /// Keeps the memory alive: a lease on it.
    pub keep: Box<dyn Send>,
}

/// What a capsule owns: the managed tensor (first, so a pointer to it is a pointer to
/// this), the arrays it points to, and the lease keeping the memory alive.
#[repr(C)]
struct Managed {
    tensor: DLManagedTensor,
    shape: Vec<i64>,
    strides: Vec<i64>,
    _lease: Box<dyn Send>,
}

/// The managed tensor's deleter: frees what the capsule owned, the lease with it. Called
/// by the consumer (on any thread, without the GIL) or by the capsule's destructor.
unsafe extern "C" fn delete_managed(t: *mut DLManagedTensor) {
    if !t.is_null() {
        // SAFETY: `t` is the `Box<Managed>` leaked in `host_capsule` (its first field, repr(C)),
        // and DLPack calls the deleter once.
        drop(unsafe { Box::from_raw(t.cast::<Managed>()) });
    }
}

/// The capsule's destructor: a capsule nobody consumed still owns its tensor.
unsafe extern "C" fn destroy_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with the capsule being destroyed (the GIL held); a consumed
    // capsule was renamed, so only an unconsumed one is still valid under our name, and its
    // pointer is the managed tensor we made.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, CAPSULE_NAME.as_ptr()) == 1 {
            let t = ffi::PyCapsule_GetPointer(capsule, CAPSULE_NAME.as_ptr());
            delete_managed(t.cast::<DLManagedTensor>());
        }
    }
}

/// A `"dltensor"` capsule describing a contiguous CPU tensor of `element`s shaped `shape`,
/// starting `offset` elements into `lease`'s memory. `torch.from_dlpack(capsule)` gives a
/// tensor over that memory (its own storage, of exactly its bytes) holding the lease. An
/// error if the tensor does not fit the leased bytes.
pub fn host_capsule<'py>(
    py: Python<'py>,
    lease: Lease,
    element: DlElement,
    offset: usize,
    shape: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    let memory = SharedMemory {
        addr: lease.addr() as u64,
        bytes: lease.bytes(),
        device: DlDevice::Cpu,
        keep: Box::new(lease),
    };
    capsule(py, memory, element, offset, shape)
}

/// A `"dltensor"` capsule describing a contiguous tensor of `element`s shaped `shape`,
/// starting `offset` elements into `memory`, on its device: `torch.from_dlpack(capsule)`
/// gives a tensor over that memory (on `cuda:N` for [`DlDevice::Cuda`]`(N)`) holding
/// `memory.keep`. An error if the tensor does not fit the memory's bytes.
pub fn capsule<'py>(
    py: Python<'py>,
    memory: SharedMemory,
    element: DlElement,
    offset: usize,
    shape: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    let len = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let end = len
        .and_then(|n| n.checked_add(offset))
        .and_then(|n| n.checked_mul(element.size()));
    if end.is_none_or(|e| e > memory.bytes) {
        return Err(PyValueError::new_err(format!(
            "a tensor of shape {shape:?} at element {offset} does not fit the {} leased bytes of {element:?}",
            memory.bytes
        )));
    }
    let addr = memory.addr + (offset * element.size()) as u64;
    let device = match memory.device {
        DlDevice::Cpu => DLDevice {
            device_type: K_DL_CPU,
            device_id: 0,
        },
        DlDevice::Cuda(ordinal) => DLDevice {
            device_type: K_DL_CUDA,
            device_id: i32::try_from(ordinal).map_err(|_| {
                PyValueError::new_err(format!("CUDA device ordinal {ordinal} is out of range"))
            })?,
        },
    };
    // Contiguous (row-major) strides, in elements.
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1] as i64;
    }
    let mut managed = Box::new(Managed {
        tensor: DLManagedTensor {
            dl_tensor: DLTensor {
                data: addr as *mut c_void,
                device,
                ndim: shape.len() as i32,
                dtype: element.dl(),
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_managed),
        },
        shape: shape.iter().map(|&d| d as i64).collect(),
        strides,
        _lease: memory.keep,
    });
    managed.tensor.dl_tensor.shape = managed.shape.as_mut_ptr();
    managed.tensor.dl_tensor.strides = managed.strides.as_mut_ptr();
    let raw = Box::into_raw(managed);
    // SAFETY: `raw` points to the managed tensor (first field of `Managed`), valid until its
    // deleter runs; `shape` and `strides` point into vectors the box owns and never
    // changes (a 0-dimensional tensor's point at no element and are not read). The
    // name is a static C string, as PyCapsule_New requires; the GIL is held (`py`).
    let capsule = unsafe {
        ffi::PyCapsule_New(
            raw.cast::<c_void>(),
            CAPSULE_NAME.as_ptr(),
            Some(destroy_capsule),
        )
    };
    if capsule.is_null() {
        // SAFETY: no capsule took `raw`; it is ours to free, once.
        unsafe { delete_managed(raw.cast::<DLManagedTensor>()) };
    }
    // SAFETY: PyCapsule_New returned a new reference, or null with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, capsule) }
}
