//! The one trait every backend implements.

use crate::{CommBuffer, CommError, CommStats, ReduceOp};

/// A collective that was issued and may still be running.
pub trait Completion {
    /// What the collective hands back (the buffers it was given, now holding the result).
    type Output;
    /// Blocks until the collective finished on every rank, failed, or timed out.
    fn wait(self) -> Result<Self::Output, CommError>;
    /// Whether `wait` would return at once.
    fn is_complete(&self) -> bool;
}

/// Collectives over a fixed group of ranks.
///
/// Every rank must issue the same collectives in the same order with matching dtype,
/// length, reduce op and root; anything else is an error on every rank. Buffers are moved
/// into the call and handed back by [`Completion::wait`], so no rank can touch a buffer a
/// collective is still using.
///
/// Lengths need not divide by the world size: rank `r`'s piece of a length-`n` buffer is
/// [`even_split`](crate::even_split)`(n, world, r)` (the first `n % world` ranks get one
/// more element).
// The `(input, output)` pair returned through a backend's own handle type reads plainest
// spelled out.
#[allow(clippy::type_complexity)]
pub trait Communicator: Send + 'static {
    /// The buffer type this backend moves.
    type Buffer: CommBuffer;
    /// The handle of an issued collective (it may move to another thread, with the engine
    /// that holds it).
    type Pending<T: Send + 'static>: Completion<Output = T> + Send;

    /// This rank, in `0..world_size()`.
    fn rank(&self) -> usize;
    /// Number of ranks in the group.
    fn world_size(&self) -> usize;

    /// Reduces `buf` element-wise across ranks; every rank gets the result in place.
    fn all_reduce(
        &self,
        buf: Self::Buffer,
        op: ReduceOp,
    ) -> Result<Self::Pending<Self::Buffer>, CommError>;

    /// Reduces `input` (the same length `n` on every rank) across ranks and writes this
    /// rank's piece `even_split(n, world, rank)` of the result into `output`. Hands back
    /// `(input, output)`.
    fn reduce_scatter(
        &self,
        input: Self::Buffer,
        output: Self::Buffer,
        op: ReduceOp,
    ) -> Result<Self::Pending<(Self::Buffer, Self::Buffer)>, CommError>;

    /// Concatenates every rank's `input` into `output` (length `n` on every rank; rank `r`
    /// gives `even_split(n, world, r).len()` elements). Hands back `(input, output)`.
    fn all_gather(
        &self,
        input: Self::Buffer,
        output: Self::Buffer,
    ) -> Result<Self::Pending<(Self::Buffer, Self::Buffer)>, CommError>;

    /// Copies `root`'s `buf` into every rank's `buf`.
    fn broadcast(
        &self,
        buf: Self::Buffer,
        root: usize,
    ) -> Result<Self::Pending<Self::Buffer>, CommError>;

    /// Completes once every rank has issued it.
    fn barrier(&self) -> Result<Self::Pending<()>, CommError>;

    /// Splits this group: the ranks that pass the same `color` form one new group, ranked
    /// by `key` (ties broken by rank in this group). A collective of this group: every
    /// rank calls it, in the same order relative to its other collectives. The new group
    /// has its own sequence numbers, counters and timeout (this group's), and lives
    /// independently of this one (either may be dropped first).
    ///
    /// A split is matched like any collective (a rank that issues something else at its
    /// position fails every rank with [`CommError::Mismatch`]); it is not counted in
    /// [`stats`](Self::stats).
    fn split(&self, color: usize, key: usize) -> Result<Self, CommError>
    where
        Self: Sized;

    /// What this rank has issued so far, per operation.
    fn stats(&self) -> CommStats;
    /// Host memory the group keeps mapped in this process for its collectives (the
    /// shared-memory group's windows; 0 where the backend keeps none of its own).
    fn held_bytes(&self) -> usize {
        0
    }
    /// Zeroes the counters.
    fn reset_stats(&self);
}
