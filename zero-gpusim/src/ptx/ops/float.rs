//! Floating-point arithmetic, comparisons and every conversion that involves a float,
//! with the GPU's rounding, NaN and subnormal rules.

use super::{cmp, Int, W};
use half::{bf16, f16};

/// A floating-point type of PTX.
pub(crate) trait Float: Copy + PartialOrd + 'static {
    const BITS: u32;
    /// The NaN the GPU produces.
    const CANON: u64;
    fn from_bits(x: u64) -> Self;
    fn bits(self) -> u64;
    fn is_nan(self) -> bool;
    /// Exact widening.
    fn to_f64(self) -> f64;
    /// Round to nearest even from f64 (correctly rounded).
    fn from_f64(x: f64) -> Self;
    /// Subnormal to zero of the same sign (`.ftz`; only meaningful for f32).
    fn ftz(self) -> Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    fn sqrt(self) -> Self;
    fn fma(self, b: Self, c: Self) -> Self;
    fn zero() -> Self;
    fn one() -> Self;
    fn sign(self) -> bool;
}

impl Float for f32 {
    const BITS: u32 = 32;
    const CANON: u64 = 0x7fff_ffff;
    #[inline(always)]
    fn from_bits(x: u64) -> Self {
        f32::from_bits(x as u32)
    }
    #[inline(always)]
    fn bits(self) -> u64 {
        self.to_bits() as u64
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    #[inline(always)]
    fn ftz(self) -> Self {
        if self.is_subnormal() {
            f32::from_bits(self.to_bits() & 0x8000_0000)
        } else {
            self
        }
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        self + o
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        self - o
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        self * o
    }
    #[inline(always)]
    fn div(self, o: Self) -> Self {
        self / o
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
    #[inline(always)]
    fn fma(self, b: Self, c: Self) -> Self {
        self.mul_add(b, c)
    }
    fn zero() -> Self {
        0.0
    }
    fn one() -> Self {
        1.0
    }
    fn sign(self) -> bool {
        self.is_sign_negative()
    }
}

impl Float for f64 {
    const BITS: u32 = 64;
    const CANON: u64 = 0x7fff_ffff_ffff_ffff;
    #[inline(always)]
    fn from_bits(x: u64) -> Self {
        f64::from_bits(x)
    }
    #[inline(always)]
    fn bits(self) -> u64 {
        self.to_bits()
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_f64(x: f64) -> Self {
        x
    }
    #[inline(always)]
    fn ftz(self) -> Self {
        if self.is_subnormal() {
            f64::from_bits(self.to_bits() & (1 << 63))
        } else {
            self
        }
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        self + o
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        self - o
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        self * o
    }
    #[inline(always)]
    fn div(self, o: Self) -> Self {
        self / o
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
    #[inline(always)]
    fn fma(self, b: Self, c: Self) -> Self {
        self.mul_add(b, c)
    }
    fn zero() -> Self {
        0.0
    }
    fn one() -> Self {
        1.0
    }
    fn sign(self) -> bool {
        self.is_sign_negative()
    }
}

/// f64 to f32 rounded to odd (the truncated value with its last bit set when inexact):
/// rounding that again to nearest even at 2 or more bits less precision is correct.
fn f64_to_f32_odd(x: f64) -> f32 {
    if x.is_nan() || x.is_infinite() {
        return x as f32;
    }
    let r = x as f32;
    if r as f64 == x {
        return r;
    }
    // Truncate toward zero, then set the last bit.
    let t = if (r as f64).abs() > x.abs() {
        if r.is_infinite() {
            f32::MAX.copysign(r)
        } else {
            f32::from_bits(r.to_bits() - 1)
        }
    } else {
        r
    };
    f32::from_bits(t.to_bits() | 1)
}

macro_rules! impl_half {
    ($t:ty) => {
        impl Float for $t {
            const BITS: u32 = 16;
            const CANON: u64 = 0x7fff;
            #[inline(always)]
            fn from_bits(x: u64) -> Self {
                <$t>::from_bits(x as u16)
            }
            #[inline(always)]
            fn bits(self) -> u64 {
                self.to_bits() as u64
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                <$t>::to_f32(self) as f64
            }
            #[inline(always)]
            fn from_f64(x: f64) -> Self {
                <$t>::from_f32(f64_to_f32_odd(x))
            }
            #[inline(always)]
            fn ftz(self) -> Self {
                self
            }
            fn add(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() + o.to_f32())
            }
            fn sub(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() - o.to_f32())
            }
            fn mul(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() * o.to_f32())
            }
            fn div(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() / o.to_f32())
            }
            fn sqrt(self) -> Self {
                <$t>::from_f32(self.to_f32().sqrt())
            }
            fn fma(self, b: Self, c: Self) -> Self {
                <$t>::from_f64(self.to_f64().mul_add(b.to_f64(), c.to_f64()))
            }
            fn zero() -> Self {
                <$t>::from_f32(0.0)
            }
            fn one() -> Self {
                <$t>::from_f32(1.0)
            }
            fn sign(self) -> bool {
                self.is_sign_negative()
            }
        }
    };
}
impl_half!(f16);
impl_half!(bf16);

/// The value's bits, every NaN made the GPU's canonical one.
#[inline(always)]
pub(crate) fn canon<T: Float>(x: T) -> u64 {
    if x.is_nan() {
        T::CANON
    } else {
        x.bits()
    }
}

/// `.sat` of floats: clamped to [0, 1], NaN to +0.
#[inline(always)]
fn saturate<T: Float>(x: T) -> T {
    if x.is_nan() || x <= T::zero() {
        T::zero()
    } else if x > T::one() {
        T::one()
    } else {
        x
    }
}

#[inline(always)]
fn fmin<T: Float>(x: T, y: T) -> T {
    if x.is_nan() {
        return y;
    }
    if y.is_nan() {
        return x;
    }
    if x == y {
        // -0 < +0.
        return if x.sign() { x } else { y };
    }
    if x < y {
        x
    } else {
        y
    }
}

#[inline(always)]
fn fmax<T: Float>(x: T, y: T) -> T {
    if x.is_nan() {
        return y;
    }
    if y.is_nan() {
        return x;
    }
    if x == y {
        return if x.sign() { y } else { x };
    }
    if x > y {
        x
    } else {
        y
    }
}

/// Float binary operation codes (the `OP` of [`fbin`]).
pub(crate) mod fop {
    pub(crate) const ADD: u8 = 0;
    pub(crate) const SUB: u8 = 1;
    pub(crate) const MUL: u8 = 2;
    pub(crate) const DIV: u8 = 3;
    pub(crate) const MIN: u8 = 4;
    pub(crate) const MAX: u8 = 5;
    pub(crate) const MIN_NAN: u8 = 6;
    pub(crate) const MAX_NAN: u8 = 7;
    pub(crate) const COPYSIGN: u8 = 8;
}

#[inline(always)]
fn flush<T: Float, const FTZ: bool>(x: T) -> T {
    if FTZ {
        x.ftz()
    } else {
        x
    }
}

/// Float binary operations, round to nearest even, `.ftz` and `.sat` as the constants say.
pub(crate) fn fbin<T: Float, const OP: u8, const FTZ: bool, const SAT: bool>(
    a: &W,
    b: &W,
    o: &mut W,
) {
    for l in 0..32 {
        let x = flush::<T, FTZ>(T::from_bits(a[l]));
        let y = flush::<T, FTZ>(T::from_bits(b[l]));
        let r = match OP {
            fop::ADD => x.add(y),
            fop::SUB => x.sub(y),
            fop::MUL => x.mul(y),
            fop::DIV => x.div(y),
            fop::MIN => fmin(x, y),
            fop::MAX => fmax(x, y),
            fop::MIN_NAN | fop::MAX_NAN => {
                if x.is_nan() || y.is_nan() {
                    T::from_bits(T::CANON)
                } else if OP == fop::MIN_NAN {
                    fmin(x, y)
                } else {
                    fmax(x, y)
                }
            }
            _ => {
                // copysign: a's sign, b's magnitude.
                let sign = 1u64 << (T::BITS - 1);
                T::from_bits((x.bits() & sign) | (y.bits() & !sign))
            }
        };
        let r = flush::<T, FTZ>(r);
        let r = if SAT { saturate(r) } else { r };
        o[l] = if OP == fop::COPYSIGN {
            r.bits()
        } else {
            canon(r)
        };
    }
}

/// `fma.rn` (and `mad.rn`): `a * b + c` rounded once.
pub(crate) fn ffma<T: Float, const FTZ: bool, const SAT: bool>(a: &W, b: &W, c: &W, o: &mut W) {
    for l in 0..32 {
        let x = flush::<T, FTZ>(T::from_bits(a[l]));
        let y = flush::<T, FTZ>(T::from_bits(b[l]));
        let z = flush::<T, FTZ>(T::from_bits(c[l]));
        let r = flush::<T, FTZ>(x.fma(y, z));
        let r = if SAT { saturate(r) } else { r };
        o[l] = canon(r);
    }
}

/// Float unary operation codes (the `OP` of [`fun`]).
pub(crate) mod fun_op {
    pub(crate) const ABS: u8 = 0;
    pub(crate) const NEG: u8 = 1;
    pub(crate) const SQRT: u8 = 2;
    pub(crate) const RCP: u8 = 3;
}

/// Float unary operations.
pub(crate) fn fun<T: Float, const OP: u8, const FTZ: bool>(a: &W, o: &mut W) {
    let sign = 1u64 << (T::BITS - 1);
    for l in 0..32 {
        let x = flush::<T, FTZ>(T::from_bits(a[l]));
        let r = match OP {
            fun_op::ABS => T::from_bits(x.bits() & !sign),
            fun_op::NEG => T::from_bits(x.bits() ^ sign),
            fun_op::SQRT => x.sqrt(),
            _ => T::one().div(x),
        };
        o[l] = canon(flush::<T, FTZ>(r));
    }
}

/// Float comparison (`C` from [`cmp`]); ordered comparisons are false on NaN.
pub(crate) fn fcmp<T: Float, const C: u8, const FTZ: bool>(a: &W, b: &W) -> u32 {
    let mut m = 0u32;
    for l in 0..32 {
        let x = flush::<T, FTZ>(T::from_bits(a[l]));
        let y = flush::<T, FTZ>(T::from_bits(b[l]));
        let nan = x.is_nan() || y.is_nan();
        let r = match C {
            cmp::EQ => x == y,
            cmp::NE => !nan && x != y,
            cmp::LT => x < y,
            cmp::LE => x <= y,
            cmp::GT => x > y,
            cmp::GE => x >= y,
            cmp::EQU => nan || x == y,
            cmp::NEU => x != y,
            cmp::LTU => nan || x < y,
            cmp::LEU => nan || x <= y,
            cmp::GTU => nan || x > y,
            cmp::GEU => nan || x >= y,
            cmp::NUM => !nan,
            _ => nan,
        };
        m |= (r as u32) << l;
    }
    m
}

/// Rounding of conversions: none (exact or the type's default), to nearest even, or to
/// an integral value (`.rni`, `.rzi`, `.rmi`, `.rpi`).
pub(crate) mod rnd {
    pub(crate) const NONE: u8 = 0;
    pub(crate) const RN: u8 = 1;
    pub(crate) const RNI: u8 = 2;
    pub(crate) const RZI: u8 = 3;
    pub(crate) const RMI: u8 = 4;
    pub(crate) const RPI: u8 = 5;
}

#[inline(always)]
fn round_integral(x: f64, r: u8) -> f64 {
    match r {
        rnd::RNI => x.round_ties_even(),
        rnd::RZI => x.trunc(),
        rnd::RMI => x.floor(),
        rnd::RPI => x.ceil(),
        _ => x,
    }
}

/// Float to integer: rounded as `R` says, NaN to 0, clamped to the range.
pub(crate) fn cvt_fi<S: Float, D: Int, const R: u8, const FTZ: bool>(a: &W, o: &mut W) {
    for l in 0..32 {
        let x = flush::<S, FTZ>(S::from_bits(a[l]));
        o[l] = if x.is_nan() {
            0
        } else {
            let v = round_integral(x.to_f64(), R);
            // f64 -> i128 saturates; then into D's range.
            D::saturate(v as i128).bits()
        };
    }
}

/// Integer to float, round to nearest even.
pub(crate) fn cvt_if<S: Int, D: Float, const SAT: bool>(a: &W, o: &mut W) {
    for l in 0..32 {
        let v = S::from_bits(a[l]).value();
        let r = int_to_float::<D>(v);
        let r = if SAT { saturate(r) } else { r };
        o[l] = canon(r);
    }
}

/// An integer of at most 64 bits (magnitude) to `D`, rounded once to nearest even.
fn int_to_float<D: Float>(v: i128) -> D {
    if D::BITS == 32 {
        return D::from_bits((v as f32).to_bits() as u64);
    }
    if D::BITS == 64 {
        return D::from_bits((v as f64).to_bits());
    }
    // 16-bit: through f64, rounded to odd where f64 is not exact.
    let mag = v.unsigned_abs();
    let f = if mag < (1u128 << 53) {
        mag as f64
    } else {
        let shift = 128 - mag.leading_zeros() - 53;
        let kept = mag >> shift;
        let sticky = (mag & ((1u128 << shift) - 1) != 0) as u128;
        ((kept | sticky) as f64) * 2f64.powi(shift as i32)
    };
    D::from_f64(if v < 0 { -f } else { f })
}

/// Float to float: widening exact, narrowing to nearest even, `.rni` etc. to an integral
/// value in the same type; `.ftz` and `.sat` as the constants say.
pub(crate) fn cvt_ff<S: Float, D: Float, const R: u8, const FTZ: bool, const SAT: bool>(
    a: &W,
    o: &mut W,
) {
    for l in 0..32 {
        let x = flush::<S, FTZ>(S::from_bits(a[l]));
        let r = if x.is_nan() {
            D::from_bits(D::CANON)
        } else {
            D::from_f64(round_integral(x.to_f64(), R))
        };
        let r = flush::<D, FTZ>(r);
        let r = if SAT { saturate(r) } else { r };
        o[l] = canon(r);
    }
}

/// `slct.*.f32`: `c >= 0.0 ? a : b` (NaN selects `b`).
pub(crate) fn slct_f32<const FTZ: bool>(a: &W, b: &W, c: &W, o: &mut W) {
    for l in 0..32 {
        let x = <f32 as Float>::from_bits(c[l]);
        let x = if FTZ { x.ftz() } else { x };
        o[l] = if x >= 0.0 { a[l] } else { b[l] };
    }
}
