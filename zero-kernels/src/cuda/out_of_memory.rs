//! Out of device memory with a second allocator in the process.
//!
//! A framework that trains on the engine (PyTorch) allocates from its own caching
//! allocator, which keeps freed blocks for reuse: memory it does not use, but that zero's
//! allocations cannot get. When a device allocation of zero's fails for lack of memory,
//! the hook a framework registered ([`set_out_of_memory_hook`]: zero-torch's calls
//! `torch.cuda.empty_cache()`) releases that cache and the allocation is tried once more.
//! The retry is local to the allocation: no collective is repeated, so ranks stay in step.
//! (The other direction needs nothing of zero: its stream-ordered pool keeps no memory
//! across synchronizations, release threshold 0.)

use super::error::GpuError;
use std::sync::{Arc, RwLock};
use zero_sys::cudarc::driver::{sys::cudaError_enum, DriverError};

/// What a framework runs to release memory it caches but does not use.
pub type OutOfMemoryHook = Arc<dyn Fn() + Send + Sync>;

static HOOK: RwLock<Option<OutOfMemoryHook>> = RwLock::new(None);

/// Sets (or, with `None`, clears) the process's out-of-memory hook.
pub fn set_out_of_memory_hook(hook: Option<OutOfMemoryHook>) {
    *HOOK.write().unwrap_or_else(|p| p.into_inner()) = hook;
}

/// Runs `alloc`; if it fails for lack of device memory, runs the registered hook and
/// `alloc` once more. Errors name `what` and, after a retry, that the hook ran.
pub(crate) fn allocating<T>(
    what: &'static str,
    alloc: impl FnMut() -> Result<T, DriverError>,
) -> Result<T, GpuError> {
    let hook = HOOK.read().unwrap_or_else(|p| p.into_inner()).clone();
    retry_with(what, alloc, hook.as_deref())
}

/// [`allocating`] with the hook given.
fn retry_with<T>(
    what: &'static str,
    mut alloc: impl FnMut() -> Result<T, DriverError>,
    hook: Option<&(dyn Fn() + Send + Sync)>,
) -> Result<T, GpuError> {
    // (The code's name: formatting the whole error asks the driver for its text.)
    let failed = |e: DriverError, after_hook: bool| GpuError::Driver {
        context: what,
        message: if after_hook {
            format!(
                "{:?}, again after the framework's cache was released (the device is full)",
                e.0
            )
        } else {
            format!("{:?}", e.0)
        },
    };
    match alloc() {
        Err(e) if e.0 == cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => match hook {
            Some(release) => {
                release();
                alloc().map_err(|e| failed(e, true))
            }
            None => Err(failed(e, false)),
        },
        other => other.map_err(|e| failed(e, false)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn oom() -> DriverError {
        DriverError(cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// An allocation that always fails with `error`, under `hook`: how many times it was
    /// tried, and the error's text.
    fn always_failing(
        error: cudaError_enum,
        hook: Option<&(dyn Fn() + Send + Sync)>,
    ) -> (usize, String) {
        let mut calls = 0;
        let e = retry_with::<()>(
            "alloc",
            || {
                calls += 1;
                Err(DriverError(error))
            },
            hook,
        )
        .unwrap_err()
        .to_string();
        (calls, e)
    }

    #[test]
    fn an_allocation_out_of_memory_is_tried_again_after_the_hook() {
        let released = AtomicUsize::new(0);
        let hook = || {
            released.fetch_add(1, Ordering::Relaxed);
        };
        // Fails once, then (the cache released) succeeds.
        let mut calls = 0;
        let got = retry_with(
            "alloc",
            || {
                calls += 1;
                if calls == 1 {
                    Err(oom())
                } else {
                    Ok(7)
                }
            },
            Some(&hook),
        );
        assert_eq!(got.ok(), Some(7));
        assert_eq!((calls, released.load(Ordering::Relaxed)), (2, 1));
        // Still full after the hook: one retry only, and the error says the hook ran.
        let (calls, e) = always_failing(cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY, Some(&hook));
        assert_eq!(calls, 2);
        assert!(
            e.contains("OUT_OF_MEMORY") && e.contains("cache was released"),
            "{e}"
        );
    }

    #[test]
    fn other_errors_and_no_hook_are_not_retried() {
        let (calls, e) = always_failing(
            cudaError_enum::CUDA_ERROR_INVALID_VALUE,
            Some(&|| panic!("the hook is for out-of-memory only")),
        );
        assert!(e.contains("INVALID_VALUE") && calls == 1, "{e}");
        let (calls, e) = always_failing(cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY, None);
        assert!(e.contains("OUT_OF_MEMORY") && calls == 1, "{e}");
    }
}
