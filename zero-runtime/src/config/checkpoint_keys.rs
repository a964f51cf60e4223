//! The `checkpoint` section's keys (DeepSpeed's `checkpoint` config), with their rows of
//! docs/CONFIG.md.

use super::keys::{DocNames, Fixed, Key, KeyDefault, Section};
use super::top_keys::CHECKPOINT;

/// The `checkpoint` section.
pub(super) const CHECKPOINT_SECTION: Section = Section {
    path: CHECKPOINT.name,
    names: DocNames::Path,
    keys: &[
        TAG_VALIDATION,
        LOAD_UNIVERSAL,
        USE_NODE_LOCAL_STORAGE,
        Key::only(
            "parallel_write",
            Fixed::Object(&[("pipeline_stage", Fixed::Bool(false))]),
        )
        .doc("only the default (there is no pipeline parallelism)"),
    ],
};

/// What a differing checkpoint tag on another rank does.
pub(super) const TAG_VALIDATION: Key = Key::new("tag_validation", KeyDefault::Text("`Warn`")).doc(
    "`Ignore`, `Warn` or `Fail`: what a checkpoint tag on another rank that differs from \
    rank 0's does (rank 0's is always the one used); see [CHECKPOINTS.md](CHECKPOINTS.md)",
);

/// Whether a load reads a universal checkpoint (every zero checkpoint loads anyway).
pub(super) const LOAD_UNIVERSAL: Key = Key::new("load_universal", KeyDefault::Bool(false))
    .doc("accepted: every zero checkpoint loads at any world size and stage");

/// Whether each node writes its ranks' files to its own storage.
pub(super) const USE_NODE_LOCAL_STORAGE: Key =
    Key::new("use_node_local_storage", KeyDefault::Bool(false))
        .doc("accepted: each rank writes its own files");
