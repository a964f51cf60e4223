//! Reading and writing the offloaded state outside the step: for checkpoints (a save
//! reads it, from the swap file on NVMe), for `optimizer_state()`, and for filling it
//! (initialization, and a load, which fills a new copy and swaps it in only once every
//! rank succeeded).

use super::{Offload, Store, SubGroup, SWAP_FILE};
use crate::io::{AlignedBuf, SwapFile};
use crate::EngineError;
use std::ops::Range;

/// Which fp32 array: master, exp_avg, exp_avg_sq.
pub(crate) type Kind = usize;

/// A region being filled: a sub-group.
pub(crate) type Region = usize;

fn io(e: crate::io::IoError) -> EngineError {
    EngineError::Device(e.to_string())
}

/// A block's three arrays, as `f32`s.
fn sections(buf: &mut AlignedBuf, len: usize) -> Result<&mut [f32], EngineError> {
    buf.as_mut_f32s()
        .get_mut(..3 * len)
        .ok_or_else(|| EngineError::Internal("NVMe buffer smaller than its block".into()))
}

/// A copy of the state being filled: new host arrays or a new swap file (for a load), or
/// the live state itself (initialization).
pub(crate) struct Staging {
    host: Option<Vec<[Vec<f32>; 3]>>,
    nvme: Option<SwapFile>,
    buf: Option<AlignedBuf>,
}

impl Offload {
    /// Reads elements `range` of bucket `b`'s array `kind`, handing them to `sink` as
    /// (offset in the range, values). On NVMe the last block read stays cached, so reading
    /// parameter after parameter reads each block once.
    pub(crate) fn read(
        &mut self,
        b: usize,
        kind: Kind,
        range: Range<usize>,
        mut sink: impl FnMut(usize, &[f32]) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        match &mut self.store {
            Store::Host(per) => sink(0, &per[b][kind][range]),
            Store::Nvme {
                file,
                buffers,
                cache,
            } => {
                for (i, g) in self
                    .groups
                    .iter()
                    .enumerate()
                    .filter(|(_, g)| g.bucket == b)
                {
                    let (lo, hi) = (range.start.max(g.range.start), range.end.min(g.range.end));
                    if lo >= hi {
                        continue;
                    }
                    let buf = match cache {
                        Some((at, buf)) if *at == i => buf,
                        _ => {
                            let buf = match cache.take() {
                                Some((_, buf)) => buf,
                                None => buffers.pop().ok_or_else(|| {
                                    EngineError::Internal("no free NVMe buffer".into())
                                })?,
                            };
                            match file.read(buf, g.offset, g.block).and_then(|t| file.wait(t)) {
                                Ok(buf) => &mut cache.insert((i, buf)).1,
                                Err(e) => {
                                    // The buffer went with the failed transfer.
                                    self.pipeline.refill(buffers);
                                    return Err(io(e));
                                }
                            }
                        }
                    };
                    let vals = sections(buf, g.len())?;
                    let at = kind * g.len() + (lo - g.range.start);
                    sink(lo - range.start, &vals[at..at + (hi - lo)])?;
                }
                Ok(())
            }
        }
    }

    /// Hands the cached block's buffer back to the pipeline (before anything writes).
    pub(crate) fn uncache(&mut self) {
        if let Store::Nvme { buffers, cache, .. } = &mut self.store {
            if let Some((_, buf)) = cache.take() {
                buffers.push(buf);
            }
        }
    }

    /// Starts filling the state: a new copy (`fresh`, for a load), or the live state
    /// (initialization).
    pub(crate) fn begin_staging(&mut self, fresh: bool) -> Result<Staging, EngineError> {
        self.uncache();
        let buf = match &mut self.store {
            Store::Nvme { buffers, .. } => Some(
                buffers
                    .pop()
                    .ok_or_else(|| EngineError::Internal("no free NVMe buffer".into()))?,
            ),
            Store::Host(_) => None,
        };
        let (host, nvme) = match (&self.store, fresh) {
            (_, false) => (None, None),
            (Store::Host(per), true) => {
                let mut copy = Vec::with_capacity(per.len());
                for arrays in per {
                    let n = arrays[0].len();
                    copy.push([
                        self.arena.f32s(n, "the fp32 master weights being loaded")?,
                        self.arena.f32s(n, "exp_avg being loaded")?,
                        self.arena.f32s(n, "exp_avg_sq being loaded")?,
                    ]);
                }
                (Some(copy), None)
            }
            (Store::Nvme { file, .. }, true) => {
                let path = file.path().with_extension("loading");
                let workers = (self.aio.intra_op_parallelism * self.aio.queue_depth).clamp(1, 64);
                let f = SwapFile::create(
                    &path,
                    file.len(),
                    workers as usize,
                    self.aio.block_size as usize,
                )
                .map_err(io)?;
                (None, Some(f))
            }
        };
        Ok(Staging { host, nvme, buf })
    }

    /// Prepares sub-group `g` for filling: zeros, or (`keep`) the current values.
    pub(crate) fn begin_region(
        &mut self,
        st: &mut Staging,
        g: Region,
        keep: bool,
    ) -> Result<(), EngineError> {
        let group = self.groups[g].clone();
        match (&mut self.store, st.host.as_mut()) {
            (Store::Host(per), Some(copy)) => {
                for k in 0..3 {
                    let dst = &mut copy[group.bucket][k][group.range.clone()];
                    if keep {
                        dst.copy_from_slice(&per[group.bucket][k][group.range.clone()]);
                    } else {
                        dst.fill(0.0);
                    }
                }
            }
            (Store::Host(per), None) => {
                if !keep {
                    for array in &mut per[group.bucket] {
                        array[group.range.clone()].fill(0.0);
                    }
                }
            }
            (Store::Nvme { file, .. }, _) => {
                let mut buf = buf_take(st.buf.as_mut().ok_or_else(no_buffer)?);
                if keep {
                    buf = file.read_now(buf, group.offset, group.block).map_err(io)?;
                } else {
                    buf.as_mut_slice()[..group.block].fill(0);
                }
                st.buf = Some(buf);
            }
        }
        Ok(())
    }

    /// Writes `vals` at `offset` of sub-group `g`'s array `kind`.
    pub(crate) fn put(
        &mut self,
        st: &mut Staging,
        g: Region,
        kind: Kind,
        offset: usize,
        vals: &[f32],
    ) -> Result<(), EngineError> {
        let group = &self.groups[g];
        let at = group.range.start + offset;
        match (&mut self.store, st.host.as_mut()) {
            (Store::Host(_), Some(copy)) => {
                copy[group.bucket][kind][at..at + vals.len()].copy_from_slice(vals)
            }
            (Store::Host(per), None) => {
                per[group.bucket][kind][at..at + vals.len()].copy_from_slice(vals)
            }
            (Store::Nvme { .. }, _) => {
                let buf = st.buf.as_mut().ok_or_else(no_buffer)?;
                let s = sections(buf, group.len())?;
                let at = kind * group.len() + offset;
                s[at..at + vals.len()].copy_from_slice(vals);
            }
        }
        Ok(())
    }

    /// Finishes sub-group `g`: on NVMe its block is written (to the new file, or the
    /// live one).
    pub(crate) fn end_region(&mut self, st: &mut Staging, g: Region) -> Result<(), EngineError> {
        let group: SubGroup = self.groups[g].clone();
        if let Store::Nvme { file, .. } = &mut self.store {
            let buf = buf_take(st.buf.as_mut().ok_or_else(no_buffer)?);
            let target = st.nvme.as_mut().unwrap_or(file);
            let t = target.write(buf, group.offset, group.block).map_err(io)?;
            st.buf = Some(target.wait(t).map_err(io)?);
        }
        Ok(())
    }

    /// Makes the staged copy the state (a fresh copy replaces the old; the live state is
    /// already in place).
    pub(crate) fn commit(&mut self, st: Staging) -> Result<(), EngineError> {
        let Staging { host, nvme, buf } = st;
        match &mut self.store {
            Store::Host(per) => {
                if let Some(copy) = host {
                    *per = copy;
                    self.arena_release_copy();
                }
            }
            Store::Nvme { file, buffers, .. } => {
                buffers.extend(buf.filter(|b| !b.is_empty()));
                self.pipeline.refill(buffers);
                if let Some(new) = nvme {
                    // Both files are unlinked: the old one's space goes with it.
                    let live = file.path().to_path_buf();
                    debug_assert!(live.ends_with(SWAP_FILE));
                    *file = new.renamed(live);
                }
            }
        }
        Ok(())
    }

    /// Drops a staged copy that is not taken (a failed load).
    pub(crate) fn abandon(&mut self, st: Staging) {
        let Staging { host, nvme, buf } = st;
        if host.is_some() {
            self.arena_release_copy();
        }
        if let Store::Nvme { buffers, .. } = &mut self.store {
            buffers.extend(buf.filter(|b| !b.is_empty()));
            self.pipeline.refill(buffers);
        }
        drop(nvme);
    }

    /// A host copy's bytes leave the arena (the old arrays are freed with it).
    fn arena_release_copy(&self) {
        self.arena.release(self.host_state);
    }
}

fn no_buffer() -> EngineError {
    EngineError::Internal("the staging has no NVMe buffer".into())
}

/// Takes the buffer out of a slot, leaving an empty one.
fn buf_take(slot: &mut AlignedBuf) -> AlignedBuf {
    std::mem::replace(slot, AlignedBuf::empty())
}
