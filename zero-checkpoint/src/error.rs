//! Checkpoint errors: each names the file (and the parameter, where there is one).

use crate::io::IoError;

/// A checkpoint could not be saved or loaded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CheckpointError {
    /// A file operation failed (the message names the file).
    #[error("checkpoint I/O: {0}")]
    Io(String),
    /// There is no checkpoint where one was asked for.
    #[error("no checkpoint at {path}: {reason}")]
    NotFound {
        /// What was looked for.
        path: String,
        /// Why it is not there.
        reason: String,
    },
    /// A file is not what the format says.
    #[error("{path}: {reason}")]
    Format {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The checkpoint is of another model.
    #[error("{path}: {reason}")]
    Mismatch {
        /// The manifest.
        path: String,
        /// What differs (naming the parameter).
        reason: String,
    },
    /// Another rank failed; nothing was committed (save) or changed (load).
    #[error("rank {rank} failed: {message}")]
    RankFailed {
        /// The rank.
        rank: usize,
        /// Its error.
        message: String,
    },
    /// The tag is unusable, or the ranks' tags differ under `tag_validation: Fail`.
    #[error("checkpoint tag: {0}")]
    Tag(String),
    /// A collective of the save or load failed (a rank did not call it in time, or the
    /// communicator broke).
    #[error("checkpoint: {during} failed: {reason} (every rank must call the same checkpoint function at the same step)")]
    Collective {
        /// What the ranks were doing.
        during: String,
        /// The communicator's error.
        reason: String,
    },
    /// A 16-bit model save under stage 3 needs the parameters gathered.
    #[error("save_16bit_model under ZeRO stage 3 needs the sharded parameters gathered: set zero_optimization.stage3_gather_16bit_weights_on_model_save to true")]
    Gather16,
}

impl From<IoError> for CheckpointError {
    fn from(e: IoError) -> Self {
        CheckpointError::Io(e.to_string())
    }
}
