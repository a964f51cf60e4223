//! Test support: fresh seeded inputs (the seed is printed), poison, thread pools.
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use zero_kernels::Element;

/// The lengths every kernel is tested at.
pub const LENGTHS: [usize; 5] = [0, 1, 7, 1023, (1 << 20) + 3];

/// A fresh seed per run (or `ZERO_TEST_SEED` to replay one), printed so a failure can be
/// reproduced.
pub fn seeded(test: &str) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(zero_kernels::testing::fresh_seed(test))
}

/// Random values uniform in `[lo, hi)`, rounded to `T`, never all zero.
pub fn random_vec<T: Element>(rng: &mut ChaCha8Rng, n: usize, lo: f32, hi: f32) -> Vec<T> {
    (0..n).map(|_| T::from_f32(rng.gen_range(lo..hi))).collect()
}

/// Random values spread over many binades (both signs), so narrowing hits rounding,
/// subnormals and overflow.
pub fn wide_vec(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let mant: f32 = rng.gen_range(1.0..2.0);
            let exp: i32 = rng.gen_range(-30..20);
            let sign = if rng.gen_bool(0.5) { -1.0 } else { 1.0 };
            sign * mant * 2f32.powi(exp)
        })
        .collect()
}

/// Plants inf, -inf and NaN at random positions (if there is room).
pub fn plant_non_finite<T: Element>(rng: &mut ChaCha8Rng, v: &mut [T]) -> Vec<usize> {
    let mut at = Vec::new();
    for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
        if v.is_empty() {
            break;
        }
        let i = rng.gen_range(0..v.len());
        v[i] = T::from_f32(bad);
        at.push(i);
    }
    at
}

/// A recognisable value written into outputs before a kernel runs.
pub fn poison<T: Element>() -> T {
    T::from_f32(-1234.5)
}

/// Runs `f` on a rayon pool of `threads` threads.
pub fn in_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool")
        .install(f)
}

/// Bit patterns of a slice, for exact comparisons in which any NaN equals any NaN (the
/// GPU's canonical NaN and x86's propagated payloads differ; see
/// `zero_kernels::testing::canonical_bits`).
pub fn bits<T: Element>(v: &[T]) -> Vec<u32> {
    zero_kernels::testing::canonical_bits(v)
}

/// Reference narrowing, independent of the kernels' own conversion: Rust's `as` for f32,
/// `half`'s `f16::from_f64`, and `half`'s `bf16::from_f32` of the value as f32 (exact for the
/// f32 inputs these tests give it). `half`'s `bf16::from_f64` double-rounds values just
/// above a tie (−55.625004 → −55.5), so it is not used.
pub trait RefRound: Element {
    /// Rounds `x` to `Self`.
    fn from_f64_ref(x: f64) -> Self;
}
impl RefRound for f32 {
    fn from_f64_ref(x: f64) -> Self {
        x as f32
    }
}
impl RefRound for half::f16 {
    fn from_f64_ref(x: f64) -> Self {
        half::f16::from_f64(x)
    }
}
impl RefRound for half::bf16 {
    fn from_f64_ref(x: f64) -> Self {
        half::bf16::from_f32(x as f32)
    }
}

/// Exact equality where NaN matches any NaN.
pub fn same<T: Element>(a: T, b: T) -> bool {
    let (x, y) = (a.to_f32(), b.to_f32());
    (x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits()
}
