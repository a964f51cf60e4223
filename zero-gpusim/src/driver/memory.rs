//! Device memory: every allocation, checked.
//!
//! Addresses are handed out from one counter and never reused, so a pointer to freed
//! memory stays recognisable (a use after free is named, not masked by a new allocation),
//! and each allocation is followed by an unmapped gap (its red zone) so an access past
//! its end names the allocation it overran. Every byte carries an "initialized" bit: a
//! kernel load, or a copy to the host, of bytes nothing wrote is a finding. Allocations
//! stay in the index after they are freed (their bytes released) for the messages.

use super::shadow::Shadow;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

/// The first device address (far from where Linux maps host memory).
const BASE: u64 = 0x0000_0a00_0000_0000;
/// Every allocation starts on this boundary (CUDA guarantees 256 bytes).
pub const ALIGN: u64 = 256;

/// An allocation's bytes and their initialized bits.
#[derive(Debug)]
pub struct Body {
    /// The bytes (empty once freed).
    pub data: Vec<u8>,
    /// One bit per byte: written since the allocation was made.
    pub init: Vec<u64>,
    /// What freed it, once freed.
    pub freed: Option<String>,
}

impl Body {
    /// Marks `range` (offsets) as written.
    pub fn set_init(&mut self, range: Range<usize>) {
        set_bits(&mut self.init, range);
    }

    /// Whether the byte at `at` was written.
    pub fn is_init(&self, at: usize) -> bool {
        self.init[at / 64] & (1 << (at % 64)) != 0
    }

    /// The first offset in `range` never written, if any.
    pub fn first_uninit(&self, range: Range<usize>) -> Option<usize> {
        first_clear(&self.init, range)
    }
}

fn set_bits(bits: &mut [u64], range: Range<usize>) {
    let (mut i, end) = (range.start, range.end);
    while i < end && i % 64 != 0 {
        bits[i / 64] |= 1 << (i % 64);
        i += 1;
    }
    while i + 64 <= end {
        bits[i / 64] = u64::MAX;
        i += 64;
    }
    while i < end {
        bits[i / 64] |= 1 << (i % 64);
        i += 1;
    }
}

fn first_clear(bits: &[u64], range: Range<usize>) -> Option<usize> {
    let (mut i, end) = (range.start, range.end);
    while i < end {
        if i % 64 == 0 && i + 64 <= end {
            let w = bits[i / 64];
            if w == u64::MAX {
                i += 64;
                continue;
            }
            return Some(i + (!w).trailing_zeros() as usize);
        }
        if bits[i / 64] & (1 << (i % 64)) == 0 {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// One device allocation.
pub struct Allocation {
    /// Its number in this process (1, 2, …), for messages.
    pub id: u64,
    /// Its first address.
    pub base: u64,
    /// Bytes asked for.
    pub size: u64,
    /// The device it lives on.
    pub device: usize,
    /// What made it (`cuMemAllocAsync on stream 3`).
    pub origin: String,
    /// Its bytes.
    pub body: Mutex<Body>,
    /// Who touched which bytes, for the race check.
    pub shadow: Mutex<Shadow>,
    /// A free was queued (a second one is a double free).
    pub free_queued: std::sync::atomic::AtomicBool,
}

impl fmt::Display for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "allocation #{} ({} bytes at {:#x} on device {}, made by {})",
            self.id, self.size, self.base, self.device, self.origin
        )
    }
}

impl fmt::Debug for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl Allocation {
    /// Its bytes, locked (a panic elsewhere does not hide them).
    pub fn body(&self) -> MutexGuard<'_, Body> {
        self.body.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its access history, locked.
    pub fn shadow(&self) -> MutexGuard<'_, Shadow> {
        self.shadow.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `addr` lies inside it.
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr - self.base < self.size
    }

    /// Where it was freed, if it was.
    pub fn freed(&self) -> Option<String> {
        self.body().freed.clone()
    }
}

/// Every allocation of the process.
#[derive(Default)]
pub struct DeviceMemory {
    index: RwLock<BTreeMap<u64, Arc<Allocation>>>,
    next_addr: AtomicU64,
    next_id: AtomicU64,
    /// Live bytes per device, and their peaks.
    used: Mutex<Vec<Usage>>,
    /// Live bytes over every device (backed by host memory).
    backed: AtomicU64,
}

/// One device's live bytes and their peak: every allocation, and the default memory
/// pool's (`cuMemAllocAsync`) alone, whose peak the driver reports as
/// `CU_MEMPOOL_ATTR_USED_MEM_HIGH`.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Live bytes.
    pub used: u64,
    /// The most live bytes at once since the process started.
    pub peak: u64,
    /// Live bytes of the default pool.
    pub pool_used: u64,
    /// The most live bytes of the default pool at once since its high mark was reset.
    pub pool_peak: u64,
}

/// Whether an allocation of this origin comes from the device's default memory pool.
fn from_pool(origin: &str) -> bool {
    origin.starts_with("cuMemAllocAsync")
}

/// The process's device memory.
pub fn memory() -> &'static DeviceMemory {
    static M: OnceLock<DeviceMemory> = OnceLock::new();
    M.get_or_init(|| DeviceMemory {
        next_addr: AtomicU64::new(BASE),
        next_id: AtomicU64::new(1),
        ..Default::default()
    })
}

/// Where an address falls.
pub enum Place {
    /// Inside an allocation (live or freed), at this offset.
    Inside(Arc<Allocation>, u64),
    /// Outside every allocation; the text says where relative to the nearest one.
    Outside(String),
}

/// Why an allocation was refused.
#[derive(Debug)]
pub enum AllocError {
    /// The simulated device is full.
    DeviceFull {
        /// Bytes asked for.
        asked: u64,
        /// Bytes free on the device.
        free: u64,
    },
    /// The host memory that backs device memory is at its cap.
    BackingFull {
        /// Bytes asked for.
        asked: u64,
        /// The cap.
        cap: u64,
    },
}

impl DeviceMemory {
    /// A new allocation of `size` bytes on `device` whose memory is `capacity` bytes, with
    /// at most `backing_cap` bytes live over all devices.
    pub fn allocate(
        &self,
        device: usize,
        size: u64,
        capacity: u64,
        backing_cap: u64,
        origin: String,
    ) -> Result<Arc<Allocation>, AllocError> {
        {
            let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
            if used.len() <= device {
                used.resize(device + 1, Usage::default());
            }
            let u = &mut used[device];
            if u.used + size > capacity {
                return Err(AllocError::DeviceFull {
                    asked: size,
                    free: capacity - u.used,
                });
            }
            if self.backed.load(Ordering::Relaxed) + size > backing_cap {
                return Err(AllocError::BackingFull {
                    asked: size,
                    cap: backing_cap,
                });
            }
            u.used += size;
            u.peak = u.peak.max(u.used);
            if from_pool(&origin) {
                u.pool_used += size;
                u.pool_peak = u.pool_peak.max(u.pool_used);
            }
            self.backed.fetch_add(size, Ordering::Relaxed);
        }
        // The red zone after it: at least 64 KiB, and a quarter of its size.
        let span = size.div_ceil(ALIGN) * ALIGN + (64 << 10).max(size / 4 / ALIGN * ALIGN);
        let base = self.next_addr.fetch_add(span, Ordering::Relaxed);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let len = size as usize;
        let a = Arc::new(Allocation {
            id,
            base,
            size,
            device,
            origin,
            body: Mutex::new(Body {
                data: vec![0; len],
                init: vec![0; len.div_ceil(64)],
                freed: None,
            }),
            shadow: Mutex::new(Shadow::default()),
            free_queued: Default::default(),
        });
        self.index
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(base, a.clone());
        Ok(a)
    }

    /// Frees `a`'s bytes (it stays known by address); `by` says what freed it.
    pub fn release(&self, a: &Allocation, by: String) {
        let mut body = a.body();
        if body.freed.is_some() {
            return;
        }
        body.freed = Some(by);
        body.data = Vec::new();
        body.init = Vec::new();
        drop(body);
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(u) = used.get_mut(a.device) {
            u.used = u.used.saturating_sub(a.size);
            if from_pool(&a.origin) {
                u.pool_used = u.pool_used.saturating_sub(a.size);
            }
        }
        self.backed.fetch_sub(a.size, Ordering::Relaxed);
    }

    /// Live bytes on `device`.
    pub fn used(&self, device: usize) -> u64 {
        self.usage(device).used
    }

    /// `device`'s live bytes and peaks.
    pub fn usage(&self, device: usize) -> Usage {
        let used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        used.get(device).copied().unwrap_or_default()
    }

    /// Resets `device`'s default-pool high mark to its live bytes (setting
    /// `CU_MEMPOOL_ATTR_USED_MEM_HIGH` to 0, the only value the driver takes).
    pub fn reset_pool_peak(&self, device: usize) {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(u) = used.get_mut(device) {
            u.pool_peak = u.pool_used;
        }
    }

    /// The live allocations of `device`.
    pub fn live(&self, device: usize) -> Vec<Arc<Allocation>> {
        let index = self.index.read().unwrap_or_else(|p| p.into_inner());
        index
            .values()
            .filter(|a| a.device == device && a.body().freed.is_none())
            .cloned()
            .collect()
    }

    /// Where `addr` falls.
    pub fn place(&self, addr: u64) -> Place {
        let index = self.index.read().unwrap_or_else(|p| p.into_inner());
        let below = index.range(..=addr).next_back().map(|(_, a)| a.clone());
        if let Some(a) = &below {
            if a.contains(addr) {
                return Place::Inside(a.clone(), addr - a.base);
            }
        }
        let above = index.range(addr..).next().map(|(_, a)| a.clone());
        drop(index);
        let mut text = format!("{addr:#x} is not in any device allocation");
        if let Some(a) = &below {
            let end = a.base + a.size;
            text.push_str(&format!("; it is {} bytes past the end of {a}", addr - end));
        } else if let Some(a) = &above {
            text.push_str(&format!("; it is {} bytes before {a}", a.base - addr));
        } else if addr < BASE {
            text.push_str(" (not a device address: a host pointer, or null?)");
        }
        Place::Outside(text)
    }

    /// The allocation holding all of `[addr, addr + len)`, live, or a message saying what
    /// is wrong with the range (outside, overrunning, freed). `what` names the access.
    pub fn range(&self, addr: u64, len: u64, what: &str) -> Result<(Arc<Allocation>, u64), String> {
        match self.place(addr) {
            Place::Outside(text) => Err(format!("{what}: {text}")),
            Place::Inside(a, off) => {
                if let Some(by) = a.freed() {
                    return Err(format!(
                        "{what}: use after free of {a} at offset {off} (freed by {by})"
                    ));
                }
                if len > a.size - off {
                    return Err(format!(
                        "{what}: {len} bytes at offset {off} of {a} run {} bytes past its end",
                        len - (a.size - off)
                    ));
                }
                Ok((a, off))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_bits_mark_ranges_and_find_holes() {
        let mut bits = vec![0u64; 4];
        set_bits(&mut bits, 3..130);
        assert_eq!(first_clear(&bits, 3..130), None);
        assert_eq!(first_clear(&bits, 0..10), Some(0));
        assert_eq!(first_clear(&bits, 100..200), Some(130));
        set_bits(&mut bits, 0..3);
        assert_eq!(first_clear(&bits, 0..130), None);
    }

    #[test]
    fn addresses_are_never_reused_and_overruns_name_the_allocation() {
        let m = memory();
        let a = m
            .allocate(0, 1000, 1 << 40, 1 << 40, "test".into())
            .unwrap();
        let b = m.allocate(0, 10, 1 << 40, 1 << 40, "test".into()).unwrap();
        assert!(b.base >= a.base + 1000 + (64 << 10));
        assert_eq!(a.base % ALIGN, 0);
        let e = m.range(a.base + 990, 20, "copy").unwrap_err();
        assert!(
            e.contains("10 bytes past its end") && e.contains(&format!("#{}", a.id)),
            "{e}"
        );
        let e = match m.place(a.base + 1004) {
            Place::Outside(t) => t,
            Place::Inside(..) => panic!("inside"),
        };
        assert!(e.contains("4 bytes past the end"), "{e}");
        m.release(&a, "cuMemFree".into());
        let e = m.range(a.base, 4, "load").unwrap_err();
        assert!(e.contains("use after free"), "{e}");
        let c = m
            .allocate(0, 1000, 1 << 40, 1 << 40, "test".into())
            .unwrap();
        assert!(c.base > b.base);
    }
}
