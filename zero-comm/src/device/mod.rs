//! `DeviceGroup`: `n` ranks as threads sharing one GPU.
//!
//! NCCL refuses two ranks on one device, so this backend is what tests the GPU engine at
//! world size > 1 on a single GPU. The group machinery is [`crate::group`]'s (matching,
//! timeouts, failures); its executor queues each collective on the group's own comm
//! stream as device-to-device copies and the ordered reduction kernel, so results are
//! bit-identical to [`HostGroup`](crate::HostGroup)'s. `wait` returns once the work is
//! queued: `cudarc`'s per-buffer events make every later use of a returned buffer, on any
//! stream, wait for it, with no device-wide synchronization.

use crate::group::{self, Executor, GroupComm, GroupWork, DEFAULT_TIMEOUT};
use crate::op::{even_split, OpDesc, OpKind};
use crate::{CommError, ReduceOp};
use std::time::Duration;
use zero_kernels::cuda::{Combine, Gpu, GpuBuffer, GpuError, GpuStream, MAX_REDUCE_BUFFERS};

/// One rank of a [`DeviceGroup`].
pub type DeviceComm = GroupComm<GpuBuffer>;
/// Handle of a collective issued on a [`DeviceComm`].
pub type DeviceWork<T> = GroupWork<GpuBuffer, T>;

/// Builds the ranks of a one-GPU group.
#[derive(Debug)]
pub struct DeviceGroup;

impl DeviceGroup {
    /// `n` ranks on the process's GPU with [`DEFAULT_TIMEOUT`]; an error where there is
    /// no GPU.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(n: usize) -> Result<Vec<DeviceComm>, CommError> {
        Self::with_timeout(n, DEFAULT_TIMEOUT)
    }

    /// `n` ranks whose waits give up after `timeout`; at most [`MAX_REDUCE_BUFFERS`]
    /// (the reduction kernel takes every rank's buffer address as a launch parameter).
    pub fn with_timeout(n: usize, timeout: Duration) -> Result<Vec<DeviceComm>, CommError> {
        let backend = |e: GpuError| CommError::Backend {
            seq: 0,
            op: "DeviceGroup::new".into(),
            reason: e.to_string(),
        };
        if n > MAX_REDUCE_BUFFERS {
            return Err(CommError::Backend {
                seq: 0,
                op: "DeviceGroup::new".into(),
                reason: format!(
                    "{n} ranks asked for; one GPU's group holds at most {MAX_REDUCE_BUFFERS}"
                ),
            });
        }
        let stream = Gpu::get().map_err(backend)?.new_stream().map_err(backend)?;
        group::spawn(n, timeout, DeviceExec { stream })
    }
}

/// Runs collectives on the group's comm stream.
struct DeviceExec {
    stream: GpuStream,
}

fn combine(op: Option<ReduceOp>) -> Combine {
    match op {
        Some(ReduceOp::Avg) => Combine::Avg,
        Some(ReduceOp::Max) => Combine::Max,
        Some(ReduceOp::Sum) | None => Combine::Sum,
    }
}

/// Each rank's `[input, output]` split into the inputs (read) and outputs (written).
fn split_pairs(buffers: &mut [Vec<GpuBuffer>]) -> (Vec<&GpuBuffer>, Vec<&mut GpuBuffer>) {
    buffers
        .iter_mut()
        .filter_map(|b| match b.as_mut_slice() {
            [input, output] => Some((&*input, output)),
            _ => None,
        })
        .unzip()
}

impl Executor<GpuBuffer> for DeviceExec {
    fn execute(&mut self, desc: &OpDesc, buffers: &mut [Vec<GpuBuffer>]) -> Result<(), String> {
        let st = &self.stream;
        let world = buffers.len();
        let op = combine(desc.reduce);
        let n = desc.count;
        let mut run = || -> Result<(), GpuError> {
            match desc.kind {
                OpKind::AllReduce => {
                    let mut bufs: Vec<&mut GpuBuffer> =
                        buffers.iter_mut().filter_map(|b| b.first_mut()).collect();
                    st.reduce_in_place(&mut bufs, n, op)
                }
                OpKind::ReduceScatter => {
                    let (inputs, outputs) = split_pairs(buffers);
                    for (rank, out) in outputs.into_iter().enumerate() {
                        let piece = even_split(n, world, rank);
                        let srcs: Vec<(&GpuBuffer, usize)> =
                            inputs.iter().map(|b| (*b, piece.start)).collect();
                        st.reduce(&srcs, &mut [(out, 0)], piece.len(), op)?;
                    }
                    Ok(())
                }
                OpKind::AllGather => {
                    let (inputs, outputs) = split_pairs(buffers);
                    for out in outputs {
                        for (rank, input) in inputs.iter().enumerate() {
                            let piece = even_split(n, world, rank);
                            st.copy(input, 0..piece.len(), out, piece.start)?;
                        }
                    }
                    Ok(())
                }
                OpKind::Broadcast => {
                    let root = desc.root.unwrap_or(0);
                    let (before, rest) = buffers.split_at_mut(root);
                    let (root_bufs, after) = rest.split_at_mut(1);
                    let src = &root_bufs[0][0];
                    for b in before.iter_mut().chain(after.iter_mut()) {
                        st.copy(src, 0..n, &mut b[0], 0)?;
                    }
                    Ok(())
                }
                OpKind::Barrier => Ok(()),
            }
        };
        run().map_err(|e| e.to_string())
    }

    fn fork(&self) -> Result<Self, String> {
        let stream = Gpu::get()
            .and_then(|gpu| gpu.new_stream())
            .map_err(|e| format!("a stream for the sub-group: {e}"))?;
        Ok(DeviceExec { stream })
    }
}
