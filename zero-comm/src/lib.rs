#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod buffer;
mod communicator;
mod error;
mod host;
mod op;
mod stats;

pub use buffer::{HostBuffer, HostElement};
pub use communicator::{Communicator, Completion};
pub use error::CommError;
pub use host::{HostComm, HostGroup, HostWork, DEFAULT_TIMEOUT};
pub use op::{even_split, OpKind, ReduceOp};
pub use stats::{CommStats, OpStats};
