//! How the CPU kernels split work across threads.
//!
//! Work is cut into fixed-size chunks of [`PAR_CHUNK`] elements, independent of the number
//! of threads, so every result (including reductions) is the same for 1 thread and many.

/// Elements per unit of parallel work (256 KiB of f32): large enough to amortise rayon's
/// scheduling, small enough to balance two to a hundred cores.
pub const PAR_CHUNK: usize = 1 << 16;
