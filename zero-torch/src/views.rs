//! One copy of the parameters: PyTorch's parameters *are* the engine's buffers. Each
//! parameter becomes a tensor over its range of the buffer that holds it (a bucket's
//! 16-bit parameters, stage 3's gathered bucket, the frozen parameters), handed to torch
//! as a DLPack capsule over a lease on that buffer: torch reads and autograd saves the
//! engine's memory itself, the optimizer step writes it in place, and a parameter that
//! outlives the engine keeps its values (the lease keeps the memory).
//!
//! On a GPU the capsule describes device memory of the engine's GPU (`cuda:N`); torch's
//! kernels on its current stream and the engine's on its own are ordered by the crossings
//! the Python side makes around every engine write (`Engine.cross`).
//!
//! Each parameter gets its own torch storage of exactly its bytes, as in a model torch
//! allocated itself, so code that looks for tensors sharing storage (safetensors,
//! `save_pretrained`) sees none.

use crate::errors::to_py;
use crate::start::Inner;
use crate::tensors::{self, element};
use pyo3::prelude::*;
use zero_sys::python::dlpack::{capsule, host_capsule, DlDevice, SharedMemory};

/// DLPack capsules of parameters `ks` of module `m`, each shaped like its parameter and
/// over the engine buffer that holds it now (stage 3: fetch the module first).
pub fn capsules<'py>(
    py: Python<'py>,
    inner: &Inner,
    m: usize,
    ks: &[usize],
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let modules = match inner {
        Inner::Host(e) => e.modules(),
        Inner::Cuda(e) => e.modules(),
    };
    let module = modules.get(m).ok_or_else(|| {
        to_py(zero_runtime::EngineError::UnknownModule {
            index: m,
            count: modules.len(),
        })
    })?;
    ks.iter()
        .map(|&k| match inner {
            Inner::Host(e) => {
                let (buf, range) = e.param_buffer(m, k).map_err(to_py)?;
                let shape = &module.params[k].shape;
                host_capsule(py, buf.lease(), element(buf.dtype()), range.start, shape)
            }
            Inner::Cuda(e) => {
                let (buf, range) = e.param_buffer(m, k).map_err(to_py)?;
                let shape = &module.params[k].shape;
                let lease = buf.lease();
                let memory = SharedMemory {
                    addr: lease.addr(),
                    bytes: lease.bytes(),
                    device: DlDevice::Cuda(lease.ordinal()),
                    keep: Box::new(lease),
                };
                capsule(py, memory, element(buf.dtype()), range.start, shape)
            }
        })
        .collect()
}

/// What this rank keeps of parameter `k` of module `m` between uses (DeepSpeed's
/// `ds_tensor`; see [`zero_runtime::HeldParam`]), flattened: a DLPack capsule over the
/// engine's memory (a CPU tensor where it lives on the host, in the `offload_param` tier
/// too), or, where that partition is in the NVMe swap file, its values read from it as
/// native-endian `f32` bytes.
pub fn held<'py>(
    py: Python<'py>,
    inner: &mut Inner,
    m: usize,
    k: usize,
) -> PyResult<Bound<'py, PyAny>> {
    use zero_runtime::HeldParam;
    let dtype = match inner {
        Inner::Host(e) => e.dtype(),
        Inner::Cuda(e) => e.dtype(),
    };
    let swapped = match &*inner {
        Inner::Host(e) => match e.held_param(m, k).map_err(to_py)? {
            HeldParam::Buffer(buf, r) | HeldParam::Host(buf, r) => {
                return host_capsule(py, buf.lease(), element(dtype), r.start, &[r.len()])
            }
            HeldParam::Swapped { bucket, range } => (bucket, range),
        },
        Inner::Cuda(e) => match e.held_param(m, k).map_err(to_py)? {
            HeldParam::Buffer(buf, r) => {
                let lease = buf.lease();
                let memory = SharedMemory {
                    addr: lease.addr(),
                    bytes: lease.bytes(),
                    device: DlDevice::Cuda(lease.ordinal()),
                    keep: Box::new(lease),
                };
                return capsule(py, memory, element(dtype), r.start, &[r.len()]);
            }
            HeldParam::Host(buf, r) => {
                return host_capsule(py, buf.lease(), element(dtype), r.start, &[r.len()])
            }
            HeldParam::Swapped { bucket, range } => (bucket, range),
        },
    };
    let (bucket, range) = swapped;
    let values = match inner {
        Inner::Host(e) => e.read_swapped_f32(bucket, range),
        Inner::Cuda(e) => e.read_swapped_f32(bucket, range),
    }
    .map_err(to_py)?;
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    Ok(pyo3::types::PyBytes::new(py, &bytes).into_any())
}

/// `(address, bytes)` of every buffer that holds parameters now.
pub fn storage_ranges(inner: &Inner) -> PyResult<Vec<(usize, usize)>> {
    Ok(match inner {
        Inner::Host(e) => e
            .param_buffers()
            .into_iter()
            .map(|b| {
                let lease = b.lease();
                (lease.addr(), lease.bytes())
            })
            .collect(),
        Inner::Cuda(e) => {
            let stream = e.device().stream().cuda();
            e.param_buffers()
                .into_iter()
                .map(|b| (b.read_addr(stream).0 as usize, b.bytes()))
                .collect()
        }
    })
}

/// Values of `(module, k, tensor)` for [`Engine::adopt_params`](zero_runtime::Engine::adopt_params):
/// the global ids and the tensors' values as `f32`.
pub fn adopted(
    inner: &Inner,
    params: &[(usize, usize, Bound<'_, PyAny>)],
) -> PyResult<Vec<(usize, Vec<f32>)>> {
    params
        .iter()
        .map(|(m, k, t)| {
            let id = match inner {
                Inner::Host(e) => e.param_id(*m, *k),
                Inner::Cuda(e) => e.param_id(*m, *k),
            }
            .map_err(to_py)?;
            Ok((id, tensors::read_f32(t)?))
        })
        .collect()
}
