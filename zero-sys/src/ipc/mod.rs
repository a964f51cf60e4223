//! The raw pieces of the shared-memory group (one process per rank on one machine):
//! anonymous shared memory, futexes, file-descriptor passing and process handles. Each
//! is a thin, checked wrapper over Linux system calls; the protocol built on them lives
//! in `zero-comm`.

mod futex;
mod process;
mod shared;
mod socket;

pub use futex::{futex_wait, futex_wake};
pub use process::{pidfd_open, poll_readable, EventFd};
pub use shared::SharedMapping;
pub use socket::{peer_credentials, recv_with_fd, send_with_fd, PeerCredentials};
