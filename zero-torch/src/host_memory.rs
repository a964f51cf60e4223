//! The process's host allocator, tuned for an engine that lives beside torch's tensors.

use pyo3::prelude::*;

/// `_native.pin_mmap_threshold(bytes)`: pins glibc malloc's mmap threshold (see
/// `zero_sys::malloc::pin_mmap_threshold`), so freed tensors of at least `bytes` go back to
/// the kernel instead of staying in the heap. Whether it was set.
#[pyfunction]
pub fn pin_mmap_threshold(bytes: usize) -> bool {
    zero_sys::malloc::pin_mmap_threshold(bytes)
}
