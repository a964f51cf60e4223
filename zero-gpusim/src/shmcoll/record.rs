//! The abort record in the segment's header: the first failure of a communicator, as the
//! rank that found it wrote it. Every waiter in every process checks it, so one rank's
//! failure (or `abort`) fails every rank at once, and each names the same culprit.
//!
//! ```text
//! +0   cause (0: none; CLAIMING while being written)   +4  rank it names
//! +8   collective number                               +16 extra (pid, timeout in ms)
//! +24  call length   +28 reason length   +64 call text   +576 reason text
//! ```

use super::error::CollError;
use super::segment::{Segment, H_RECORD};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const R_CAUSE: usize = H_RECORD;
const R_RANK: usize = H_RECORD + 4;
const R_SEQ: usize = H_RECORD + 8;
const R_EXTRA: usize = H_RECORD + 16;
const R_CALL_LEN: usize = H_RECORD + 24;
const R_REASON_LEN: usize = H_RECORD + 28;
const R_CALL: usize = H_RECORD + 64;
const CALL_BYTES: usize = 512;
const R_REASON: usize = R_CALL + CALL_BYTES;
const REASON_BYTES: usize = 2048;
const CLAIMING: u32 = u32::MAX;

// The record fits the header.
const _: () = assert!(R_REASON + REASON_BYTES <= super::segment::HEADER);

/// Why the communicator was aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// `ShmComm::abort` (rank: who called it; reason: what it said).
    Aborted = 1,
    /// A rank's process ended (rank: which; extra: its pid).
    Died = 2,
    /// A rank destroyed its communicator while others waited for it (rank: which).
    Left = 3,
    /// A wait outlasted the timeout (rank: the waiter; reason: the missing ranks, comma
    /// separated; extra: the timeout in ms).
    Timeout = 4,
    /// A rank's arguments were invalid (rank: which; reason: what is wrong).
    Invalid = 5,
    /// The ranks' calls differ (reason: what each called).
    Mismatch = 6,
    /// A rank refused or failed the join, or aborted or died while joining (rank: which;
    /// reason: what happened). The only cause recorded while ranks are joining.
    JoinRefused = 7,
}

impl Cause {
    fn from_code(c: u32) -> Option<Cause> {
        Some(match c {
            1 => Cause::Aborted,
            2 => Cause::Died,
            3 => Cause::Left,
            4 => Cause::Timeout,
            5 => Cause::Invalid,
            6 => Cause::Mismatch,
            7 => Cause::JoinRefused,
            _ => return None,
        })
    }
}

/// An abort, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub cause: Cause,
    pub rank: usize,
    pub seq: u64,
    pub extra: u64,
    pub call: String,
    pub reason: String,
}

/// The prefix of `s` that fits `max` bytes, cut at a character boundary.
fn clip(s: &str, max: usize) -> &[u8] {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s.as_bytes()[..end]
}

/// Records `r` unless an abort is recorded already (the first one wins), then wakes every
/// waiter in every process.
pub(crate) fn publish(seg: &Segment, r: &Record) {
    let word = seg.header_u32(R_CAUSE);
    if word
        .compare_exchange(0, CLAIMING, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        let call = clip(&r.call, CALL_BYTES);
        let reason = clip(&r.reason, REASON_BYTES);
        seg.header_write(R_CALL, call);
        seg.header_write(R_REASON, reason);
        seg.header_u32(R_CALL_LEN)
            .store(call.len() as u32, Ordering::Relaxed);
        seg.header_u32(R_REASON_LEN)
            .store(reason.len() as u32, Ordering::Relaxed);
        seg.header_u32(R_RANK)
            .store(r.rank as u32, Ordering::Relaxed);
        seg.header_u64(R_SEQ).store(r.seq, Ordering::Relaxed);
        seg.header_u64(R_EXTRA).store(r.extra, Ordering::Relaxed);
        word.store(r.cause as u32, Ordering::Release);
    }
    seg.bell().ring();
}

/// Whether any abort is recorded (cheap: one load).
pub(crate) fn any(seg: &Segment) -> bool {
    seg.header_u32(R_CAUSE).load(Ordering::Acquire) != 0
}

/// The recorded abort, if any. A record whose writer died mid-write (claimed for over a
/// second) reads as an abort by an unknown rank.
pub(crate) fn recorded(seg: &Segment) -> Option<Record> {
    let word = seg.header_u32(R_CAUSE);
    let mut c = word.load(Ordering::Acquire);
    let start = Instant::now();
    while c == CLAIMING {
        if start.elapsed() > Duration::from_secs(1) {
            return Some(Record {
                cause: Cause::Aborted,
                rank: usize::MAX,
                seq: 0,
                extra: 0,
                call: String::new(),
                reason: "its abort record was never finished (the rank died writing it)".into(),
            });
        }
        std::thread::yield_now();
        c = word.load(Ordering::Acquire);
    }
    let cause = Cause::from_code(c)?;
    let text = |at: usize, len_at: usize, max: usize| {
        let len = (seg.header_u32(len_at).load(Ordering::Relaxed) as usize).min(max);
        let mut b = vec![0u8; len];
        seg.header_read(at, &mut b);
        String::from_utf8_lossy(&b).into_owned()
    };
    Some(Record {
        cause,
        rank: seg.header_u32(R_RANK).load(Ordering::Relaxed) as usize,
        seq: seg.header_u64(R_SEQ).load(Ordering::Relaxed),
        extra: seg.header_u64(R_EXTRA).load(Ordering::Relaxed),
        call: text(R_CALL, R_CALL_LEN, CALL_BYTES),
        reason: text(R_REASON, R_REASON_LEN, REASON_BYTES),
    })
}

fn ranks_list(ranks: &[usize]) -> String {
    ranks
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_ranks(s: &str) -> Vec<usize> {
    s.split(',').filter_map(|r| r.trim().parse().ok()).collect()
}

impl Record {
    /// What rank `me` records when it fails with `e`.
    pub fn from_error(e: &CollError, me: usize) -> Record {
        let plain = |cause, rank, seq: u64, extra, call: &str, reason: String| Record {
            cause,
            rank,
            seq,
            extra,
            call: call.to_string(),
            reason,
        };
        match e {
            CollError::InvalidArgument {
                rank,
                seq,
                call,
                reason,
            } => plain(Cause::Invalid, *rank, *seq, 0, call, reason.clone()),
            CollError::Mismatch { seq, detail } => {
                plain(Cause::Mismatch, me, *seq, 0, "", detail.clone())
            }
            CollError::Timeout {
                seq,
                call,
                waiter,
                missing,
                after,
            } => plain(
                Cause::Timeout,
                *waiter,
                *seq,
                after.as_millis() as u64,
                call,
                ranks_list(missing),
            ),
            CollError::PeerDied {
                seq,
                call,
                dead,
                pid,
                ..
            } => plain(
                Cause::Died,
                *dead,
                *seq,
                u64::from(*pid),
                call,
                String::new(),
            ),
            CollError::PeerLeft {
                seq, call, left, ..
            } => plain(Cause::Left, *left, *seq, 0, call, String::new()),
            CollError::Aborted {
                seq,
                call,
                by,
                reason,
                ..
            } => plain(Cause::Aborted, *by, *seq, 0, call, reason.clone()),
            other => {
                let text = other.to_string();
                let text = text.trim_start_matches("ncclCommInitRank: ").to_string();
                plain(Cause::JoinRefused, me, 0, 0, "", text)
            }
        }
    }

    /// The error rank `me`, in its collective `seq` (call `call`), reports for this
    /// record.
    pub fn to_error(&self, me: usize, seq: u64, call: &str) -> CollError {
        match self.cause {
            Cause::Aborted => CollError::Aborted {
                rank: me,
                seq,
                call: call.to_string(),
                by: self.rank,
                reason: self.reason.clone(),
            },
            Cause::Died => CollError::PeerDied {
                rank: me,
                seq,
                call: call.to_string(),
                dead: self.rank,
                pid: self.extra as u32,
            },
            Cause::Left => CollError::PeerLeft {
                rank: me,
                seq,
                call: call.to_string(),
                left: self.rank,
            },
            Cause::Timeout => CollError::Timeout {
                seq: self.seq,
                call: self.call.clone(),
                waiter: self.rank,
                missing: parse_ranks(&self.reason),
                after: Duration::from_millis(self.extra),
            },
            Cause::Invalid => CollError::InvalidArgument {
                rank: self.rank,
                seq: self.seq,
                call: self.call.clone(),
                reason: self.reason.clone(),
            },
            Cause::Mismatch => CollError::Mismatch {
                seq: self.seq,
                detail: self.reason.clone(),
            },
            Cause::JoinRefused => self.to_join_error(me),
        }
    }

    /// The error rank `me` reports for this record while joining.
    pub fn to_join_error(&self, me: usize) -> CollError {
        let detail = match self.cause {
            Cause::Aborted => format!("it aborted ({})", self.reason),
            Cause::Died => format!("it died (pid {}) before every rank joined", self.extra),
            Cause::Left => "it left before every rank joined".to_string(),
            Cause::JoinRefused => self.reason.clone(),
            _ => self.to_error(me, self.seq, &self.call).to_string(),
        };
        CollError::JoinRefused {
            rank: me,
            by: self.rank,
            detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_survive_the_record_and_the_first_abort_wins() {
        let Ok(file) = tempfile::tempfile() else {
            return;
        };
        let seg = Segment::format(&file, 2, 4096, 0).expect("format");
        assert!(recorded(&seg).is_none() && !any(&seg));
        let e = CollError::Timeout {
            seq: 3,
            call: "ncclAllGather(7 x f32 per rank)".into(),
            waiter: 0,
            missing: vec![1],
            after: Duration::from_millis(2500),
        };
        publish(&seg, &Record::from_error(&e, 0));
        let died = CollError::PeerDied {
            rank: 0,
            seq: 3,
            call: "x".into(),
            dead: 1,
            pid: 9,
        };
        publish(&seg, &Record::from_error(&died, 0));
        let r = recorded(&seg).expect("recorded");
        assert_eq!(r.to_error(1, 3, "whatever"), e);
        assert!(any(&seg));
        let long = "é".repeat(5000);
        assert!(std::str::from_utf8(clip(&long, REASON_BYTES)).is_ok());
        assert_eq!(parse_ranks("1,2"), vec![1, 2]);
        let d = Record::from_error(&died, 0).to_error(2, 5, "ncclAllReduce(1 x f32, sum)");
        assert!(d.to_string().contains("rank 1 (pid 9) died"), "{d}");
    }
}
