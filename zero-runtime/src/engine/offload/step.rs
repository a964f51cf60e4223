//! The optimizer step with the state off the device, sub-group by sub-group: the same
//! code for the host tier and NVMe (where the blocks are read ahead and written behind).

use super::super::Engine;
use super::{HostGrads, Offload, Pipeline, Store, SubGroup};
use crate::device::{Device, HostDevice};
use crate::io::{AlignedBuf, SwapFile, Ticket};
use crate::EngineError;
use std::collections::VecDeque;
use zero_comm::{Communicator, HostBuffer};
use zero_kernels::{adam_step, AdamConfig};

/// Blocks read ahead of the one being stepped.
const READ_AHEAD: usize = 2;

/// Elements of a sub-group that cross to the host and back at a time (16 Mi: 96 MiB of
/// host staging in bf16 — two gradient chunks and one parameter chunk — and 160 MiB with
/// the fp32 accumulator). Each chunk is one parallel
/// copy, one parallel Adam and one parallel copy back; smaller chunks pay the thread pool's
/// wake-ups more often than they gain in cache (measured by the offload_step bench).
const STAGE: usize = 1 << 24;

/// [`STAGE`], or `ZERO_OFFLOAD_STAGE_ELEMENTS` (tests use it to cut tiny models into
/// several chunks).
pub(crate) fn stage_elements() -> usize {
    std::env::var("ZERO_OFFLOAD_STAGE_ELEMENTS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(STAGE)
}

fn io(e: crate::io::IoError) -> EngineError {
    EngineError::Device(e.to_string())
}

/// The fused CPU Adam over `n = master.len()` elements: `grads[at..at + n]` and
/// `params[at..at + n]` in their dtypes.
#[allow(clippy::too_many_arguments)]
fn cpu_adam(
    cfg: &AdamConfig,
    step: u64,
    grad_scale: f32,
    master: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    grads: &HostBuffer,
    params: &mut HostBuffer,
    at: usize,
) -> Result<(), EngineError> {
    let n = master.len();
    macro_rules! run {
        ($g:expr) => {
            match params {
                HostBuffer::F32(p) => adam_step(
                    cfg,
                    step,
                    grad_scale,
                    master,
                    m,
                    v,
                    &$g[at..at + n],
                    Some(&mut p[at..at + n]),
                ),
                HostBuffer::F16(p) => adam_step(
                    cfg,
                    step,
                    grad_scale,
                    master,
                    m,
                    v,
                    &$g[at..at + n],
                    Some(&mut p[at..at + n]),
                ),
                HostBuffer::BF16(p) => adam_step(
                    cfg,
                    step,
                    grad_scale,
                    master,
                    m,
                    v,
                    &$g[at..at + n],
                    Some(&mut p[at..at + n]),
                ),
            }
        };
    }
    match grads {
        HostBuffer::F32(g) => run!(g),
        HostBuffer::F16(g) => run!(g),
        HostBuffer::BF16(g) => run!(g),
    }
    .map_err(EngineError::from)
}

/// What every sub-group of one offloaded step shares: the sub-groups, the host staging
/// (the double gradient chunk and the parameter chunk), the reduced gradient partitions
/// when they live in host memory, and the gradients' scale.
struct Pass<'a> {
    groups: &'a [SubGroup],
    staging: (&'a mut [HostBuffer; 2], &'a mut HostBuffer),
    host: Option<&'a HostGrads>,
    scale: f32,
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// Runs `f` with the offloaded optimizer lent out of the engine (its passes need the
    /// rest of the engine mutably; it is back when `f` returns); `None` when the optimizer
    /// state is on the device.
    pub(in crate::engine) fn with_offload<T>(
        &mut self,
        f: impl FnOnce(&mut Self, &mut Offload) -> Result<T, EngineError>,
    ) -> Option<Result<T, EngineError>> {
        let mut off = self.offload.take()?;
        let r = f(self, &mut off);
        self.offload = Some(off);
        Some(r)
    }

    /// Adam over every sub-group of the offloaded state `off`; the 16-bit parameters of
    /// each go back to the device's buffers (the all-gathers follow, as on the device).
    pub(in crate::engine) fn offloaded_adam(
        &mut self,
        off: &mut Offload,
        grad_scale: f32,
    ) -> Result<(), EngineError> {
        off.uncache();
        let Offload {
            groups,
            store,
            grads,
            params,
            host_grads,
            pipeline,
            ..
        } = off;
        let pass = Pass {
            groups,
            staging: (grads, params),
            host: host_grads.as_ref(),
            scale: grad_scale,
        };
        match store {
            Store::Host(per) => self.host_pass(per, pass),
            Store::Nvme { file, buffers, .. } => self.nvme_pass(file, buffers, pipeline, pass),
        }
    }

    fn host_pass(
        &mut self,
        per: &mut [[Vec<f32>; 3]],
        mut pass: Pass<'_>,
    ) -> Result<(), EngineError> {
        let groups = pass.groups;
        for g in groups {
            let [master, m, v] = &mut per[g.bucket];
            let r = g.range.clone();
            self.step_group(
                &mut pass,
                g,
                [&mut master[r.clone()], &mut m[r.clone()], &mut v[r]],
            )?;
        }
        Ok(())
    }

    /// NVMe: block i+1 (and i+2) is read while block i is stepped and block i−1 written.
    fn nvme_pass(
        &mut self,
        file: &mut SwapFile,
        buffers: &mut Vec<AlignedBuf>,
        pipeline: &Pipeline,
        mut pass: Pass<'_>,
    ) -> Result<(), EngineError> {
        let groups = pass.groups;
        let mut free: Vec<_> = std::mem::take(buffers);
        let mut reads: VecDeque<(usize, Ticket)> = VecDeque::new();
        let mut writes: VecDeque<Ticket> = VecDeque::new();
        let mut next = 0;
        let result = (|| -> Result<(), EngineError> {
            for i in 0..groups.len() {
                // Keep up to READ_AHEAD blocks in flight, reusing written buffers.
                while next < groups.len() && reads.len() < READ_AHEAD {
                    if free.is_empty() {
                        match writes.pop_front() {
                            Some(t) => free.push(file.wait(t).map_err(io)?),
                            None => break,
                        }
                    }
                    let Some(buf) = free.pop() else { break };
                    let g = &groups[next];
                    reads.push_back((next, file.read(buf, g.offset, g.block).map_err(io)?));
                    next += 1;
                }
                let (at, t) = reads
                    .pop_front()
                    .ok_or_else(|| EngineError::Internal("no block read ahead".into()))?;
                debug_assert_eq!(at, i);
                let mut buf = file.wait(t).map_err(io)?;
                let g = &groups[i];
                let n = g.range.len();
                {
                    let (master, rest) = buf.as_mut_f32s()[..3 * n].split_at_mut(n);
                    let (m, v) = rest.split_at_mut(n);
                    self.step_group(&mut pass, g, [master, m, v])?;
                }
                writes.push_back(file.write(buf, g.offset, g.block).map_err(io)?);
            }
            while let Some(t) = writes.pop_front() {
                free.push(file.wait(t).map_err(io)?);
            }
            Ok(())
        })();
        // On an error, take back what is still in flight before handing the buffers back.
        for (_, t) in reads.drain(..) {
            if let Ok(b) = file.wait(t) {
                free.push(b);
            }
        }
        for t in writes.drain(..) {
            if let Ok(b) = file.wait(t) {
                free.push(b);
            }
        }
        *buffers = free;
        pipeline.refill(buffers);
        result
    }

    /// One sub-group, in chunks of at most [`stage_elements`]: gradients to the host, the
    /// fused Adam, parameters back. Adam is elementwise, so chunks change no bit; they
    /// bound the host staging whatever `sub_group_size` is. The gradients are double-
    /// buffered: chunk k+1's are fetched before chunk k's parameters are queued back, so
    /// on a GPU (where the upload returns before its DMA runs) the upload of chunk k
    /// overlaps Adam on chunk k+1.
    /// `pass`: the staging, the host gradient partitions (stages 2–3 with them in host
    /// memory; else the gradients are read from the device) and the scale, shared by the
    /// pass's sub-groups; the last argument: the sub-group's master weights and moments.
    fn step_group(
        &mut self,
        pass: &mut Pass<'_>,
        g: &SubGroup,
        [master, m, v]: [&mut [f32]; 3],
    ) -> Result<(), EngineError> {
        let (host, scale) = (pass.host, pass.scale);
        let (grads, params) = (&mut *pass.staging.0, &mut *pass.staging.1);
        let b = g.bucket;
        let runs = self.adam_runs(b);
        // Where the sub-group starts in what the step reads: a host partition holds only
        // the rank's range; a device buffer may hold more (stage 1's whole bucket).
        let from = g.range.start
            + match host {
                Some(_) => 0,
                None => self.step_grads(b)?.1.start,
            };
        let chunk = params.len().max(1);
        let chunks: Vec<std::ops::Range<usize>> = (0..g.range.len())
            .step_by(chunk)
            .map(|at| at..(at + chunk).min(g.range.len()))
            .collect();
        let [cur, next] = grads;
        // The staging takes the dtype of what the step reads: a reopened micro-step's
        // fp32 carry crosses as fp32 (rounding it to the gradients' dtype would change
        // the step), and the next step's gradients in their own dtype again.
        let reads = match host {
            Some(h) => h.step_grads(b)?.dtype(),
            None => self.dev.dtype(self.step_grads(b)?.0),
        };
        for s in [&mut *cur, &mut *next] {
            if s.dtype() != reads {
                *s = HostBuffer::zeros(reads, s.len());
            }
        }
        let fetch = |e: &Self, r: &std::ops::Range<usize>, dst: &mut HostBuffer| {
            let src = from + r.start..from + r.end;
            match host {
                Some(h) => HostDevice.copy(h.step_grads(b)?, src, dst, 0),
                None => e.dev.copy_to_host(e.step_grads(b)?.0, src, dst, 0),
            }
        };
        if let Some(first) = chunks.first() {
            fetch(self, first, cur)?;
        }
        for (k, r) in chunks.iter().enumerate() {
            let n = r.len();
            let (now, ahead) = if k % 2 == 0 {
                (&mut *cur, &mut *next)
            } else {
                (&mut *next, &mut *cur)
            };
            // Each parameter group's part of the chunk with its own hyper-parameters.
            let chunk_at = g.range.start + r.start;
            for run in &runs {
                let (s, e) = (
                    run.range.start.max(chunk_at),
                    run.range.end.min(chunk_at + n),
                );
                if s >= e {
                    continue;
                }
                let local = s - chunk_at..e - chunk_at;
                let sub = r.start + local.start..r.start + local.end;
                cpu_adam(
                    &run.cfg,
                    self.steps.optimizer,
                    scale,
                    &mut master[sub.clone()],
                    &mut m[sub.clone()],
                    &mut v[sub],
                    now,
                    params,
                    local.start,
                )?;
            }
            if let Some(following) = chunks.get(k + 1) {
                fetch(self, following, ahead)?;
            }
            self.write_owned_params(b, g.range.start + r.start, params, 0..n)?;
        }
        Ok(())
    }
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// Initialization: each sub-group's master weights from the (rounded) parameters,
    /// moments zero.
    pub(in crate::engine) fn init_offloaded_master(
        &mut self,
        off: &mut Offload,
    ) -> Result<(), EngineError> {
        let mut st = off.begin_staging(false)?;
        let mut vals = Vec::new();
        for i in 0..off.groups.len() {
            let g = off.groups[i].clone();
            off.begin_region(&mut st, i, false)?;
            vals.resize(g.range.len(), 0.0);
            self.owned_params_f32(g.bucket, g.range.clone(), &mut vals)?;
            off.put(&mut st, i, 0, 0, &vals)?;
            off.end_region(&mut st, i)?;
        }
        off.commit(st)
    }

    /// The owned 16-bit parameters from the offloaded master weights (after a load; the
    /// all-gathers follow).
    pub(in crate::engine) fn offloaded_params_from_master(
        &mut self,
        off: &mut Offload,
    ) -> Result<(), EngineError> {
        for b in self.trainable_range() {
            let n = self.plan.buckets[b].layout.partition_len();
            off.read(b, 0, 0..n, |o, vals| self.upload_owned_f32(b, o, vals))?;
        }
        Ok(())
    }
}
