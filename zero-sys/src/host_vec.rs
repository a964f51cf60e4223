//! Host memory the engine owns and a framework's tensors may view: a vector whose
//! allocation can be *leased*.
//!
//! A [`HostVec`] is used like a `Vec` (it dereferences to a slice). [`HostVec::lease`]
//! hands out a [`Lease`]: the allocation's address and size, and a share of its ownership.
//! The memory is freed when the vector and every lease are gone, so a tensor built over a
//! lease (zero-torch wraps one in a DLPack capsule) keeps its values after the engine that
//! owned the vector was dropped.
//!
//! The rule that makes this sound: only the `HostVec` forms Rust references into the
//! allocation; a lease gives an address, for code outside Rust (a framework's kernels)
//! that reads and writes it between the engine's calls. The allocation never moves or
//! grows while leased ([`HostVec::resize`] refuses). Element 0 is 512-byte aligned (past
//! the 64 PyTorch gives its CPU allocations), and a new vector's memory comes zeroed from the
//! allocator (untouched pages of a large one cost nothing until written).

use bytemuck::Pod;
use std::alloc::Layout;
use std::cell::UnsafeCell;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

/// Where element 0 of every `HostVec` lies: a multiple of 512 bytes, what PyTorch's CUDA
/// allocator gives and more than the 64 of its CPU allocations, so a flat layout's
/// 512-byte tensor starts (`zero_kernels::ALIGN_BYTES`) are 512-byte addresses. A
/// framework's kernels that view the memory (MKL's GEMM among them) may pick their code
/// path, and with it their rounding, by alignment; aligned at least like the framework's
/// own tensors, the views compute what the framework's own copies would.
pub const ALIGN_BYTES: usize = 512;

/// Vectors of at least this many bytes are mapped from the kernel (anonymous `mmap`), not
/// taken from malloc's heap: the engine's long-lived buffers and stage 3's per-gather
/// buckets then never sit among the framework's short-lived tensors in the heap, where a
/// freed block stays resident until everything above it is freed too, and a freed one
/// goes back to the kernel at once. Its pages are zero and cost nothing until written.
pub const MAP_MIN_BYTES: usize = 1 << 20;

/// Where an allocation came from.
enum Memory {
    /// malloc's heap, with this layout.
    Heap(Layout),
    /// An anonymous mapping of this many bytes.
    Mapped(usize),
}

/// The elements: `len` of them from `ptr`, [`ALIGN_BYTES`]-aligned, inside an allocation
/// of `cap` elements (plus, on the heap, the alignment's slack) that starts at `base`.
struct Elements<T: Pod> {
    base: NonNull<u8>,
    ptr: NonNull<T>,
    len: usize,
    cap: usize,
    memory: Memory,
}

impl<T: Pod> Elements<T> {
    /// The allocation for `cap` elements: the allocator's own alignment (so a zeroed one
    /// comes from `calloc`, whose fresh pages cost nothing until written; an over-aligned
    /// layout would be zeroed by hand, every page touched), with room to align by hand.
    fn layout(cap: usize) -> Layout {
        let bytes = cap
            .checked_mul(std::mem::size_of::<T>())
            .and_then(|b| b.checked_add(ALIGN_BYTES))
            .expect("a host buffer larger than the address space");
        Layout::from_size_align(bytes, std::mem::align_of::<T>().max(8))
            .expect("a host buffer larger than the address space")
    }

    /// `len` zero elements (all-zero bytes, which `Pod` makes a valid value: +0.0 for
    /// the float types), from the allocator's zeroed pages, or a fresh mapping from
    /// [`MAP_MIN_BYTES`] on.
    fn zeroed(len: usize) -> Self {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .expect("a host buffer larger than the address space");
        if bytes >= MAP_MIN_BYTES {
            // SAFETY: an anonymous private mapping of `bytes` (non-zero) readable and
            // writable bytes at an address the kernel picks; no file, no fixed address.
            let raw = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if raw == libc::MAP_FAILED {
                std::alloc::handle_alloc_error(Self::layout(len));
            }
            // A mapping is page-aligned: aligned for `T` and to ALIGN_BYTES.
            let base = NonNull::new(raw.cast::<u8>()).unwrap_or(NonNull::dangling());
            return Elements {
                base,
                ptr: base.cast::<T>(),
                len,
                cap: len,
                memory: Memory::Mapped(bytes),
            };
        }
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size (the alignment slack) and a power-of-two
        // alignment.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(base) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        let skip = (ALIGN_BYTES - raw as usize % ALIGN_BYTES) % ALIGN_BYTES;
        // SAFETY: `skip < ALIGN_BYTES` stays inside the allocation, which has ALIGN_BYTES
        // of slack beyond `len` elements; `raw` is aligned for `T` and ALIGN_BYTES is a
        // multiple of `T`'s alignment, so the result is too.
        let ptr = unsafe { NonNull::new_unchecked(raw.add(skip).cast::<T>()) };
        Elements {
            base,
            ptr,
            len,
            cap: len,
            memory: Memory::Heap(layout),
        }
    }

    fn slice(&self) -> &[T] {
        // SAFETY: `ptr` holds `cap >= len` initialized elements (zeroed at allocation, `Pod`)
        // for as long as `self` lives; `&self` excludes writers.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn slice_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `slice`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Elements the allocation holds.
    fn room(&self) -> usize {
        self.cap
    }

    /// A mapped allocation's pages back to the kernel: the elements read as zero after,
    /// and a page is faulted in afresh at its next write. Bytes handed back; 0 from the
    /// heap (nothing changes there).
    fn release_pages(&mut self) -> usize {
        let Memory::Mapped(bytes) = self.memory else {
            return 0;
        };
        // SAFETY: `base` is the start of a private anonymous mapping of `bytes` made in
        // `zeroed` and still mapped; `&mut self` excludes every Rust reference into it.
        // MADV_DONTNEED on such a mapping only drops its pages: later reads see zero
        // pages, which are valid `Pod` values, and leases keep the same addresses.
        let rc = unsafe {
            libc::madvise(
                self.base.as_ptr().cast::<libc::c_void>(),
                bytes,
                libc::MADV_DONTNEED,
            )
        };
        if rc == 0 {
            bytes
        } else {
            // Refused (not expected for an anonymous mapping): zero by hand instead.
            self.slice_mut().fill(T::zeroed());
            0
        }
    }
}

impl<T: Pod> Drop for Elements<T> {
    fn drop(&mut self) {
        match self.memory {
            // SAFETY: `base` was allocated with exactly this layout in `zeroed`; `Pod`
            // elements need no drop.
            Memory::Heap(layout) => unsafe { std::alloc::dealloc(self.base.as_ptr(), layout) },
            // SAFETY: `base` is the start of a mapping of `bytes` made in `zeroed`, unmapped
            // once (no reference into it outlives `self`; leases keep `self` alive).
            Memory::Mapped(bytes) => unsafe {
                libc::munmap(self.base.as_ptr().cast::<libc::c_void>(), bytes);
            },
        }
    }
}

/// The allocation, behind the `Arc` the vector and its leases share.
struct Cell<T: Pod>(UnsafeCell<Elements<T>>);

// SAFETY: the elements inside are reached through references only by the one `HostVec`
// that owns the `Arc` (it is not `Clone`-shared: cloning a `HostVec` copies the elements),
// so moving or sharing the `Arc` between threads moves or shares at most that one owner's
// access, which `&`/`&mut HostVec` already orders. Leases hold the `Arc` only to keep the
// allocation alive and never dereference it. `Pod` elements are plain bytes, so the
// allocation may be freed on any thread.
unsafe impl<T: Pod> Send for Cell<T> {}
// SAFETY: as above: a shared `&Cell` (inside a `Lease`) gives no access to the elements.
unsafe impl<T: Pod> Sync for Cell<T> {}

/// A vector of `T` whose allocation can be leased to code outside Rust (see the module
/// docs). Element 0 is [`ALIGN_BYTES`]-aligned. Cloning copies the elements into a new,
/// unleased allocation.
pub struct HostVec<T: Pod> {
    cell: Arc<Cell<T>>,
}

/// A share in a [`HostVec`]'s allocation: its address and size, kept valid while the
/// lease lives. It never gives access to the elements from Rust.
#[derive(Clone)]
pub struct Lease {
    _keep: Arc<dyn Send + Sync>,
    addr: usize,
    bytes: usize,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Lease {
    /// The address of the first element.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// The size of the leased allocation's elements, in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// [`HostVec::resize`] on a leased vector: growing could move the allocation under the
/// leases, so it is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leased {
    /// How many leases are alive.
    pub leases: usize,
}

impl fmt::Display for Leased {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the buffer is leased to {} tensor storage(s) and cannot be resized",
            self.leases
        )
    }
}

impl std::error::Error for Leased {}

impl<T: Pod> HostVec<T> {
    fn wrap(e: Elements<T>) -> Self {
        HostVec {
            cell: Arc::new(Cell(UnsafeCell::new(e))),
        }
    }

    fn elements(&self) -> &Elements<T> {
        // SAFETY: only this `HostVec` forms references into the cell (module docs), and
        // `&self` excludes a `&mut` from `elements_mut` for as long as this one lives.
        unsafe { &*self.cell.0.get() }
    }

    fn elements_mut(&mut self) -> &mut Elements<T> {
        // SAFETY: as in `elements`; `&mut self` makes this the only reference.
        unsafe { &mut *self.cell.0.get() }
    }

    /// How many leases are alive.
    pub fn leases(&self) -> usize {
        Arc::strong_count(&self.cell) - 1
    }
}

impl<T: Pod> HostVec<T> {
    /// `v`'s elements, copied into an aligned allocation.
    pub fn new(v: Vec<T>) -> Self {
        let mut e = Elements::zeroed(v.len());
        e.slice_mut().copy_from_slice(&v);
        Self::wrap(e)
    }

    /// `len` zeros (+0.0 for the float types).
    pub fn zeroed(len: usize) -> Self {
        Self::wrap(Elements::zeroed(len))
    }

    /// Changes the length to `len`, filling new elements with `value`. Refused while
    /// leased, when it would need a larger allocation (the leases would point at freed
    /// memory); shrinking, or growing within the allocation, keeps it.
    pub fn resize(&mut self, len: usize, value: T) -> Result<(), Leased> {
        let leases = self.leases();
        let e = self.elements_mut();
        if len <= e.room() {
            let old = e.len;
            e.len = len;
            if len > old {
                e.slice_mut()[old..].fill(value);
            }
            return Ok(());
        }
        if leases > 0 {
            return Err(Leased { leases });
        }
        let mut grown = Elements::zeroed(len);
        let old = e.len;
        grown.slice_mut()[..old].copy_from_slice(e.slice());
        grown.slice_mut()[old..].fill(value);
        *e = grown;
        Ok(())
    }

    /// Sets every element to zero and, where the allocation is a mapping (from
    /// [`MAP_MIN_BYTES`] on), hands its pages back to the kernel: resident memory falls by
    /// the buffer's size until it is written again, each page then faulted in zeroed.
    /// Returns the bytes handed back; a buffer from the heap is left as it is and 0
    /// returned (zero it yourself where its values must go). Leases see the zeros too:
    /// their address stays valid.
    pub fn release_pages(&mut self) -> usize {
        self.elements_mut().release_pages()
    }

    /// The elements, copied into a `Vec`.
    pub fn into_vec(self) -> Vec<T> {
        self.elements().slice().to_vec()
    }
}

impl<T: Pod> HostVec<T> {
    /// A lease on the allocation (see the module docs).
    pub fn lease(&self) -> Lease {
        let v = self.elements().slice();
        Lease {
            addr: v.as_ptr() as usize,
            bytes: std::mem::size_of_val(v),
            _keep: self.cell.clone(),
        }
    }
}

impl<T: Pod> Deref for HostVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.elements().slice()
    }
}

impl<T: Pod> DerefMut for HostVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.elements_mut().slice_mut()
    }
}

impl<T: Pod> From<Vec<T>> for HostVec<T> {
    fn from(v: Vec<T>) -> Self {
        HostVec::new(v)
    }
}

impl<T: Pod> FromIterator<T> for HostVec<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        HostVec::new(iter.into_iter().collect())
    }
}

impl<T: Pod> Clone for HostVec<T> {
    fn clone(&self) -> Self {
        let mut c = Self::zeroed(self.len());
        c.copy_from_slice(self);
        c
    }
}

impl<T: Pod + PartialEq> PartialEq for HostVec<T> {
    fn eq(&self, other: &Self) -> bool {
        self[..] == other[..]
    }
}

impl<T: Pod + fmt::Debug> fmt::Debug for HostVec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.elements().slice().fmt(f)
    }
}

impl<T: Pod> Default for HostVec<T> {
    fn default() -> Self {
        HostVec::zeroed(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_keeps_the_values_after_the_vector_is_gone() {
        let mut v = HostVec::new(vec![1.5f32, 2.5, 3.5]);
        v[1] = 7.0;
        let lease = v.lease();
        assert_eq!(v.leases(), 1);
        assert_eq!(lease.bytes(), 12);
        assert_eq!(lease.addr(), v.as_ptr() as usize);
        drop(v);
        // The allocation is alive: read it as foreign code would.
        let mut back = [0f32; 3];
        // SAFETY: the lease keeps 12 bytes at addr alive; nothing else references them.
        unsafe { std::ptr::copy_nonoverlapping(lease.addr() as *const f32, back.as_mut_ptr(), 3) };
        assert_eq!(back, [1.5, 7.0, 3.5]);
    }

    #[test]
    fn resize_keeps_a_leased_allocation_or_refuses() {
        let mut v = HostVec::<u16>::zeroed(8);
        v.fill(1);
        let lease = v.lease();
        v.resize(3, 0).unwrap();
        v.resize(5, 2).unwrap(); // within the allocation: it stays
        assert_eq!(v.as_ptr() as usize, lease.addr());
        assert_eq!(
            &v[..],
            &[1, 1, 1, 2, 2],
            "regrown elements take the new value"
        );
        assert_eq!(v.resize(9, 0), Err(Leased { leases: 1 }));
        assert_eq!(&v[..], &[1, 1, 1, 2, 2]);
        drop(lease);
        v.resize(1 << 20, 3).unwrap();
        assert_eq!(v.len(), 1 << 20);
        assert_eq!(&v[..6], &[1, 1, 1, 2, 2, 3]);
        assert_eq!(v.as_ptr() as usize % ALIGN_BYTES, 0);
    }

    #[test]
    fn element_zero_is_aligned_like_torch_allocations() {
        // From the heap, and (at MAP_MIN_BYTES and above) mapped.
        for len in [0usize, 1, 3, 1000, 1 << 18, 1 << 20, (1 << 20) + 3] {
            let v = HostVec::<u16>::zeroed(len);
            assert_eq!(v.as_ptr() as usize % ALIGN_BYTES, 0, "zeroed({len})");
            assert!(v.iter().all(|&x| x == 0));
            // A Vec of any alignment is copied to an aligned place.
            let mut raw = vec![7u16; len + 1];
            raw.remove(0);
            let w = HostVec::new(raw.clone());
            assert_eq!(w.as_ptr() as usize % ALIGN_BYTES, 0, "new({len})");
            assert_eq!(&w[..], &raw[..]);
        }
    }

    #[test]
    fn a_mapped_vector_is_zeroed_written_and_leased_like_any() {
        let n = MAP_MIN_BYTES / 4 + 7;
        let mut v = HostVec::<f32>::zeroed(n);
        assert!(v.iter().all(|&x| x == 0.0));
        v[n - 1] = 2.5;
        let lease = v.lease();
        drop(v);
        let mut last = 0f32;
        // SAFETY: the lease keeps the mapping's n floats alive.
        unsafe {
            std::ptr::copy_nonoverlapping((lease.addr() as *const f32).add(n - 1), &mut last, 1)
        };
        assert_eq!(last, 2.5);
    }

    /// Whether the page holding `addr` is resident (`mincore`).
    fn resident(addr: usize) -> bool {
        let page = 4096usize;
        let mut flag = 0u8;
        // SAFETY: one page at a page-aligned address inside a live mapping; `flag` takes
        // the one byte mincore writes for it.
        let rc = unsafe {
            libc::mincore(
                (addr & !(page - 1)) as *mut libc::c_void,
                page,
                (&mut flag as *mut u8).cast(),
            )
        };
        assert_eq!(rc, 0, "mincore");
        flag & 1 == 1
    }

    #[test]
    fn released_pages_read_as_zero_and_leave_memory() {
        let n = MAP_MIN_BYTES / 4 + 5;
        let mut v = HostVec::<f32>::zeroed(n);
        v.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = i as f32 + 0.5);
        let lease = v.lease();
        assert!(resident(lease.addr()) && resident(lease.addr() + 4 * (n - 1)));
        assert_eq!(v.release_pages(), MAP_MIN_BYTES + 20);
        assert!(
            !resident(lease.addr()),
            "the first page went back to the kernel"
        );
        assert!(
            v.iter().all(|&x| x == 0.0),
            "released elements read as zero"
        );
        v[n - 1] = 3.0; // written again: faulted in, the rest still zero
        assert_eq!((v[n - 1], v[n - 2], v[0]), (3.0, 0.0, 0.0));
        assert_eq!(v.as_ptr() as usize, lease.addr(), "the address stays");
        // From the heap: nothing changes, nothing is handed back.
        let mut small = HostVec::new(vec![1.5f32; 100]);
        assert_eq!(small.release_pages(), 0);
        assert!(small.iter().all(|&x| x == 1.5));
    }

    #[test]
    fn clones_and_vecs_are_copies() {
        let v: HostVec<u8> = [1u8, 2, 3].into_iter().collect();
        let c = v.clone();
        assert_ne!(c.as_ptr(), v.as_ptr());
        assert_eq!(c, v);
        let lease = v.lease();
        let copy = v.into_vec();
        assert_ne!(copy.as_ptr() as usize, lease.addr());
        assert_eq!(copy, vec![1, 2, 3]);
    }
}
