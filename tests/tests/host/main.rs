//! The engine, its checkpoints, offload and shard groups on the host (CPU ranks as
//! threads or child processes): one test executable of eighteen modules, so that the
//! engine's generic code is compiled and linked once for all of them rather than once per
//! file (eighteen executables took a quarter of CI's test build).
//!
//! A test that sets a process-wide variable (`offload_budget`, `offload_chunks`), reads the
//! GPU pool's process-wide peak (`engine_gpu_memory`) or runs on the GPU stand-in stays an
//! executable of its own, beside this one. Run one module with its path as the filter:
//! `cargo test -p zero-tests --test host engine_equivalence::`.

mod checkpoint_crash;
mod checkpoint_errors;
mod checkpoint_reshard;
mod checkpoint_resume;
mod engine_accounting;
mod engine_accumulation_window;
mod engine_equivalence;
mod engine_frontend_api;
mod engine_held;
mod engine_micro_step;
mod engine_misuse;
mod engine_optimizer_api;
mod engine_overflow;
mod offload_checkpoint;
mod offload_equivalence;
mod offload_errors;
mod shard_groups;
mod sharded_adam;
