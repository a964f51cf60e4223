//! The GPU path's errors, and the conversion of a driver call's error: the leaf every
//! other module of `cuda/` stands on (cudarc's `result.rs`).

use crate::KernelError;
use zero_sys::nvrtc::NvrtcError;
use zero_sys::LoadError;

/// The GPU path failed.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No CUDA driver on this machine.
    #[error("no GPU: {0}")]
    NoDriver(#[from] LoadError),
    /// A driver call failed.
    #[error("CUDA driver error in {context}: {message}")]
    Driver {
        /// What was being done.
        context: &'static str,
        /// The driver's message.
        message: String,
    },
    /// A driver error from an earlier call that could not report it: `cudarc` keeps the
    /// errors of frees and event records made in `Drop` in the context, shared by every
    /// thread of the process, and returns them from the next call on any thread.
    #[error(
        "CUDA driver error {message} on GPU {device}, noticed before {noticed_in}: it was \
         deferred from an earlier free or event record in a Drop on some thread of this \
         process (with ranks as threads, possibly another rank's), not caused by this call \
         ({origin}); the GPU context may be unusable (docs/LAUNCHING.md, \"Troubleshooting\")"
    )]
    Deferred {
        /// The device ordinal.
        device: usize,
        /// The call that found the error waiting.
        noticed_in: &'static str,
        /// The driver's message.
        message: String,
        /// Where it was most likely queued: the last buffer free queued before it was
        /// noticed (cudarc keeps the error without its origin).
        origin: String,
    },
    /// A kernel did not compile.
    #[error(transparent)]
    Compile(#[from] NvrtcError),
    /// Bad arguments (the same checks as the CPU kernels).
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

pub(crate) fn driver<E: std::fmt::Debug>(context: &'static str) -> impl FnOnce(E) -> GpuError {
    move |e| GpuError::Driver {
        context,
        message: format!("{e:?}"),
    }
}

/// The error of opening the GPU.
pub(crate) fn opening_error(message: String) -> GpuError {
    GpuError::Driver {
        context: "opening the GPU",
        message,
    }
}
