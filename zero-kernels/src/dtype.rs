//! Element types: `f32`, `f16` and `bf16`, with round-to-nearest-even narrowing.

use half::{bf16, f16};
use std::fmt;

/// The floating-point types zero stores parameters, gradients and buffers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16: the top 16 bits of a binary32.
    BF16,
}

impl DType {
    /// Bytes per element.
    pub const fn size_of(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// Lower-case name, as DeepSpeed configs and logs write it.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A storable element: converts to `f32` exactly and from `f32` rounding to nearest even.
pub trait Element: Copy + Send + Sync + PartialEq + fmt::Debug + Default + 'static {
    /// The runtime tag of this type.
    const DTYPE: DType;
    /// Exact widening to `f32`.
    fn to_f32(self) -> f32;
    /// Narrowing from `f32`, round to nearest even; NaN stays NaN, overflow gives ±inf.
    fn from_f32(x: f32) -> Self;
    /// `false` for ±inf and NaN, decided on the bits.
    fn is_finite(self) -> bool;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn is_finite(self) -> bool {
        self.to_bits() & 0x7f80_0000 != 0x7f80_0000
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    #[inline(always)]
    fn is_finite(self) -> bool {
        self.to_bits() & 0x7c00 != 0x7c00
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_bits(bf16_from_f32_rne(x))
    }
    #[inline(always)]
    fn is_finite(self) -> bool {
        self.to_bits() & 0x7f80 != 0x7f80
    }
}

/// `f32` → `bf16` bits, round to nearest even, written without branches so that loops over
/// it vectorise. NaN is kept (and made quiet); the same function the CUDA kernels use.
#[inline(always)]
pub fn bf16_from_f32_rne(x: f32) -> u16 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_half_f32_path_on_every_class_of_value() {
        // Exhaustive over the top 16 bits with a spread of low halves: covers ties,
        // subnormals, overflow to inf, inf and NaN.
        for hi in 0u32..=0xffff {
            for lo in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff] {
                let x = f32::from_bits((hi << 16) | lo);
                let ours = bf16_from_f32_rne(x);
                let theirs = bf16::from_f32(x);
                if x.is_nan() {
                    assert!(bf16::from_bits(ours).is_nan(), "{x:?}");
                } else {
                    assert_eq!(ours, theirs.to_bits(), "x bits {:#010x}", x.to_bits());
                }
            }
        }
    }

    #[test]
    fn finiteness_is_decided_on_the_bits() {
        // (value, finite as f32, as bf16, as f16): f32::MAX rounds up to inf in bf16, and
        // 1e30 overflows f16.
        for (x, f32_ok, bf16_ok, f16_ok) in [
            (1.0f32, true, true, true),
            (1e30, true, true, false),
            (f32::MAX, true, false, false),
            (f32::INFINITY, false, false, false),
            (f32::NEG_INFINITY, false, false, false),
            (f32::NAN, false, false, false),
        ] {
            assert_eq!(Element::is_finite(x), f32_ok, "{x}");
            assert_eq!(
                Element::is_finite(<bf16 as Element>::from_f32(x)),
                bf16_ok,
                "{x}"
            );
            assert_eq!(
                Element::is_finite(<f16 as Element>::from_f32(x)),
                f16_ok,
                "{x}"
            );
        }
    }
}
