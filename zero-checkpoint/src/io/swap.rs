//! `SwapFile`: a preallocated file of fixed size read and written in aligned blocks by a
//! pool of I/O threads, for state that lives on NVMe (ZeRO-Infinity's swap files).
//!
//! Every transfer is a job on one buffer: the caller hands the buffer over, the job runs
//! on the I/O side while the caller computes, and [`SwapFile::wait`] hands the buffer back.
//! Jobs run in the order submitted; each is cut into `block` byte requests issued by
//! `workers` threads at once (`aio.intra_op_parallelism × aio.queue_depth`, the requests in
//! flight). `O_DIRECT` is required: a file system that refuses it (tmpfs before Linux 6.6) is an error
//! naming the path, since the page cache would hold a second copy of everything swapped.
//!
//! The file is unlinked as soon as it is open and preallocated: it holds disk space only
//! while its descriptor is open, and nothing is left in `nvme_path` after any exit, a
//! SIGKILL included (DeepSpeed's swap folders outlive a crash). Its path only names it in
//! messages.

use super::{os, AlignedBuf, IoError, ALIGN};
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::collections::HashMap;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A transfer in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket(u64);

#[derive(Clone, Copy, Debug)]
enum Dir {
    Read,
    Write,
}

struct Job {
    id: u64,
    dir: Dir,
    buf: AlignedBuf,
    offset: u64,
    len: usize,
}

type Done = (u64, Result<AlignedBuf, (AlignedBuf, IoError)>);

/// A fixed-size file of aligned blocks on an `O_DIRECT` file system.
pub struct SwapFile {
    path: PathBuf,
    len: u64,
    next: u64,
    jobs: Option<Sender<Job>>,
    done: Receiver<Done>,
    finished: HashMap<u64, Result<AlignedBuf, (AlignedBuf, IoError)>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for SwapFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwapFile")
            .field("path", &self.path)
            .field("len", &self.len)
            .finish()
    }
}

/// Whether `dir` takes `O_DIRECT` files: `Ok` or the error naming the folder.
pub fn check_direct(dir: &Path) -> Result<(), IoError> {
    let probe = dir.join(format!(".zero-direct-probe-{}", std::process::id()));
    let r = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe);
    let _ = std::fs::remove_file(&probe);
    match r {
        Ok(_) => Ok(()),
        Err(e) => Err(IoError::Os {
            op: "opening with O_DIRECT (NVMe offload needs a file system that supports it; tmpfs before Linux 6.6 does not) a file in",
            path: dir.to_path_buf(),
            source: e,
        }),
    }
}

impl SwapFile {
    /// Creates `path`, `len` bytes (a multiple of [`ALIGN`]), preallocated and unlinked at
    /// once, with `workers` I/O threads issuing `block`-byte requests.
    pub fn create(path: &Path, len: u64, workers: usize, block: usize) -> Result<Self, IoError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map_err(os("creating with O_DIRECT", path))?;
        let sized = zero_sys::fs::preallocate(&file, len).map_err(os("preallocating", path));
        std::fs::remove_file(path).map_err(os("unlinking the open swap file", path))?;
        sized?;
        let file = Arc::new(file);
        let (jobs, rx) = unbounded::<Job>();
        let (tx, done) = unbounded::<Done>();
        let workers = workers.max(1);
        let block = (block.max(ALIGN) / ALIGN) * ALIGN;
        let thread = {
            let (file, shown) = (file.clone(), path.to_path_buf());
            std::thread::Builder::new()
                .name("zero-swap".into())
                .spawn(move || {
                    for mut job in rx {
                        let r = transfer(&file, &mut job, workers, block).map_err(|e| {
                            os(
                                if matches!(job.dir, Dir::Read) {
                                    "reading"
                                } else {
                                    "writing"
                                },
                                &shown,
                            )(e)
                        });
                        let out = match r {
                            Ok(()) => Ok(job.buf),
                            Err(e) => Err((job.buf, e)),
                        };
                        if tx.send((job.id, out)).is_err() {
                            break;
                        }
                    }
                })
                .map_err(os("starting the I/O threads for", path))?
        };
        Ok(Self {
            path: path.to_path_buf(),
            len,
            next: 0,
            jobs: Some(jobs),
            done,
            finished: HashMap::new(),
            thread: Some(thread),
        })
    }

    /// The same file, named `path` in messages from now on.
    pub fn renamed(mut self, path: PathBuf) -> Self {
        self.path = path;
        self
    }

    /// The path it was created at (unlinked since).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its length.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn submit(
        &mut self,
        dir: Dir,
        buf: AlignedBuf,
        offset: u64,
        len: usize,
    ) -> Result<Ticket, IoError> {
        if offset % ALIGN as u64 != 0
            || len % ALIGN != 0
            || len > buf.len()
            || offset + len as u64 > self.len
        {
            return Err(IoError::OutOfRange {
                path: self.path.clone(),
                start: offset,
                end: offset + len as u64,
                len: self.len,
            });
        }
        let id = self.next;
        self.next += 1;
        let sender = self.jobs.as_ref().ok_or_else(|| IoError::Thread {
            path: self.path.clone(),
        })?;
        sender
            .send(Job {
                id,
                dir,
                buf,
                offset,
                len,
            })
            .map_err(|_| IoError::Thread {
                path: self.path.clone(),
            })?;
        Ok(Ticket(id))
    }

    /// Starts reading `len` bytes at `offset` (both multiples of [`ALIGN`]) into `buf`.
    pub fn read(&mut self, buf: AlignedBuf, offset: u64, len: usize) -> Result<Ticket, IoError> {
        self.submit(Dir::Read, buf, offset, len)
    }

    /// Starts writing the first `len` bytes of `buf` at `offset`.
    pub fn write(&mut self, buf: AlignedBuf, offset: u64, len: usize) -> Result<Ticket, IoError> {
        self.submit(Dir::Write, buf, offset, len)
    }

    /// Waits for `ticket`'s transfer; its buffer (read: holding the bytes).
    pub fn wait(&mut self, ticket: Ticket) -> Result<AlignedBuf, IoError> {
        loop {
            if let Some(r) = self.finished.remove(&ticket.0) {
                return r.map_err(|(_, e)| e);
            }
            let (id, r) = self.done.recv().map_err(|_| IoError::Thread {
                path: self.path.clone(),
            })?;
            self.finished.insert(id, r);
        }
    }

    /// Reads `len` bytes at `offset` now (for a checkpoint save).
    pub fn read_now(
        &mut self,
        buf: AlignedBuf,
        offset: u64,
        len: usize,
    ) -> Result<AlignedBuf, IoError> {
        let t = self.read(buf, offset, len)?;
        self.wait(t)
    }
}

/// Runs one job: `len` bytes in `block`-byte requests over `workers` threads.
fn transfer(
    file: &std::fs::File,
    job: &mut Job,
    workers: usize,
    block: usize,
) -> std::io::Result<()> {
    let bytes = &mut job.buf.as_mut_slice()[..job.len];
    let pieces: Vec<(u64, &mut [u8])> = bytes
        .chunks_mut(block)
        .enumerate()
        .map(|(i, c)| (job.offset + (i * block) as u64, c))
        .collect();
    let per = pieces.len().div_ceil(workers).max(1);
    let dir = job.dir;
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        let mut rest = pieces;
        while !rest.is_empty() {
            let take = per.min(rest.len());
            let mine: Vec<(u64, &mut [u8])> = rest.drain(..take).collect();
            handles.push(s.spawn(move || -> std::io::Result<()> {
                for (at, c) in mine {
                    match dir {
                        Dir::Read => file.read_exact_at(c, at)?,
                        Dir::Write => file.write_all_at(c, at)?,
                    }
                }
                Ok(())
            }));
        }
        for h in handles {
            h.join()
                .map_err(|_| std::io::Error::other("an I/O thread panicked"))??;
        }
        Ok(())
    })
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_written_come_back_and_transfers_overlap_the_caller() {
        let dir = std::env::temp_dir().join(format!("zero-swap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        check_direct(&dir).unwrap();
        let mut f = SwapFile::create(&dir.join("s.bin"), 64 * ALIGN as u64, 3, 2 * ALIGN).unwrap();
        // Unlinked at once: nothing is left in the folder whatever happens next.
        assert!(!dir.join("s.bin").exists());
        let mut a = AlignedBuf::new(16 * ALIGN);
        for (i, b) in a.as_mut_slice().iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let want = a.as_slice().to_vec();
        let t = f.write(a, 8 * ALIGN as u64, 16 * ALIGN).unwrap();
        let t2 = f
            .read(AlignedBuf::new(16 * ALIGN), 8 * ALIGN as u64, 16 * ALIGN)
            .unwrap();
        let back = f.wait(t2).unwrap();
        assert_eq!(back.as_slice(), &want[..]);
        f.wait(t).unwrap();
        // Unaligned or out-of-file requests are refused, naming the file.
        let e = f.read(AlignedBuf::new(ALIGN), 100, ALIGN).unwrap_err();
        assert!(e.to_string().contains("s.bin"), "{e}");
        let e = f
            .read(AlignedBuf::new(ALIGN), 64 * ALIGN as u64, ALIGN)
            .unwrap_err();
        assert!(e.to_string().contains("s.bin"), "{e}");
        drop(f);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_folder_that_cannot_take_the_file_is_named() {
        let e = check_direct(Path::new("/nonexistent-zero-nvme")).unwrap_err();
        assert!(
            e.to_string().contains("/nonexistent-zero-nvme") && e.to_string().contains("O_DIRECT"),
            "{e}"
        );
    }
}
