//! Choosing the warp-wide function of an instruction for its exact type and modifiers.

use super::super::ops::{self, cmp, rnd, BinFn, CmpFn, UnFn};
use super::Ty;
use half::{bf16, f16};

pub(super) fn int_bin<const OP: u8>(ty: Ty) -> Option<BinFn> {
    use ops::ibin;
    Some(match ty {
        Ty::U8 | Ty::B8 => ibin::<u8, OP>,
        Ty::U16 | Ty::B16 => ibin::<u16, OP>,
        Ty::U32 | Ty::B32 => ibin::<u32, OP>,
        Ty::U64 | Ty::B64 => ibin::<u64, OP>,
        Ty::S8 => ibin::<i8, OP>,
        Ty::S16 => ibin::<i16, OP>,
        Ty::S32 => ibin::<i32, OP>,
        Ty::S64 => ibin::<i64, OP>,
        _ => return None,
    })
}

pub(super) fn int_un<const OP: u8>(ty: Ty) -> Option<UnFn> {
    use ops::iun;
    Some(match ty {
        Ty::U8 | Ty::B8 => iun::<u8, OP>,
        Ty::U16 | Ty::B16 => iun::<u16, OP>,
        Ty::U32 | Ty::B32 => iun::<u32, OP>,
        Ty::U64 | Ty::B64 => iun::<u64, OP>,
        Ty::S8 => iun::<i8, OP>,
        Ty::S16 => iun::<i16, OP>,
        Ty::S32 => iun::<i32, OP>,
        Ty::S64 => iun::<i64, OP>,
        _ => return None,
    })
}

pub(super) fn float_bin<const OP: u8>(ty: Ty, ftz: bool, sat: bool) -> Option<BinFn> {
    use ops::fbin;
    Some(match (ty, ftz, sat) {
        (Ty::F32, false, false) => fbin::<f32, OP, false, false>,
        (Ty::F32, true, false) => fbin::<f32, OP, true, false>,
        (Ty::F32, false, true) => fbin::<f32, OP, false, true>,
        (Ty::F32, true, true) => fbin::<f32, OP, true, true>,
        (Ty::F64, false, false) => fbin::<f64, OP, false, false>,
        _ => return None,
    })
}

pub(super) fn float_un<const OP: u8>(ty: Ty, ftz: bool) -> Option<UnFn> {
    use ops::fun;
    Some(match (ty, ftz) {
        (Ty::F32, false) => fun::<f32, OP, false>,
        (Ty::F32, true) => fun::<f32, OP, true>,
        (Ty::F64, false) => fun::<f64, OP, false>,
        _ => return None,
    })
}

pub(super) fn icmp_of<T: ops::Int>(c: u8) -> CmpFn {
    use ops::icmp;
    match c {
        cmp::EQ => icmp::<T, { cmp::EQ }>,
        cmp::NE => icmp::<T, { cmp::NE }>,
        cmp::LT => icmp::<T, { cmp::LT }>,
        cmp::LE => icmp::<T, { cmp::LE }>,
        cmp::GT => icmp::<T, { cmp::GT }>,
        _ => icmp::<T, { cmp::GE }>,
    }
}

pub(super) fn fcmp_of<T: ops::Float, const FTZ: bool>(c: u8) -> CmpFn {
    use ops::fcmp;
    match c {
        cmp::EQ => fcmp::<T, { cmp::EQ }, FTZ>,
        cmp::NE => fcmp::<T, { cmp::NE }, FTZ>,
        cmp::LT => fcmp::<T, { cmp::LT }, FTZ>,
        cmp::LE => fcmp::<T, { cmp::LE }, FTZ>,
        cmp::GT => fcmp::<T, { cmp::GT }, FTZ>,
        cmp::GE => fcmp::<T, { cmp::GE }, FTZ>,
        cmp::EQU => fcmp::<T, { cmp::EQU }, FTZ>,
        cmp::NEU => fcmp::<T, { cmp::NEU }, FTZ>,
        cmp::LTU => fcmp::<T, { cmp::LTU }, FTZ>,
        cmp::LEU => fcmp::<T, { cmp::LEU }, FTZ>,
        cmp::GTU => fcmp::<T, { cmp::GTU }, FTZ>,
        cmp::GEU => fcmp::<T, { cmp::GEU }, FTZ>,
        cmp::NUM => fcmp::<T, { cmp::NUM }, FTZ>,
        _ => fcmp::<T, { cmp::NAN }, FTZ>,
    }
}

pub(super) fn cvt_ii_to<S: ops::Int>(d: Ty, sat: bool) -> Option<UnFn> {
    use ops::cvt_ii;
    macro_rules! pick {
        ($d:ty) => {
            if sat {
                cvt_ii::<S, $d, true>
            } else {
                cvt_ii::<S, $d, false>
            }
        };
    }
    Some(match d {
        Ty::U8 | Ty::B8 => pick!(u8),
        Ty::U16 | Ty::B16 => pick!(u16),
        Ty::U32 | Ty::B32 => pick!(u32),
        Ty::U64 | Ty::B64 => pick!(u64),
        Ty::S8 => pick!(i8),
        Ty::S16 => pick!(i16),
        Ty::S32 => pick!(i32),
        Ty::S64 => pick!(i64),
        _ => return None,
    })
}

pub(super) fn cvt_ii_fn(d: Ty, s: Ty, sat: bool) -> Option<UnFn> {
    match s {
        Ty::U8 | Ty::B8 => cvt_ii_to::<u8>(d, sat),
        Ty::U16 | Ty::B16 => cvt_ii_to::<u16>(d, sat),
        Ty::U32 | Ty::B32 => cvt_ii_to::<u32>(d, sat),
        Ty::U64 | Ty::B64 => cvt_ii_to::<u64>(d, sat),
        Ty::S8 => cvt_ii_to::<i8>(d, sat),
        Ty::S16 => cvt_ii_to::<i16>(d, sat),
        Ty::S32 => cvt_ii_to::<i32>(d, sat),
        Ty::S64 => cvt_ii_to::<i64>(d, sat),
        _ => None,
    }
}

pub(super) fn cvt_fi_to<S: ops::Float, const FTZ: bool>(d: Ty, r: u8) -> Option<UnFn> {
    use ops::cvt_fi;
    macro_rules! pick {
        ($d:ty) => {
            match r {
                rnd::RNI => cvt_fi::<S, $d, { rnd::RNI }, FTZ>,
                rnd::RZI => cvt_fi::<S, $d, { rnd::RZI }, FTZ>,
                rnd::RMI => cvt_fi::<S, $d, { rnd::RMI }, FTZ>,
                _ => cvt_fi::<S, $d, { rnd::RPI }, FTZ>,
            }
        };
    }
    Some(match d {
        Ty::U8 => pick!(u8),
        Ty::U16 => pick!(u16),
        Ty::U32 => pick!(u32),
        Ty::U64 => pick!(u64),
        Ty::S8 => pick!(i8),
        Ty::S16 => pick!(i16),
        Ty::S32 => pick!(i32),
        Ty::S64 => pick!(i64),
        _ => return None,
    })
}

pub(super) fn cvt_if_from<D: ops::Float>(s: Ty, sat: bool) -> Option<UnFn> {
    use ops::cvt_if;
    macro_rules! pick {
        ($s:ty) => {
            if sat {
                cvt_if::<$s, D, true>
            } else {
                cvt_if::<$s, D, false>
            }
        };
    }
    Some(match s {
        Ty::U8 => pick!(u8),
        Ty::U16 => pick!(u16),
        Ty::U32 => pick!(u32),
        Ty::U64 => pick!(u64),
        Ty::S8 => pick!(i8),
        Ty::S16 => pick!(i16),
        Ty::S32 => pick!(i32),
        Ty::S64 => pick!(i64),
        _ => return None,
    })
}

pub(super) fn cvt_ff_pair<S: ops::Float, D: ops::Float>(r: u8, ftz: bool, sat: bool) -> UnFn {
    use ops::cvt_ff;
    macro_rules! flags {
        ($r:expr) => {
            match (ftz, sat) {
                (false, false) => cvt_ff::<S, D, { $r }, false, false>,
                (true, false) => cvt_ff::<S, D, { $r }, true, false>,
                (false, true) => cvt_ff::<S, D, { $r }, false, true>,
                (true, true) => cvt_ff::<S, D, { $r }, true, true>,
            }
        };
    }
    if S::BITS != D::BITS || std::any::TypeId::of::<S>() != std::any::TypeId::of::<D>() {
        // Different types: exact widening or round to nearest even.
        return flags!(rnd::RN);
    }
    match r {
        rnd::RNI => flags!(rnd::RNI),
        rnd::RZI => flags!(rnd::RZI),
        rnd::RMI => flags!(rnd::RMI),
        rnd::RPI => flags!(rnd::RPI),
        _ => flags!(rnd::NONE),
    }
}

pub(super) fn cvt_ff_to<S: ops::Float>(d: Ty, r: u8, ftz: bool, sat: bool) -> Option<UnFn> {
    Some(match d {
        Ty::F16 => cvt_ff_pair::<S, f16>(r, ftz, sat),
        Ty::BF16 => cvt_ff_pair::<S, bf16>(r, ftz, sat),
        Ty::F32 => cvt_ff_pair::<S, f32>(r, ftz, sat),
        Ty::F64 => cvt_ff_pair::<S, f64>(r, ftz, sat),
        _ => return None,
    })
}
