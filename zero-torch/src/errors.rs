//! The Python exceptions zero-torch raises, each naming the problem, and the mapping from
//! the engine's errors to them. Every one derives from `zero_torch.ZeroError`
//! (a `RuntimeError`), so one `except` catches them all.

use pyo3::create_exception;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use zero_comm::CommError as RustCommError;
use zero_runtime::EngineError;

create_exception!(
    zero_torch,
    ZeroError,
    PyRuntimeError,
    "Anything zero-torch could not do; the message names the problem."
);
create_exception!(
    zero_torch,
    ConfigError,
    ZeroError,
    "The DeepSpeed config is unusable (unknown key, bad value, inconsistent batch sizes)."
);
create_exception!(
    zero_torch,
    CommError,
    ZeroError,
    "A collective failed on every rank: a rank died, left, timed out or issued another collective (and, after it, any use of what that collective held)."
);
create_exception!(
    zero_torch,
    OrderError,
    ZeroError,
    "Calls out of order (step() before backward(), backward() twice, a module not gathered)."
);
create_exception!(
    zero_torch,
    CheckpointError,
    ZeroError,
    "A checkpoint could not be saved or loaded; the previous one is intact."
);
create_exception!(
    zero_torch,
    DeviceError,
    ZeroError,
    "The GPU could not be used: no driver or NCCL, a tensor on another GPU, a failed kernel."
);

/// The Python exception for an engine error.
pub fn to_py(e: EngineError) -> PyErr {
    let text = e.to_string();
    match e {
        EngineError::Config(_) => ConfigError::new_err(text),
        EngineError::Comm(_) | EngineError::Lost(_) => CommError::new_err(text),
        EngineError::Order(_) | EngineError::NotFetched(_) => OrderError::new_err(text),
        EngineError::Checkpoint(_) => CheckpointError::new_err(text),
        EngineError::Device(_) => DeviceError::new_err(text),
        _ => ZeroError::new_err(text),
    }
}

/// The Python exception for a communicator error (start-up, or a collective).
pub fn comm_to_py(e: RustCommError) -> PyErr {
    CommError::new_err(e.to_string())
}

/// The Python exception for a GPU error (a kernel or copy on torch's tensors).
pub fn device_to_py(e: zero_kernels::cuda::GpuError) -> PyErr {
    DeviceError::new_err(e.to_string())
}

/// Registers the exception types on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ZeroError", py.get_type::<ZeroError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("CommError", py.get_type::<CommError>())?;
    m.add("OrderError", py.get_type::<OrderError>())?;
    m.add("CheckpointError", py.get_type::<CheckpointError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    Ok(())
}
