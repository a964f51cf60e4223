//! The C library's allocator, which a framework's tensors share with the engine's
//! buffers on the host.

/// Pins glibc malloc's mmap threshold at `bytes`: every allocation of at least `bytes` is
/// then an anonymous mapping, returned to the kernel when it is freed. By default glibc
/// raises the threshold each time a mapped block is freed (up to 32 MiB), so later
/// tensors of up to that size come from the heap, where a freed block stays resident
/// until everything above it is freed too: a training step's short-lived tensors then
/// leave the process larger after each step (measured on a 135M-parameter stage-3 run:
/// about 100 MiB of peak RSS per rank). Setting the threshold also turns that raising
/// off. Returns whether it was set: `false` where the C library is not glibc or refuses
/// the value.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn pin_mmap_threshold(bytes: usize) -> bool {
    let Ok(value) = libc::c_int::try_from(bytes) else {
        return false;
    };
    // SAFETY: mallopt only changes malloc's tunables; it takes any value and answers 0
    // for one it refuses. Blocks already allocated are untouched.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, value) == 1 }
}

/// Pins glibc malloc's mmap threshold: not glibc here, so nothing is set (`false`).
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn pin_mmap_threshold(_bytes: usize) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_takes_a_megabyte_and_refuses_what_does_not_fit() {
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            assert!(pin_mmap_threshold(1 << 20));
            assert!(
                !pin_mmap_threshold(usize::MAX),
                "a value past c_int must be refused"
            );
        } else {
            assert!(!pin_mmap_threshold(1 << 20));
        }
    }
}
