//! Train ordinary candle models with ZeRO stages 0–3 through the zero engine.
//!
//! The model is built through candle's `VarBuilder` over a backend of ours: its parameters
//! become the engine's, grouped into modules by name, initialized from the model's `Init`
//! hints with a stream seeded by each parameter's name (the same on every rank). Each
//! parameter tensor the model holds hangs from a gradient tap: candle's backward hands
//! the tap the fully accumulated gradient once, the tap adds it into the engine's bucket,
//! and a module's reduction starts as soon as its last gradient arrives. After `step`, the
//! updated parameters are written into candle's storage in place. In stage 3, wrapped
//! modules ([`ZeroCandle::wrap`]) hold their parameters only while in use.
//!
//! CPU only for now; the CUDA path is designed in (see the README).

mod error;
pub mod gpt;
mod init;
mod ops;
mod register;
mod seeded;
mod stage3;
mod state;
mod trainer;

pub use error::{Error, Result};
pub use register::{not_parameters, Constants, Grouping};
pub use seeded::seeded_var_builder;
pub use stage3::ZeroModule;
pub use trainer::{NameFilter, Options, ZeroCandle};

/// The README's examples, compiled and run as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;

/// The workspace README's usage snippet, compiled and run as a doc-test.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct WorkspaceReadmeExamples;
