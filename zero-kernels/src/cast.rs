//! Whole-slice dtype conversion.

use crate::error::check_len;
use crate::{Element, KernelError, PAR_CHUNK};
use rayon::prelude::*;

/// Copies `src` into `dst` of the same dtype, bit for bit (NaN payloads included), on
/// all threads: the equal-dtype case of [`cast`] without the trip through `f32`.
pub fn copy<T: Element>(src: &[T], dst: &mut [T]) -> Result<(), KernelError> {
    check_len("copy: dst", src.len(), dst.len())?;
    if src.len() <= PAR_CHUNK {
        dst.copy_from_slice(src);
        return Ok(());
    }
    dst.par_chunks_mut(PAR_CHUNK)
        .zip(src.par_chunks(PAR_CHUNK))
        .for_each(|(d, s)| d.copy_from_slice(s));
    Ok(())
}

/// Converts `src` into `dst` element by element through `f32`: widening is exact,
/// narrowing rounds to nearest even (so f16 → bf16 rounds once). Runs on all threads.
pub fn cast<S: Element, D: Element>(src: &[S], dst: &mut [D]) -> Result<(), KernelError> {
    check_len("cast: dst", src.len(), dst.len())?;
    dst.par_chunks_mut(PAR_CHUNK)
        .zip(src.par_chunks(PAR_CHUNK))
        .for_each(|(d, s)| cast_serial(s, d));
    Ok(())
}

/// Serial conversion of equal-length slices: the inner loop of [`cast`] and of flatten.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+avx+sse4.2+sse4.1+ssse3+sse3",
    "x86_64+avx2+avx+sse4.2+sse4.1+ssse3+sse3",
))]
pub(crate) fn cast_serial<S: Element, D: Element>(src: &[S], dst: &mut [D]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = D::from_f32(s.to_f32());
    }
}
