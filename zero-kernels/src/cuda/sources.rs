//! The CUDA C sources of the GPU kernels, each with its entry points: a leaf of `cuda/`.

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
