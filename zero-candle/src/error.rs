//! The adapter's errors: the engine's, candle's, and the adapter's own misuse checks.

use zero_runtime::EngineError;

/// An error of the candle adapter.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The engine refused or failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// candle refused or failed (a model's construction, forward or backward).
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// The model or the adapter's options do not fit together; the message names what.
    #[error("{0}")]
    Model(String),
}

/// A `Result` with the adapter's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// An engine error inside a candle op (a custom op must return candle's error type).
pub(crate) fn to_candle(e: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Msg(format!("zero-candle: {e}"))
}
