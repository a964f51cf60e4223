//! Moving values between PyTorch's CPU tensors and the engine's buffers: copies of the
//! tensor's bytes (zero-sys' `HostTensor`), typed with the tensor's dtype; and the DLPack
//! element type the engine's buffers are seen with.

use half::{bf16, f16};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use zero_comm::HostElement;
use zero_kernels::{DType, Element};
use zero_sys::python::dlpack::DlElement;
use zero_sys::python::HostTensor;

/// The DLPack element type of `dtype` (the engine's buffers seen as tensors).
pub(crate) fn element(dtype: DType) -> DlElement {
    match dtype {
        DType::F32 => DlElement::F32,
        DType::F16 => DlElement::F16,
        DType::BF16 => DlElement::BF16,
    }
}

/// The element type of a tensor: float32, float16 or bfloat16.
pub fn dtype_of(t: &Bound<'_, PyAny>) -> PyResult<DType> {
    let name: String = t
        .getattr(pyo3::intern!(t.py(), "dtype"))?
        .str()?
        .extract()?;
    match name.as_str() {
        "torch.float32" => Ok(DType::F32),
        "torch.float16" => Ok(DType::F16),
        "torch.bfloat16" => Ok(DType::BF16),
        other => Err(PyTypeError::new_err(format!(
            "zero trains float32, float16 and bfloat16 parameters; this one is {other}"
        ))),
    }
}

/// Checks that tensor `t` holds elements of `want`, naming `what` otherwise.
pub fn check_dtype(t: &Bound<'_, PyAny>, want: DType, what: &str) -> PyResult<()> {
    let have = dtype_of(t)?;
    if have == want {
        Ok(())
    } else {
        Err(PyTypeError::new_err(format!(
            "{what} is {have}, the engine's buffers hold {want}"
        )))
    }
}

/// The number of elements of tensor `t`.
pub fn numel(t: &Bound<'_, PyAny>) -> PyResult<usize> {
    t.call_method0("numel")?.extract()
}

/// The values of `t` widened to `f32`.
pub fn read_f32(t: &Bound<'_, PyAny>) -> PyResult<Vec<f32>> {
    let mut out = vec![0f32; numel(t)?];
    read_f32_into(t, &mut out)?;
    Ok(out)
}

/// The values of `t` widened to `f32` into `out` (of `t`'s length).
pub fn read_f32_into(t: &Bound<'_, PyAny>, out: &mut [f32]) -> PyResult<()> {
    fn widen<T: Element + bytemuck::Pod>(t: &HostTensor<'_>, out: &mut [f32]) -> PyResult<()> {
        let mut v = vec![T::from_f32(0.0); t.nbytes() / std::mem::size_of::<T>()];
        t.read(bytemuck::cast_slice_mut(&mut v))?;
        for (o, x) in out.iter_mut().zip(&v) {
            *o = x.to_f32();
        }
        Ok(())
    }
    let host = HostTensor::of(t)?;
    let dtype = dtype_of(t)?;
    if host.nbytes() != out.len() * dtype.size_of() {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "the tensor holds {} bytes of {dtype}, {} values were expected",
            host.nbytes(),
            out.len()
        )));
    }
    match dtype {
        DType::F32 => host.read(bytemuck::cast_slice_mut(out)),
        DType::F16 => widen::<f16>(&host, out),
        DType::BF16 => widen::<bf16>(&host, out),
    }
}

/// Copies `src` into tensor `t` (same dtype and length).
pub fn write<T: HostElement + bytemuck::Pod>(t: &Bound<'_, PyAny>, src: &[T]) -> PyResult<()> {
    check_dtype(t, T::DTYPE, "the tensor")?;
    HostTensor::of(t)?.write(bytemuck::cast_slice(src))
}

/// Copies tensor `t` into `dst` (same dtype and length).
pub fn read_into<T: HostElement + bytemuck::Pod>(
    t: &Bound<'_, PyAny>,
    dst: &mut [T],
) -> PyResult<()> {
    check_dtype(t, T::DTYPE, "the gradient")?;
    HostTensor::of(t)?.read(bytemuck::cast_slice_mut(dst))
}

/// Adds tensor `t` into `acc` (same dtype and length), in `f32` and rounded once, as
/// PyTorch accumulates a gradient used twice.
pub fn add_into<T: HostElement + bytemuck::Pod>(
    t: &Bound<'_, PyAny>,
    acc: &mut [T],
) -> PyResult<()> {
    let mut more = vec![T::from_f32(0.0); acc.len()];
    read_into(t, &mut more)?;
    for (a, m) in acc.iter_mut().zip(&more) {
        *a = T::from_f32(a.to_f32() + m.to_f32());
    }
    Ok(())
}

/// Runs `$body` with `$t` the host element type of `$dtype`.
#[macro_export]
macro_rules! with_host_type {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            zero_kernels::DType::F32 => {
                type $t = f32;
                $body
            }
            zero_kernels::DType::F16 => {
                type $t = half::f16;
                $body
            }
            zero_kernels::DType::BF16 => {
                type $t = half::bf16;
                $body
            }
        }
    };
}
