#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod adam;
mod cast;
pub mod cuda;
mod dtype;
mod error;
mod flatten;
mod layout;
mod par;
mod stats;
pub mod testing;

pub use adam::{adam_step, AdamConfig, WeightDecay};
pub use cast::{cast, copy};
pub use dtype::{bf16_from_f32_rne, DType, Element};
pub use error::KernelError;
pub use flatten::{flatten, tensor_views, tensor_views_mut, unflatten};
pub use layout::{align_elems, FlatLayout, Shard, ALIGN_BYTES};
pub use par::PAR_CHUNK;
pub use stats::{grad_stats, GradStats, STATS_CHUNK};

pub use half::{bf16, f16};
