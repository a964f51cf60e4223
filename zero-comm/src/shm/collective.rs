//! The collectives of the shared-memory group, run by every rank on its own data.
//!
//! Each rank copies what the others need into its own window, every rank arrives at a
//! barrier, then each takes what it needs from the others' windows. A reduction is split
//! by destination: rank r reduces piece r (`even_split`), reading every rank's part in
//! rank order through the one reduction core ([`crate::reduce`]), so the bits equal
//! `HostGroup`'s. It reads the others' windows in place (no window is written again
//! before every rank has passed the next barrier), and streams a large reduce-scatter's
//! output past the caches ([`STREAM_MIN_BYTES`]). Large buffers go in chunks of one
//! window; windows are double-buffered by barrier parity, so a chunk's copies never wait
//! for the one before to be read.
//!
//! | collective | per chunk |
//! |---|---|
//! | reduce-scatter | copy the others' pieces in · barrier · reduce my piece into my output |
//! | all-reduce ≤ 32 KiB | copy in · barrier · every rank reduces the whole buffer |
//! | all-reduce | as reduce-scatter, the result also into my other half · barrier · copy the others' pieces out |
//! | all-gather | copy my piece in · barrier · copy the others' out (at most 256 KiB a chunk) |
//! | broadcast | the root copies in · barrier · the others copy out (likewise) |
//! | barrier | barrier |
//!
//! The first barrier of every collective also compares what each rank issued (each
//! writes its descriptor first), so a mismatch is found before anything depends on it.

use super::segment::{Cause, Segment};
use crate::buffer::HostElement;
use crate::op::{even_split, OpDesc};
use crate::reduce::{reduce_into, reduce_into_streaming, STREAM_MIN_BYTES, TILE};
use crate::{CommError, ReduceOp};
use std::cell::Cell;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// An all-reduce this small (in bytes) runs in one phase.
const ONE_SHOT_BYTES: usize = 32 << 10;
/// The most an all-gather or broadcast moves per barrier: pure copies stay in cache at
/// this size, and gain nothing from fewer barriers (2 processes, 64 Mi bf16 all-gather,
/// 2026-11-28: 10.6–11.3 ms in 256 KiB chunks, 12.5–15.0 ms in 1 MiB ones).
const COPY_CHUNK_BYTES: usize = 256 << 10;

/// An element type the group moves: the reduction core's, and plain bytes.
pub(crate) trait ShmElement: HostElement + bytemuck::Pod {}
impl<T: HostElement + bytemuck::Pod> ShmElement for T {}

/// Where a reduction finds this rank's own part, and how it writes the result.
#[derive(Clone, Copy)]
enum Own<'a, T> {
    /// In `mine`; the result goes to a separate output, by streaming stores when `cold`
    /// (a large reduce-scatter's output, see [`STREAM_MIN_BYTES`]).
    Separate { mine: &'a [T], cold: bool },
    /// In the output itself (an all-reduce). With `publish = Some((b', at'))` the result
    /// is also copied into this rank's window for barrier `b'` at element `at'`.
    InPlace { publish: Option<(u64, usize)> },
}

/// One rank running one collective.
pub(crate) struct Run<'a> {
    pub seg: &'a Segment,
    pub me: usize,
    pub world: usize,
    pub timeout: Duration,
    pub spin: Duration,
    /// Barriers this rank has passed (shared across collectives).
    pub steps: &'a Cell<u64>,
    pub seq: u64,
    pub desc: &'a OpDesc,
    /// Turns a recorded abort into this rank's error.
    pub abort_error: &'a dyn Fn(&Segment) -> Option<CommError>,
}

impl Run<'_> {
    /// Arrives at the next barrier and waits for every rank; returns its number.
    fn barrier(&self) -> Result<u64, CommError> {
        let b = self.steps.get() + 1;
        self.seg.arrive(self.me).store(b, Ordering::Release);
        self.seg.bell().ring();
        let deadline = Instant::now() + self.timeout;
        let seg = self.seg;
        // A barrier every rank reached is passed even if the group was aborted since: the
        // abort belongs to a later collective, which reports it.
        let got = seg.bell().wait(self.spin, deadline, || {
            let behind = |r: &usize| seg.arrive(*r).load(Ordering::Acquire) < b;
            if !(0..self.world).any(|r| behind(&r)) {
                return Some(Ok(()));
            }
            if let Some(e) = (self.abort_error)(seg) {
                return Some(Err(e));
            }
            (0..self.world).filter(behind).find_map(|r| {
                let left = seg.left(r).load(Ordering::Acquire);
                (left != 0).then_some(Err(CommError::RankLeft {
                    rank: r,
                    panicked: left == 2,
                }))
            })
        });
        match got {
            Some(Ok(())) => {
                self.steps.set(b);
                Ok(b)
            }
            Some(Err(e)) => Err(e),
            None => {
                let missing: Vec<usize> = (0..self.world)
                    .filter(|&r| seg.arrive(r).load(Ordering::Acquire) < b)
                    .collect();
                let list = missing
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(",");
                seg.abort(
                    Cause::Timeout,
                    self.me,
                    self.seq,
                    &format!("{}\0{list}", self.desc),
                );
                Err(CommError::Timeout {
                    seq: self.seq,
                    op: self.desc.to_string(),
                    after: self.timeout,
                    waiter: self.me,
                    missing,
                })
            }
        }
    }

    /// The collective's first barrier: publishes this rank's descriptor, then checks that
    /// every rank issued the same collective.
    fn first_barrier(&self) -> Result<u64, CommError> {
        self.seg
            .put_desc(self.me, self.steps.get() + 1, self.seq, self.desc);
        let b = self.barrier()?;
        let all: Vec<(u64, Option<OpDesc>)> =
            (0..self.world).map(|r| self.seg.desc(r, b)).collect();
        if all
            .iter()
            .any(|(seq, d)| *seq != self.seq || d.as_ref() != Some(self.desc))
        {
            let detail = all
                .iter()
                .enumerate()
                .map(|(r, (seq, d))| match d {
                    Some(d) if *seq == self.seq => format!("rank {r} issued {d}"),
                    Some(d) => format!("rank {r} issued {d} as its collective #{seq}"),
                    None => format!("rank {r} issued an unknown collective"),
                })
                .collect::<Vec<_>>()
                .join("; ");
            return Err(CommError::Mismatch {
                seq: self.seq,
                detail,
            });
        }
        Ok(b)
    }

    /// Elements of `T` in one window.
    fn window_elems<T>(&self) -> usize {
        self.seg.window() / std::mem::size_of::<T>()
    }

    /// Elements of `T` an all-gather or broadcast moves per barrier.
    fn copy_chunk<T>(&self) -> usize {
        (self.seg.window().min(COPY_CHUNK_BYTES) / std::mem::size_of::<T>()).max(1)
    }

    /// Copies `src` into this rank's window for barrier `b`, at element `at`.
    fn put<T: ShmElement>(&self, b: u64, at: usize, src: &[T]) {
        let off = self.seg.window_at(self.me, (b % 2) as usize) + at * std::mem::size_of::<T>();
        self.seg.map().write(off, bytemuck::cast_slice(src));
    }

    /// Copies rank `r`'s window for barrier `b`, from element `at`, into `dst`.
    fn get<T: ShmElement>(&self, r: usize, b: u64, at: usize, dst: &mut [T]) {
        let off = self.seg.window_at(r, (b % 2) as usize) + at * std::mem::size_of::<T>();
        self.seg.map().read(off, bytemuck::cast_slice_mut(dst));
    }

    /// `out[i] = op` over ranks in order of their element `i`: this rank's as `own` says,
    /// every other rank's read in place from its window for barrier `b` at element `at`.
    fn reduce<T: ShmElement>(
        &self,
        b: u64,
        at: usize,
        op: ReduceOp,
        own: Own<'_, T>,
        out: &mut [T],
    ) {
        let size = std::mem::size_of::<T>();
        let others: Vec<Range<usize>> = (0..self.world)
            .filter(|&r| r != self.me)
            .map(|r| {
                let off = self.seg.window_at(r, (b % 2) as usize) + at * size;
                off..off + std::mem::size_of_val(out)
            })
            .collect();
        // The others' windows for barrier `b` are not written again before this rank
        // arrives at its next barrier, so they are read in place.
        self.seg
            .map()
            .with_slices(&others, std::mem::align_of::<T>(), |bytes| {
                let others: Vec<&[T]> = bytes.iter().map(|b| bytemuck::cast_slice(b)).collect();
                match own {
                    Own::Separate { mine, cold } => {
                        let ins = self.inputs(&others, mine, 0..out.len());
                        if cold {
                            reduce_into_streaming(out, &ins, op, self.world);
                        } else {
                            reduce_into(out, &ins, op, self.world);
                        }
                    }
                    Own::InPlace { publish } => {
                        // The result goes through a tile first: its inputs include `out`.
                        let mut result = [T::from_f32(0.0); TILE];
                        for start in (0..out.len()).step_by(TILE) {
                            let tile = start..(start + TILE).min(out.len());
                            let len = tile.len();
                            let ins = self.inputs(&others, &out[tile.clone()], tile.clone());
                            reduce_into(&mut result[..len], &ins, op, self.world);
                            out[tile].copy_from_slice(&result[..len]);
                            if let Some((b2, at2)) = publish {
                                self.put(b2, at2 + start, &result[..len]);
                            }
                        }
                    }
                }
            });
    }

    /// The inputs of one tile in rank order: `own` for this rank, elements `tile` of the
    /// others' windows (`others`, in rank order without this rank) for the rest.
    fn inputs<'s, T>(&self, others: &[&'s [T]], own: &'s [T], tile: Range<usize>) -> Vec<&'s [T]> {
        let mut rest = others.iter();
        (0..self.world)
            .map(|r| match r == self.me {
                true => own,
                // `others` holds one window per other rank.
                false => rest.next().map_or(own, |w| &w[tile.clone()]),
            })
            .collect()
    }

    /// The chunking of a reduction of `n` elements: each rank's piece, the elements of
    /// each piece per chunk, and the number of chunks (at least one, for the checks).
    fn pieces<T>(&self, n: usize) -> (Vec<Range<usize>>, usize, usize) {
        let pieces: Vec<Range<usize>> = (0..self.world)
            .map(|r| even_split(n, self.world, r))
            .collect();
        let w = (self.window_elems::<T>() / self.world).max(1);
        let chunks = pieces[0].len().div_ceil(w).max(1);
        (pieces, w, chunks)
    }

    /// Passes chunk `k`'s barrier: the collective's first (with the descriptor check) for
    /// the first chunk.
    fn chunk_barrier(&self, k: usize) -> Result<u64, CommError> {
        if k == 0 {
            self.first_barrier()
        } else {
            self.barrier()
        }
    }

    /// Copies every other rank's part of chunk `k` of `input` into this rank's window (rank
    /// r's at element r·w), then passes the chunk's barrier.
    fn scatter_parts<T: ShmElement>(
        &self,
        input: &[T],
        pieces: &[Range<usize>],
        k: usize,
        w: usize,
    ) -> Result<u64, CommError> {
        let next = self.steps.get() + 1;
        for r in (0..self.world).filter(|&r| r != self.me) {
            self.put(next, r * w, &input[Self::part(pieces, r, k, w)]);
        }
        self.chunk_barrier(k)
    }

    /// Rank `r`'s part of chunk `k`: its piece's elements `[k·w, (k+1)·w)`.
    fn part(pieces: &[Range<usize>], r: usize, k: usize, w: usize) -> Range<usize> {
        let p = &pieces[r];
        let s = (p.start + k * w).min(p.end);
        s..(s + w).min(p.end)
    }

    /// Reduce-scatter of `input` (length `n`) into `output` (this rank's piece).
    pub fn reduce_scatter<T: ShmElement>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let (pieces, w, chunks) = self.pieces::<T>(input.len());
        let mine = pieces[self.me].clone();
        let cold = std::mem::size_of_val(output) >= STREAM_MIN_BYTES;
        for k in 0..chunks {
            let b = self.scatter_parts(input, &pieces, k, w)?;
            let part = Self::part(&pieces, self.me, k, w);
            let out = &mut output[part.start - mine.start..part.end - mine.start];
            let own = Own::Separate {
                mine: &input[part],
                cold,
            };
            self.reduce(b, self.me * w, op, own, out);
        }
        Ok(())
    }

    /// All-reduce of `buf` in place.
    pub fn all_reduce<T: ShmElement>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CommError> {
        let n = buf.len();
        if std::mem::size_of_val(buf) <= ONE_SHOT_BYTES.min(self.seg.window()) {
            let next = self.steps.get() + 1;
            self.put(next, 0, buf);
            let b = self.first_barrier()?;
            self.reduce(b, 0, op, Own::InPlace { publish: None }, buf);
            return Ok(());
        }
        let (pieces, w, chunks) = self.pieces::<T>(n);
        for k in 0..chunks {
            let b = self.scatter_parts(buf, &pieces, k, w)?;
            let part = Self::part(&pieces, self.me, k, w);
            let publish = Some((b + 1, self.me * w));
            self.reduce(b, self.me * w, op, Own::InPlace { publish }, &mut buf[part]);
            let b2 = self.barrier()?;
            for r in (0..self.world).filter(|&r| r != self.me) {
                self.get(r, b2, r * w, &mut buf[Self::part(&pieces, r, k, w)]);
            }
        }
        Ok(())
    }

    /// All-gather of every rank's `input` (its piece) into `output` (length `n`).
    pub fn all_gather<T: ShmElement>(
        &self,
        input: &[T],
        output: &mut [T],
    ) -> Result<(), CommError> {
        let pieces: Vec<Range<usize>> = (0..self.world)
            .map(|r| even_split(output.len(), self.world, r))
            .collect();
        let w = self.copy_chunk::<T>();
        let chunks = pieces[0].len().div_ceil(w).max(1);
        let mine = pieces[self.me].clone();
        for k in 0..chunks {
            let next = self.steps.get() + 1;
            let part = Self::part(&pieces, self.me, k, w);
            let src = &input[part.start - mine.start..part.end - mine.start];
            self.put(next, 0, src);
            output[part].copy_from_slice(src);
            let b = self.chunk_barrier(k)?;
            for r in (0..self.world).filter(|&r| r != self.me) {
                self.get(r, b, 0, &mut output[Self::part(&pieces, r, k, w)]);
            }
        }
        Ok(())
    }

    /// Broadcast of `root`'s `buf`.
    pub fn broadcast<T: ShmElement>(&self, buf: &mut [T], root: usize) -> Result<(), CommError> {
        let w = self.copy_chunk::<T>();
        let chunks = buf.len().div_ceil(w).max(1);
        for k in 0..chunks {
            let range = (k * w).min(buf.len())..((k + 1) * w).min(buf.len());
            let next = self.steps.get() + 1;
            if self.me == root {
                self.put(next, 0, &buf[range.clone()]);
            }
            let b = self.chunk_barrier(k)?;
            if self.me != root {
                self.get(root, b, 0, &mut buf[range]);
            }
        }
        Ok(())
    }

    /// A barrier.
    pub fn barrier_op(&self) -> Result<(), CommError> {
        self.first_barrier().map(|_| ())
    }

    /// Every rank's `mine` (at most a window's bytes; the same length on every rank), in
    /// rank order, through one first barrier (so the collective is matched as usual).
    pub fn exchange(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
        let next = self.steps.get() + 1;
        let at = |r: usize, b: u64| self.seg.window_at(r, (b % 2) as usize);
        self.seg.map().write(at(self.me, next), mine);
        let b = self.first_barrier()?;
        Ok((0..self.world)
            .map(|r| {
                let mut theirs = vec![0u8; mine.len()];
                self.seg.map().read(at(r, b), &mut theirs);
                theirs
            })
            .collect())
    }
}
