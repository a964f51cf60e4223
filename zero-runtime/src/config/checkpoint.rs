//! The `checkpoint` section.

use super::checkpoint_keys::{
    CHECKPOINT_SECTION, LOAD_UNIVERSAL, TAG_VALIDATION, USE_NODE_LOCAL_STORAGE,
};
use super::json::Obj;
use super::ConfigError;

/// `checkpoint.tag_validation`: what to do when the ranks' checkpoint tags differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagValidation {
    /// Use rank 0's tag and say nothing.
    Ignore,
    /// Use rank 0's tag and print a warning naming the ranks whose tag differed (the
    /// default, as DeepSpeed).
    Warn,
    /// Fail on every rank.
    Fail,
}

/// The `checkpoint` section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// `tag_validation` (`Ignore`, `Warn` or `Fail`; default `Warn`).
    pub tag_validation: TagValidation,
    /// `load_universal`: accepted; every zero checkpoint loads at any world size and stage.
    pub load_universal: bool,
    /// `use_node_local_storage`: each node writes its ranks' files to its own storage (a
    /// load then needs the files of the ranks it reads on that node).
    pub use_node_local_storage: bool,
}

pub(super) fn checkpoint(top: &Obj) -> Result<CheckpointConfig, ConfigError> {
    let o = CHECKPOINT_SECTION.open(top)?;
    let tag_validation = match o.str(TAG_VALIDATION.name)? {
        None => TagValidation::Warn,
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "ignore" => TagValidation::Ignore,
            "warn" => TagValidation::Warn,
            "fail" => TagValidation::Fail,
            _ => {
                return Err(o.invalid(
                    TAG_VALIDATION.name,
                    &format!("`{v}`: expected Ignore, Warn or Fail"),
                ))
            }
        },
    };
    Ok(CheckpointConfig {
        tag_validation,
        load_universal: o.bool_or(LOAD_UNIVERSAL.name, const { LOAD_UNIVERSAL.flag() })?,
        use_node_local_storage: o.bool_or(
            USE_NODE_LOCAL_STORAGE.name,
            const { USE_NODE_LOCAL_STORAGE.flag() },
        )?,
    })
}
