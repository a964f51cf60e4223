//! Errors of the kernels: every one names the argument that is wrong.

/// Bad arguments to a kernel or layout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// A slice has the wrong length.
    #[error("{what}: expected {expected} elements, got {actual}")]
    LengthMismatch {
        /// Which argument (for example `"adam_step: exp_avg"`).
        what: String,
        /// The length required.
        expected: usize,
        /// The length given.
        actual: usize,
    },
    /// The number of tensors differs from the layout's.
    #[error("{what}: the layout has {expected} tensors, got {actual}")]
    TensorCountMismatch {
        /// Which call.
        what: &'static str,
        /// Tensors in the layout.
        expected: usize,
        /// Tensors given.
        actual: usize,
    },
    /// A layout parameter is out of range.
    #[error("invalid layout: {0}")]
    InvalidLayout(String),
    /// A rank outside `0..world`.
    #[error("rank {rank} is out of range for world size {world}")]
    RankOutOfRange {
        /// The rank asked for.
        rank: usize,
        /// The world size.
        world: usize,
    },
    /// A tensor index outside the layout.
    #[error("tensor {index} is out of range: the layout has {count} tensors")]
    TensorOutOfRange {
        /// The index asked for.
        index: usize,
        /// Tensors in the layout.
        count: usize,
    },
    /// An optimizer hyper-parameter is out of range.
    #[error("invalid Adam hyper-parameter: {0}")]
    InvalidHyperParameter(String),
}

/// Returns an error unless `actual == expected`.
pub(crate) fn check_len(what: &str, expected: usize, actual: usize) -> Result<(), KernelError> {
    if expected == actual {
        Ok(())
    } else {
        Err(KernelError::LengthMismatch {
            what: what.to_string(),
            expected,
            actual,
        })
    }
}
