#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

//! Checkpoints: the format, its files and how they are read back, independent of the
//! engine (the engine's `save_checkpoint` / `load_checkpoint` / `save_16bit_model` and the
//! `zero-ckpt` tool build on this), and the one file I/O layer ([`io`]) checkpoints and NVMe
//! offload share.
//!
//! A checkpoint is a folder `DIR/TAG/` of safetensors files and a JSON manifest:
//!
//! ```text
//! DIR/latest                          the tag of the newest complete checkpoint
//! DIR/TAG/manifest.json               written last: a tag without it does not exist
//! DIR/TAG/rank00000-master.safetensors  rank 0's fragments of the fp32 master weights
//! DIR/TAG/rank00000-moments.safetensors rank 0's exp_avg and exp_avg_sq fragments
//! DIR/TAG/rank00000.index.json        rank 0's files: sizes, CRC-32C whole and per chunk
//! DIR/TAG/frozen.safetensors          frozen parameters, whole, in the 16-bit dtype
//! ```
//!
//! Rank `r` saves partition `r` of every bucket (in every stage), as one 1-D fragment per
//! parameter it touches, keyed by the parameter's name; the manifest lists, for every
//! parameter, its shape and fragments (rank, offset in the flattened parameter, length).
//! Fragments are per parameter, not per bucket, so a checkpoint loads into any world size,
//! stage, bucket size and 16-bit dtype: each rank reads the byte ranges of its new
//! partitions and nothing else.

mod error;
pub mod export;
pub mod format;
pub mod hf;
pub mod io;
pub mod resolve;

pub use error::CheckpointError;
pub use format::{FileEntry, Fragment, Manifest, ParamEntry, RankIndex};
pub use resolve::{resolve_tag, CheckpointDir};

/// Options of `Engine::load_checkpoint`, with DeepSpeed's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// Load the optimizer state (fp32 moments and the Adam step). Without it the moments
    /// start from zero and the Adam step from 0, as a fresh optimizer; the fp32 master
    /// weights are always loaded.
    pub load_optimizer_states: bool,
    /// Load the LR schedule's position.
    pub load_lr_scheduler_states: bool,
    /// Load the weights only: no optimizer state, schedule, step counts or loss scale.
    pub load_module_only: bool,
    /// Every parameter of the model must be in the checkpoint and every parameter of the
    /// checkpoint in the model. Without it, parameters missing from the checkpoint keep
    /// their current values and extra ones are ignored. Shapes must always agree.
    pub strict: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            load_optimizer_states: true,
            load_lr_scheduler_states: true,
            load_module_only: false,
            strict: true,
        }
    }
}
