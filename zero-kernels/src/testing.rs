//! Support for tests across the workspace.

/// A fresh seed for a randomized test — or the one in `ZERO_TEST_SEED`, to replay a
/// failure — printed with the test's name so every run can be reproduced.
pub fn fresh_seed(test: &str) -> u64 {
    let seed = std::env::var("ZERO_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0x5eed)
        });
    println!("{test}: seed = {seed} (replay with ZERO_TEST_SEED={seed})");
    seed
}

/// Whether GPU tests must run: `ZERO_REQUIRE_GPU=1` (the stand-in pass of CI, `.ci/gpusim`,
/// and a first run on a real GPU), where a GPU test that would skip fails instead.
pub fn gpu_required() -> bool {
    std::env::var("ZERO_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// Prints a GPU test's visible skip, or fails it where GPU tests are required
/// ([`gpu_required`]).
pub fn skip_gpu_test(test: &str, reason: &str) {
    assert!(
        !gpu_required(),
        "{test}: ZERO_REQUIRE_GPU=1, and this GPU test would skip: {reason}"
    );
    println!("SKIPPED {test}: {reason}");
}

/// The process's GPU for a GPU test, or `None` after printing a visible skip where this
/// machine has no CUDA driver ([`skip_gpu_test`]: a failure under `ZERO_REQUIRE_GPU=1`). A
/// driver that is present but fails is a test failure.
pub fn gpu_or_skip(test: &str) -> Option<&'static crate::cuda::Gpu> {
    match crate::cuda::Gpu::get() {
        Ok(g) => {
            println!("{test}: on {} ({})", g.name(), g.arch);
            Some(g)
        }
        Err(crate::cuda::GpuError::NoDriver(e)) => {
            skip_gpu_test(test, &format!("no GPU on this machine ({e})"));
            None
        }
        Err(e) => panic!("{test}: a GPU driver is present but the GPU path failed: {e}"),
    }
}

/// The bit pattern of every value widened to `f32`, with every NaN mapped to one pattern:
/// the comparison the CPU/GPU tests use. GPU arithmetic returns the canonical NaN
/// (`0x7fffffff`) where x86 propagates an operand's payload (and gives `0xffc00000` for
/// inf − inf), so both sides can be right with different NaN bits: any NaN equals any
/// NaN, and every other value must match bit for bit (ARCHITECTURE.md, invariant 12).
pub fn canonical_bits<T: crate::Element>(v: &[T]) -> Vec<u32> {
    v.iter()
        .map(|x| {
            let f = x.to_f32();
            if f.is_nan() {
                0x7fc0_0000
            } else {
                f.to_bits()
            }
        })
        .collect()
}

/// Waits for `children` (the rank processes of a multi-process test, their output piped),
/// killing any still running at `deadline`; returns each one's stdout and stderr, and
/// whether it exited successfully, in order.
pub fn finish_children(
    children: Vec<std::process::Child>,
    deadline: std::time::Instant,
) -> Vec<(String, bool)> {
    children
        .into_iter()
        .map(|mut c| {
            loop {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                if std::time::Instant::now() > deadline {
                    let _ = c.kill();
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            match c.wait_with_output() {
                Ok(out) => (
                    format!(
                        "{}{}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    ),
                    out.status.success(),
                ),
                Err(e) => (format!("reading the child's output: {e}"), false),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn canonical_bits_equal_any_nan_and_nothing_else() {
        let gpu_nan = f32::from_bits(0x7fff_ffff);
        let x86_nan = f32::from_bits(0xffc0_0000);
        assert_eq!(canonical_bits(&[gpu_nan]), canonical_bits(&[x86_nan]));
        assert_ne!(canonical_bits(&[0.0f32]), canonical_bits(&[-0.0f32]));
        assert_ne!(
            canonical_bits(&[1.0f32]),
            canonical_bits(&[1.0f32 + f32::EPSILON])
        );
        assert_ne!(canonical_bits(&[f32::INFINITY]), canonical_bits(&[gpu_nan]));
        let h = half::bf16::from_bits(0x7fc1);
        assert_eq!(canonical_bits(&[h]), canonical_bits(&[half::bf16::NAN]));
    }
    use super::canonical_bits;
}
