#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod checkpoint;
mod cuda_tensors;
mod engine;
mod errors;
mod exchange;
mod host_memory;
mod relay;
mod resolved;
mod results;
mod start;
mod tensors;
mod views;

use pyo3::prelude::*;

/// The extension module `zero_torch._native`: the engine and the exception types. The
/// Python package `zero_torch` (python/zero_torch) is the API scripts use.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<engine::NativeEngine>()?;
    m.add_class::<results::StepOutcome>()?;
    m.add_class::<results::StepCounts>()?;
    m.add_class::<results::MemoryReport>()?;
    m.add_class::<results::CommReport>()?;
    m.add_class::<results::HfLoad>()?;
    m.add_class::<results::ExternalPiece>()?;
    m.add_class::<results::LaunchInfo>()?;
    m.add_class::<resolved::AdamHyper>()?;
    m.add_class::<resolved::ResolvedOptimizer>()?;
    m.add_class::<resolved::ResolvedConfig>()?;
    m.add_function(wrap_pyfunction!(engine::launch_info, m)?)?;
    m.add_function(wrap_pyfunction!(resolved::resolve_config, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::read_fp32_state, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::read_client_state, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::read_checkpoint_summary, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::read_hf_tensors, m)?)?;
    m.add_function(wrap_pyfunction!(host_memory::pin_mmap_threshold, m)?)?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
