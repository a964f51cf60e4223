//! A PTX parser and a strict, warp-vectorized interpreter: the kernels NVRTC writes for
//! zero (PTX ISA 8.x–9.x, `sm_90`) run on the CPU with the GPU's bits and every access
//! checked.
//!
//! # Parsing
//! [`Module::parse`] reads a module's text once and decodes every instruction into a
//! compact form: labels become instruction indices, registers dense indices per kernel,
//! immediates numbers, and each arithmetic instruction a function over the 32 lanes of a
//! warp chosen for its exact type and modifiers. An instruction or modifier the
//! interpreter does not implement (atomics, shuffles, votes, tensor ops, calls, `.func`,
//! approximate math, directed rounding of arithmetic, ...) is a [`PtxError`] naming it and
//! its line, never a wrong result at run time.
//!
//! # Execution
//! [`launch`] runs a grid's blocks one after another. A block's threads form warps of 32
//! lanes whose registers are stored as structure-of-arrays; each instruction is applied
//! to all active lanes at once. Each lane has its own program counter; the lanes at the
//! smallest one run together (min-pc reconvergence), so divergent branches and loops
//! reconverge where they meet again.
//!
//! Warps of a block run one at a time in an order shuffled from [`ExecOptions::seed`]:
//! each runs until all its live lanes wait at a barrier or have exited. When every
//! thread of the block that has not exited waits, the barrier releases (a new interval,
//! a new order). Threads that exited count as arrived (so `if (tid >= n) return;` before
//! a `__syncthreads()` works, as on sm_70 and newer). Threads waiting at barriers with
//! different ids, which could never all be released, are a fault, not a hang.
//! `bar.sync` with a thread count smaller than the block is not supported (a fault).
//!
//! # Memory
//! - Global memory goes to the caller's [`GlobalMemory`].
//! - Shared memory (static `.shared` variables, then the dynamic bytes of the launch) lives
//!   here, per block, poisoned: reading a byte no thread wrote is a fault. Within one
//!   barrier interval a byte written by one thread and read or written by another, or read
//!   by one and then written by another, is a race fault naming both threads, the byte,
//!   both PTX lines and "no bar.sync between them" (lanes of one warp count as different
//!   threads; a `bar.warp.sync` orders the accesses of its warp's lanes).
//! - Local memory (`.local` declarations) is per thread, bounds- and
//!   initialization-checked.
//! - Kernel parameters are read from the packed buffer of the launch; writing them is a
//!   fault.
//!
//! State-space addresses are offsets: a `.shared` variable's address (`mov.u64 %rd,
//! var`) is its offset in the block's shared memory, a parameter's its offset in the
//! parameter buffer, a `.local` variable's its offset in the thread's local memory.
//! Generic addresses of those spaces lie in fixed windows of [`WINDOW_BYTES`] bytes:
//! [`SHARED_WINDOW`], [`LOCAL_WINDOW`] and [`PARAM_WINDOW`] plus the offset (`cvta`
//! adds or subtracts the base); every other generic address is global memory, and
//! `cvta.to.global` / `cvta.global` are the identity. A memory model must therefore
//! never hand out device addresses inside `[SHARED_WINDOW, PARAM_WINDOW + WINDOW_BYTES)`.
//!
//! Every access must be aligned to its size (a vector access to the whole vector's size),
//! else "misaligned address", as on the GPU. Every fault is an [`ExecError::Fault`] with
//! the kernel, block, thread, PTX line and its text.
//!
//! # Arithmetic (sm_90's results)
//! Registers hold raw bits; instructions reinterpret them. Integer arithmetic wraps;
//! shift amounts clamp at the width; integer division by zero gives all ones (quotient)
//! or the dividend (remainder), never a panic. `.rn` f32/f64 add, sub, mul, div, sqrt,
//! rcp and fma are IEEE round-to-nearest-even (plain `add.f32` is `.rn`); subnormals are
//! kept unless `.ftz`; every NaN an f32 (f64) operation produces is `0x7fffffff`
//! (`0x7fffffffffffffff`), a 16-bit one `0x7fff`. `min`/`max` return the other operand
//! for one NaN, and order `-0 < +0`.

#![warn(missing_docs)]

mod decode;
mod exec;
mod lex;
mod ops;
mod parse;
mod shared;

#[cfg(test)]
mod nvrtc;
#[cfg(test)]
mod testmem;
#[cfg(test)]
mod tests_kernels;

use std::fmt;

/// Base of the generic-address window of shared memory: generic `SHARED_WINDOW + o` is
/// byte `o` of the block's shared memory.
pub const SHARED_WINDOW: u64 = 0x0000_0100_0000_0000;
/// Base of the generic-address window of the issuing thread's local memory.
pub const LOCAL_WINDOW: u64 = 0x0000_0200_0000_0000;
/// Base of the generic-address window of the kernel parameters (read only).
pub const PARAM_WINDOW: u64 = 0x0000_0300_0000_0000;
/// Size of each window; global memory must lie outside all three.
pub const WINDOW_BYTES: u64 = 1 << 32;

/// Shared memory a block may always use (static and dynamic together), as on the GPU.
pub const DEFAULT_SHARED_LIMIT: u32 = 48 * 1024;
/// The most shared memory an sm_90 block may use with an opt-in (227 KiB).
pub const MAX_SHARED_LIMIT: u32 = 227 * 1024;
/// The most threads in a block.
pub const MAX_BLOCK_THREADS: u32 = 1024;

/// A parsed PTX module: its kernels, decoded and ready to launch.
#[derive(Debug)]
pub struct Module {
    target: String,
    version: (u32, u32),
    kernels: Vec<Kernel>,
}

impl Module {
    /// Parses a PTX module's text; errors name the line and what was not understood.
    pub fn parse(text: &str) -> Result<Module, PtxError> {
        parse::parse_module(text)
    }

    /// The `.target` (e.g. "sm_90").
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The `.version` (e.g. (9, 0)).
    pub fn version(&self) -> (u32, u32) {
        self.version
    }

    /// The kernel (`.entry`) of that name.
    pub fn kernel(&self, name: &str) -> Option<&Kernel> {
        self.kernels.iter().find(|k| k.name == name)
    }

    /// The names of every kernel, in the order of the text.
    pub fn kernel_names(&self) -> Vec<&str> {
        self.kernels.iter().map(|k| k.name.as_str()).collect()
    }
}

/// One kernel (`.entry`), decoded.
pub struct Kernel {
    name: String,
    params: Vec<ParamSlot>,
    param_names: Vec<String>,
    param_bytes: usize,
    code: Vec<decode::Inst>,
    data_regs: u32,
    pred_regs: u32,
    declared_regs: u32,
    shared_vars: Vec<shared::Var>,
    static_shared: usize,
    dynamic_shared_align: usize,
    local_vars: Vec<shared::Var>,
    local_bytes: usize,
    maxntid: Option<[u32; 3]>,
    reqntid: Option<[u32; 3]>,
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.name)
            .field("params", &self.params)
            .field("instructions", &self.code.len())
            .field("static_shared", &self.static_shared)
            .field("local_bytes", &self.local_bytes)
            .finish()
    }
}

impl Kernel {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Each parameter's byte offset and size in the packed parameter buffer (PTX .param
    /// layout with alignment).
    pub fn params(&self) -> &[ParamSlot] {
        &self.params
    }

    /// Each parameter's name, in the order of [`params`](Self::params).
    pub fn param_names(&self) -> &[String] {
        &self.param_names
    }

    /// Size of the packed parameter buffer: the end of the last parameter (no padding
    /// after it); 0 for a kernel without parameters.
    pub fn param_bytes(&self) -> usize {
        self.param_bytes
    }

    /// Bytes of static shared memory: every module-scope `.shared` variable and the
    /// kernel's own, laid out with their alignment.
    pub fn static_shared_bytes(&self) -> usize {
        self.static_shared
    }

    /// Bytes of local memory per thread (its `.local` declarations).
    pub fn local_bytes(&self) -> usize {
        self.local_bytes
    }

    /// The product of `.maxntid` (or `.reqntid`), if the kernel declares one.
    pub fn max_threads(&self) -> Option<u32> {
        self.reqntid
            .or(self.maxntid)
            .map(|d| d.iter().map(|&x| x.max(1)).product())
    }

    /// The number of declared registers other than predicates (the `.reg` ranges; what
    /// `cuFuncGetAttribute(NUM_REGS)` reports in this stand-in).
    pub fn registers(&self) -> u32 {
        self.declared_regs
    }

    /// The number of decoded instructions.
    pub fn instruction_count(&self) -> usize {
        self.code.len()
    }
}

/// Where one parameter lies in the packed parameter buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamSlot {
    /// Byte offset from the start of the buffer (a multiple of `align`).
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
    /// Alignment in bytes.
    pub align: usize,
}

/// The shape of a launch.
#[derive(Clone, Copy, Debug)]
pub struct LaunchDims {
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub dynamic_shared_bytes: u32,
}

/// How a launch runs.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExecOptions {
    /// Seeds the order in which a block's warps run between barriers.
    pub seed: u64,
    /// The most shared memory (static + dynamic) a block may use, as raised by
    /// `cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)`; values below 48 KiB (0
    /// included) mean 48 KiB. Never more than [`MAX_SHARED_LIMIT`].
    pub max_shared_bytes: u32,
    /// The most warp instructions the launch may run (0: no limit): past it the launch
    /// faults, so an endless loop in a kernel is an error instead of a hang.
    pub max_warp_instructions: u64,
}

/// What a launch executed.
#[derive(Debug, Default, Clone)]
pub struct LaunchStats {
    /// Instructions issued, counted once per warp.
    pub warp_instructions: u64,
    /// Instructions executed, counted once per active thread (guard true).
    pub thread_instructions: u64,
    /// Blocks run.
    pub blocks: u64,
}

/// Global memory as the kernel sees it; implemented by the driver's memory model (checks
/// bounds, initialization, races, and counts traffic).
pub trait GlobalMemory {
    /// For each i: loads `size` bytes (1, 2, 4, 8 or 16) at `addrs[i]` into the low bytes
    /// of `out[i]` (little-endian). `threads[i]` is the issuing thread's linear index in
    /// the block. An Err aborts the launch; its text names the allocation and offset, the
    /// interpreter adds the rest.
    fn load(
        &mut self,
        size: u32,
        addrs: &[u64],
        threads: &[u32],
        out: &mut [u128],
    ) -> Result<(), String>;
    /// For each i: stores the low `size` bytes of `vals[i]` at `addrs[i]`, in order of i.
    /// Errors as for [`load`](Self::load).
    fn store(
        &mut self,
        size: u32,
        addrs: &[u64],
        threads: &[u32],
        vals: &[u128],
    ) -> Result<(), String>;
    /// Called once before each block starts (the block's index), so the memory model can
    /// attribute accesses.
    fn begin_block(&mut self, _block: [u32; 3]) {}
}

/// Runs every block of the grid (blocks one after another, x fastest). Ok: statistics.
/// Err: the launch was refused ([`ExecError::LaunchLimit`], [`ExecError::ParamSize`]) or
/// the first fault, with context.
pub fn launch(
    kernel: &Kernel,
    dims: &LaunchDims,
    params: &[u8],
    mem: &mut dyn GlobalMemory,
    opts: &ExecOptions,
) -> Result<LaunchStats, ExecError> {
    exec::launch(kernel, dims, params, mem, opts)
}

/// A PTX text the parser did not accept.
#[derive(Debug, thiserror::Error)]
pub enum PtxError {
    /// Malformed or unexpected text.
    #[error("PTX line {line}: {message} (`{text}`)")]
    Syntax {
        /// 1-based line number.
        line: u32,
        /// The line's text.
        text: String,
        /// What was wrong.
        message: String,
    },
    /// An instruction, modifier or directive the interpreter does not implement.
    #[error("PTX line {line}: `{what}` is not supported by the interpreter{} (`{text}`)", if reason.is_empty() { String::new() } else { format!(": {reason}") })]
    Unsupported {
        /// 1-based line number.
        line: u32,
        /// The line's text.
        text: String,
        /// The instruction or directive.
        what: String,
        /// Why, where there is more to say.
        reason: String,
    },
}

impl PtxError {
    /// The 1-based line the error is about.
    pub fn line(&self) -> u32 {
        match self {
            PtxError::Syntax { line, .. } | PtxError::Unsupported { line, .. } => *line,
        }
    }
}

/// A launch that was refused or faulted.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The launch shape breaks a limit of the kernel or the device.
    #[error("launch of `{kernel}` refused: {limit} is {value}, more than the allowed {max}")]
    LaunchLimit {
        /// The kernel.
        kernel: String,
        /// Which limit (for example "threads per block").
        limit: String,
        /// The launch's value.
        value: u64,
        /// The limit.
        max: u64,
    },
    /// The launch shape is invalid (a zero dimension).
    #[error("launch of `{kernel}` refused: {message}")]
    BadLaunch {
        /// The kernel.
        kernel: String,
        /// What is wrong.
        message: String,
    },
    /// The parameter buffer does not have the kernel's size.
    #[error("launch of `{kernel}` refused: the parameter buffer holds {actual} bytes, the kernel's parameters take {expected}")]
    ParamSize {
        /// The kernel.
        kernel: String,
        /// [`Kernel::param_bytes`].
        expected: usize,
        /// The buffer's length.
        actual: usize,
    },
    /// A thread did something a GPU would fault on, or that the checks forbid.
    #[error("fault in kernel `{kernel}`, block ({}, {}, {}), thread ({}, {}, {}), PTX line {line} `{text}`: {message}", block[0], block[1], block[2], thread[0], thread[1], thread[2])]
    Fault {
        /// The kernel.
        kernel: String,
        /// The block's index.
        block: [u32; 3],
        /// The thread's index in its block.
        thread: [u32; 3],
        /// 1-based PTX line of the instruction.
        line: u32,
        /// The instruction's text.
        text: String,
        /// What went wrong (with the memory system's message).
        message: String,
    },
}

#[cfg(test)]
mod tests;
