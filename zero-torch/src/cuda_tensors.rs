//! Moving gradients from PyTorch's CUDA tensors into the GPU engine's buffers: device copies
//! queued on the engine's stream, ordered with torch's current stream by events in both
//! directions (`GpuStream::crossing`): the engine waits for what torch queued so far (the
//! gradient was produced there), and torch's stream waits for the copies, so torch does not
//! reuse a gradient's memory before they ran. Nothing waits on the host. (The parameters
//! need no copies: they view the engine's buffers, `views.rs`.)

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
