//! The memory of a Python framework's tensor (PyTorch's), reached through its public API:
//! `device`, `is_contiguous()`, `data_ptr()` and `nbytes`. Nothing of the framework's
//! internals is read and nothing is linked: the tensor is a Python object.
//!
//! [`HostTensor`] holds the tensor object (so its memory stays alive) and a GIL token (so
//! no Python code runs, and nothing resizes or frees the storage, while it copies). Its
//! bytes are only copied in and out, never borrowed.
//!
//! The other way round, [`dlpack`] hands memory zero owns to the framework as a tensor
//! (a DLPack capsule over a [`Lease`](crate::host_vec::Lease)), so the framework's
//! parameters can live in the engine's buffers.

pub mod dlpack;

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;

/// `(data_ptr, nbytes, device index)` of a contiguous tensor on a device of type `want`
/// (`"cpu"`, `"cuda"`): an error naming the problem otherwise.
fn memory_of(tensor: &Bound<'_, PyAny>, want: &str) -> PyResult<(u64, usize, Option<usize>)> {
    let py = tensor.py();
    // The CPU case is every gradient of every backward (issue 31): `is_cpu` is one
    // attribute read where `device.type` makes a device object and a string.
    let on_cpu = want == "cpu" && tensor.getattr(intern!(py, "is_cpu"))?.extract::<bool>()?;
    let index = if on_cpu {
        None
    } else {
        let device = tensor.getattr(intern!(py, "device"))?;
        let kind: String = device.getattr(intern!(py, "type"))?.extract()?;
        if kind != want {
            return Err(PyValueError::new_err(format!(
                "expected a {} tensor, got one on {kind}",
                if want == "cpu" { "CPU" } else { "CUDA" }
            )));
        }
        device.getattr(intern!(py, "index"))?.extract()?
    };
    let contiguous: bool = tensor
        .call_method0(intern!(py, "is_contiguous"))?
        .extract()?;
    if !contiguous {
        return Err(PyValueError::new_err(
            "expected a contiguous tensor (call .contiguous() first)",
        ));
    }
    let addr: u64 = tensor.call_method0(intern!(py, "data_ptr"))?.extract()?;
    let nbytes: usize = tensor.getattr(intern!(py, "nbytes"))?.extract()?;
    if nbytes > 0 && addr == 0 {
        return Err(PyValueError::new_err(
            "the tensor has no storage (it was freed): gather it first",
        ));
    }
    Ok((addr, nbytes, index))
}

/// A contiguous CPU tensor's memory, for copies.
#[derive(Debug)]
pub struct HostTensor<'py> {
    _tensor: Bound<'py, PyAny>,
    addr: usize,
    nbytes: usize,
}

impl<'py> HostTensor<'py> {
    /// The memory of `tensor`: an error naming the problem unless it is a contiguous tensor
    /// on the CPU.
    pub fn of(tensor: &Bound<'py, PyAny>) -> PyResult<Self> {
        let (addr, nbytes, _) = memory_of(tensor, "cpu")?;
        Ok(HostTensor {
            _tensor: tensor.clone(),
            addr: addr as usize,
            nbytes,
        })
    }

    /// Bytes it holds.
    pub fn nbytes(&self) -> usize {
        self.nbytes
    }

    fn check(&self, what: &str, n: usize) -> PyResult<()> {
        if n == self.nbytes {
            Ok(())
        } else {
            Err(PyValueError::new_err(format!(
                "{what}: the tensor holds {} bytes, {n} were given",
                self.nbytes
            )))
        }
    }

    /// Copies the tensor's bytes into `dst` (exactly its length).
    pub fn read(&self, dst: &mut [u8]) -> PyResult<()> {
        self.check("reading a tensor", dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: a contiguous CPU tensor's data_ptr() addresses nbytes valid bytes while
        // the tensor lives (held in `_tensor`) and its storage is not resized (no Python
        // code runs while the GIL, which `'py` proves held, is not released); the range
        // cannot overlap `dst`, which Rust owns. Only a copy is made; no reference to the
        // tensor's memory escapes.
        unsafe {
            std::ptr::copy_nonoverlapping(self.addr as *const u8, dst.as_mut_ptr(), dst.len())
        };
        Ok(())
    }

    /// Copies `src` (exactly the tensor's length) into the tensor.
    pub fn write(&self, src: &[u8]) -> PyResult<()> {
        self.check("writing a tensor", src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: as in `read`, with the roles swapped; the tensor's memory is writable
        // (a tensor's storage always is).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.addr as *mut u8, src.len()) };
        Ok(())
    }
}

/// A contiguous CUDA tensor's device memory: its address, byte count and device index,
/// with the tensor object held so the memory stays allocated while this lives. The bytes
/// are never touched from the host; GPU work on them must be ordered with the tensor's
/// stream (zero-kernels' `GpuStream::crossing`).
#[derive(Debug)]
pub struct DeviceTensor<'py> {
    _tensor: Bound<'py, PyAny>,
    /// Device address of the first byte.
    pub addr: u64,
    /// Bytes it holds.
    pub nbytes: usize,
    /// The CUDA device ordinal it lives on.
    pub device: usize,
}

impl<'py> DeviceTensor<'py> {
    /// The memory of `tensor`: an error naming the problem unless it is a contiguous tensor
    /// on a CUDA device.
    pub fn of(tensor: &Bound<'py, PyAny>) -> PyResult<Self> {
        let (addr, nbytes, index) = memory_of(tensor, "cuda")?;
        Ok(DeviceTensor {
            _tensor: tensor.clone(),
            addr,
            nbytes,
            device: index.unwrap_or(0),
        })
    }
}
