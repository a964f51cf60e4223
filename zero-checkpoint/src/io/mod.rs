//! The one file I/O layer of zero: aligned, direct (`O_DIRECT`) where the file
//! system allows it, checksummed while the bytes pass, and crash-safe. Checkpoints and
//! NVMe offload both use it.
//!
//! - [`AlignedBuf`]: heap memory aligned to [`ALIGN`] bytes, as `O_DIRECT` requires.
//! - [`FileWriter`]: writes a new file under a temporary name with two buffers (one fills
//!   while the other is written by an I/O thread), computes its CRC-32C — whole and per
//!   [`CHUNK`] — from the bytes as they pass, then `fsync`s, renames it into place and
//!   `fsync`s the directory. Dropped unfinished, it removes the temporary file.
//! - [`RangeReader`]: reads byte ranges of a file, rounded out to whole chunks, verifies
//!   each chunk's CRC-32C against the writer's, and counts what it read.
//! - [`write_file`]: a small file (a manifest, `latest`) written the same crash-safe way.
//! - [`SwapFile`]: a preallocated `O_DIRECT` file read and written in aligned blocks by a
//!   pool of I/O threads, while the caller computes (NVMe offload).
//!
//! Where the file system refuses `O_DIRECT` (tmpfs, some network file systems), the same
//! code runs through the page cache, with the same `fsync`s.

mod aligned;
mod reader;
mod swap;
mod writer;

pub use aligned::{AlignedBuf, ALIGN};
pub use reader::{RangeReader, ReadStats};
pub use swap::{check_direct, SwapFile, Ticket};
pub use writer::{write_file, FileWriter, WrittenFile};

use std::path::{Path, PathBuf};

/// Bytes per checksummed chunk: a range is read as the whole chunks that hold it.
pub const CHUNK: usize = 256 * 1024;

/// The default I/O buffer: the most host memory a save or a read holds for I/O.
pub const DEFAULT_BUFFER: usize = 64 << 20;

/// An I/O operation failed; names the file and what was being done.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// The operating system refused.
    #[error("{op} {}: {source}", path.display())]
    Os {
        /// What was being done (`writing`, `renaming`, …).
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// The bytes on disk are not the bytes written.
    #[error("{}: bytes {start}..{end} fail their checksum (crc32c {found:08x}, expected {expected:08x}): the file is damaged", path.display())]
    Checksum {
        /// The file.
        path: PathBuf,
        /// Start of the chunk.
        start: u64,
        /// End of the chunk.
        end: u64,
        /// The checksum of what was read.
        found: u32,
        /// The checksum recorded when it was written.
        expected: u32,
    },
    /// The file is shorter or longer than recorded.
    #[error("{}: {actual} bytes, expected {expected}: the file is truncated or was replaced", path.display())]
    Size {
        /// The file.
        path: PathBuf,
        /// Its size now.
        actual: u64,
        /// The size recorded when it was written.
        expected: u64,
    },
    /// A read asked for bytes outside the file.
    #[error("{}: bytes {start}..{end} asked for, but the file has {len}", path.display())]
    OutOfRange {
        /// The file.
        path: PathBuf,
        /// Start asked for.
        start: u64,
        /// End asked for.
        end: u64,
        /// The file's length.
        len: u64,
    },
    /// The I/O thread stopped (it panicked, or its channel closed).
    #[error("{}: the I/O thread stopped", path.display())]
    Thread {
        /// The file.
        path: PathBuf,
    },
}

pub(crate) fn os<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> IoError + 'a {
    move |source| IoError::Os {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Opens `path` with `O_DIRECT` added to `options` where the file system allows it;
/// returns the file and whether it is direct.
pub(crate) fn open_maybe_direct(
    options: &mut std::fs::OpenOptions,
    path: &Path,
    op: &'static str,
) -> Result<(std::fs::File, bool), IoError> {
    use std::os::unix::fs::OpenOptionsExt;
    let direct = options.clone().custom_flags(libc::O_DIRECT).open(path);
    match direct {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            options.open(path).map(|f| (f, false)).map_err(os(op, path))
        }
        Err(e) => Err(os(op, path)(e)),
    }
}

/// `fsync`s a directory, so a rename inside it is durable.
pub fn sync_dir(dir: &Path) -> Result<(), IoError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(os("syncing the directory", dir))
}

/// CRC-32C of each [`CHUNK`] of `bytes` that starts at `offset` in the file, continuing
/// the running chunk checksum `partial` (of the bytes of the current chunk so far).
pub(crate) fn chunk_crcs(bytes: &[u8], mut offset: u64, partial: &mut u32, done: &mut Vec<u32>) {
    let mut rest = bytes;
    while !rest.is_empty() {
        let in_chunk = (offset % CHUNK as u64) as usize;
        let take = (CHUNK - in_chunk).min(rest.len());
        *partial = crc32c::crc32c_append(*partial, &rest[..take]);
        offset += take as u64;
        rest = &rest[take..];
        if offset % CHUNK as u64 == 0 {
            done.push(*partial);
            *partial = 0;
        }
    }
}
