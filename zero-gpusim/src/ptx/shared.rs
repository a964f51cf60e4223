//! A block's shared memory and its threads' local memory, with every byte tracked:
//! whether it was written in this block, and (shared) which threads read and wrote it in
//! the current barrier interval, to find races.

/// A variable in shared or local memory.
#[derive(Clone, Debug)]
pub(crate) struct Var {
    pub(crate) name: String,
    pub(crate) offset: usize,
    pub(crate) size: usize,
}

/// Names byte `off` of a memory holding `vars` (dynamic shared memory from `dyn_start`).
pub(crate) fn describe(vars: &[Var], dyn_start: Option<usize>, off: u64) -> String {
    let off_us = off as usize;
    if let Some(v) = vars
        .iter()
        .find(|v| off_us >= v.offset && off_us < v.offset + v.size)
    {
        return format!("`{}`+{}", v.name, off_us - v.offset);
    }
    if let Some(d) = dyn_start {
        if off_us >= d {
            return format!("dynamic shared memory+{}", off_us - d);
        }
    }
    format!("byte {off} (padding between variables)")
}

/// One access of a byte: interval (epoch), thread, the thread's warp-sync count, and the
/// instruction index.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct Access {
    pub(crate) ep: u32,
    pub(crate) thr: u32,
    pub(crate) sync: u32,
    pub(crate) inst: u32,
}

#[derive(Clone, Copy, Default)]
struct Track {
    /// The block generation that wrote it (initialized iff equal to the current one).
    init: u32,
    w: Access,
    r1: Access,
    r2: Access,
}

/// What went wrong with a shared or local access.
#[derive(Debug)]
pub(crate) enum MemFault {
    OutOfBounds {
        off: u64,
        size: u32,
        limit: u64,
    },
    /// `first` (a read or write of `byte`) and the current access conflict.
    Race {
        byte: u64,
        first: Access,
        first_write: bool,
        second_write: bool,
    },
    Uninit {
        byte: u64,
    },
}

/// The first uninitialized shared read of the current interval (reported at its end,
/// unless a race on the same data is found first).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pending {
    pub(crate) byte: u64,
    pub(crate) thr: u32,
    pub(crate) inst: u32,
}

/// A block's shared memory.
#[derive(Default)]
pub(crate) struct SharedMem {
    data: Vec<u8>,
    track: Vec<Track>,
    size: usize,
    gen: u32,
    epoch: u32,
    pending: Option<Pending>,
    raced: bool,
}

impl SharedMem {
    /// A new block with `size` bytes, all poisoned.
    pub(crate) fn begin_block(&mut self, size: usize) {
        if self.data.len() < size {
            self.data.resize(size, 0);
            self.track.resize(size, Track::default());
        }
        self.size = size;
        self.gen = self.gen.wrapping_add(1);
        self.epoch = self.epoch.wrapping_add(1);
        self.pending = None;
        self.raced = false;
    }

    /// A barrier released: a new interval.
    pub(crate) fn barrier(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
    }

    /// The uninitialized read of the interval that just ended, if any.
    pub(crate) fn take_pending(&mut self) -> Option<Pending> {
        self.pending.take()
    }

    /// Whether a race was reported in this block (a race explains an uninitialized read
    /// better than the read itself).
    pub(crate) fn raced(&self) -> bool {
        self.raced
    }

    fn check(&self, off: u64, size: u32) -> Result<usize, MemFault> {
        match off.checked_add(size as u64) {
            Some(end) if end <= self.size as u64 => Ok(off as usize),
            _ => Err(MemFault::OutOfBounds {
                off,
                size,
                limit: self.size as u64,
            }),
        }
    }

    #[inline(always)]
    fn conflicts(rec: &Access, ep: u32, thr: u32, sync: u32) -> bool {
        rec.ep == ep && rec.thr != thr && !(rec.thr / 32 == thr / 32 && rec.sync != sync)
    }

    /// Reads `size` bytes at `off` for thread `thr` (its warp's sync count `sync`) at
    /// instruction `inst`.
    pub(crate) fn load(
        &mut self,
        off: u64,
        size: u32,
        thr: u32,
        sync: u32,
        inst: u32,
    ) -> Result<u128, MemFault> {
        let start = self.check(off, size)?;
        let ep = self.epoch;
        let cur = Access {
            ep,
            thr,
            sync,
            inst,
        };
        let mut v = 0u128;
        for i in 0..size as usize {
            let b = start + i;
            let t = &mut self.track[b];
            if Self::conflicts(&t.w, ep, thr, sync) {
                self.raced = true;
                return Err(MemFault::Race {
                    byte: b as u64,
                    first: t.w,
                    first_write: true,
                    second_write: false,
                });
            }
            if t.init != self.gen {
                if self.pending.is_none() {
                    self.pending = Some(Pending {
                        byte: b as u64,
                        thr,
                        inst,
                    });
                }
            } else {
                v |= (self.data[b] as u128) << (8 * i);
            }
            if t.r1.ep != ep || t.r1.thr == thr {
                t.r1 = cur;
            } else {
                t.r2 = cur;
            }
        }
        Ok(v)
    }

    /// Writes the low `size` bytes of `val` at `off`.
    pub(crate) fn store(
        &mut self,
        off: u64,
        size: u32,
        val: u128,
        thr: u32,
        sync: u32,
        inst: u32,
    ) -> Result<(), MemFault> {
        let start = self.check(off, size)?;
        let ep = self.epoch;
        let gen = self.gen;
        for i in 0..size as usize {
            let b = start + i;
            let t = &mut self.track[b];
            for (rec, write) in [(&t.w, true), (&t.r1, false), (&t.r2, false)] {
                if Self::conflicts(rec, ep, thr, sync) {
                    self.raced = true;
                    return Err(MemFault::Race {
                        byte: b as u64,
                        first: *rec,
                        first_write: write,
                        second_write: true,
                    });
                }
            }
            t.w = Access {
                ep,
                thr,
                sync,
                inst,
            };
            t.init = gen;
            self.data[b] = (val >> (8 * i)) as u8;
        }
        Ok(())
    }
}

/// The local memory of a block's threads, `per_thread` bytes each.
#[derive(Default)]
pub(crate) struct LocalMem {
    data: Vec<u8>,
    init: Vec<u32>,
    per_thread: usize,
    gen: u32,
}

impl LocalMem {
    /// A new block of `threads` threads, every byte unwritten.
    pub(crate) fn begin_block(&mut self, threads: usize, per_thread: usize) {
        let n = threads * per_thread;
        if self.data.len() < n {
            self.data.resize(n, 0);
            self.init.resize(n, 0);
        }
        self.per_thread = per_thread;
        self.gen = self.gen.wrapping_add(1);
    }

    fn check(&self, off: u64, size: u32) -> Result<usize, MemFault> {
        match off.checked_add(size as u64) {
            Some(end) if end <= self.per_thread as u64 => Ok(off as usize),
            _ => Err(MemFault::OutOfBounds {
                off,
                size,
                limit: self.per_thread as u64,
            }),
        }
    }

    pub(crate) fn load(&mut self, thr: u32, off: u64, size: u32) -> Result<u128, MemFault> {
        let start = thr as usize * self.per_thread + self.check(off, size)?;
        let mut v = 0u128;
        for i in 0..size as usize {
            if self.init[start + i] != self.gen {
                return Err(MemFault::Uninit {
                    byte: off + i as u64,
                });
            }
            v |= (self.data[start + i] as u128) << (8 * i);
        }
        Ok(v)
    }

    pub(crate) fn store(
        &mut self,
        thr: u32,
        off: u64,
        size: u32,
        val: u128,
    ) -> Result<(), MemFault> {
        let start = thr as usize * self.per_thread + self.check(off, size)?;
        for i in 0..size as usize {
            self.init[start + i] = self.gen;
            self.data[start + i] = (val >> (8 * i)) as u8;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn races_in_either_order_and_none_after_a_barrier() {
        let mut s = SharedMem::default();
        s.begin_block(64);
        s.store(0, 4, 7, 0, 0, 1).expect("first write");
        // Same thread reads back: fine.
        assert_eq!(s.load(0, 4, 0, 0, 2).expect("own read"), 7);
        // Another thread (another warp) reads: race, write first.
        match s.load(0, 4, 40, 0, 3) {
            Err(MemFault::Race {
                first,
                first_write: true,
                second_write: false,
                ..
            }) => assert_eq!(first.thr, 0),
            other => panic!("{other:?}"),
        }
        s.barrier();
        assert_eq!(s.load(0, 4, 40, 0, 3).expect("after barrier"), 7);
        // Read by 40, then written by 0 in the same interval: race, read first.
        match s.store(0, 4, 1, 0, 0, 4) {
            Err(MemFault::Race {
                first,
                first_write: false,
                second_write: true,
                ..
            }) => assert_eq!(first.thr, 40),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn warp_sync_orders_lanes_of_one_warp_only() {
        let mut s = SharedMem::default();
        s.begin_block(8);
        s.store(0, 4, 1, 3, 0, 1).expect("write");
        assert!(s.load(0, 4, 4, 0, 2).is_err(), "same warp, no syncwarp");
        let mut s = SharedMem::default();
        s.begin_block(8);
        s.store(0, 4, 1, 3, 0, 1).expect("write");
        assert_eq!(s.load(0, 4, 4, 1, 2).expect("after syncwarp"), 1);
    }

    #[test]
    fn uninitialized_reads_are_pending_and_bounds_checked() {
        let mut s = SharedMem::default();
        s.begin_block(8);
        assert_eq!(s.load(4, 4, 1, 0, 9).expect("poisoned reads pend"), 0);
        let p = s.take_pending().expect("pending");
        assert_eq!((p.byte, p.thr, p.inst), (4, 1, 9));
        assert!(matches!(
            s.load(6, 4, 1, 0, 9),
            Err(MemFault::OutOfBounds { .. })
        ));
        // A new block forgets the old one's writes.
        s.store(0, 1, 1, 0, 0, 0).expect("write");
        s.begin_block(8);
        s.load(0, 1, 0, 0, 0).expect("reads");
        assert!(s.take_pending().is_some());
        let mut l = LocalMem::default();
        l.begin_block(2, 8);
        l.store(1, 0, 4, 0xdead_beef).expect("store");
        assert_eq!(l.load(1, 0, 4).expect("load"), 0xdead_beef);
        assert!(matches!(l.load(0, 0, 4), Err(MemFault::Uninit { byte: 0 })));
        assert!(matches!(l.load(1, 6, 4), Err(MemFault::OutOfBounds { .. })));
    }

    #[test]
    fn names_bytes_by_variable() {
        let vars = vec![
            Var {
                name: "a".into(),
                offset: 0,
                size: 8,
            },
            Var {
                name: "b".into(),
                offset: 16,
                size: 4,
            },
        ];
        assert_eq!(describe(&vars, Some(32), 17), "`b`+1");
        assert_eq!(describe(&vars, Some(32), 40), "dynamic shared memory+8");
        assert!(describe(&vars, Some(32), 10).contains("padding"));
    }
}
