//! `zero-kernels`: the numeric kernels of zero.
//!
//! Every kernel here is a CPU implementation that is also the CPU-offload path; the CUDA
//! twins (same semantics, same test vectors) arrive with the CUDA-path issue.
//!
//! - [`DType`] and [`Element`]: `f32`, `f16` and `bf16` (from the `half` crate), with
//!   round-to-nearest-even narrowing.
//! - [`FlatLayout`]: offsets of many tensors in one flat buffer that splits into `world`
//!   equal, aligned partitions, and which tensor ranges each rank owns.
//! - [`flatten`], [`unflatten`], [`tensor_views`]: copy many tensors into and out of a flat
//!   buffer in one pass, converting dtype in the same pass.
//! - [`adam_step`]: fused mixed-precision Adam/AdamW over a contiguous range.
//! - [`grad_stats`]: non-finite check and sum of squares in one pass, thread-count
//!   independent.
//! - [`cast`]: dtype conversion of a whole slice.
//!
//! ```
//! use zero_kernels::{flatten, DType, FlatLayout};
//! let a = [1.0f32, 2.0, 3.0];
//! let b = [4.0f32; 5];
//! let layout = FlatLayout::new(&[a.len(), b.len()], DType::BF16, 4, 2).unwrap();
//! let mut flat = vec![half::bf16::ZERO; layout.total_len()];
//! flatten(&layout, &[&a[..], &b[..]], &mut flat).unwrap();
//! assert_eq!(flat[layout.tensor_range(1).start].to_f32(), 4.0);
//! ```

mod adam;
mod cast;
mod dtype;
mod error;
mod flatten;
mod layout;
mod par;
mod stats;

pub use adam::{adam_step, AdamConfig, WeightDecay};
pub use cast::cast;
pub use dtype::{bf16_from_f32_rne, DType, Element};
pub use error::KernelError;
pub use flatten::{flatten, tensor_views, tensor_views_mut, unflatten};
pub use layout::{FlatLayout, Shard, DEFAULT_ALIGN_ELEMS};
pub use par::PAR_CHUNK;
pub use stats::{grad_stats, GradStats, STATS_CHUNK};

pub use half::{bf16, f16};
