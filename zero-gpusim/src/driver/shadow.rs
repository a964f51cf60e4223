//! Who touched which bytes of an allocation, to find unordered accesses (races).
//!
//! For each byte range the history keeps the last write and the reads since it (the
//! latest per agent). A new access conflicts with a recorded one when they come from
//! operations neither of which happened before the other, and at least one writes: the
//! new operation's vector clock does not cover the recorded operation. Ranges are kept
//! as segments in a map; a write replaces the history of its range.

use super::clock::{Agent, VectorClock};
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

/// An operation, as named in messages (`kernel adam_f32_bf16, op 12 on stream 3`).
#[derive(Debug)]
pub struct OpLabel(pub String);

impl fmt::Display for OpLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One recorded access: by which operation.
#[derive(Debug, Clone)]
pub struct Access {
    /// The agent (stream) that ran it.
    pub agent: Agent,
    /// Its tick on that agent.
    pub tick: u64,
    /// Its name.
    pub op: Arc<OpLabel>,
}

impl Access {
    fn same(&self, other: &Access) -> bool {
        self.agent == other.agent && self.tick == other.tick
    }
}

/// Whether an access reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A read.
    Read,
    /// A write (a free counts as a write of every byte).
    Write,
}

impl Kind {
    fn verb(self) -> &'static str {
        match self {
            Kind::Read => "reads",
            Kind::Write => "writes",
        }
    }
}

/// Two unordered accesses to the same bytes.
#[derive(Debug, Clone)]
pub struct Conflict {
    /// The byte offsets both touch (the first overlapping segment).
    pub range: Range<u64>,
    /// The earlier recorded access and its kind.
    pub earlier: (Access, Kind),
    /// The new access and its kind.
    pub later: (Access, Kind),
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} bytes [{}, {}), which {} {} with nothing ordering the two (no event \
             recorded after the one and waited for before the other, no synchronization)",
            self.later.0.op,
            self.later.1.verb(),
            self.range.start,
            self.range.end,
            self.earlier.0.op,
            match self.earlier.1 {
                Kind::Read => "also reads",
                Kind::Write => "wrote",
            }
        )
    }
}

#[derive(Debug, Clone)]
struct Seg {
    end: u64,
    write: Option<Access>,
    reads: Vec<Access>,
}

/// An allocation's access history.
#[derive(Debug, Default)]
pub struct Shadow {
    segs: BTreeMap<u64, Seg>,
}

impl Shadow {
    /// Splits the segment containing `at` (if any) so a segment starts at `at`.
    fn split_at(&mut self, at: u64) {
        let Some((&start, seg)) = self.segs.range(..at).next_back() else {
            return;
        };
        if seg.end <= at {
            return;
        }
        let mut tail = seg.clone();
        if let Some(s) = self.segs.get_mut(&start) {
            s.end = at;
        }
        tail.end = tail.end.max(at);
        self.segs.insert(at, tail);
    }

    /// Records an access of `kind` to `range` by `who`, whose clock is `vc`; the first
    /// conflict found, if any (the history is updated either way).
    pub fn access(
        &mut self,
        range: Range<u64>,
        kind: Kind,
        who: &Access,
        vc: &VectorClock,
    ) -> Result<(), Conflict> {
        if range.is_empty() {
            return Ok(());
        }
        self.split_at(range.start);
        self.split_at(range.end);
        let mut conflict: Option<Conflict> = None;
        let mut note = |seg_range: Range<u64>, earlier: &Access, ekind: Kind| {
            if conflict.is_none() && !earlier.same(who) && !vc.covers(earlier.agent, earlier.tick) {
                conflict = Some(Conflict {
                    range: seg_range,
                    earlier: (earlier.clone(), ekind),
                    later: (who.clone(), kind),
                });
            }
        };
        // Check every recorded segment inside the range.
        for (&start, seg) in self.segs.range(range.start..range.end) {
            let r = start..seg.end;
            if let Some(w) = &seg.write {
                note(r.clone(), w, Kind::Write);
            }
            if kind == Kind::Write {
                for rd in &seg.reads {
                    note(r.clone(), rd, Kind::Read);
                }
            }
        }
        match kind {
            Kind::Write => {
                let starts: Vec<u64> = self
                    .segs
                    .range(range.start..range.end)
                    .map(|(&s, _)| s)
                    .collect();
                for s in starts {
                    self.segs.remove(&s);
                }
                self.segs.insert(
                    range.start,
                    Seg {
                        end: range.end,
                        write: Some(who.clone()),
                        reads: Vec::new(),
                    },
                );
            }
            Kind::Read => {
                // Add this reader to every segment, and fill the gaps with new segments.
                let mut at = range.start;
                let starts: Vec<(u64, u64)> = self
                    .segs
                    .range(range.start..range.end)
                    .map(|(&s, seg)| (s, seg.end))
                    .collect();
                for (s, e) in starts {
                    if s > at {
                        self.segs.insert(at, reader_seg(s, who));
                    }
                    if let Some(seg) = self.segs.get_mut(&s) {
                        seg.reads.retain(|r| r.agent != who.agent);
                        seg.reads.push(who.clone());
                    }
                    at = e;
                }
                if at < range.end {
                    self.segs.insert(at, reader_seg(range.end, who));
                }
            }
        }
        self.merge_around(range.start, range.end);
        conflict.map_or(Ok(()), Err)
    }

    /// Merges neighbouring segments with the same history in `[from, to]`.
    fn merge_around(&mut self, from: u64, to: u64) {
        let lo = self
            .segs
            .range(..from)
            .next_back()
            .map_or(from, |(&s, _)| s);
        let keys: Vec<u64> = self.segs.range(lo..=to).map(|(&s, _)| s).collect();
        let mut prev: Option<u64> = None;
        for k in keys {
            if let Some(p) = prev {
                let same = match (self.segs.get(&p), self.segs.get(&k)) {
                    (Some(a), Some(b)) => a.end == k && same_history(a, b),
                    _ => false,
                };
                if same {
                    if let Some(b) = self.segs.remove(&k) {
                        if let Some(a) = self.segs.get_mut(&p) {
                            a.end = b.end;
                        }
                    }
                    continue;
                }
            }
            prev = Some(k);
        }
    }

    /// Number of segments (for tests).
    pub fn segments(&self) -> usize {
        self.segs.len()
    }
}

fn reader_seg(end: u64, who: &Access) -> Seg {
    Seg {
        end,
        write: None,
        reads: vec![who.clone()],
    }
}

fn same_history(a: &Seg, b: &Seg) -> bool {
    let w = match (&a.write, &b.write) {
        (None, None) => true,
        (Some(x), Some(y)) => x.same(y),
        _ => false,
    };
    w && a.reads.len() == b.reads.len() && a.reads.iter().zip(&b.reads).all(|(x, y)| x.same(y))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(agent: Agent, tick: u64) -> Access {
        Access {
            agent,
            tick,
            op: Arc::new(OpLabel(format!("op {tick} on stream {agent}"))),
        }
    }

    fn clock(pairs: &[(Agent, u64)]) -> VectorClock {
        let mut v = VectorClock::default();
        for &(a, t) in pairs {
            v.raise(a, t);
        }
        v
    }

    #[test]
    fn unordered_write_then_read_on_two_streams_is_a_conflict() {
        let mut s = Shadow::default();
        s.access(0..100, Kind::Write, &who(1, 1), &clock(&[(1, 1)]))
            .unwrap();
        // Stream 2 without waiting for stream 1.
        let c = s
            .access(50..60, Kind::Read, &who(2, 1), &clock(&[(2, 1)]))
            .unwrap_err();
        assert_eq!(c.range, 50..60);
        assert!(c.to_string().contains("op 1 on stream 1"), "{c}");
        // The same read after waiting for stream 1's tick 1 is fine.
        let mut s2 = Shadow::default();
        s2.access(0..100, Kind::Write, &who(1, 1), &clock(&[(1, 1)]))
            .unwrap();
        s2.access(50..60, Kind::Read, &who(2, 1), &clock(&[(1, 1), (2, 1)]))
            .unwrap();
    }

    #[test]
    fn concurrent_reads_are_fine_but_a_write_after_them_is_not() {
        let mut s = Shadow::default();
        s.access(0..10, Kind::Read, &who(1, 1), &clock(&[(1, 1)]))
            .unwrap();
        s.access(0..10, Kind::Read, &who(2, 1), &clock(&[(2, 1)]))
            .unwrap();
        // Stream 3 ordered after stream 1 only: conflicts with stream 2's read.
        let c = s
            .access(5..6, Kind::Write, &who(3, 1), &clock(&[(1, 1), (3, 1)]))
            .unwrap_err();
        assert!(c.to_string().contains("stream 2"), "{c}");
    }

    #[test]
    fn disjoint_ranges_never_conflict_and_segments_merge() {
        let mut s = Shadow::default();
        for i in 0..100u64 {
            s.access(i * 8..i * 8 + 8, Kind::Write, &who(1, 1), &clock(&[(1, 1)]))
                .unwrap();
        }
        assert_eq!(s.segments(), 1);
        s.access(800..900, Kind::Write, &who(2, 1), &clock(&[(2, 1)]))
            .unwrap();
        s.access(0..800, Kind::Read, &who(1, 2), &clock(&[(1, 2)]))
            .unwrap();
    }
}
