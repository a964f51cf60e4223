//! Flatten many tensors into one flat buffer and back, converting dtype in the same pass.

use crate::cast::cast_serial;
use crate::error::check_len;
use crate::{Element, FlatLayout, KernelError, PAR_CHUNK};
use rayon::prelude::*;

/// Copies `srcs` into `flat` at the layout's offsets, converting `S` → `D` in the same
/// pass, and writes zeros to every padding element. One pass over the data, on all threads.
pub fn flatten<S: Element, D: Element>(
    layout: &FlatLayout,
    srcs: &[&[S]],
    flat: &mut [D],
) -> Result<(), KernelError> {
    check_shapes(
        "flatten",
        layout,
        srcs.iter().map(|s| s.len()),
        srcs.len(),
        flat.len(),
    )?;
    // Cut `flat` into the disjoint pieces each job writes: tensors and the padding between.
    let mut jobs: Vec<(Option<&[S]>, &mut [D])> = Vec::with_capacity(2 * srcs.len() + 1);
    let mut rest = flat;
    let mut pos = 0;
    for (i, src) in srcs.iter().enumerate() {
        let r = layout.tensor_range(i);
        let (gap, tail) = rest.split_at_mut(r.start - pos);
        let (dst, tail) = tail.split_at_mut(r.len());
        push_chunked(&mut jobs, None, gap);
        push_chunked(&mut jobs, Some(src), dst);
        rest = tail;
        pos = r.end;
    }
    push_chunked(&mut jobs, None, rest);
    jobs.into_par_iter().for_each(|(src, dst)| match src {
        Some(s) => cast_serial(s, dst),
        None => dst.fill(D::default()),
    });
    Ok(())
}

/// Copies each tensor's elements out of `flat` into `dsts`, converting `S` → `D` in the
/// same pass. Padding is not read. One pass over the data, on all threads.
pub fn unflatten<S: Element, D: Element>(
    layout: &FlatLayout,
    flat: &[S],
    dsts: &mut [&mut [D]],
) -> Result<(), KernelError> {
    check_count("unflatten", layout, dsts.len())?;
    check_len("unflatten: flat buffer", layout.total_len(), flat.len())?;
    for (i, dst) in dsts.iter().enumerate() {
        check_len(
            &format!("unflatten: tensor {i}"),
            layout.sizes()[i],
            dst.len(),
        )?;
    }
    let mut jobs: Vec<(&[S], &mut [D])> = Vec::with_capacity(dsts.len());
    for (i, dst) in dsts.iter_mut().enumerate() {
        let src = &flat[layout.tensor_range(i)];
        for (s, d) in src.chunks(PAR_CHUNK).zip(dst.chunks_mut(PAR_CHUNK)) {
            jobs.push((s, d));
        }
    }
    jobs.into_par_iter().for_each(|(s, d)| cast_serial(s, d));
    Ok(())
}

/// Read-only views of each tensor inside `flat` (no copy; same dtype).
pub fn tensor_views<'a, T>(
    layout: &FlatLayout,
    flat: &'a [T],
) -> Result<Vec<&'a [T]>, KernelError> {
    check_len("tensor_views: flat buffer", layout.total_len(), flat.len())?;
    Ok((0..layout.num_tensors())
        .map(|i| &flat[layout.tensor_range(i)])
        .collect())
}

/// Mutable views of each tensor inside `flat` (no copy; same dtype).
pub fn tensor_views_mut<'a, T>(
    layout: &FlatLayout,
    flat: &'a mut [T],
) -> Result<Vec<&'a mut [T]>, KernelError> {
    check_len(
        "tensor_views_mut: flat buffer",
        layout.total_len(),
        flat.len(),
    )?;
    let mut out = Vec::with_capacity(layout.num_tensors());
    let mut rest = flat;
    let mut pos = 0;
    for i in 0..layout.num_tensors() {
        let r = layout.tensor_range(i);
        let (_, tail) = rest.split_at_mut(r.start - pos);
        let (view, tail) = tail.split_at_mut(r.len());
        out.push(view);
        rest = tail;
        pos = r.end;
    }
    Ok(out)
}

/// Checks tensor count, each tensor's length and the flat buffer's length against `layout`.
pub(crate) fn check_shapes(
    what: &'static str,
    layout: &FlatLayout,
    lens: impl Iterator<Item = usize>,
    count: usize,
    flat_len: usize,
) -> Result<(), KernelError> {
    check_count(what, layout, count)?;
    check_len(
        &format!("{what}: flat buffer"),
        layout.total_len(),
        flat_len,
    )?;
    for (i, len) in lens.enumerate() {
        check_len(&format!("{what}: tensor {i}"), layout.sizes()[i], len)?;
    }
    Ok(())
}

fn check_count(what: &'static str, layout: &FlatLayout, actual: usize) -> Result<(), KernelError> {
    if layout.num_tensors() == actual {
        Ok(())
    } else {
        Err(KernelError::TensorCountMismatch {
            what,
            expected: layout.num_tensors(),
            actual,
        })
    }
}

fn push_chunked<'a, S, D>(
    jobs: &mut Vec<(Option<&'a [S]>, &'a mut [D])>,
    src: Option<&'a [S]>,
    dst: &'a mut [D],
) {
    match src {
        Some(s) => {
            for (s, d) in s.chunks(PAR_CHUNK).zip(dst.chunks_mut(PAR_CHUNK)) {
                jobs.push((Some(s), d));
            }
        }
        None => jobs.extend(dst.chunks_mut(PAR_CHUNK).map(|d| (None, d))),
    }
}
