//! The reduction core, the same as zero's host one (`zero-comm/src/reduce.rs`): for each
//! element, rank 0's value widened to the accumulator type (`f32` for `f32`, `f16` and
//! `bf16`; `f64` for `f64`; the integer itself for integers), each next rank's value
//! combined in rank order, `Avg` divided by the world size, and the result rounded once to
//! the element type (round to nearest even). Floating `Max` and `Min` give NaN if any
//! input is NaN; integers wrap.

#[cfg(test)]
use super::DType;
use super::RedOp;
use half::{bf16, f16};

/// An element type the engine reduces.
///
/// # Safety
///
/// Implemented only for plain numbers: no padding and every bit pattern a valid value, so
/// a `[Self]` may be viewed as bytes ([`as_bytes`]) and filled from any bytes
/// ([`as_bytes_mut`]).
pub(crate) unsafe trait Element: Copy + Default + Send + Sync + 'static {
    /// What values are accumulated in.
    type Acc: Copy + Default;
    /// Exact widening.
    fn widen(self) -> Self::Acc;
    /// Rounding to the element type (nearest even), once.
    fn narrow(a: Self::Acc) -> Self;
    /// `Sum` and `Avg`.
    fn sum(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// `Prod`.
    fn prod(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// `Max`.
    fn max(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// `Min`.
    fn min(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// The `Avg` of a sum over `n` ranks.
    fn avg(a: Self::Acc, n: usize) -> Self::Acc;
}

/// Maximum in which NaN wins (zero's `nan_max`).
#[inline(always)]
pub(crate) fn nan_max_f32(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}

/// Minimum in which NaN wins.
#[inline(always)]
pub(crate) fn nan_min_f32(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.min(b)
    }
}

/// `f32` to `bf16` bits, round to nearest even, NaN kept (quieted): the same bits as
/// `half::bf16::from_f32`, without branches.
#[inline(always)]
pub(crate) fn bf16_bits_from_f32(x: f32) -> u16 {
    let b = x.to_bits();
    let is_nan = (b & 0x7fff_ffff) > 0x7f80_0000;
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    let quiet_nan = ((b >> 16) as u16) | 0x0040;
    if is_nan {
        quiet_nan
    } else {
        rounded
    }
}

macro_rules! f32_accumulated {
    ($t:ty, $widen:expr, $narrow:expr) => {
        // SAFETY: a plain number type of the `half` crate or `f32`: no padding, every
        // bit pattern valid.
        unsafe impl Element for $t {
            type Acc = f32;
            #[inline(always)]
            fn widen(self) -> f32 {
                $widen(self)
            }
            #[inline(always)]
            fn narrow(a: f32) -> Self {
                $narrow(a)
            }
            #[inline(always)]
            fn sum(a: f32, b: f32) -> f32 {
                a + b
            }
            #[inline(always)]
            fn prod(a: f32, b: f32) -> f32 {
                a * b
            }
            #[inline(always)]
            fn max(a: f32, b: f32) -> f32 {
                nan_max_f32(a, b)
            }
            #[inline(always)]
            fn min(a: f32, b: f32) -> f32 {
                nan_min_f32(a, b)
            }
            #[inline(always)]
            fn avg(a: f32, n: usize) -> f32 {
                a / n as f32
            }
        }
    };
}

f32_accumulated!(f32, |x: f32| x, |a: f32| a);
f32_accumulated!(f16, f16::to_f32, f16::from_f32);
f32_accumulated!(
    bf16,
    |x: bf16| f32::from_bits(u32::from(x.to_bits()) << 16),
    |a: f32| bf16::from_bits(bf16_bits_from_f32(a))
);

// SAFETY: a plain number: no padding, every bit pattern valid.
unsafe impl Element for f64 {
    type Acc = f64;
    #[inline(always)]
    fn widen(self) -> f64 {
        self
    }
    #[inline(always)]
    fn narrow(a: f64) -> f64 {
        a
    }
    #[inline(always)]
    fn sum(a: f64, b: f64) -> f64 {
        a + b
    }
    #[inline(always)]
    fn prod(a: f64, b: f64) -> f64 {
        a * b
    }
    #[inline(always)]
    fn max(a: f64, b: f64) -> f64 {
        if a.is_nan() || b.is_nan() {
            f64::NAN
        } else {
            a.max(b)
        }
    }
    #[inline(always)]
    fn min(a: f64, b: f64) -> f64 {
        if a.is_nan() || b.is_nan() {
            f64::NAN
        } else {
            a.min(b)
        }
    }
    #[inline(always)]
    fn avg(a: f64, n: usize) -> f64 {
        a / n as f64
    }
}

macro_rules! integer {
    ($($t:ty),*) => {$(
        // SAFETY: a primitive integer: no padding, every bit pattern valid.
        unsafe impl Element for $t {
            type Acc = $t;
            #[inline(always)]
            fn widen(self) -> $t {
                self
            }
            #[inline(always)]
            fn narrow(a: $t) -> $t {
                a
            }
            #[inline(always)]
            fn sum(a: $t, b: $t) -> $t {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn prod(a: $t, b: $t) -> $t {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn max(a: $t, b: $t) -> $t {
                a.max(b)
            }
            #[inline(always)]
            fn min(a: $t, b: $t) -> $t {
                a.min(b)
            }
            #[inline(always)]
            fn avg(a: $t, n: usize) -> $t {
                // Exact in i128 for every integer type and world size; the quotient's
                // magnitude is at most the sum's, so it fits back.
                (a as i128 / n as i128) as $t
            }
        }
    )*};
}

integer!(i8, u8, i32, u32, i64, u64);

/// Runs `$body` with `$t` the Rust type of `$dtype`.
macro_rules! with_element {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $t = f32;
                $body
            }
            DType::F16 => {
                type $t = half::f16;
                $body
            }
            DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            DType::F64 => {
                type $t = f64;
                $body
            }
            DType::I8 => {
                type $t = i8;
                $body
            }
            DType::U8 => {
                type $t = u8;
                $body
            }
            DType::I32 => {
                type $t = i32;
                $body
            }
            DType::U32 => {
                type $t = u32;
                $body
            }
            DType::I64 => {
                type $t = i64;
                $body
            }
            DType::U64 => {
                type $t = u64;
                $body
            }
        }
    };
}
pub(crate) use with_element;

/// The bytes of `v`.
pub(crate) fn as_bytes<T: Element>(v: &[T]) -> &[u8] {
    // SAFETY: `T: Element` has no padding (trait contract), so every byte of the slice is
    // initialised; the view has the same address, length in bytes and lifetime.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// The bytes of `v`, writable.
pub(crate) fn as_bytes_mut<T: Element>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`; besides, every bit pattern is a valid `T` (trait
    // contract), so any bytes written through the view leave valid elements; the view
    // borrows `v` mutably, so nothing else sees it meanwhile.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// Elements accumulated together, so each block's accumulators stay in registers.
const LANES: usize = 16;

/// `out[i] = op(inputs[0][i], inputs[1][i], …)` in that order, in the accumulator type,
/// rounded once; `Avg` divides the sum by `nranks`. Every input holds at least
/// `out.len()` elements; with no inputs `out` is left alone.
pub(crate) fn reduce_into<T: Element>(out: &mut [T], inputs: &[&[T]], op: RedOp, nranks: usize) {
    match op {
        RedOp::Sum => fold(out, inputs, T::sum, None),
        RedOp::Prod => fold(out, inputs, T::prod, None),
        RedOp::Max => fold(out, inputs, T::max, None),
        RedOp::Min => fold(out, inputs, T::min, None),
        RedOp::Avg => fold(out, inputs, T::sum, Some(nranks.max(1))),
    }
}

#[inline(always)]
fn fold<T: Element>(
    out: &mut [T],
    inputs: &[&[T]],
    f: impl Fn(T::Acc, T::Acc) -> T::Acc,
    avg: Option<usize>,
) {
    let Some((first, rest)) = inputs.split_first() else {
        return;
    };
    let n = out.len();
    let mut at = 0;
    while at < n {
        let len = LANES.min(n - at);
        let mut acc = [T::Acc::default(); LANES];
        for (a, x) in acc[..len].iter_mut().zip(&first[at..at + len]) {
            *a = x.widen();
        }
        for input in rest {
            for (a, x) in acc[..len].iter_mut().zip(&input[at..at + len]) {
                *a = f(*a, x.widen());
            }
        }
        if let Some(nr) = avg {
            for a in &mut acc[..len] {
                *a = T::avg(*a, nr);
            }
        }
        for (o, a) in out[at..at + len].iter_mut().zip(&acc[..len]) {
            *o = T::narrow(*a);
        }
        at += len;
    }
}

/// Reduces byte buffers of `dtype` elements (for tests and small callers): `out` gets the
/// reduction of `inputs`, all of `out.len()` bytes.
#[cfg(test)]
pub(crate) fn reduce_bytes(
    dtype: DType,
    out: &mut [u8],
    inputs: &[&[u8]],
    op: RedOp,
    nranks: usize,
) {
    with_element!(dtype, T => {
        let n = out.len() / std::mem::size_of::<T>();
        let typed: Vec<Vec<T>> = inputs
            .iter()
            .map(|b| {
                let mut v = vec![T::default(); n];
                as_bytes_mut(&mut v).copy_from_slice(&b[..n * std::mem::size_of::<T>()]);
                v
            })
            .collect();
        let refs: Vec<&[T]> = typed.iter().map(|v| v.as_slice()).collect();
        let mut o = vec![T::default(); n];
        reduce_into(&mut o, &refs, op, nranks);
        out[..n * std::mem::size_of::<T>()].copy_from_slice(as_bytes(&o));
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_half_on_every_class_of_value() {
        for hi in 0u32..=0xffff {
            for lo in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff] {
                let x = f32::from_bits((hi << 16) | lo);
                assert_eq!(
                    bf16_bits_from_f32(x),
                    bf16::from_f32(x).to_bits(),
                    "{:#010x}",
                    x.to_bits()
                );
            }
        }
    }

    #[test]
    fn reduction_is_in_rank_order_in_f32_rounded_once() {
        // 1 + 2^-9 + 2^-9 in bf16: each step alone would round back to 1; in f32 the two
        // halves add up to 2^-8, which is still a tie that rounds to even (1); with a third
        // the sum reaches 1 + 3·2^-9 and rounds up.
        let x = |v: f32| bf16::from_f32(v);
        let tiny = 2f32.powi(-9);
        let ins = [
            vec![x(1.0); 20],
            vec![x(tiny); 20],
            vec![x(tiny); 20],
            vec![x(tiny); 20],
        ];
        let refs: Vec<&[bf16]> = ins.iter().map(|v| v.as_slice()).collect();
        let mut out = vec![bf16::ZERO; 20];
        reduce_into(&mut out, &refs[..3], RedOp::Sum, 3);
        assert!(out.iter().all(|v| v.to_f32() == 1.0));
        reduce_into(&mut out, &refs, RedOp::Sum, 4);
        assert!(out.iter().all(|v| v.to_f32() == 1.0 + 2f32.powi(-7)));
        reduce_into(&mut out, &refs[..2], RedOp::Avg, 2);
        assert!(out.iter().all(|v| *v == x((1.0 + tiny) / 2.0)));
    }

    #[test]
    fn nan_wins_max_and_min_and_integers_wrap() {
        let a = [1.0f32, f32::NAN, -3.0, 0.5];
        let b = [f32::NAN, 2.0, -4.0, f32::INFINITY];
        let mut out = [0f32; 4];
        reduce_into(&mut out, &[&a, &b], RedOp::Max, 2);
        assert!(out[0].is_nan() && out[1].is_nan() && out[2] == -3.0 && out[3].is_infinite());
        reduce_into(&mut out, &[&a, &b], RedOp::Min, 2);
        assert!(out[0].is_nan() && out[1].is_nan() && out[2] == -4.0 && out[3] == 0.5);
        let (p, q) = ([120i8, -128, 7], [10i8, -1, -3]);
        let mut o = [0i8; 3];
        reduce_into(&mut o, &[&p, &q], RedOp::Sum, 2);
        assert_eq!(o, [-126, 127, 4]);
        reduce_into(&mut o, &[&p, &q], RedOp::Avg, 2);
        assert_eq!(o, [-63, 63, 2]);
        let (u, v) = ([u64::MAX, 3], [2u64, 5]);
        let mut w = [0u64; 2];
        reduce_into(&mut w, &[&u, &v], RedOp::Prod, 2);
        assert_eq!(w, [u64::MAX - 1, 15]);
    }

    #[test]
    fn bytes_reduce_like_typed_values() {
        let a: Vec<u8> = [1.5f64, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let b: Vec<u8> = [0.25f64, -8.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut out = vec![0u8; 16];
        reduce_bytes(DType::F64, &mut out, &[&a, &b], RedOp::Sum, 2);
        let got: Vec<f64> = out
            .chunks(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect();
        assert_eq!(got, [1.75, -6.0]);
    }
}
