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
//! grows while leased ([`HostVec::resize`] refuses).

use std::cell::UnsafeCell;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

/// The allocation, behind the `Arc` the vector and its leases share.
struct Cell<T>(UnsafeCell<Vec<T>>);

// SAFETY: the `Vec` inside is reached through references only by the one `HostVec` that
// owns the `Arc` (it is not `Clone`-shared: cloning a `HostVec` copies the elements), so
// moving or sharing the `Arc` between threads moves or shares at most that one owner's
// access, which `&`/`&mut HostVec` already orders. Leases hold the `Arc` only to keep the
// allocation alive and never dereference it. `T: Send` because the elements are dropped
// wherever the last owner goes.
unsafe impl<T: Send> Send for Cell<T> {}
// SAFETY: as above: a shared `&Cell` (inside a `Lease`) gives no access to the elements.
unsafe impl<T: Send> Sync for Cell<T> {}

/// A vector of `T` whose allocation can be leased to code outside Rust (see the module
/// docs). Cloning copies the elements into a new, unleased allocation.
pub struct HostVec<T> {
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

impl<T> HostVec<T> {
    /// Takes `v`'s allocation.
    pub fn new(v: Vec<T>) -> Self {
        HostVec {
            cell: Arc::new(Cell(UnsafeCell::new(v))),
        }
    }

    fn vec(&self) -> &Vec<T> {
        // SAFETY: only this `HostVec` forms references into the cell (module docs), and
        // `&self` excludes a `&mut` from `vec_mut` for as long as this one lives.
        unsafe { &*self.cell.0.get() }
    }

    fn vec_mut(&mut self) -> &mut Vec<T> {
        // SAFETY: as in `vec`; `&mut self` makes this the only reference.
        unsafe { &mut *self.cell.0.get() }
    }

    /// How many leases are alive.
    pub fn leases(&self) -> usize {
        Arc::strong_count(&self.cell) - 1
    }

    /// Changes the length to `len`, filling new elements with `value`. Refused while
    /// leased, when it would need a larger allocation (the leases would point at freed
    /// memory); shrinking, or growing within the capacity, keeps the allocation.
    pub fn resize(&mut self, len: usize, value: T) -> Result<(), Leased>
    where
        T: Clone,
    {
        let leases = self.leases();
        if leases > 0 && len > self.vec().capacity() {
            return Err(Leased { leases });
        }
        self.vec_mut().resize(len, value);
        Ok(())
    }

    /// The elements as a `Vec`: the allocation itself when nothing leases it, else a copy.
    pub fn into_vec(self) -> Vec<T>
    where
        T: Clone,
    {
        match Arc::try_unwrap(self.cell) {
            Ok(cell) => cell.0.into_inner(),
            Err(shared) => HostVec { cell: shared }.vec().clone(),
        }
    }
}

impl<T: Send + 'static> HostVec<T> {
    /// A lease on the allocation (see the module docs).
    pub fn lease(&self) -> Lease {
        let v = self.vec();
        Lease {
            addr: v.as_ptr() as usize,
            bytes: std::mem::size_of_val(v.as_slice()),
            _keep: self.cell.clone(),
        }
    }
}

impl<T> Deref for HostVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.vec()
    }
}

impl<T> DerefMut for HostVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.vec_mut()
    }
}

impl<T> From<Vec<T>> for HostVec<T> {
    fn from(v: Vec<T>) -> Self {
        HostVec::new(v)
    }
}

impl<T> FromIterator<T> for HostVec<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        HostVec::new(iter.into_iter().collect())
    }
}

impl<T: Clone> Clone for HostVec<T> {
    fn clone(&self) -> Self {
        HostVec::new(self.vec().clone())
    }
}

impl<T: PartialEq> PartialEq for HostVec<T> {
    fn eq(&self, other: &Self) -> bool {
        self[..] == other[..]
    }
}

impl<T: fmt::Debug> fmt::Debug for HostVec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.vec().fmt(f)
    }
}

impl<T> Default for HostVec<T> {
    fn default() -> Self {
        HostVec::new(Vec::new())
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
        let mut v = HostVec::new(Vec::with_capacity(8));
        v.resize(4, 1u16).unwrap();
        let lease = v.lease();
        v.resize(8, 2).unwrap(); // within the capacity: same allocation
        assert_eq!(v.as_ptr() as usize, lease.addr());
        v.resize(2, 0).unwrap();
        assert_eq!(v.resize(64, 0), Err(Leased { leases: 1 }));
        assert_eq!(&v[..], &[1, 1]);
        drop(lease);
        v.resize(64, 3).unwrap();
        assert_eq!(v.len(), 64);
    }

    #[test]
    fn clones_and_into_vec_copy_only_when_leased() {
        let v = HostVec::new(vec![1u8, 2, 3]);
        let c = v.clone();
        assert_ne!(c.as_ptr(), v.as_ptr());
        assert_eq!(c, v);
        let ptr = v.as_ptr() as usize;
        let back = v.into_vec();
        assert_eq!(
            back.as_ptr() as usize,
            ptr,
            "unleased: the allocation itself"
        );
        let v = HostVec::new(vec![4u8, 5]);
        let lease = v.lease();
        let copy = v.into_vec();
        assert_ne!(copy.as_ptr() as usize, lease.addr(), "leased: a copy");
        assert_eq!(copy, vec![4, 5]);
    }
}
