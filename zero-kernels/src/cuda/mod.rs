//! The CUDA C sources of the GPU kernels: one source of truth, compiled by NVRTC to a
//! cubin for the GPU at hand at first use (and cached on disk).
//!
//! Each source is `common.cuh` followed by the kernel file; none includes a CUDA header,
//! so NVRTC needs no include path. [`GpuStream`] launches them on device buffers.
//!
//! Layers, from the ground up: `error.rs` (errors, the driver-error conversion),
//! `sources.rs`, `data.rs` (the typed allocation), `copies.rs`, `readers.rs`, `lease.rs`,
//! `out_of_memory.rs`; then `buffer.rs`, `gpu.rs` (the device and its loaded kernels),
//! `staging.rs`; `stream.rs` (streams, made by the device); `ops.rs`, `foreign.rs`; and
//! `host_slices.rs` on top. Each imports only from the layers below it.

mod buffer;
mod copies;
mod data;
mod device_choice;
mod error;
mod foreign;
mod gpu;
mod host_slices;
pub mod kernel_cache;
mod lease;
mod ops;
mod out_of_memory;
mod readers;
mod sources;
mod staging;
mod stream;
mod toolchain;

pub use buffer::GpuBuffer;
pub use copies::{copy_dtoh, copy_htod, pinned_flags, Direction};
pub use data::{GpuData, GpuElement};
pub use device_choice::choose_device;
pub use error::GpuError;
pub use foreign::{ForeignSlice, ForeignStream};
pub use gpu::Gpu;
pub use lease::GpuLease;
pub use ops::{AdamViews, GradScale};
pub use out_of_memory::{set_out_of_memory_hook, OutOfMemoryHook};
pub use sources::{KernelSource, COMMON, SOURCES};
pub use stream::{Combine, GpuStream, MAX_REDUCE_BUFFERS};
pub use toolchain::check_toolchain;
