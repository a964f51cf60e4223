//! The layout of the shared-memory group's segment, and typed access to it.
//!
//! ```text
//! 0       header: magic, version, world, window size, the bell and its sleepers, the
//!         abort record (cause, rank, seq, and its text)
//! 4 KiB   one 256-byte control block per rank: barriers passed (`arrive`), pid, pid
//!         namespace, whether it left, and two descriptor slots (by barrier parity)
//! data    per rank, two windows (halves) of `window` bytes: data written for barrier b
//!         goes in half b % 2 and is read only between barriers b and b + 1
//! ```

use crate::op::{OpDesc, OpKind};
use crate::wait::Bell;
use crate::ReduceOp;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use zero_kernels::DType;
use zero_sys::ipc::SharedMapping;

const MAGIC: u64 = 0x7a65_726f_5f73_686d; // "zero_shm"
const LAYOUT_VERSION: u32 = 1;
const HEADER: usize = 4096;
const BLOCK: usize = 256;
/// Bytes of the abort record's text.
const TEXT: usize = 2048;

// Header offsets.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 8;
const H_WORLD: usize = 12;
const H_WINDOW: usize = 16;
const H_BELL: usize = 24;
const H_SLEEPERS: usize = 28;
const H_ABORT: usize = 32;
const H_ABORT_RANK: usize = 36;
const H_ABORT_SEQ: usize = 40;
const H_ABORT_LEN: usize = 48;
const H_ABORT_TEXT: usize = 64;

// Control-block offsets.
const C_ARRIVE: usize = 0;
const C_PID: usize = 8;
const C_LEFT: usize = 12;
const C_PIDNS: usize = 16;
const C_DESC: usize = 64;
const DESC_BYTES: usize = 32;

/// Why the group was aborted; the rank that did it, or that it names, is beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// A rank's process ended without leaving.
    Died = 1,
    /// A rank dropped its communicator.
    Left = 2,
    /// A rank's wait outlasted the timeout.
    Timeout = 3,
    /// A rank issued a collective with bad arguments.
    Invalid = 4,
}

/// Being written: readers wait for the final cause.
const CLAIMING: u32 = u32::MAX;

/// An abort as recorded in the segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Abort {
    pub cause: Cause,
    pub rank: usize,
    pub seq: u64,
    /// The collective, then a NUL, then the reason, as the aborting rank wrote them.
    pub text: String,
}

/// The bytes a group of `world` ranks with `window`-byte windows needs.
pub(crate) fn segment_bytes(world: usize, window: usize) -> usize {
    data_start(world) + world * 2 * window
}

fn data_start(world: usize) -> usize {
    (HEADER + world * BLOCK).div_ceil(4096) * 4096
}

/// The mapped segment.
#[derive(Debug)]
pub(crate) struct Segment {
    map: SharedMapping,
    world: usize,
    window: usize,
}

/// A header that is not a segment of this layout, for this world size.
#[derive(Debug)]
pub(crate) struct BadHeader(pub String);

impl Segment {
    /// Writes the header of a new segment.
    pub fn format(map: SharedMapping, world: usize, window: usize) -> Segment {
        map.u64_at(H_WINDOW).store(window as u64, Ordering::Relaxed);
        map.u32_at(H_WORLD).store(world as u32, Ordering::Relaxed);
        map.u32_at(H_VERSION)
            .store(LAYOUT_VERSION, Ordering::Relaxed);
        map.u64_at(H_MAGIC).store(MAGIC, Ordering::Release);
        Segment { map, world, window }
    }

    /// Checks the header of a segment received from rank 0.
    pub fn open(map: SharedMapping, world: usize) -> Result<Segment, BadHeader> {
        if map.u64_at(H_MAGIC).load(Ordering::Acquire) != MAGIC
            || map.u32_at(H_VERSION).load(Ordering::Relaxed) != LAYOUT_VERSION
        {
            return Err(BadHeader(
                "the shared memory rank 0 sent is not a zero segment of this version".into(),
            ));
        }
        let theirs = map.u32_at(H_WORLD).load(Ordering::Relaxed) as usize;
        if theirs != world {
            return Err(BadHeader(format!(
                "rank 0's segment is for {theirs} ranks, this rank was launched with WORLD_SIZE={world}"
            )));
        }
        let window = map.u64_at(H_WINDOW).load(Ordering::Relaxed) as usize;
        if map.len() < segment_bytes(world, window) {
            return Err(BadHeader(format!(
                "rank 0's segment holds {} bytes, {} are needed",
                map.len(),
                segment_bytes(world, window)
            )));
        }
        Ok(Segment { map, world, window })
    }

    /// Bytes per window.
    pub fn window(&self) -> usize {
        self.window
    }

    /// The bell every arrival rings.
    pub fn bell(&self) -> Bell<'_> {
        Bell {
            word: self.map.u32_at(H_BELL),
            sleepers: self.map.u32_at(H_SLEEPERS),
        }
    }

    fn block(&self, rank: usize) -> usize {
        HEADER + rank * BLOCK
    }

    /// Barriers `rank` has passed.
    pub fn arrive(&self, rank: usize) -> &AtomicU64 {
        self.map.u64_at(self.block(rank) + C_ARRIVE)
    }

    /// `rank`'s pid (0 until it wrote it).
    pub fn pid(&self, rank: usize) -> &AtomicU32 {
        self.map.u32_at(self.block(rank) + C_PID)
    }

    /// `rank`'s pid namespace (the inode of `/proc/self/ns/pid`).
    pub fn pid_namespace(&self, rank: usize) -> &AtomicU64 {
        self.map.u64_at(self.block(rank) + C_PIDNS)
    }

    /// Non-zero once `rank` dropped its communicator (2: while panicking).
    pub fn left(&self, rank: usize) -> &AtomicU32 {
        self.map.u32_at(self.block(rank) + C_LEFT)
    }

    /// Byte offset of `rank`'s window `half`.
    pub fn window_at(&self, rank: usize, half: usize) -> usize {
        data_start(self.world) + (rank * 2 + half) * self.window
    }

    /// The mapping (for copies in and out of windows).
    pub fn map(&self) -> &SharedMapping {
        &self.map
    }

    /// Writes `rank`'s descriptor for barrier `b` (slot `b % 2`).
    pub fn put_desc(&self, rank: usize, b: u64, seq: u64, d: &OpDesc) {
        let at = self.block(rank) + C_DESC + (b % 2) as usize * DESC_BYTES;
        let words = encode(d);
        for (i, w) in words.iter().enumerate() {
            self.map.u32_at(at + 4 * i).store(*w, Ordering::Relaxed);
        }
        self.map.u64_at(at + 24).store(seq, Ordering::Relaxed);
    }

    /// `rank`'s descriptor for barrier `b` (read after the barrier).
    pub fn desc(&self, rank: usize, b: u64) -> (u64, Option<OpDesc>) {
        let at = self.block(rank) + C_DESC + (b % 2) as usize * DESC_BYTES;
        let mut words = [0u32; 6];
        for (i, w) in words.iter_mut().enumerate() {
            *w = self.map.u32_at(at + 4 * i).load(Ordering::Relaxed);
        }
        (
            self.map.u64_at(at + 24).load(Ordering::Relaxed),
            decode(&words),
        )
    }

    /// Records an abort unless one is recorded already (the first cause wins) and wakes
    /// every waiter. The text is the collective, a NUL, and the reason.
    pub fn abort(&self, cause: Cause, rank: usize, seq: u64, text: &str) {
        let word = self.map.u32_at(H_ABORT);
        if word
            .compare_exchange(0, CLAIMING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let bytes = &text.as_bytes()[..text.len().min(TEXT)];
            self.map.write(H_ABORT_TEXT, bytes);
            self.map
                .u32_at(H_ABORT_LEN)
                .store(bytes.len() as u32, Ordering::Relaxed);
            self.map
                .u32_at(H_ABORT_RANK)
                .store(rank as u32, Ordering::Relaxed);
            self.map.u64_at(H_ABORT_SEQ).store(seq, Ordering::Relaxed);
            word.store(cause as u32, Ordering::Release);
        }
        self.bell().ring();
    }

    /// The recorded abort, if any.
    pub fn aborted(&self) -> Option<Abort> {
        let word = self.map.u32_at(H_ABORT);
        let mut c = word.load(Ordering::Acquire);
        while c == CLAIMING {
            std::hint::spin_loop();
            c = word.load(Ordering::Acquire);
        }
        let cause = match c {
            0 => return None,
            1 => Cause::Died,
            2 => Cause::Left,
            3 => Cause::Timeout,
            _ => Cause::Invalid,
        };
        let len = (self.map.u32_at(H_ABORT_LEN).load(Ordering::Relaxed) as usize).min(TEXT);
        let mut text = vec![0u8; len];
        self.map.read(H_ABORT_TEXT, &mut text);
        Some(Abort {
            cause,
            rank: self.map.u32_at(H_ABORT_RANK).load(Ordering::Relaxed) as usize,
            seq: self.map.u64_at(H_ABORT_SEQ).load(Ordering::Relaxed),
            text: String::from_utf8_lossy(&text).into_owned(),
        })
    }
}

const NONE: u32 = u32::MAX;
/// The kind word of a split (after the collectives of [`OpKind::ALL`]).
const SPLIT_KIND: u32 = 100;

fn encode(d: &OpDesc) -> [u32; 6] {
    let kind = if d.split {
        SPLIT_KIND
    } else {
        OpKind::ALL.iter().position(|k| *k == d.kind).unwrap_or(0) as u32
    };
    let dtype = match d.dtype {
        None => NONE,
        Some(DType::F32) => 0,
        Some(DType::F16) => 1,
        Some(DType::BF16) => 2,
    };
    let reduce = match d.reduce {
        None => NONE,
        Some(ReduceOp::Sum) => 0,
        Some(ReduceOp::Avg) => 1,
        Some(ReduceOp::Max) => 2,
    };
    let root = d.root.map_or(NONE, |r| r as u32);
    let count = d.count as u64;
    [
        kind,
        dtype,
        count as u32,
        (count >> 32) as u32,
        reduce,
        root,
    ]
}

fn decode(w: &[u32; 6]) -> Option<OpDesc> {
    if w[0] == SPLIT_KIND {
        return Some(OpDesc::split());
    }
    let kind = *OpKind::ALL.get(w[0] as usize)?;
    let dtype = match w[1] {
        NONE => None,
        0 => Some(DType::F32),
        1 => Some(DType::F16),
        2 => Some(DType::BF16),
        _ => return None,
    };
    let reduce = match w[4] {
        NONE => None,
        0 => Some(ReduceOp::Sum),
        1 => Some(ReduceOp::Avg),
        2 => Some(ReduceOp::Max),
        _ => return None,
    };
    Some(OpDesc {
        kind,
        dtype,
        count: (u64::from(w[2]) | (u64::from(w[3]) << 32)) as usize,
        reduce,
        root: (w[5] != NONE).then_some(w[5] as usize),
        split: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip() {
        let descs = [
            OpDesc {
                kind: OpKind::ReduceScatter,
                dtype: Some(DType::BF16),
                count: (5u64 << 32) as usize + 7,
                reduce: Some(ReduceOp::Avg),
                root: None,
                split: false,
            },
            OpDesc {
                kind: OpKind::Broadcast,
                dtype: Some(DType::F16),
                count: 0,
                reduce: None,
                root: Some(3),
                split: false,
            },
            OpDesc {
                kind: OpKind::Barrier,
                dtype: None,
                count: 0,
                reduce: None,
                root: None,
                split: false,
            },
            OpDesc::split(),
        ];
        for d in descs {
            assert_eq!(decode(&encode(&d)), Some(d));
        }
    }

    #[test]
    fn windows_do_not_overlap_and_fit() {
        for world in 1..=8 {
            let window = 4096;
            let total = segment_bytes(world, window);
            let mut starts: Vec<usize> = (0..world)
                .flat_map(|r| (0..2).map(move |h| (r, h)))
                .map(|(r, h)| data_start(world) + (r * 2 + h) * window)
                .collect();
            starts.sort();
            assert!(starts[0] >= HEADER + world * BLOCK);
            assert!(starts.windows(2).all(|w| w[1] - w[0] == window));
            assert_eq!(*starts.last().unwrap() + window, total);
        }
    }
}
