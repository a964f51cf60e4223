#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod buffer;
mod communicator;
mod cpu;
mod device;
mod error;
mod group;
mod host;
pub mod launch;
pub mod nccl;
mod op;
mod reduce;
mod relay;
mod shm;
mod stats;
mod tiered;
mod wait;

pub use buffer::{CommBuffer, HostBuffer, HostElement, HostVec, Lease, Leased};
pub use communicator::{Communicator, Completion};
pub use cpu::{machine_ranks, CpuComm, CpuWork, Spanning};
pub use device::{DeviceComm, DeviceGroup, DeviceWork};
pub use error::CommError;
pub use group::{GroupComm, GroupWork, DEFAULT_TIMEOUT};
pub use host::{HostComm, HostGroup, HostWork};
pub use op::{even_split, OpKind, ReduceOp};
pub use relay::{Relay, RelayComm, RelayWork};
pub use shm::{ShmComm, ShmGroup, ShmWork, DEFAULT_WINDOW};
pub use stats::{CommStats, OpStats};
pub use tiered::{Layout, Tier, TierStats, Tiered, TieredWork};
