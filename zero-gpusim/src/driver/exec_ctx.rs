//! What an operation's code gets when its stream runs it: who it is (stream, tick, clock,
//! name) and the checked device accesses (live, in bounds, written before read, recorded
//! for the race check). The copies, kernels and collectives all go through it.

use super::clock::{Agent, VectorClock};
use super::errors::FindingKind;
use super::memory::Allocation;
use super::shadow::{Access, Kind, OpLabel};
use std::ops::Range;
use std::sync::Arc;

/// A device range: an allocation and a byte range in it.
#[derive(Clone)]
pub struct DevRange {
    /// The allocation.
    pub alloc: Arc<Allocation>,
    /// Offset of the first byte.
    pub off: u64,
    /// Bytes.
    pub len: u64,
}

impl DevRange {
    /// Its byte range in the allocation.
    pub fn span(&self) -> Range<u64> {
        self.off..self.off + self.len
    }
}

/// What an operation's code needs to touch device memory.
pub struct ExecCtx<'a> {
    /// The stream running it.
    pub agent: Agent,
    /// The operation's tick on its stream.
    pub tick: u64,
    /// Everything the operation is ordered after.
    pub vc: &'a Arc<VectorClock>,
    /// The operation's name in messages.
    pub label: &'a Arc<OpLabel>,
}

impl ExecCtx<'_> {
    /// The access record of this operation.
    pub fn who(&self) -> Access {
        Access {
            agent: self.agent,
            tick: self.tick,
            op: self.label.clone(),
        }
    }

    /// Records an access of `kind` to `span` of `a`: a race with an unordered operation is
    /// a finding message.
    pub fn record(&self, a: &Allocation, span: Range<u64>, kind: Kind) -> Result<(), String> {
        a.shadow()
            .access(span, kind, &self.who(), self.vc)
            .map_err(|c| format!("race on {a}: {c}"))
    }

    pub(super) fn live(&self, r: &DevRange) -> Result<(), String> {
        match r.alloc.freed() {
            Some(by) => Err(format!(
                "{}: use after free: offset {} of {} (freed by {by})",
                self.label, r.off, r.alloc
            )),
            None => Ok(()),
        }
    }

    /// Reads a device range (written bytes only, unless `any` is set).
    pub fn read(&self, r: &DevRange, any: bool) -> Result<Vec<u8>, (FindingKind, String)> {
        // The race check first: a free on another stream that nothing ordered is named as
        // the race it is, whichever ran first.
        self.record(&r.alloc, r.span(), Kind::Read).map_err(race)?;
        self.live(r).map_err(mem)?;
        let body = r.alloc.body();
        let span = r.off as usize..(r.off + r.len) as usize;
        if !any {
            if let Some(at) = body.first_uninit(span.clone()) {
                return Err(mem(format!(
                    "{} reads never-written device memory: offset {at} of {} (the read \
                     covers [{}, {}))",
                    self.label, r.alloc, span.start, span.end
                )));
            }
        }
        Ok(body.data[span].to_vec())
    }

    /// Writes `data` into a device range (marking it written).
    pub fn write(&self, r: &DevRange, data: &[u8]) -> Result<(), (FindingKind, String)> {
        self.record(&r.alloc, r.span(), Kind::Write).map_err(race)?;
        self.live(r).map_err(mem)?;
        let mut body = r.alloc.body();
        let span = r.off as usize..r.off as usize + data.len();
        body.data[span.clone()].copy_from_slice(data);
        body.set_init(span);
        Ok(())
    }
}

pub(super) fn mem(m: String) -> (FindingKind, String) {
    (FindingKind::Memory, m)
}

pub(super) fn race(m: String) -> (FindingKind, String) {
    (FindingKind::Race, m)
}
