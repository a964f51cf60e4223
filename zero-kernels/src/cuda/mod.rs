//! The CUDA C sources of the GPU kernels: one source of truth, compiled by NVRTC to a
//! cubin for the GPU at hand at first use (and cached on disk).
//!
//! Each source is `common.cuh` followed by the kernel file; none includes a CUDA header,
//! so NVRTC needs no include path. [`GpuStream`] launches them on device buffers.

mod buffer;
mod copies;
mod device_choice;
mod foreign;
mod gpu;
pub mod kernel_cache;
mod lease;
mod ops;
mod out_of_memory;
mod readers;
mod staging;
mod stream;
mod toolchain;

pub use buffer::{GpuBuffer, GpuData, GpuElement};
pub use copies::{copy_dtoh, copy_htod, pinned_flags, Direction};
pub use device_choice::choose_device;
pub use foreign::{ForeignSlice, ForeignStream};
pub use gpu::{Gpu, GpuError};
pub use lease::GpuLease;
pub use ops::{AdamViews, GradScale};
pub use out_of_memory::{set_out_of_memory_hook, OutOfMemoryHook};
pub use stream::{Combine, GpuStream, MAX_REDUCE_BUFFERS};
pub use toolchain::check_toolchain;

/// Helpers every kernel file starts with: 16-bit conversions, element types, indexing.
pub const COMMON: &str = include_str!("../../cuda/common.cuh");

/// A kernel file and the entry points it defines.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// File name, also the NVRTC program name.
    pub name: &'static str,
    /// The file's text (without [`COMMON`]).
    pub body: &'static str,
    /// `extern "C"` entry points it defines.
    pub entries: &'static [&'static str],
}

impl KernelSource {
    /// The complete program: [`COMMON`] then the file.
    pub fn program(&self) -> String {
        format!("{COMMON}\n{}", self.body)
    }
}

/// Every kernel file.
pub const SOURCES: [KernelSource; 5] = [
    KernelSource {
        name: "adam.cu",
        body: include_str!("../../cuda/adam.cu"),
        entries: &[
            "adam_f32_f32",
            "adam_f32_f16",
            "adam_f32_bf16",
            "adam_f16_f32",
            "adam_f16_f16",
            "adam_f16_bf16",
            "adam_bf16_f32",
            "adam_bf16_f16",
            "adam_bf16_bf16",
        ],
    },
    KernelSource {
        name: "flatten.cu",
        body: include_str!("../../cuda/flatten.cu"),
        entries: &[
            "copy_f32_f32",
            "copy_f16_f16",
            "copy_bf16_bf16",
            "copy_f32_f16",
            "copy_f32_bf16",
            "copy_f16_f32",
            "copy_bf16_f32",
        ],
    },
    KernelSource {
        name: "stats.cu",
        body: include_str!("../../cuda/stats.cu"),
        entries: &["stats_f32", "stats_f16", "stats_bf16", "stats_finish"],
    },
    KernelSource {
        name: "cast.cu",
        body: include_str!("../../cuda/cast.cu"),
        entries: &[
            "cast_f32_f16",
            "cast_f32_bf16",
            "cast_f16_f32",
            "cast_bf16_f32",
            "cast_f16_bf16",
            "cast_bf16_f16",
        ],
    },
    KernelSource {
        name: "reduce.cu",
        body: include_str!("../../cuda/reduce.cu"),
        entries: &[
            "reduce_f32",
            "reduce_f16",
            "reduce_bf16",
            "accumulate_f32",
            "accumulate_f16",
            "accumulate_bf16",
        ],
    },
];
