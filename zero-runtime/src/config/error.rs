//! `ConfigError`: what is wrong with a configuration, naming the key.

/// A configuration that cannot be used, naming the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// The text is not JSON.
    #[error("config is not valid JSON: {0}")]
    Json(String),
    /// A key nobody knows.
    #[error("unknown config key `{key}`{}", suggestion.as_ref().map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default())]
    UnknownKey {
        /// The full dotted path of the key.
        key: String,
        /// The closest known key, if one is close.
        suggestion: Option<String>,
    },
    /// A DeepSpeed key (or value) zero does not implement yet.
    #[error("config key `{key}` is not supported yet: {reason}")]
    Unsupported {
        /// The full dotted path of the key.
        key: String,
        /// Why, and what is supported.
        reason: String,
    },
    /// A value of the wrong type or out of range.
    #[error("config key `{key}`: {reason}")]
    InvalidValue {
        /// The full dotted path of the key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// Keys that contradict each other.
    #[error("inconsistent config: {0}")]
    Inconsistent(String),
}
