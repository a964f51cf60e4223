//! Moving values between PyTorch's CUDA tensors and the GPU engine's buffers: device copies
//! queued on the engine's stream, ordered with torch's current stream by events in both
//! directions (`GpuStream::crossing`): the engine waits for what torch queued so far (the
//! gradient was produced there, the parameter's storage was just allocated there), and
//! torch's stream waits for the copies, so torch neither reads a parameter nor reuses a
//! gradient's memory before they ran. Nothing waits on the host.

use crate::errors::{device_to_py, to_py};
use crate::start::CudaEngine;
use crate::tensors::check_dtype;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use zero_kernels::cuda::{ForeignSlice, GpuStream};
use zero_kernels::DType;
use zero_sys::python::DeviceTensor;

/// The device memory of CUDA tensor `t` (contiguous, of `dtype`, on the engine's GPU).
fn slice_of<'py>(
    t: &Bound<'py, PyAny>,
    dtype: DType,
    stream: &GpuStream,
    what: &str,
) -> PyResult<(DeviceTensor<'py>, ForeignSlice)> {
    check_dtype(t, dtype, what)?;
    let mem = DeviceTensor::of(t)?;
    let ours = stream.gpu().ordinal;
    if mem.device != ours {
        return Err(crate::errors::DeviceError::new_err(format!(
            "{what} is on cuda:{}, the engine on cuda:{ours} (the local rank's GPU): move the \
             model to cuda:{ours} before initialize()",
            mem.device
        )));
    }
    let slice = ForeignSlice {
        addr: mem.addr,
        len: mem.nbytes / dtype.size_of(),
        dtype,
    };
    Ok((mem, slice))
}

/// Copies module `m`'s parameters (in registration order) into `tensors`.
pub fn fill(e: &CudaEngine, m: usize, tensors: &[Bound<'_, PyAny>], handle: u64) -> PyResult<()> {
    let st = e.device().stream();
    let dtype = e.dtype();
    let count = e.modules().get(m).map_or(0, |s| s.params.len());
    if count != tensors.len() {
        return Err(PyValueError::new_err(format!(
            "module {m} has {count} parameters, {} tensors were given",
            tensors.len()
        )));
    }
    let mut jobs = Vec::with_capacity(count);
    for (k, t) in tensors.iter().enumerate() {
        let (buf, range) = e.param_buffer(m, k).map_err(to_py)?;
        let (mem, dst) = slice_of(t, dtype, st, "the parameter tensor")?;
        jobs.push((buf, range, mem, dst));
    }
    let owner = st.borrow_foreign(handle).map_err(device_to_py)?;
    st.crossing(&owner, |s| {
        jobs.iter()
            .try_for_each(|(buf, range, _, dst)| s.copy_to_foreign(buf, range.clone(), dst))
    })
    .map_err(device_to_py)
}

/// Copies parameter `k` of module `m` into `tensor`.
pub fn fill_param(
    e: &CudaEngine,
    m: usize,
    k: usize,
    tensor: &Bound<'_, PyAny>,
    handle: u64,
) -> PyResult<()> {
    let st = e.device().stream();
    let (buf, range) = e.param_buffer(m, k).map_err(to_py)?;
    let (_mem, dst) = slice_of(tensor, e.dtype(), st, "the parameter tensor")?;
    let owner = st.borrow_foreign(handle).map_err(device_to_py)?;
    st.crossing(&owner, |s| s.copy_to_foreign(buf, range, &dst))
        .map_err(device_to_py)
}

/// Puts the gradient of trainable parameter `k` of module `m` into the engine: copied on
/// its first arrival in a micro-step, added (in `f32`, rounded once) on later ones.
pub fn put_grad(
    e: &mut CudaEngine,
    m: usize,
    k: usize,
    grad: &Bound<'_, PyAny>,
    first: bool,
    handle: u64,
) -> PyResult<()> {
    let st = e.device().stream().clone();
    let (_mem, src) = slice_of(grad, e.dtype(), &st, "the gradient")?;
    let (buf, range) = e.grad_buffer_mut(m, k).map_err(to_py)?;
    if src.len != range.len() {
        return Err(PyValueError::new_err(format!(
            "the gradient has {} elements, the parameter {}",
            src.len,
            range.len()
        )));
    }
    let owner = st.borrow_foreign(handle).map_err(device_to_py)?;
    st.crossing(&owner, |s| {
        if first {
            s.copy_from_foreign(&src, buf, range.start)
        } else {
            s.add_from_foreign(&src, buf, range.start)
        }
    })
    .map_err(device_to_py)
}
