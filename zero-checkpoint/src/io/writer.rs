//! Crash-safe, checksummed, double-buffered file writes.

use super::{chunk_crcs, open_maybe_direct, os, sync_dir, AlignedBuf, IoError, ALIGN};
use crossbeam_channel::{bounded, Receiver, Sender};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A file that was written, synced and renamed into place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenFile {
    /// Where it is.
    pub path: PathBuf,
    /// Its length.
    pub bytes: u64,
    /// CRC-32C of all of it.
    pub crc32c: u32,
    /// CRC-32C of each [`CHUNK`](super::CHUNK) (the last one may be shorter).
    pub chunk_crc32c: Vec<u32>,
}

/// One buffer to write at `offset`: `len` bytes of `buf`.
struct Job {
    buf: AlignedBuf,
    offset: u64,
    len: usize,
}

/// Writes a new file: under a temporary name until [`finish`](Self::finish) syncs and
/// renames it; dropped before that, the temporary file is removed.
pub struct FileWriter {
    path: PathBuf,
    tmp: PathBuf,
    file: Arc<std::fs::File>,
    direct: bool,
    cur: Option<AlignedBuf>,
    fill: usize,
    base: u64,
    free: Vec<AlignedBuf>,
    in_flight: usize,
    crc: u32,
    partial: u32,
    chunks: Vec<u32>,
    to_io: Option<Sender<Job>>,
    from_io: Receiver<Result<AlignedBuf, IoError>>,
    thread: Option<JoinHandle<()>>,
    finished: bool,
}

impl std::fmt::Debug for FileWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWriter")
            .field("path", &self.path)
            .field("direct", &self.direct)
            .finish()
    }
}

impl FileWriter {
    /// Starts writing `path` (its folder must exist) through two buffers of half of
    /// `buffer_bytes` each.
    pub fn create(path: &Path, buffer_bytes: usize) -> Result<Self, IoError> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        let (file, direct) = open_maybe_direct(&mut options, &tmp, "creating")?;
        let file = Arc::new(file);
        let half = (buffer_bytes / 2).max(ALIGN) / ALIGN * ALIGN;
        let (to_io, jobs) = bounded::<Job>(2);
        let (done, from_io) = bounded::<Result<AlignedBuf, IoError>>(2);
        let thread = {
            let (file, tmp_path) = (file.clone(), tmp.clone());
            std::thread::Builder::new()
                .name("zero-io-write".into())
                .spawn(move || {
                    for job in jobs {
                        let r = write_fully(&file, &job.buf.as_slice()[..job.len], job.offset)
                            .map(|()| job.buf)
                            .map_err(os("writing", &tmp_path));
                        if done.send(r).is_err() {
                            break;
                        }
                    }
                })
                .map_err(os("starting the I/O thread for", &tmp))?
        };
        Ok(Self {
            path: path.to_path_buf(),
            tmp,
            file,
            direct,
            cur: Some(AlignedBuf::new(half)),
            fill: 0,
            base: 0,
            free: vec![AlignedBuf::new(half)],
            in_flight: 0,
            crc: 0,
            partial: 0,
            chunks: Vec::new(),
            to_io: Some(to_io),
            from_io,
            thread: Some(thread),
            finished: false,
        })
    }

    /// Whether the file is written with `O_DIRECT`.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Bytes written so far.
    pub fn position(&self) -> u64 {
        self.base + self.fill as u64
    }

    /// Appends `bytes`.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), IoError> {
        self.write_with(bytes.len(), |at, dst: &mut [u8]| {
            dst.copy_from_slice(&bytes[at..at + dst.len()]);
            Ok::<(), IoError>(())
        })
    }

    /// Appends `len` bytes that `fill` writes in place: it is called with the offset of a
    /// piece in those `len` bytes and the piece to fill, piece after piece. Pieces split
    /// only where a buffer ends, at multiples of [`ALIGN`] from the start of the file.
    pub fn write_with<E: From<IoError>>(
        &mut self,
        len: usize,
        mut fill: impl FnMut(usize, &mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut done = 0;
        while done < len {
            let start = self.fill;
            let cur = self.cur.as_mut().ok_or_else(|| IoError::Thread {
                path: self.tmp.clone(),
            })?;
            let take = (cur.len() - start).min(len - done);
            let piece = &mut cur.as_mut_slice()[start..start + take];
            fill(done, piece)?;
            let offset = self.base + start as u64;
            self.crc = crc32c::crc32c_append(self.crc, piece);
            chunk_crcs(piece, offset, &mut self.partial, &mut self.chunks);
            self.fill += take;
            done += take;
            if self.fill == cur.len() {
                self.flush(false)?;
            }
        }
        Ok(())
    }

    /// Hands the current buffer to the I/O thread and takes a free one.
    fn flush(&mut self, last: bool) -> Result<(), IoError> {
        let Some(mut buf) = self.cur.take() else {
            return Ok(());
        };
        let mut len = self.fill;
        if last && self.direct {
            // O_DIRECT writes whole blocks: pad with zeros; finish() truncates them off.
            let padded = len.div_ceil(ALIGN) * ALIGN;
            buf.as_mut_slice()[len..padded].fill(0);
            len = padded;
        }
        if len > 0 {
            let sender = self.to_io.as_ref().ok_or_else(|| IoError::Thread {
                path: self.tmp.clone(),
            })?;
            sender
                .send(Job {
                    buf,
                    offset: self.base,
                    len,
                })
                .map_err(|_| IoError::Thread {
                    path: self.tmp.clone(),
                })?;
            self.in_flight += 1;
        } else {
            self.free.push(buf);
        }
        self.base += self.fill as u64;
        self.fill = 0;
        if !last {
            let next = match self.free.pop() {
                Some(b) => b,
                None => self.wait_one()?,
            };
            self.cur = Some(next);
        }
        Ok(())
    }

    /// Waits for one write to finish; its buffer.
    fn wait_one(&mut self) -> Result<AlignedBuf, IoError> {
        let r = self.from_io.recv().map_err(|_| IoError::Thread {
            path: self.tmp.clone(),
        })?;
        self.in_flight -= 1;
        r
    }

    /// Writes what is left, truncates the padding, `fsync`s, renames the file into place
    /// and `fsync`s its folder.
    pub fn finish(mut self) -> Result<WrittenFile, IoError> {
        let total = self.position();
        self.flush(true)?;
        while self.in_flight > 0 {
            let buf = self.wait_one()?;
            self.free.push(buf);
        }
        self.stop_thread();
        if self.direct {
            self.file
                .set_len(total)
                .map_err(os("truncating", &self.tmp))?;
        }
        self.file.sync_all().map_err(os("syncing", &self.tmp))?;
        std::fs::rename(&self.tmp, &self.path).map_err(os("renaming into place", &self.path))?;
        self.finished = true;
        if let Some(dir) = self.path.parent() {
            sync_dir(if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            })?;
        }
        let mut chunks = std::mem::take(&mut self.chunks);
        if total % super::CHUNK as u64 != 0 {
            chunks.push(self.partial);
        }
        Ok(WrittenFile {
            path: self.path.clone(),
            bytes: total,
            crc32c: self.crc,
            chunk_crc32c: chunks,
        })
    }

    fn stop_thread(&mut self) {
        self.to_io = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for FileWriter {
    fn drop(&mut self) {
        self.stop_thread();
        if !self.finished {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes all of `bytes` at `offset`. A short write (after which an `O_DIRECT` retry at an
/// unaligned offset would fail with a misleading `EINVAL`) is reported as what it almost
/// always is: a full disk or a file-size limit.
fn write_fully(file: &std::fs::File, bytes: &[u8], offset: u64) -> std::io::Result<()> {
    loop {
        match file.write_at(bytes, offset) {
            Ok(n) if n == bytes.len() => return Ok(()),
            Ok(n) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::StorageFull,
                    format!(
                        "only {n} of {} bytes at offset {offset} were written: the disk is full or a file-size limit was reached",
                        bytes.len()
                    ),
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Writes a small file crash-safely: temporary name, `fsync`, rename, `fsync` of the
/// folder.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<WrittenFile, IoError> {
    let mut w = FileWriter::create(path, 2 * ALIGN.max(bytes.len().next_power_of_two()))?;
    w.write(bytes)?;
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::CHUNK;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("zero-io-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_written_file_has_its_bytes_and_checksums() {
        let d = dir("writer");
        for len in [0usize, 1, 4095, 4096, 70_001, CHUNK + 5, 3 * CHUNK] {
            let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let path = d.join(format!("f{len}"));
            // A small buffer, so the file crosses many buffers and chunk boundaries.
            let mut w = FileWriter::create(&path, 3 * ALIGN).unwrap();
            // Uneven pieces.
            let mut at = 0;
            for step in [1usize, 4097, 10, 100_000].iter().cycle() {
                if at >= len {
                    break;
                }
                let n = (*step).min(len - at);
                w.write(&data[at..at + n]).unwrap();
                at += n;
            }
            let out = w.finish().unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), data, "len {len}");
            assert_eq!(out.bytes, len as u64);
            assert_eq!(out.crc32c, crc32c::crc32c(&data));
            let want: Vec<u32> = data.chunks(CHUNK).map(crc32c::crc32c).collect();
            assert_eq!(out.chunk_crc32c, want, "len {len}");
        }
        let leftovers: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn an_unfinished_file_leaves_nothing_behind() {
        let d = dir("unfinished");
        let path = d.join("never");
        {
            let mut w = FileWriter::create(&path, 2 * ALIGN).unwrap();
            w.write(&[1u8; 20_000]).unwrap();
        }
        assert!(!path.exists());
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_failed_create_names_the_file() {
        let err = FileWriter::create(Path::new("/nonexistent-zero-dir/f"), ALIGN).unwrap_err();
        assert!(err.to_string().contains("/nonexistent-zero-dir/"), "{err}");
    }
}
