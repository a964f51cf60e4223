//! The buffer operations the engine needs, behind one trait, so the same engine runs on
//! host memory now and on a GPU later (the CUDA path implements [`Device`] over device
//! buffers). All ranges are in elements; copies convert dtype in the same pass.

use crate::EngineError;
use std::ops::Range;
use zero_comm::HostBuffer;
use zero_kernels::{
    adam_step, cast, grad_stats, AdamConfig, DType, Element, GradStats, KernelError,
};

/// fp32 optimizer state of one owned range.
#[derive(Debug)]
pub struct AdamState<B> {
    /// Master weights; `None` when the parameters are fp32 and the master weights are
    /// the parameters' own held range (as DeepSpeed's optimizer steps fp32 parameters in
    /// place), so they are not kept twice.
    pub master: Option<B>,
    /// First moment.
    pub exp_avg: B,
    /// Second moment.
    pub exp_avg_sq: B,
}

impl<B> AdamState<B> {
    /// Array `kind`: 0 master (`None` when it is the parameters), 1 exp_avg, 2 exp_avg_sq.
    pub fn array(&self, kind: usize) -> Option<&B> {
        match kind {
            0 => self.master.as_ref(),
            1 => Some(&self.exp_avg),
            _ => Some(&self.exp_avg_sq),
        }
    }

    /// Array `kind`, mutable.
    pub fn array_mut(&mut self, kind: usize) -> Option<&mut B> {
        match kind {
            0 => self.master.as_mut(),
            1 => Some(&mut self.exp_avg),
            _ => Some(&mut self.exp_avg_sq),
        }
    }
}

/// A stretch of a bucket's held optimizer state stepped with one parameter group's
/// hyper-parameters: elements `range` of the state (and the same elements of the
/// gradients and parameters that go with it).
#[derive(Debug, Clone, PartialEq)]
pub struct AdamRun {
    /// Elements of the state.
    pub range: Range<usize>,
    /// The group's hyper-parameters, with the LR of this step.
    pub cfg: AdamConfig,
}

/// Checks `runs` lie within a state of `n` elements.
pub(crate) fn check_runs(runs: &[AdamRun], n: usize) -> Result<(), EngineError> {
    for r in runs {
        range_check("adam run", &r.range, n)?;
    }
    Ok(())
}

/// Buffer operations of one device.
pub trait Device: Send {
    /// The buffer type (the communicator's buffer type too).
    type Buffer: Send + 'static;
    /// A zeroed buffer.
    fn zeros(&self, dtype: DType, len: usize) -> Result<Self::Buffer, EngineError>;
    /// Element count.
    fn len(&self, b: &Self::Buffer) -> usize;
    /// Bytes the device's allocator counts in use by this process, where it counts them
    /// (CUDA: the default memory pool every zero buffer draws from); `None` on the host,
    /// or where the figure cannot be read. What the memory report is checked against.
    fn allocator_used(&self) -> Option<usize> {
        None
    }
    /// The most bytes the device's allocator ever counted in use at once by this process
    /// (CUDA: the default memory pool's high-water mark); `None` on the host, or where the
    /// figure cannot be read. A run's peak device memory, for benchmarks and budgets.
    fn allocator_peak(&self) -> Option<usize> {
        None
    }
    /// Element type.
    fn dtype(&self, b: &Self::Buffer) -> DType;
    /// Changes the length, zero-filling new elements (keeps the allocation when shrinking).
    fn resize(&self, b: &mut Self::Buffer, len: usize) -> Result<(), EngineError>;
    /// Writes host `f32` values at `offset`, rounding to the buffer's dtype.
    fn upload_f32(
        &self,
        dst: &mut Self::Buffer,
        offset: usize,
        src: &[f32],
    ) -> Result<(), EngineError>;
    /// Reads `src[range]` back to the host as `f32`.
    fn download_f32(
        &self,
        src: &Self::Buffer,
        range: Range<usize>,
    ) -> Result<Vec<f32>, EngineError> {
        let mut out = vec![0f32; range.len()];
        self.download_f32_into(src, range, &mut out)?;
        Ok(out)
    }
    /// Reads `src[range]` into `dst` (of the same length) as `f32`, with no allocation of
    /// its own: what a checkpoint save streams through its I/O buffer.
    fn download_f32_into(
        &self,
        src: &Self::Buffer,
        range: Range<usize>,
        dst: &mut [f32],
    ) -> Result<(), EngineError>;
    /// `dst[offset..] = round(dst[offset..] + src)`, the sum in `f32` (a trainer's
    /// gradient added in).
    fn add_f32(
        &self,
        dst: &mut Self::Buffer,
        offset: usize,
        src: &[f32],
    ) -> Result<(), EngineError>;
    /// Copies `src[range]` into the host buffer `dst[offset..]`, converting to its dtype
    /// (the offload path's device → host crossing; same dtype: a plain copy).
    fn copy_to_host(
        &self,
        src: &Self::Buffer,
        range: Range<usize>,
        dst: &mut HostBuffer,
        offset: usize,
    ) -> Result<(), EngineError>;
    /// Copies host `src[range]` into `dst[offset..]`, converting to its dtype (the
    /// offload path's host → device crossing).
    fn copy_from_host(
        &self,
        src: &HostBuffer,
        range: Range<usize>,
        dst: &mut Self::Buffer,
        offset: usize,
    ) -> Result<(), EngineError>;
    /// Copies `src[range]` to `dst[offset..]`, converting dtype.
    fn copy(
        &self,
        src: &Self::Buffer,
        range: Range<usize>,
        dst: &mut Self::Buffer,
        offset: usize,
    ) -> Result<(), EngineError>;
    /// `acc[offset..] += src[range]`: an `f32` accumulator takes any dtype; a 16-bit one
    /// its own, each element summed in `f32` and rounded once.
    fn accumulate(
        &self,
        acc: &mut Self::Buffer,
        offset: usize,
        src: &Self::Buffer,
        range: Range<usize>,
    ) -> Result<(), EngineError>;
    /// Zeroes `b[range]`.
    fn zero(&self, b: &mut Self::Buffer, range: Range<usize>) -> Result<(), EngineError>;
    /// `b`'s values are no longer needed (the next use overwrites them): where the device
    /// can, it takes the memory back without freeing the buffer (a host mapping's pages go
    /// back to the kernel until written again, and read as zero meanwhile). Returns the
    /// bytes taken back; 0 means `b` is as it was (the default: device memory stays).
    fn discard(&self, b: &mut Self::Buffer) -> Result<usize, EngineError> {
        let _ = b;
        Ok(0)
    }
    /// Zeroes all of `b`: by [`discard`](Self::discard) where that takes the memory back
    /// (its elements read as zero then), else in place. Returns the bytes taken back.
    fn zero_discarding(&self, b: &mut Self::Buffer) -> Result<usize, EngineError> {
        let released = self.discard(b)?;
        if released == 0 {
            let n = self.len(b);
            self.zero(b, 0..n)?;
        }
        Ok(released)
    }
    /// Non-finite check and sum of squares of `b[range]`.
    fn stats(&self, b: &Self::Buffer, range: Range<usize>) -> Result<GradStats, EngineError>;
    /// One fused Adam step over `state`, with gradients `grads[range]`, writing the rounded
    /// weights to `params[offset..]`: each run of `runs` (elements of the state) with its
    /// own hyper-parameters; elements no run covers are left as they are. Without master
    /// weights in `state`, `params[offset..]` (fp32) are the master weights, updated in
    /// place.
    #[allow(clippy::too_many_arguments)]
    fn adam(
        &self,
        runs: &[AdamRun],
        step: u64,
        grad_scale: f32,
        state: &mut AdamState<Self::Buffer>,
        grads: &Self::Buffer,
        range: Range<usize>,
        params: &mut Self::Buffer,
        offset: usize,
    ) -> Result<(), EngineError>;
}

/// Host memory: buffers are [`HostBuffer`]s and the kernels are `zero-kernels`' CPU half.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostDevice;

/// Runs `$body` with `$s` bound to the typed slice of `$buf`.
macro_rules! with_slice {
    ($buf:expr, $s:ident => $body:expr) => {
        match $buf {
            HostBuffer::F32($s) => $body,
            HostBuffer::F16($s) => $body,
            HostBuffer::BF16($s) => $body,
        }
    };
}

fn f32_mut(b: &mut HostBuffer) -> Result<&mut [f32], EngineError> {
    match b {
        HostBuffer::F32(v) => Ok(v),
        other => Err(not_f32(other)),
    }
}

/// A buffer that must hold `f32`s (an accumulator, Adam's moments) holds another dtype.
fn not_f32(b: &HostBuffer) -> EngineError {
    EngineError::WrongDType {
        requested: DType::F32,
        actual: b.dtype(),
    }
}

fn range_check(what: &str, range: &Range<usize>, len: usize) -> Result<(), EngineError> {
    if range.start <= range.end && range.end <= len {
        Ok(())
    } else {
        Err(EngineError::OutOfRange {
            what: what.into(),
            range: range.clone(),
            len,
        })
    }
}

fn copy_typed<S: Element, D: Element>(src: &[S], dst: &mut [D]) -> Result<(), KernelError> {
    cast(src, dst)
}

impl Device for HostDevice {
    type Buffer = HostBuffer;

    fn zeros(&self, dtype: DType, len: usize) -> Result<HostBuffer, EngineError> {
        Ok(HostBuffer::zeros(dtype, len))
    }

    fn len(&self, b: &HostBuffer) -> usize {
        b.len()
    }

    fn dtype(&self, b: &HostBuffer) -> DType {
        b.dtype()
    }

    fn resize(&self, b: &mut HostBuffer, len: usize) -> Result<(), EngineError> {
        b.resize(len)
            .map_err(|e| EngineError::Device(format!("resizing a buffer: {e}")))
    }

    fn upload_f32(
        &self,
        dst: &mut HostBuffer,
        offset: usize,
        src: &[f32],
    ) -> Result<(), EngineError> {
        range_check("upload", &(offset..offset + src.len()), dst.len())?;
        with_slice!(dst, d => copy_typed(src, &mut d[offset..offset + src.len()])?);
        Ok(())
    }

    fn download_f32_into(
        &self,
        src: &HostBuffer,
        range: Range<usize>,
        dst: &mut [f32],
    ) -> Result<(), EngineError> {
        range_check("download", &range, src.len())?;
        with_slice!(src, s => copy_typed(&s[range.clone()], dst)?);
        Ok(())
    }

    fn add_f32(&self, dst: &mut HostBuffer, offset: usize, src: &[f32]) -> Result<(), EngineError> {
        range_check("add", &(offset..offset + src.len()), dst.len())?;
        with_slice!(dst, d => {
            for (d, s) in d[offset..offset + src.len()].iter_mut().zip(src) {
                *d = Element::from_f32(Element::to_f32(*d) + *s);
            }
        });
        Ok(())
    }

    fn copy(
        &self,
        src: &HostBuffer,
        range: Range<usize>,
        dst: &mut HostBuffer,
        offset: usize,
    ) -> Result<(), EngineError> {
        range_check("copy source", &range, src.len())?;
        range_check(
            "copy destination",
            &(offset..offset + range.len()),
            dst.len(),
        )?;
        let n = range.len();
        let to = offset..offset + n;
        // The same dtype: a plain memcpy (bit for bit, NaN payloads included).
        match (src, &mut *dst) {
            (HostBuffer::F32(s), HostBuffer::F32(d)) => zero_kernels::copy(&s[range], &mut d[to])?,
            (HostBuffer::F16(s), HostBuffer::F16(d)) => zero_kernels::copy(&s[range], &mut d[to])?,
            (HostBuffer::BF16(s), HostBuffer::BF16(d)) => {
                zero_kernels::copy(&s[range], &mut d[to])?
            }
            _ => {
                with_slice!(src, s => with_slice!(dst, d => copy_typed(&s[range.clone()], &mut d[to.clone()])?))
            }
        }
        Ok(())
    }

    fn copy_to_host(
        &self,
        src: &HostBuffer,
        range: Range<usize>,
        dst: &mut HostBuffer,
        offset: usize,
    ) -> Result<(), EngineError> {
        self.copy(src, range, dst, offset)
    }

    fn copy_from_host(
        &self,
        src: &HostBuffer,
        range: Range<usize>,
        dst: &mut HostBuffer,
        offset: usize,
    ) -> Result<(), EngineError> {
        self.copy(src, range, dst, offset)
    }

    fn accumulate(
        &self,
        acc: &mut HostBuffer,
        offset: usize,
        src: &HostBuffer,
        range: Range<usize>,
    ) -> Result<(), EngineError> {
        range_check("accumulate source", &range, src.len())?;
        range_check("accumulator", &(offset..offset + range.len()), acc.len())?;
        let to = offset..offset + range.len();
        // A 16-bit accumulator takes its own dtype, summed in f32 and rounded once (torch's
        // `add_` on 16-bit tensors); an f32 one takes any.
        fn add_16<T: Element>(acc: &mut [T], src: &[T]) {
            for (a, x) in acc.iter_mut().zip(src) {
                *a = T::from_f32(a.to_f32() + x.to_f32());
            }
        }
        match (&mut *acc, src) {
            (HostBuffer::F16(a), HostBuffer::F16(s)) => add_16(&mut a[to], &s[range]),
            (HostBuffer::BF16(a), HostBuffer::BF16(s)) => add_16(&mut a[to], &s[range]),
            (HostBuffer::F32(a), _) => with_slice!(src, s => {
                for (a, x) in a[to].iter_mut().zip(&s[range.clone()]) {
                    *a += Element::to_f32(*x);
                }
            }),
            // A 16-bit accumulator takes gradients of its own dtype only.
            (a, s) => {
                return Err(EngineError::WrongDType {
                    requested: a.dtype(),
                    actual: s.dtype(),
                })
            }
        }
        Ok(())
    }

    fn zero(&self, b: &mut HostBuffer, range: Range<usize>) -> Result<(), EngineError> {
        range_check("zero", &range, b.len())?;
        with_slice!(b, s => s[range].fill(Default::default()));
        Ok(())
    }

    fn discard(&self, b: &mut HostBuffer) -> Result<usize, EngineError> {
        Ok(b.release_pages())
    }

    fn stats(&self, b: &HostBuffer, range: Range<usize>) -> Result<GradStats, EngineError> {
        range_check("stats", &range, b.len())?;
        Ok(with_slice!(b, s => grad_stats(&s[range])))
    }

    fn adam(
        &self,
        runs: &[AdamRun],
        step: u64,
        grad_scale: f32,
        state: &mut AdamState<HostBuffer>,
        grads: &HostBuffer,
        range: Range<usize>,
        params: &mut HostBuffer,
        offset: usize,
    ) -> Result<(), EngineError> {
        let n = state.exp_avg.len();
        range_check("adam gradients", &range, grads.len())?;
        range_check("adam parameters", &(offset..offset + n), params.len())?;
        check_runs(runs, n)?;
        let m = f32_mut(&mut state.exp_avg)?;
        let v = f32_mut(&mut state.exp_avg_sq)?;
        for run in runs {
            let r = run.range.clone();
            let g = range.start + r.start..range.start + r.end;
            let p = offset + r.start..offset + r.end;
            match state.master.as_mut() {
                Some(master) => {
                    let master = f32_mut(master)?;
                    with_slice!(grads, gs => with_slice!(params, ps => {
                        adam_step(&run.cfg, step, grad_scale, &mut master[r.clone()], &mut m[r.clone()], &mut v[r.clone()], &gs[g], Some(&mut ps[p]))?
                    }));
                }
                None => {
                    let master = f32_mut(params)?;
                    with_slice!(grads, gs => {
                        adam_step::<_, f32>(&run.cfg, step, grad_scale, &mut master[p], &mut m[r.clone()], &mut v[r.clone()], &gs[g], None)?
                    });
                }
            }
        }
        Ok(())
    }
}
