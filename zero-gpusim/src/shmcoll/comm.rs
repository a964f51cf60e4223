//! The communicator and its collectives.
//!
//! Every rank owns a window of `W` bytes in the segment, in two halves: data written for
//! barrier `b` goes in half `b % 2` and is read by the others between barriers `b` and
//! `b + 1`, so a chunk's copies never wait for the previous chunk to be read. Each
//! collective's first barrier also compares what every rank called (each publishes its
//! descriptor first), before anything depends on the data.
//!
//! | collective | per chunk |
//! |---|---|
//! | all-reduce ≤ 32 KiB | copy mine in · barrier · every rank reduces the whole buffer |
//! | all-reduce | copy the others' parts in · barrier · reduce my part (into recv and my other half) · barrier · copy the others' reduced parts out |
//! | reduce-scatter | copy the others' blocks' parts in · barrier · reduce my block's part |
//! | all-gather | copy my block's part in · barrier · copy the others' out (≤ 1 MiB a chunk) |
//! | broadcast | the root copies in · barrier · the others copy out (≤ 1 MiB a chunk) |
//!
//! A reduction is split by destination: rank `r` reduces part `r` (an even split of the
//! elements), reading every rank's values in rank order through [`reduce`](super::reduce),
//! so every rank gets the same bits, and the bits of zero's host engine.

use super::desc::{CallKind, Desc};
use super::error::CollError;
use super::join::{join, Joined};
use super::liveness::Peer;
use super::record::{self, Cause, Record};
use super::reduce::{as_bytes, as_bytes_mut, reduce_into, with_element, Element};
use super::segment::{state, Segment};
use super::wait::spin_budget;
use super::{default_timeout, AbortFlag, DType, Member, RedOp, UNIQUE_ID_BYTES};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// An all-reduce this small (bytes) runs in one phase.
const ONE_SHOT_BYTES: usize = 32 << 10;
/// The most an all-gather or broadcast moves per barrier.
const COPY_CHUNK_BYTES: usize = 1 << 20;
/// Elements staged and reduced at a time.
const TILE: usize = 4096;
/// The longest sleep in a collective's wait: how soon a dead peer is noticed.
const SLICE: Duration = Duration::from_millis(20);

/// One rank of a communicator over shared memory (see the module docs). `Send + Sync`:
/// [`abort`](ShmComm::abort) may be called from any thread while another is blocked in a
/// collective; collectives called from several threads at once run one after the other.
/// Dropping it unmaps the segment; peers waiting for this rank then fail.
pub struct ShmComm {
    seg: Segment,
    rank: usize,
    nranks: usize,
    spin: Duration,
    timeout_ms: AtomicU64,
    state: Mutex<State>,
}

/// What the collectives of one rank share.
struct State {
    /// The next collective's number.
    seq: u64,
    /// Barriers passed.
    steps: u64,
    /// The error that ended the communicator, if one did.
    broken: Option<CollError>,
    /// A watcher per peer (`None` for this rank).
    peers: Vec<Option<Peer>>,
}

impl std::fmt::Debug for ShmComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmComm")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("window", &self.seg.window())
            .finish()
    }
}

/// A collective's buffers: separate, or one buffer holding both (in place), with where
/// the send and receive data start in it (bytes).
enum Io<'a> {
    Separate {
        send: &'a [u8],
        recv: &'a mut [u8],
    },
    InPlace {
        buf: &'a mut [u8],
        send_at: usize,
        recv_at: usize,
    },
}

impl Io<'_> {
    /// Bytes `r` of the send data.
    fn send(&self, r: Range<usize>) -> &[u8] {
        match self {
            Io::Separate { send, .. } => &send[r],
            Io::InPlace { buf, send_at, .. } => &buf[r.start + send_at..r.end + send_at],
        }
    }

    /// Bytes `r` of the receive buffer.
    fn recv(&mut self, r: Range<usize>) -> &mut [u8] {
        match self {
            Io::Separate { recv, .. } => &mut recv[r],
            Io::InPlace { buf, recv_at, .. } => &mut buf[r.start + *recv_at..r.end + *recv_at],
        }
    }

    /// Copies send bytes `from` to receive bytes starting at `to` (a no-op in place when
    /// they are the same memory).
    fn copy_own(&mut self, from: Range<usize>, to: usize) {
        match self {
            Io::Separate { send, recv } => recv[to..to + from.len()].copy_from_slice(&send[from]),
            Io::InPlace {
                buf,
                send_at,
                recv_at,
            } => {
                let (src, dst) = (from.start + *send_at, to + *recv_at);
                if src != dst {
                    buf.copy_within(src..src + from.len(), dst);
                }
            }
        }
    }
}

/// The elements `[start, end)` of rank `r`'s share of `n` split `nranks` ways (the first
/// `n % nranks` ranks get one more).
fn even_split(n: usize, nranks: usize, r: usize) -> Range<usize> {
    let (q, rem) = (n / nranks, n % nranks);
    let start = r * q + r.min(rem);
    start..start + q + usize::from(r < rem)
}

/// Elements `[k·w, (k+1)·w)` of `piece`, clipped to it.
fn part(piece: &Range<usize>, k: usize, w: usize) -> Range<usize> {
    let s = (piece.start + k * w).min(piece.end);
    s..(s + w).min(piece.end)
}

/// Bytes of elements `r` of `esz` bytes each.
fn bytes(r: Range<usize>, esz: usize) -> Range<usize> {
    r.start * esz..r.end * esz
}

impl ShmComm {
    /// Joins the communicator named by `id` as `me.rank` of `me.nranks`: the first rank to
    /// arrive creates the segment `/dev/shm/zero-gpusim-nccl-<hex>`, the others map it;
    /// returns once every rank arrived, or errors: a rank that has not arrived by `timeout`
    /// (the error names the missing ranks), `nranks` disagreeing (names both values and
    /// ranks), a rank number taken twice, two ranks on one device (names both ranks and
    /// the device), or `abort` set meanwhile. Once all ranks have mapped the segment, its
    /// name is unlinked. Collectives then time out after [`default_timeout`].
    pub fn join(
        id: &[u8; UNIQUE_ID_BYTES],
        me: Member,
        timeout: Duration,
        abort: &AbortFlag,
    ) -> Result<ShmComm, CollError> {
        let Joined { seg, peers } = join(id, &me, timeout, abort)?;
        Ok(ShmComm {
            seg,
            rank: me.rank,
            nranks: me.nranks,
            spin: spin_budget(me.nranks),
            timeout_ms: AtomicU64::new(default_timeout().as_millis() as u64),
            state: Mutex::new(State {
                seq: 0,
                steps: 0,
                broken: None,
                peers,
            }),
        })
    }

    /// This rank's number.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Bytes of each window half (the most a chunk moves per rank and barrier).
    pub fn window_bytes(&self) -> usize {
        self.seg.window()
    }

    /// The per-collective timeout: how long a rank waits for a peer before it fails.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    /// Sets the per-collective timeout (from the next wait on; at least 1 ms).
    pub fn set_timeout(&self, timeout: Duration) {
        let ms = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        self.timeout_ms.store(ms, Ordering::Relaxed);
    }

    /// Marks the communicator aborted, here and, through the segment, for every peer (they
    /// fail at once with an error naming this rank and `reason`), waking every waiter in
    /// this process and the others. Idempotent (the first abort of the communicator is the
    /// one reported); callable from any thread while another is blocked in a collective.
    pub fn abort(&self, reason: &str) {
        record::publish(
            &self.seg,
            &Record {
                cause: Cause::Aborted,
                rank: self.rank,
                seq: 0,
                extra: 0,
                call: "ncclCommAbort".into(),
                reason: reason.to_string(),
            },
        );
    }

    /// All-reduce: `recv[i] = op` over ranks of `send[i]`. `recv.len() == send.len()`, a
    /// multiple of the element size.
    pub fn all_reduce(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: RedOp,
    ) -> Result<(), CollError> {
        let esz = dtype.size();
        let check = if send.len() % esz != 0 {
            Err(format!(
                "send is {} bytes, not a whole number of {dtype}",
                send.len()
            ))
        } else if recv.len() != send.len() {
            Err(format!(
                "send is {} bytes but recv {} bytes; they must be equal",
                send.len(),
                recv.len()
            ))
        } else {
            Ok(())
        };
        let desc = self.desc(CallKind::AllReduce, send.len() / esz, dtype, Some(op), None);
        self.run(desc, check, |run| {
            run.all_reduce(&mut Io::Separate { send, recv }, op)
        })
    }

    /// All-reduce of `buf` in place (`ncclAllReduce` with `sendbuff == recvbuff`).
    pub fn all_reduce_in_place(
        &self,
        buf: &mut [u8],
        dtype: DType,
        op: RedOp,
    ) -> Result<(), CollError> {
        let esz = dtype.size();
        let check = if buf.len() % esz != 0 {
            Err(format!(
                "buffer is {} bytes, not a whole number of {dtype}",
                buf.len()
            ))
        } else {
            Ok(())
        };
        let desc = self.desc(CallKind::AllReduce, buf.len() / esz, dtype, Some(op), None);
        self.run(desc, check, |run| {
            run.all_reduce(
                &mut Io::InPlace {
                    buf,
                    send_at: 0,
                    recv_at: 0,
                },
                op,
            )
        })
    }

    /// Reduce-scatter: `send` holds `nranks` blocks of `recv.len()` bytes; rank `r` gets
    /// the reduction over ranks of block `r`.
    pub fn reduce_scatter(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: RedOp,
    ) -> Result<(), CollError> {
        let esz = dtype.size();
        let check = if recv.len() % esz != 0 {
            Err(format!(
                "recv is {} bytes, not a whole number of {dtype}",
                recv.len()
            ))
        } else if Some(send.len()) != recv.len().checked_mul(self.nranks) {
            Err(format!(
                "send is {} bytes but recv {} bytes; send must be nranks ({}) x recv",
                send.len(),
                recv.len(),
                self.nranks
            ))
        } else {
            Ok(())
        };
        let desc = self.desc(
            CallKind::ReduceScatter,
            recv.len() / esz,
            dtype,
            Some(op),
            None,
        );
        self.run(desc, check, |run| {
            run.reduce_scatter(&mut Io::Separate { send, recv }, op)
        })
    }

    /// Reduce-scatter in place: `buf` holds the `nranks` blocks sent; the result is left
    /// in block `rank` (`ncclReduceScatter` with `recvbuff == sendbuff + rank·recvcount`).
    pub fn reduce_scatter_in_place(
        &self,
        buf: &mut [u8],
        dtype: DType,
        op: RedOp,
    ) -> Result<(), CollError> {
        let esz = dtype.size();
        let block = buf.len() / self.nranks;
        let check = if buf.len() % (esz * self.nranks) != 0 {
            Err(format!(
                "buffer is {} bytes, not nranks ({}) blocks of whole {dtype}",
                buf.len(),
                self.nranks
            ))
        } else {
            Ok(())
        };
        let desc = self.desc(CallKind::ReduceScatter, block / esz, dtype, Some(op), None);
        let recv_at = block * self.rank;
        self.run(desc, check, |run| {
            run.reduce_scatter(
                &mut Io::InPlace {
                    buf,
                    send_at: 0,
                    recv_at,
                },
                op,
            )
        })
    }

    /// All-gather: `recv` gets `nranks` blocks of `send.len()` bytes, block `r` from rank
    /// `r`.
    pub fn all_gather(&self, send: &[u8], recv: &mut [u8], dtype: DType) -> Result<(), CollError> {
        let esz = dtype.size();
        let check = if send.len() % esz != 0 {
            Err(format!(
                "send is {} bytes, not a whole number of {dtype}",
                send.len()
            ))
        } else if Some(recv.len()) != send.len().checked_mul(self.nranks) {
            Err(format!(
                "send is {} bytes but recv {} bytes; recv must be nranks ({}) x send",
                send.len(),
                recv.len(),
                self.nranks
            ))
        } else {
            Ok(())
        };
        let desc = self.desc(CallKind::AllGather, send.len() / esz, dtype, None, None);
        self.run(desc, check, |run| {
            run.all_gather(&mut Io::Separate { send, recv })
        })
    }

    /// All-gather in place: `buf` holds `nranks` blocks, this rank's block `rank` already
    /// filled (`ncclAllGather` with `sendbuff == recvbuff + rank·sendcount`).
    pub fn all_gather_in_place(&self, buf: &mut [u8], dtype: DType) -> Result<(), CollError> {
        let esz = dtype.size();
        let block = buf.len() / self.nranks;
        let check = if buf.len() % (esz * self.nranks) != 0 {
            Err(format!(
                "buffer is {} bytes, not nranks ({}) blocks of whole {dtype}",
                buf.len(),
                self.nranks
            ))
        } else {
            Ok(())
        };
        let desc = self.desc(CallKind::AllGather, block / esz, dtype, None, None);
        let send_at = block * self.rank;
        self.run(desc, check, |run| {
            run.all_gather(&mut Io::InPlace {
                buf,
                send_at,
                recv_at: 0,
            })
        })
    }

    /// Broadcast: every rank's `recv` gets `root`'s `send`. `send` is only read on `root`
    /// (where `send.len() == recv.len()`); elsewhere it may be empty.
    pub fn broadcast(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        root: usize,
    ) -> Result<(), CollError> {
        let esz = dtype.size();
        let check = if recv.len() % esz != 0 {
            Err(format!(
                "recv is {} bytes, not a whole number of {dtype}",
                recv.len()
            ))
        } else if root >= self.nranks {
            Err(format!("root {root} is not below nranks {}", self.nranks))
        } else if self.rank == root && send.len() != recv.len() {
            Err(format!(
                "on the root, send is {} bytes but recv {} bytes; they must be equal",
                send.len(),
                recv.len()
            ))
        } else {
            Ok(())
        };
        let desc = self.desc(
            CallKind::Broadcast,
            recv.len() / esz,
            dtype,
            None,
            Some(root),
        );
        self.run(desc, check, |run| {
            run.broadcast(&mut Io::Separate { send, recv }, root)
        })
    }

    /// Broadcast of `root`'s `buf` into every rank's `buf`.
    pub fn broadcast_in_place(
        &self,
        buf: &mut [u8],
        dtype: DType,
        root: usize,
    ) -> Result<(), CollError> {
        let esz = dtype.size();
        let check = if buf.len() % esz != 0 {
            Err(format!(
                "buffer is {} bytes, not a whole number of {dtype}",
                buf.len()
            ))
        } else if root >= self.nranks {
            Err(format!("root {root} is not below nranks {}", self.nranks))
        } else {
            Ok(())
        };
        let desc = self.desc(
            CallKind::Broadcast,
            buf.len() / esz,
            dtype,
            None,
            Some(root),
        );
        self.run(desc, check, |run| {
            run.broadcast(
                &mut Io::InPlace {
                    buf,
                    send_at: 0,
                    recv_at: 0,
                },
                root,
            )
        })
    }

    fn desc(
        &self,
        kind: CallKind,
        count: usize,
        dtype: DType,
        op: Option<RedOp>,
        root: Option<usize>,
    ) -> Desc {
        Desc {
            kind,
            count: count as u64,
            dtype,
            op,
            root,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic in an earlier collective poisons the lock; its guard recorded an abort,
        // which the next collective reports.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs one collective: numbers it, refuses it on a broken or aborted communicator or
    /// with bad arguments (`check`), runs `body`, and on any error records it for every
    /// rank and keeps it as this communicator's end.
    fn run(
        &self,
        desc: Desc,
        check: Result<(), String>,
        body: impl FnOnce(&mut Run<'_>) -> Result<(), CollError>,
    ) -> Result<(), CollError> {
        let mut st = self.lock();
        let seq = st.seq;
        st.seq += 1;
        if let Some(e) = &st.broken {
            return Err(e.clone());
        }
        let call = desc.to_string();
        let result = if let Some(rec) = record::recorded(&self.seg) {
            Err(rec.to_error(self.rank, seq, &call))
        } else if let Err(reason) = check {
            Err(CollError::InvalidArgument {
                rank: self.rank,
                seq,
                call: call.clone(),
                reason,
            })
        } else {
            let guard = PanicGuard {
                seg: &self.seg,
                rank: self.rank,
                seq,
                call: &call,
            };
            let mut run = Run {
                comm: self,
                st: &mut st,
                seq,
                desc,
                timeout: self.timeout(),
            };
            let r = body(&mut run);
            drop(guard);
            r
        };
        if let Err(e) = &result {
            record::publish(&self.seg, &Record::from_error(e, self.rank));
            st.broken = Some(e.clone());
        }
        result
    }
}

/// Records an abort if a collective panics, so peers fail instead of waiting it out.
struct PanicGuard<'a> {
    seg: &'a Segment,
    rank: usize,
    seq: u64,
    call: &'a str,
}

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            record::publish(
                self.seg,
                &Record {
                    cause: Cause::Aborted,
                    rank: self.rank,
                    seq: self.seq,
                    extra: 0,
                    call: self.call.to_string(),
                    reason: format!("rank {} panicked in collective #{}", self.rank, self.seq),
                },
            );
        }
    }
}

impl Drop for ShmComm {
    fn drop(&mut self) {
        self.seg
            .state(self.rank)
            .store(state::LEFT, Ordering::Release);
        self.seg.bell().ring();
    }
}

/// One rank running one collective.
struct Run<'a> {
    comm: &'a ShmComm,
    st: &'a mut State,
    seq: u64,
    desc: Desc,
    timeout: Duration,
}

impl Run<'_> {
    fn seg(&self) -> &Segment {
        &self.comm.seg
    }

    /// Arrives at the next barrier and waits for every rank; returns its number.
    fn barrier(&mut self) -> Result<u64, CollError> {
        let (me, n) = (self.comm.rank, self.comm.nranks);
        let seg = &self.comm.seg;
        let b = self.st.steps + 1;
        seg.arrive(me).store(b, Ordering::Release);
        seg.bell().ring();
        let deadline = Instant::now() + self.timeout;
        let (seq, call) = (self.seq, self.desc.to_string());
        let peers = &mut self.st.peers;
        let got = seg
            .bell()
            .wait(self.comm.spin, SLICE, deadline, |thorough| {
                // An abort is reported even if every rank has arrived: no rank goes on
                // once any rank gave up.
                if record::any(seg) {
                    if let Some(rec) = record::recorded(seg) {
                        return Some(Err(rec.to_error(me, seq, &call)));
                    }
                }
                let behind = |r: &usize| seg.arrive(*r).load(Ordering::Acquire) < b;
                if !(0..n).any(|r| behind(&r)) {
                    return Some(Ok(()));
                }
                for r in (0..n).filter(behind) {
                    if seg.state(r).load(Ordering::Acquire) == state::LEFT {
                        return Some(Err(CollError::PeerLeft {
                            rank: me,
                            seq,
                            call: call.clone(),
                            left: r,
                        }));
                    }
                }
                if thorough {
                    for r in (0..n).filter(behind) {
                        if let Some(p) = peers[r].as_mut() {
                            if p.is_dead() {
                                return Some(Err(CollError::PeerDied {
                                    rank: me,
                                    seq,
                                    call: call.clone(),
                                    dead: r,
                                    pid: p.pid(),
                                }));
                            }
                        }
                    }
                }
                None
            });
        match got {
            Some(Ok(())) => {
                self.st.steps = b;
                Ok(b)
            }
            Some(Err(e)) => Err(e),
            None => Err(CollError::Timeout {
                seq,
                call,
                waiter: me,
                missing: (0..n)
                    .filter(|&r| seg.arrive(r).load(Ordering::Acquire) < b)
                    .collect(),
                after: self.timeout,
            }),
        }
    }

    /// The collective's first barrier: publishes this rank's descriptor, passes the
    /// barrier, then checks that every rank called the same collective.
    fn first_barrier(&mut self) -> Result<u64, CollError> {
        let me = self.comm.rank;
        self.seg()
            .put_desc(me, self.st.steps + 1, self.seq, &self.desc);
        let b = self.barrier()?;
        let all: Vec<(u64, Option<Desc>)> = (0..self.comm.nranks)
            .map(|r| self.seg().desc(r, b))
            .collect();
        if all
            .iter()
            .any(|(seq, d)| *seq != self.seq || *d != Some(self.desc))
        {
            let detail = all
                .iter()
                .enumerate()
                .map(|(r, (seq, d))| match d {
                    Some(d) if *seq == self.seq => format!("rank {r} called {d}"),
                    Some(d) => format!("rank {r} called {d} as its collective #{seq}"),
                    None => format!("rank {r} called an unknown collective"),
                })
                .collect::<Vec<_>>()
                .join(", ");
            return Err(CollError::Mismatch {
                seq: self.seq,
                detail,
            });
        }
        Ok(b)
    }

    /// Chunk `k`'s barrier: the collective's first (with the check) for the first chunk.
    fn chunk_barrier(&mut self, k: usize) -> Result<u64, CollError> {
        if k == 0 {
            self.first_barrier()
        } else {
            self.barrier()
        }
    }

    /// The barrier the next arrival will be.
    fn next(&self) -> u64 {
        self.st.steps + 1
    }

    /// Copies `src` into this rank's window for barrier `b`, at byte `at`.
    fn put(&self, b: u64, at: usize, src: &[u8]) {
        let seg = self.seg();
        seg.write(seg.window_at(self.comm.rank, b) + at, src);
    }

    /// Copies rank `r`'s window for barrier `b`, from byte `at`, into `dst`.
    fn get(&self, r: usize, b: u64, at: usize, dst: &mut [u8]) {
        let seg = self.seg();
        seg.read(seg.window_at(r, b) + at, dst);
    }

    /// Reduces `len` elements: every other rank's from its window for barrier `b` at byte
    /// `win_at`, this rank's from send byte `send_at`, in rank order, into recv byte
    /// `recv_at`, and with `publish = Some((b', at'))` also into this rank's window for
    /// barrier `b'` at byte `at'`.
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        b: u64,
        win_at: usize,
        len: usize,
        io: &mut Io<'_>,
        send_at: usize,
        recv_at: usize,
        publish: Option<(u64, usize)>,
        op: RedOp,
    ) {
        with_element!(self.desc.dtype, T => {
            self.reduce_typed::<T>(b, win_at, len, io, (send_at, recv_at), publish, op)
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce_typed<T: Element>(
        &self,
        b: u64,
        win_at: usize,
        len: usize,
        io: &mut Io<'_>,
        (send_at, recv_at): (usize, usize),
        publish: Option<(u64, usize)>,
        op: RedOp,
    ) {
        let (me, n) = (self.comm.rank, self.comm.nranks);
        let esz = std::mem::size_of::<T>();
        let tile = TILE.min(len.max(1));
        let mut staged: Vec<Vec<T>> = (0..n).map(|_| vec![T::default(); tile]).collect();
        let mut out = vec![T::default(); tile];
        let mut done = 0;
        while done < len {
            let l = tile.min(len - done);
            let off = done * esz;
            for (r, stage) in staged.iter_mut().enumerate() {
                let dst = as_bytes_mut(&mut stage[..l]);
                if r == me {
                    dst.copy_from_slice(io.send(send_at + off..send_at + off + l * esz));
                } else {
                    self.get(r, b, win_at + off, dst);
                }
            }
            let inputs: Vec<&[T]> = staged.iter().map(|s| &s[..l]).collect();
            reduce_into(&mut out[..l], &inputs, op, n);
            let result = as_bytes(&out[..l]);
            io.recv(recv_at + off..recv_at + off + l * esz)
                .copy_from_slice(result);
            if let Some((b2, at2)) = publish {
                self.put(b2, at2 + off, result);
            }
            done += l;
        }
    }

    /// Elements per rank's part of a reduction chunk (each rank's part of the window).
    fn reduce_part(&self) -> usize {
        (self.comm.seg.window() / self.desc.dtype.size() / self.comm.nranks).max(1)
    }

    /// Elements an all-gather or broadcast moves per chunk.
    fn copy_chunk(&self) -> usize {
        (self.comm.seg.window().min(COPY_CHUNK_BYTES) / self.desc.dtype.size()).max(1)
    }

    fn all_reduce(&mut self, io: &mut Io<'_>, op: RedOp) -> Result<(), CollError> {
        let (me, n_ranks) = (self.comm.rank, self.comm.nranks);
        let esz = self.desc.dtype.size();
        let n = self.desc.count as usize;
        if n * esz <= ONE_SHOT_BYTES.min(self.comm.seg.window()) {
            self.put(self.next(), 0, io.send(0..n * esz));
            let b = self.first_barrier()?;
            self.reduce(b, 0, n, io, 0, 0, None, op);
            return Ok(());
        }
        let pieces: Vec<Range<usize>> = (0..n_ranks).map(|r| even_split(n, n_ranks, r)).collect();
        let w = self.reduce_part();
        let chunks = pieces[0].len().div_ceil(w).max(1);
        for k in 0..chunks {
            let next = self.next();
            for r in (0..n_ranks).filter(|&r| r != me) {
                let p = part(&pieces[r], k, w);
                self.put(next, r * w * esz, io.send(bytes(p, esz)));
            }
            let b = self.chunk_barrier(k)?;
            let mine = part(&pieces[me], k, w);
            let at = mine.start * esz;
            let publish = Some((b + 1, me * w * esz));
            self.reduce(b, me * w * esz, mine.len(), io, at, at, publish, op);
            let b2 = self.barrier()?;
            for r in (0..n_ranks).filter(|&r| r != me) {
                let p = part(&pieces[r], k, w);
                self.get(r, b2, r * w * esz, io.recv(bytes(p, esz)));
            }
        }
        Ok(())
    }

    fn reduce_scatter(&mut self, io: &mut Io<'_>, op: RedOp) -> Result<(), CollError> {
        let (me, n_ranks) = (self.comm.rank, self.comm.nranks);
        let esz = self.desc.dtype.size();
        let m = self.desc.count as usize;
        let w = self.reduce_part();
        let chunks = m.div_ceil(w).max(1);
        for k in 0..chunks {
            let next = self.next();
            let p = part(&(0..m), k, w);
            for r in (0..n_ranks).filter(|&r| r != me) {
                let src = bytes(r * m + p.start..r * m + p.end, esz);
                self.put(next, r * w * esz, io.send(src));
            }
            let b = self.chunk_barrier(k)?;
            let send_at = (me * m + p.start) * esz;
            self.reduce(
                b,
                me * w * esz,
                p.len(),
                io,
                send_at,
                p.start * esz,
                None,
                op,
            );
        }
        Ok(())
    }

    fn all_gather(&mut self, io: &mut Io<'_>) -> Result<(), CollError> {
        let (me, n_ranks) = (self.comm.rank, self.comm.nranks);
        let esz = self.desc.dtype.size();
        let m = self.desc.count as usize;
        let w = self.copy_chunk();
        let chunks = m.div_ceil(w).max(1);
        for k in 0..chunks {
            let p = part(&(0..m), k, w);
            self.put(self.next(), 0, io.send(bytes(p.clone(), esz)));
            io.copy_own(bytes(p.clone(), esz), (me * m + p.start) * esz);
            let b = self.chunk_barrier(k)?;
            for r in (0..n_ranks).filter(|&r| r != me) {
                let dst = bytes(r * m + p.start..r * m + p.end, esz);
                self.get(r, b, 0, io.recv(dst));
            }
        }
        Ok(())
    }

    fn broadcast(&mut self, io: &mut Io<'_>, root: usize) -> Result<(), CollError> {
        let me = self.comm.rank;
        let esz = self.desc.dtype.size();
        let m = self.desc.count as usize;
        let w = self.copy_chunk();
        let chunks = m.div_ceil(w).max(1);
        for k in 0..chunks {
            let p = bytes(part(&(0..m), k, w), esz);
            if me == root {
                self.put(self.next(), 0, io.send(p.clone()));
                io.copy_own(p.clone(), p.start);
            }
            let b = self.chunk_barrier(k)?;
            if me != root {
                self.get(root, b, 0, io.recv(p));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_communicator_can_be_shared_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<ShmComm>();
    }

    #[test]
    fn even_split_and_parts_cover_every_element_once() {
        for n in [0, 1, 7, 10, 1023] {
            for nranks in 1..5 {
                let pieces: Vec<Range<usize>> =
                    (0..nranks).map(|r| even_split(n, nranks, r)).collect();
                assert_eq!(pieces[0].start, 0);
                assert_eq!(pieces[nranks - 1].end, n);
                assert!(pieces.windows(2).all(|p| p[0].end == p[1].start));
                assert!(pieces.iter().all(|p| pieces[0].len() >= p.len()));
                for w in [1, 3, 64] {
                    let chunks = pieces[0].len().div_ceil(w).max(1);
                    for p in &pieces {
                        let covered: usize = (0..chunks).map(|k| part(p, k, w).len()).sum();
                        assert_eq!(covered, p.len());
                    }
                }
            }
        }
    }

    #[test]
    fn in_place_buffers_map_send_and_recv_into_one() {
        let mut buf: Vec<u8> = (0..12).collect();
        let mut io = Io::InPlace {
            buf: &mut buf,
            send_at: 4,
            recv_at: 0,
        };
        assert_eq!(io.send(0..2), &[4, 5]);
        io.copy_own(0..4, 8);
        assert_eq!(io.recv(8..12), &[4, 5, 6, 7]);
        let send = [9u8, 8];
        let mut recv = [0u8; 4];
        let mut io = Io::Separate {
            send: &send,
            recv: &mut recv,
        };
        io.copy_own(0..2, 2);
        assert_eq!(recv, [0, 0, 9, 8]);
    }
}
