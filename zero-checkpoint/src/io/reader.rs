//! Reads byte ranges of a file, whole checksummed chunks at a time, reading ahead.

use super::{open_maybe_direct, os, AlignedBuf, IoError, ALIGN, CHUNK};
use crossbeam_channel::{bounded, Receiver, Sender};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Bytes a reader was asked for, and bytes it read from the file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Bytes asked for.
    pub requested: u64,
    /// Bytes read (whole chunks, each at most once while it stays in the buffer).
    pub read: u64,
}

/// What the reading needs, shared with the read-ahead thread.
#[derive(Debug)]
struct Source {
    path: PathBuf,
    file: std::fs::File,
    len: u64,
    chunk_crcs: Option<Vec<u32>>,
}

/// Verified bytes of the file: `range`, at the start of `buf`.
#[derive(Debug)]
struct Window {
    buf: AlignedBuf,
    range: std::ops::Range<u64>,
}

impl Source {
    /// Reads `want` bytes from `first` (a chunk boundary) into `buf` and checks every
    /// chunk; the window, or the error with the buffer back.
    fn read(
        &self,
        mut buf: AlignedBuf,
        first: u64,
        want: usize,
    ) -> Result<Window, (AlignedBuf, IoError)> {
        match self.fill(&mut buf, first, want) {
            Ok(()) => Ok(Window {
                buf,
                range: first..first + want as u64,
            }),
            Err(e) => Err((buf, e)),
        }
    }

    fn fill(&self, buf: &mut AlignedBuf, first: u64, want: usize) -> Result<(), IoError> {
        // O_DIRECT reads whole blocks; past the end of the file the read just stops.
        let ask = want.div_ceil(ALIGN) * ALIGN;
        let bytes = &mut buf.as_mut_slice()[..ask];
        let mut got = 0;
        while got < want {
            let n = self
                .file
                .read_at(&mut bytes[got..], first + got as u64)
                .map_err(os("reading", &self.path))?;
            if n == 0 {
                return Err(IoError::Size {
                    path: self.path.clone(),
                    actual: first + got as u64,
                    expected: self.len,
                });
            }
            got += n;
        }
        if let Some(crcs) = &self.chunk_crcs {
            let chunk = CHUNK as u64;
            for (i, c) in bytes[..want].chunks(CHUNK).enumerate() {
                let index = (first / chunk) as usize + i;
                let found = crc32c::crc32c(c);
                let expected = crcs[index];
                if found != expected {
                    let start = index as u64 * chunk;
                    return Err(IoError::Checksum {
                        path: self.path.clone(),
                        start,
                        end: start + c.len() as u64,
                        found,
                        expected,
                    });
                }
            }
        }
        Ok(())
    }
}

type Reply = Result<Window, (AlignedBuf, IoError)>;

/// Reads ranges of one file. With the CRC-32Cs recorded when the file was written, each
/// range is read as the whole [`CHUNK`]s that hold it and every chunk is checked, so a
/// damaged byte in anything read is an error naming the file; without them (a file zero
/// did not write), as the whole [`ALIGN`]-byte blocks that hold it, so little more than
/// the range is read.
/// The chunks last read stay in the buffer, so ranges asked for in order share them.
///
/// The buffer is two windows: while the caller consumes one, an I/O thread reads and
/// verifies the next part of the same range into the other. It never reads past the range
/// asked for (beyond rounding to whole chunks).
#[derive(Debug)]
pub struct RangeReader {
    src: Arc<Source>,
    /// What a read is rounded out to: a checksummed chunk, or an aligned block.
    granule: u64,
    window: usize,
    cur: Option<Window>,
    spare: Option<AlignedBuf>,
    /// Where the window being read ahead starts.
    ahead: Option<u64>,
    to_io: Option<Sender<(AlignedBuf, u64, usize)>>,
    from_io: Receiver<Reply>,
    thread: Option<JoinHandle<()>>,
    stats: ReadStats,
}

impl RangeReader {
    /// Opens `path`, which must be `len` bytes long, with the chunk checksums written
    /// with it (or `None` to read unverified), reading through about `buffer_bytes` (two
    /// windows of whole chunks, no more than the file needs).
    pub fn open(
        path: &Path,
        len: u64,
        chunk_crcs: Option<Vec<u32>>,
        buffer_bytes: usize,
    ) -> Result<Self, IoError> {
        let mut options = std::fs::OpenOptions::new();
        options.read(true);
        let (file, _direct) = open_maybe_direct(&mut options, path, "opening")?;
        let actual = file
            .metadata()
            .map_err(os("reading the size of", path))?
            .len();
        if actual != len {
            return Err(IoError::Size {
                path: path.to_path_buf(),
                actual,
                expected: len,
            });
        }
        if let Some(c) = &chunk_crcs {
            let want = len.div_ceil(CHUNK as u64);
            if c.len() as u64 != want {
                return Err(IoError::Size {
                    path: path.to_path_buf(),
                    actual: c.len() as u64 * CHUNK as u64,
                    expected: len,
                });
            }
        }
        let chunks = (buffer_bytes / 2 / CHUNK)
            .min(len.div_ceil(CHUNK as u64) as usize)
            .max(1);
        let src = Arc::new(Source {
            path: path.to_path_buf(),
            file,
            len,
            chunk_crcs,
        });
        let (to_io, jobs) = bounded::<(AlignedBuf, u64, usize)>(1);
        let (done, from_io) = bounded::<Reply>(1);
        let thread = {
            let src = src.clone();
            std::thread::Builder::new()
                .name("zero-io-read".into())
                .spawn(move || {
                    for (buf, first, want) in jobs {
                        if done.send(src.read(buf, first, want)).is_err() {
                            break;
                        }
                    }
                })
                .map_err(os("starting the I/O thread for", path))?
        };
        let granule = if src.chunk_crcs.is_some() {
            CHUNK
        } else {
            ALIGN
        } as u64;
        Ok(Self {
            src,
            granule,
            window: chunks * CHUNK,
            cur: None,
            spare: Some(AlignedBuf::new(chunks * CHUNK)),
            ahead: None,
            to_io: Some(to_io),
            from_io,
            thread: Some(thread),
            stats: ReadStats::default(),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.src.path
    }

    /// The file's length.
    pub fn len(&self) -> u64 {
        self.src.len
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.src.len == 0
    }

    /// What was asked for and read so far.
    pub fn stats(&self) -> ReadStats {
        self.stats
    }

    /// Reads `start..start + len`, handing it to `sink` piece by piece as (offset in the
    /// range, bytes).
    pub fn read<E: From<IoError>>(
        &mut self,
        start: u64,
        len: u64,
        mut sink: impl FnMut(u64, &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let end = start
            .checked_add(len)
            .filter(|&e| e <= self.src.len)
            .ok_or_else(|| IoError::OutOfRange {
                path: self.src.path.clone(),
                start,
                end: start.saturating_add(len),
                len: self.src.len,
            })?;
        self.stats.requested += len;
        let mut pos = start;
        while pos < end {
            if !self.cur.as_ref().is_some_and(|w| w.range.contains(&pos)) {
                self.load(pos, end)?;
            }
            self.read_ahead(end)?;
            let w = self.cur.as_ref().ok_or_else(|| IoError::Thread {
                path: self.src.path.clone(),
            })?;
            let take = (end.min(w.range.end) - pos) as usize;
            let at = (pos - w.range.start) as usize;
            sink(pos - start, &w.buf.as_slice()[at..at + take])?;
            pos += take as u64;
        }
        Ok(())
    }

    /// The window starting at `first` and as long as the window size, the range's end and
    /// the file allow.
    fn span(&self, first: u64, end: u64) -> usize {
        let last = end.div_ceil(self.granule) * self.granule;
        (self.window as u64)
            .min(last - first)
            .min(self.src.len - first) as usize
    }

    /// Makes the window holding `pos` current: the one read ahead, or one read now (up to
    /// `end`, the end of the range being read).
    fn load(&mut self, pos: u64, end: u64) -> Result<(), IoError> {
        let first = pos / self.granule * self.granule;
        if let Some(at) = self.ahead {
            let w = self.wait_ahead()?;
            if at == first {
                if let Some(old) = self.cur.replace(w) {
                    self.spare = Some(old.buf);
                }
                return Ok(());
            }
            self.spare = Some(w.buf);
        }
        let buf = match (self.spare.take(), self.cur.take()) {
            (Some(b), cur) => {
                self.cur = cur;
                b
            }
            (None, Some(w)) => w.buf,
            (None, None) => AlignedBuf::new(self.window),
        };
        // Read synchronously: nothing useful was read ahead.
        let want = self.span(first, end);
        let w = self.src.read(buf, first, want).map_err(|(buf, e)| {
            self.spare = Some(buf);
            e
        })?;
        self.stats.read += want as u64;
        if let Some(old) = self.cur.replace(w) {
            self.spare = Some(old.buf);
        }
        Ok(())
    }

    /// While more of the range than the current window holds is wanted, reads the next
    /// window on the I/O thread.
    fn read_ahead(&mut self, end: u64) -> Result<(), IoError> {
        let Some(next) = self.cur.as_ref().map(|w| w.range.end) else {
            return Ok(());
        };
        if self.ahead.is_some() || next >= end {
            return Ok(());
        }
        let Some(buf) = self.spare.take() else {
            return Ok(());
        };
        let want = self.span(next, end);
        let sender = self.to_io.as_ref().ok_or_else(|| IoError::Thread {
            path: self.src.path.clone(),
        })?;
        sender
            .send((buf, next, want))
            .map_err(|_| IoError::Thread {
                path: self.src.path.clone(),
            })?;
        self.stats.read += want as u64;
        self.ahead = Some(next);
        Ok(())
    }

    fn wait_ahead(&mut self) -> Result<Window, IoError> {
        self.ahead = None;
        match self.from_io.recv() {
            Ok(Ok(w)) => Ok(w),
            Ok(Err((buf, e))) => {
                self.spare = Some(buf);
                Err(e)
            }
            Err(_) => Err(IoError::Thread {
                path: self.src.path.clone(),
            }),
        }
    }
}

impl Drop for RangeReader {
    fn drop(&mut self) {
        if self.ahead.is_some() {
            let _ = self.from_io.recv();
        }
        self.to_io = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::FileWriter;

    #[test]
    fn without_checksums_a_range_costs_its_aligned_blocks_only() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("plain");
        let data: Vec<u8> = (0..3 * CHUNK + 123).map(|i| (i * 13 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let mut r = RangeReader::open(&path, data.len() as u64, None, 2 * CHUNK).unwrap();
        let block = ALIGN as u64;
        // Inside one block; across two blocks; the file's tail.
        for (s, l, blocks) in [
            (10u64, 20u64, 1u64),
            (5 * block - 8, 16, 2),
            (data.len() as u64 - 100, 100, 1),
        ] {
            let before = r.stats().read;
            let mut got = Vec::new();
            r.read(s, l, |_, b| {
                got.extend_from_slice(b);
                Ok::<(), IoError>(())
            })
            .unwrap();
            assert_eq!(got, &data[s as usize..(s + l) as usize]);
            let cost = r.stats().read - before;
            assert!(cost <= blocks * block, "{s}+{l}: read {cost} bytes");
        }
    }

    #[test]
    fn ranges_come_back_verified_and_counted() {
        let d = std::env::temp_dir().join(format!("zero-io-reader-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let path = d.join("data");
        let data: Vec<u8> = (0..9 * CHUNK + 777).map(|i| (i * 7 % 253) as u8).collect();
        let mut w = FileWriter::create(&path, 4 * ALIGN).unwrap();
        w.write(&data).unwrap();
        let written = w.finish().unwrap();
        // Windows of one chunk, so long ranges are read ahead window after window.
        let mut r = RangeReader::open(
            &path,
            written.bytes,
            Some(written.chunk_crc32c.clone()),
            2 * CHUNK,
        )
        .unwrap();
        let chunk = CHUNK as u64;
        for (s, l) in [
            (0u64, 10u64),
            (5, 10),
            (chunk - 3, 9),
            (chunk + 1, 5 * chunk),
            (9 * chunk, 777),
        ] {
            let mut got = Vec::new();
            r.read(s, l, |at, b| {
                assert_eq!(at as usize, got.len());
                got.extend_from_slice(b);
                Ok::<(), IoError>(())
            })
            .unwrap();
            assert_eq!(got, &data[s as usize..(s + l) as usize], "{s}+{l}");
        }
        let st = r.stats();
        assert_eq!(st.requested, 10 + 10 + 9 + 5 * chunk + 777);
        // Chunks 0..=6 once each (0 for the first three ranges, 1 for the third, 1..=6
        // for the fourth, read ahead), then the tail: no chunk beyond a range is read.
        assert_eq!(st.read, 7 * chunk + 777);
        let err = r.read(data.len() as u64 - 1, 2, |_, _| Ok::<(), IoError>(()));
        assert!(matches!(err, Err(IoError::OutOfRange { .. })));

        // A flipped byte: the chunk holding it fails, naming the file and the bytes, also
        // when it is read ahead.
        let mut bad = data.clone();
        bad[3 * CHUNK + 100] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        let mut r = RangeReader::open(
            &path,
            written.bytes,
            Some(written.chunk_crc32c.clone()),
            2 * CHUNK,
        )
        .unwrap();
        r.read(0, 10, |_, _| Ok::<(), IoError>(())).unwrap();
        let err = r
            .read(chunk, 4 * chunk, |_, _| Ok::<(), IoError>(()))
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("data") && msg.contains("checksum"), "{msg}");
        // A truncated file is refused at open.
        std::fs::write(&path, &data[..100]).unwrap();
        let err = RangeReader::open(&path, written.bytes, None, CHUNK).unwrap_err();
        assert!(matches!(err, IoError::Size { actual: 100, .. }), "{err}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
