//! `zero-comm`: collectives behind one trait.
//!
//! - [`Communicator`]: `rank`, `world_size`, `all_reduce` (sum, avg, max), `reduce_scatter`,
//!   `all_gather`, `broadcast` and `barrier`, each issued asynchronously and returning a
//!   handle you [`Completion::wait`] on, with per-operation counters ([`CommStats`]).
//! - [`HostGroup`]: `n` ranks as threads of one process. Reductions run in fixed rank order
//!   with `f32` accumulation, so every rank gets bit-identical results, run after run.
//!   Mismatched calls, a rank that drops or panics, and a rank that never arrives all end in
//!   an error on every rank, within a configurable timeout. Nothing hangs.
//!
//! The NCCL backend, buckets and stream overlap arrive with the CUDA-path issue.
//!
//! ```
//! use zero_comm::{Communicator, Completion, HostBuffer, HostGroup, ReduceOp};
//! let ranks = HostGroup::new(3).unwrap();
//! let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
//!     let handles: Vec<_> = ranks
//!         .into_iter()
//!         .map(|comm| {
//!             s.spawn(move || {
//!                 let mine = HostBuffer::F32(vec![comm.rank() as f32; 4]);
//!                 let work = comm.all_reduce(mine, ReduceOp::Sum).unwrap();
//!                 work.wait().unwrap().into_f32().unwrap()
//!             })
//!         })
//!         .collect();
//!     handles.into_iter().map(|h| h.join().unwrap()).collect()
//! });
//! assert!(sums.iter().all(|s| s == &vec![3.0; 4]));
//! ```

mod buffer;
mod communicator;
mod error;
mod host;
mod op;
mod stats;

pub use buffer::HostBuffer;
pub use communicator::{Communicator, Completion};
pub use error::CommError;
pub use host::{HostComm, HostGroup, HostWork, DEFAULT_TIMEOUT};
pub use op::{even_split, OpKind, ReduceOp};
pub use stats::{CommStats, OpStats};
