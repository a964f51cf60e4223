//! The arithmetic of one instruction over the 32 lanes of a warp. Each function here is
//! monomorphized for one type and modifier set and picked once, when the instruction is
//! decoded; executing it is one indirect call and a tight loop over the lanes.
//!
//! Values are raw register bits (`u64`, zero-extended from the type's width); every result
//! is masked to its type's width.

mod float;

pub(crate) use float::*;

/// One register across the 32 lanes of a warp.
pub(crate) type W = [u64; 32];
/// `d = f(a)` per lane.
pub(crate) type UnFn = fn(&W, &mut W);
/// `d = f(a, b)` per lane.
pub(crate) type BinFn = fn(&W, &W, &mut W);
/// `d = f(a, b, c)` per lane.
pub(crate) type TernFn = fn(&W, &W, &W, &mut W);
/// `d = f(a, b, c, e)` per lane.
pub(crate) type QuadFn = fn(&W, &W, &W, &W, &mut W);
/// One bit per lane: the comparison of `a` and `b`.
pub(crate) type CmpFn = fn(&W, &W) -> u32;

/// The low `bits` bits set.
pub(crate) const fn mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

// ---------------------------------------------------------------------------------------
// Integers

/// An integer type of PTX (`.u8` … `.s64`) as a Rust integer.
pub(crate) trait Int: Copy + Ord + 'static {
    const BITS: u32;
    const SIGNED: bool;
    /// Truncates the register bits to this type.
    fn from_bits(x: u64) -> Self;
    /// The value's bits, zero-extended.
    fn bits(self) -> u64;
    /// The numeric value.
    fn value(self) -> i128;
    /// The value clamped into this type.
    fn saturate(v: i128) -> Self;
    fn wadd(self, o: Self) -> Self;
    fn wsub(self, o: Self) -> Self;
    fn wmul(self, o: Self) -> Self;
    fn wneg(self) -> Self;
    fn wabs(self) -> Self;
    /// Quotient; all ones on division by zero; wraps on overflow.
    fn qdiv(self, o: Self) -> Self;
    /// Remainder; the dividend on division by zero.
    fn qrem(self, o: Self) -> Self;
    /// Shift right by `n` (clamped): logical for unsigned, arithmetic for signed.
    fn shr(self, n: u32) -> Self;
}

macro_rules! impl_int {
    ($t:ty, $signed:expr) => {
        impl Int for $t {
            const BITS: u32 = <$t>::BITS;
            const SIGNED: bool = $signed;
            #[inline(always)]
            fn from_bits(x: u64) -> Self {
                x as $t
            }
            #[inline(always)]
            fn bits(self) -> u64 {
                (self as u64) & mask(<$t>::BITS)
            }
            #[inline(always)]
            fn value(self) -> i128 {
                self as i128
            }
            #[inline(always)]
            fn saturate(v: i128) -> Self {
                v.clamp(<$t>::MIN as i128, <$t>::MAX as i128) as $t
            }
            #[inline(always)]
            fn wadd(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn wsub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            #[inline(always)]
            fn wmul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn wneg(self) -> Self {
                self.wrapping_neg()
            }
            #[inline(always)]
            fn wabs(self) -> Self {
                if self < (0 as $t) {
                    self.wrapping_neg()
                } else {
                    self
                }
            }
            #[inline(always)]
            fn qdiv(self, o: Self) -> Self {
                if o == 0 {
                    !(0 as $t)
                } else {
                    self.wrapping_div(o)
                }
            }
            #[inline(always)]
            fn qrem(self, o: Self) -> Self {
                if o == 0 {
                    self
                } else {
                    self.wrapping_rem(o)
                }
            }
            #[inline(always)]
            fn shr(self, n: u32) -> Self {
                self.checked_shr(n)
                    .unwrap_or(if self < (0 as $t) { !(0 as $t) } else { 0 })
            }
        }
    };
}
impl_int!(u8, false);
impl_int!(u16, false);
impl_int!(u32, false);
impl_int!(u64, false);
impl_int!(i8, true);
impl_int!(i16, true);
impl_int!(i32, true);
impl_int!(i64, true);

/// Integer binary operation codes (the `OP` of [`ibin`]).
pub(crate) mod iop {
    pub(crate) const ADD: u8 = 0;
    pub(crate) const SUB: u8 = 1;
    pub(crate) const MULLO: u8 = 2;
    pub(crate) const MULHI: u8 = 3;
    pub(crate) const DIV: u8 = 4;
    pub(crate) const REM: u8 = 5;
    pub(crate) const MIN: u8 = 6;
    pub(crate) const MAX: u8 = 7;
    pub(crate) const AND: u8 = 8;
    pub(crate) const OR: u8 = 9;
    pub(crate) const XOR: u8 = 10;
    pub(crate) const SHL: u8 = 11;
    pub(crate) const SHR: u8 = 12;
    pub(crate) const ADDSAT: u8 = 13;
    pub(crate) const SUBSAT: u8 = 14;
}

#[inline(always)]
fn ibin1<T: Int, const OP: u8>(a: u64, b: u64) -> u64 {
    let x = T::from_bits(a);
    match OP {
        iop::SHL => {
            let n = b as u32;
            if n >= T::BITS {
                0
            } else {
                (x.bits() << n) & mask(T::BITS)
            }
        }
        iop::SHR => x.shr(b as u32).bits(),
        _ => {
            let y = T::from_bits(b);
            let r = match OP {
                iop::ADD => x.wadd(y),
                iop::SUB => x.wsub(y),
                iop::MULLO => x.wmul(y),
                iop::MULHI => T::from_bits(((x.value() * y.value()) >> T::BITS) as u64),
                iop::DIV => x.qdiv(y),
                iop::REM => x.qrem(y),
                iop::MIN => x.min(y),
                iop::MAX => x.max(y),
                iop::AND => T::from_bits(x.bits() & y.bits()),
                iop::OR => T::from_bits(x.bits() | y.bits()),
                iop::XOR => T::from_bits(x.bits() ^ y.bits()),
                iop::ADDSAT => T::saturate(x.value() + y.value()),
                _ => T::saturate(x.value() - y.value()),
            };
            r.bits()
        }
    }
}

/// `d = a OP b` in type `T`.
pub(crate) fn ibin<T: Int, const OP: u8>(a: &W, b: &W, o: &mut W) {
    for l in 0..32 {
        o[l] = ibin1::<T, OP>(a[l], b[l]);
    }
}

/// `mul.wide`: the full product, twice `T`'s width.
pub(crate) fn mul_wide<T: Int>(a: &W, b: &W, o: &mut W) {
    for l in 0..32 {
        let p = T::from_bits(a[l]).value() * T::from_bits(b[l]).value();
        o[l] = (p as u64) & mask(2 * T::BITS);
    }
}

/// `mad.lo`: `a * b + c`, wrapping.
pub(crate) fn mad_lo<T: Int>(a: &W, b: &W, c: &W, o: &mut W) {
    for l in 0..32 {
        let (x, y, z) = (T::from_bits(a[l]), T::from_bits(b[l]), T::from_bits(c[l]));
        o[l] = x.wmul(y).wadd(z).bits();
    }
}

/// `mad.hi`: the high half of `a * b`, plus `c`, wrapping.
pub(crate) fn mad_hi<T: Int>(a: &W, b: &W, c: &W, o: &mut W) {
    for l in 0..32 {
        let hi = ibin1::<T, { iop::MULHI }>(a[l], b[l]);
        o[l] = T::from_bits(hi).wadd(T::from_bits(c[l])).bits();
    }
}

/// `mad.wide`: the full product plus `c` (twice `T`'s width), wrapping.
pub(crate) fn mad_wide<T: Int>(a: &W, b: &W, c: &W, o: &mut W) {
    for l in 0..32 {
        let p = T::from_bits(a[l]).value() * T::from_bits(b[l]).value();
        o[l] = (p as u64).wrapping_add(c[l]) & mask(2 * T::BITS);
    }
}

/// Integer unary operation codes (the `OP` of [`iun`]).
pub(crate) mod iun_op {
    pub(crate) const ABS: u8 = 0;
    pub(crate) const NEG: u8 = 1;
    pub(crate) const NOT: u8 = 2;
    pub(crate) const CNOT: u8 = 3;
    pub(crate) const POPC: u8 = 4;
    pub(crate) const CLZ: u8 = 5;
    pub(crate) const BREV: u8 = 6;
    pub(crate) const BFIND: u8 = 7;
    pub(crate) const BFIND_SHIFT: u8 = 8;
}

/// Integer unary operations in type `T`.
pub(crate) fn iun<T: Int, const OP: u8>(a: &W, o: &mut W) {
    for l in 0..32 {
        let x = T::from_bits(a[l]);
        let m = mask(T::BITS);
        o[l] = match OP {
            iun_op::ABS => x.wabs().bits(),
            iun_op::NEG => x.wneg().bits(),
            iun_op::NOT => !x.bits() & m,
            iun_op::CNOT => (x.bits() == 0) as u64,
            iun_op::POPC => x.bits().count_ones() as u64,
            iun_op::CLZ => (x.bits().leading_zeros() - (64 - T::BITS)) as u64,
            iun_op::BREV => x.bits().reverse_bits() >> (64 - T::BITS),
            _ => {
                // bfind: the position of the most significant non-sign bit.
                let v = if T::SIGNED && x.value() < 0 {
                    !x.bits() & m
                } else {
                    x.bits()
                };
                if v == 0 {
                    0xffff_ffff
                } else {
                    let pos = 63 - v.leading_zeros() as u64;
                    if OP == iun_op::BFIND_SHIFT {
                        (T::BITS as u64 - 1) - pos
                    } else {
                        pos
                    }
                }
            }
        };
    }
}

/// `bfe`: extract `c` bits at position `b` of `a`, zero- or sign-extended.
pub(crate) fn bfe<T: Int>(a: &W, b: &W, c: &W, o: &mut W) {
    for l in 0..32 {
        let x = T::from_bits(a[l]).bits();
        let pos = (b[l] & 0xff) as u32;
        let len = (c[l] & 0xff) as u32;
        let top = (pos + len).min(T::BITS);
        let sbit = if T::SIGNED {
            if len == 0 {
                false
            } else {
                let bit = (pos + len - 1).min(T::BITS - 1);
                (x >> bit) & 1 == 1
            }
        } else {
            false
        };
        let mut r = if pos >= T::BITS || len == 0 {
            0
        } else {
            (x >> pos) & mask(top - pos)
        };
        if sbit {
            let from = if pos >= T::BITS { 0 } else { top - pos };
            r |= !mask(from);
        }
        o[l] = r & mask(T::BITS);
    }
}

/// `bfi`: insert the low `e` bits of `a` into `b` at position `c`.
pub(crate) fn bfi<T: Int>(a: &W, b: &W, c: &W, e: &W, o: &mut W) {
    for l in 0..32 {
        let pos = (c[l] & 0xff) as u32;
        let len = (e[l] & 0xff) as u32;
        let base = b[l] & mask(T::BITS);
        o[l] = if pos >= T::BITS || len == 0 {
            base
        } else {
            let len = len.min(T::BITS - pos);
            let f = mask(len) << pos;
            ((base & !f) | ((a[l] << pos) & f)) & mask(T::BITS)
        };
    }
}

/// `prmt.b32` (default mode): bytes of `{b, a}` selected by the nibbles of `c`.
pub(crate) fn prmt(a: &W, b: &W, c: &W, o: &mut W) {
    for l in 0..32 {
        let bytes = ((b[l] & 0xffff_ffff) << 32) | (a[l] & 0xffff_ffff);
        let mut r = 0u64;
        for k in 0..4 {
            let sel = (c[l] >> (4 * k)) & 0xf;
            let byte = (bytes >> (8 * (sel & 7))) & 0xff;
            let byte = if sel & 8 != 0 {
                if byte & 0x80 != 0 {
                    0xff
                } else {
                    0
                }
            } else {
                byte
            };
            r |= byte << (8 * k);
        }
        o[l] = r;
    }
}

/// `shf.{l,r}.{wrap,clamp}.b32`: funnel shift of `{b, a}` by `c`.
pub(crate) fn shf<const LEFT: bool, const CLAMP: bool>(a: &W, b: &W, c: &W, o: &mut W) {
    for l in 0..32 {
        let v = ((b[l] & 0xffff_ffff) << 32) | (a[l] & 0xffff_ffff);
        let n = if CLAMP {
            (c[l] as u32).min(32)
        } else {
            (c[l] as u32) & 31
        };
        o[l] = if LEFT {
            ((v << n) >> 32) & 0xffff_ffff
        } else {
            (v >> n) & 0xffff_ffff
        };
    }
}

/// Integer comparison codes (the `C` of [`icmp`] and [`fcmp`]).
pub(crate) mod cmp {
    pub(crate) const EQ: u8 = 0;
    pub(crate) const NE: u8 = 1;
    pub(crate) const LT: u8 = 2;
    pub(crate) const LE: u8 = 3;
    pub(crate) const GT: u8 = 4;
    pub(crate) const GE: u8 = 5;
    pub(crate) const EQU: u8 = 6;
    pub(crate) const NEU: u8 = 7;
    pub(crate) const LTU: u8 = 8;
    pub(crate) const LEU: u8 = 9;
    pub(crate) const GTU: u8 = 10;
    pub(crate) const GEU: u8 = 11;
    pub(crate) const NUM: u8 = 12;
    pub(crate) const NAN: u8 = 13;
}

/// Integer comparison in type `T` (signedness from `T`).
pub(crate) fn icmp<T: Int, const C: u8>(a: &W, b: &W) -> u32 {
    let mut m = 0u32;
    for l in 0..32 {
        let (x, y) = (T::from_bits(a[l]), T::from_bits(b[l]));
        let r = match C {
            cmp::EQ => x == y,
            cmp::NE => x != y,
            cmp::LT => x < y,
            cmp::LE => x <= y,
            cmp::GT => x > y,
            _ => x >= y,
        };
        m |= (r as u32) << l;
    }
    m
}

/// Integer to integer conversion: sign- or zero-extension or truncation; clamped with
/// `.sat`.
pub(crate) fn cvt_ii<S: Int, D: Int, const SAT: bool>(a: &W, o: &mut W) {
    for l in 0..32 {
        let v = S::from_bits(a[l]).value();
        o[l] = if SAT {
            D::saturate(v).bits()
        } else {
            D::from_bits(v as u64).bits()
        };
    }
}

/// `selp`-like choice for `slct.*.s32`: `c >= 0 ? a : b`.
pub(crate) fn slct_s32(a: &W, b: &W, c: &W, o: &mut W) {
    for l in 0..32 {
        o[l] = if (c[l] as u32 as i32) >= 0 {
            a[l]
        } else {
            b[l]
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    fn w(v: u64) -> W {
        [v; 32]
    }

    fn run2(f: BinFn, a: u64, b: u64) -> u64 {
        let mut o = [0; 32];
        f(&w(a), &w(b), &mut o);
        o[0]
    }

    fn run1(f: UnFn, a: u64) -> u64 {
        let mut o = [0; 32];
        f(&w(a), &mut o);
        o[0]
    }

    fn f(x: f32) -> u64 {
        x.to_bits() as u64
    }

    #[test]
    fn integer_wrap_shift_clamp_and_division_by_zero() {
        assert_eq!(run2(ibin::<u32, { iop::ADD }>, 0xffff_ffff, 2), 1);
        assert_eq!(run2(ibin::<i32, { iop::SUB }>, 0, 1), 0xffff_ffff);
        assert_eq!(run2(ibin::<u32, { iop::SHL }>, 1, 32), 0);
        assert_eq!(run2(ibin::<u32, { iop::SHL }>, 1, 31), 0x8000_0000);
        assert_eq!(run2(ibin::<u32, { iop::SHR }>, 0x8000_0000, 40), 0);
        assert_eq!(
            run2(ibin::<i32, { iop::SHR }>, 0x8000_0000, 40),
            0xffff_ffff
        );
        assert_eq!(run2(ibin::<i32, { iop::SHR }>, 0x8000_0000, 4), 0xf800_0000);
        assert_eq!(run2(ibin::<u64, { iop::DIV }>, 7, 0), u64::MAX);
        assert_eq!(
            run2(ibin::<i32, { iop::DIV }>, 0x8000_0000, 0xffff_ffff),
            0x8000_0000
        );
        assert_eq!(run2(ibin::<u32, { iop::REM }>, 7, 0), 7);
        assert_eq!(
            run2(ibin::<i32, { iop::REM }>, (-7i32) as u32 as u64, 2),
            0xffff_ffff
        );
        assert_eq!(
            run2(ibin::<i32, { iop::MULHI }>, 0xffff_ffff, 0xffff_ffff),
            0
        );
        assert_eq!(
            run2(ibin::<u32, { iop::MULHI }>, 0xffff_ffff, 0xffff_ffff),
            0xffff_fffe
        );
        assert_eq!(run2(mul_wide::<i32>, 0xffff_ffff, 3), (-3i64) as u64);
        assert_eq!(run2(mul_wide::<u32>, 0xffff_ffff, 3), 3 * 0xffff_ffffu64);
        assert_eq!(run2(ibin::<i32, { iop::MIN }>, 0xffff_ffff, 1), 0xffff_ffff);
        assert_eq!(run2(ibin::<u32, { iop::MIN }>, 0xffff_ffff, 1), 1);
        assert_eq!(
            run2(ibin::<i32, { iop::ADDSAT }>, 0x7fff_ffff, 1),
            0x7fff_ffff
        );
        assert_eq!(run1(iun::<u32, { iun_op::CLZ }>, 1), 31);
        assert_eq!(run1(iun::<u64, { iun_op::POPC }>, u64::MAX), 64);
        assert_eq!(run1(iun::<u32, { iun_op::BREV }>, 1), 0x8000_0000);
        assert_eq!(run1(iun::<i64, { iun_op::NEG }>, 1), u64::MAX);
        assert_eq!(run1(iun::<u32, { iun_op::BFIND }>, 0x10), 4);
        assert_eq!(run1(iun::<u32, { iun_op::BFIND }>, 0), 0xffff_ffff);
    }

    #[test]
    fn bit_field_and_permute() {
        let mut o = [0; 32];
        bfe::<u32>(&w(0xabcd_1234), &w(8), &w(8), &mut o);
        assert_eq!(o[0], 0x12);
        bfe::<i32>(&w(0x0000_8000), &w(8), &w(8), &mut o);
        assert_eq!(o[0], 0xffff_ff80);
        bfi::<u32>(&w(0xff), &w(0x1234_5678), &w(8), &w(4), &mut o);
        assert_eq!(o[0], 0x1234_5f78);
        prmt(&w(0x4433_2211), &w(0x8877_6655), &w(0x7531), &mut o);
        assert_eq!(o[0], 0x8866_4422);
        shf::<true, false>(&w(0x8000_0000), &w(1), &w(1), &mut o);
        assert_eq!(o[0], 3);
    }

    #[test]
    fn float_nan_rules_and_rounding() {
        let nan = f(f32::NAN);
        let inf = f(f32::INFINITY);
        // inf - inf is the canonical NaN.
        assert_eq!(
            run2(fbin::<f32, { fop::SUB }, false, false>, inf, inf),
            0x7fff_ffff
        );
        assert_eq!(
            run2(fbin::<f32, { fop::ADD }, false, false>, 0xffc0_0001, f(1.0)),
            0x7fff_ffff
        );
        assert_eq!(
            run2(fbin::<f32, { fop::MIN }, false, false>, nan, f(2.0)),
            f(2.0)
        );
        assert_eq!(
            run2(fbin::<f32, { fop::MAX }, false, false>, f(2.0), nan),
            f(2.0)
        );
        assert_eq!(
            run2(fbin::<f32, { fop::MIN }, false, false>, f(0.0), f(-0.0)),
            f(-0.0)
        );
        assert_eq!(
            run2(fbin::<f32, { fop::MAX }, false, false>, f(-0.0), f(0.0)),
            f(0.0)
        );
        assert_eq!(
            run2(fbin::<f32, { fop::MIN_NAN }, false, false>, nan, f(1.0)),
            0x7fff_ffff
        );
        // Subnormals kept without .ftz, flushed with it.
        let tiny = 1u64; // smallest subnormal
        assert_eq!(run2(fbin::<f32, { fop::ADD }, false, false>, tiny, tiny), 2);
        assert_eq!(run2(fbin::<f32, { fop::ADD }, true, false>, tiny, tiny), 0);
        assert_eq!(
            run2(fbin::<f32, { fop::MUL }, true, false>, 0x8000_0001, f(1.0)),
            0x8000_0000
        );
        assert_eq!(
            run1(fun::<f32, { fun_op::SQRT }, false>, f(-1.0)),
            0x7fff_ffff
        );
        assert_eq!(
            run1(fun::<f64, { fun_op::SQRT }, false>, (-1.0f64).to_bits()),
            0x7fff_ffff_ffff_ffff
        );
        assert_eq!(
            run2(fbin::<f32, { fop::ADD }, false, true>, f(0.75), f(0.5)),
            f(1.0)
        );
        assert_eq!(
            run2(fbin::<f32, { fop::ADD }, false, true>, nan, f(0.5)),
            f(0.0)
        );
        // Unordered and ordered comparisons.
        let mut a = w(nan);
        a[1] = f(1.0);
        let b = w(f(1.0));
        assert_eq!(fcmp::<f32, { cmp::EQ }, false>(&a, &b) & 3, 2);
        assert_eq!(fcmp::<f32, { cmp::NE }, false>(&a, &b) & 3, 0);
        assert_eq!(fcmp::<f32, { cmp::NEU }, false>(&a, &b) & 3, 1);
        assert_eq!(fcmp::<f32, { cmp::EQU }, false>(&a, &b) & 3, 3);
        assert_eq!(fcmp::<f32, { cmp::NAN }, false>(&a, &b) & 3, 1);
        assert_eq!(fcmp::<f32, { cmp::NUM }, false>(&a, &b) & 3, 2);
    }

    #[test]
    fn conversions() {
        // f32 -> f16 / bf16, ties to even, overflow to inf, NaN to 0x7fff.
        assert_eq!(
            run1(cvt_ff::<f32, f16, { rnd::RN }, false, false>, f(65520.0)),
            0x7c00
        );
        assert_eq!(
            run1(cvt_ff::<f32, f16, { rnd::RN }, false, false>, f(f32::NAN)),
            0x7fff
        );
        assert_eq!(
            run1(cvt_ff::<f32, bf16, { rnd::RN }, false, false>, 0x3f80_8000),
            0x3f80
        );
        assert_eq!(
            run1(cvt_ff::<f32, bf16, { rnd::RN }, false, false>, 0x3f81_8000),
            0x3f82
        );
        assert_eq!(
            run1(cvt_ff::<f32, bf16, { rnd::RN }, false, false>, 0x3f80_8001),
            0x3f81
        );
        assert_eq!(
            run1(cvt_ff::<f16, f32, { rnd::NONE }, false, false>, 0x7e01),
            0x7fff_ffff
        );
        assert_eq!(
            run1(cvt_ff::<f16, f32, { rnd::NONE }, false, false>, 0x0001),
            f(f16::from_bits(1).to_f32())
        );
        // f64 -> bf16 rounds once (half's own f64 conversion would not).
        let x = f64::from_bits(0x3ff0_1000_0000_0001); // just above a bf16 tie
        assert_eq!(
            run1(cvt_ff::<f64, bf16, { rnd::RN }, false, false>, x.to_bits()),
            0x3f81
        );
        // Float -> int: rounding, saturation, NaN -> 0.
        assert_eq!(
            run1(cvt_fi::<f32, i32, { rnd::RZI }, false>, f(-2.7)),
            (-2i32) as u32 as u64
        );
        assert_eq!(run1(cvt_fi::<f32, i32, { rnd::RNI }, false>, f(2.5)), 2);
        assert_eq!(
            run1(cvt_fi::<f32, i32, { rnd::RMI }, false>, f(-2.5)),
            (-3i32) as u32 as u64
        );
        assert_eq!(run1(cvt_fi::<f32, u32, { rnd::RPI }, false>, f(-2.5)), 0);
        assert_eq!(run1(cvt_fi::<f32, u8, { rnd::RZI }, false>, f(300.0)), 255);
        assert_eq!(
            run1(cvt_fi::<f32, i32, { rnd::RZI }, false>, f(f32::NAN)),
            0
        );
        // Int -> int.
        assert_eq!(run1(cvt_ii::<i32, i64, false>, 0xffff_fffe), (-2i64) as u64);
        assert_eq!(run1(cvt_ii::<u32, u64, false>, 0xffff_fffe), 0xffff_fffe);
        assert_eq!(run1(cvt_ii::<u64, u32, false>, 0x1_2345_6789), 0x2345_6789);
        assert_eq!(run1(cvt_ii::<u32, u16, false>, 0x1_2345), 0x2345);
        assert_eq!(run1(cvt_ii::<i32, u8, true>, 0xffff_ffff), 0);
        // Int -> float.
        assert_eq!(
            run1(cvt_if::<u64, f32, false>, (1 << 24) + 1),
            f(16_777_216.0)
        );
        assert_eq!(
            run1(cvt_if::<i32, f16, false>, 0xffff_ffff),
            f16::from_f32(-1.0).to_bits() as u64
        );
        assert_eq!(
            run1(cvt_if::<u64, bf16, false>, u64::MAX),
            bf16::from_f32(1.8446744e19).to_bits() as u64
        );
    }
}
