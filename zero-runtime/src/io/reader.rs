//! Reads byte ranges of a file, whole checksummed chunks at a time.

use super::{open_maybe_direct, os, AlignedBuf, IoError, ALIGN, CHUNK};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Bytes a reader was asked for, and bytes it read from the file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Bytes asked for.
    pub requested: u64,
    /// Bytes read (whole chunks, each at most once while it stays in the buffer).
    pub read: u64,
}

/// Reads ranges of one file. Each range is read as the whole [`CHUNK`]s that hold it,
/// and every chunk is checked against the CRC-32C recorded when the file was written
/// (where one is given), so a damaged byte in anything read is an error naming the file.
/// The chunks last read stay in the buffer, so ranges asked for in order share them.
#[derive(Debug)]
pub struct RangeReader {
    path: PathBuf,
    file: std::fs::File,
    len: u64,
    chunk_crcs: Option<Vec<u32>>,
    buf: AlignedBuf,
    /// The file range the buffer holds, verified.
    held: std::ops::Range<u64>,
    stats: ReadStats,
}

impl RangeReader {
    /// Opens `path`, which must be `len` bytes long, with the chunk checksums written
    /// with it (or `None` to read unverified), reading through a buffer of about
    /// `buffer_bytes` (whole chunks).
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
        // No more than the file needs.
        let chunks = (buffer_bytes / CHUNK)
            .min(len.div_ceil(CHUNK as u64) as usize)
            .max(1);
        Ok(Self {
            path: path.to_path_buf(),
            file,
            len,
            chunk_crcs,
            buf: AlignedBuf::new(chunks * CHUNK),
            held: 0..0,
            stats: ReadStats::default(),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's length.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
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
            .filter(|&e| e <= self.len)
            .ok_or_else(|| IoError::OutOfRange {
                path: self.path.clone(),
                start,
                end: start.saturating_add(len),
                len: self.len,
            })?;
        self.stats.requested += len;
        let mut pos = start;
        while pos < end {
            if !self.held.contains(&pos) {
                self.load(pos, end)?;
            }
            let take = (end.min(self.held.end) - pos) as usize;
            let at = (pos - self.held.start) as usize;
            sink(pos - start, &self.buf.as_slice()[at..at + take])?;
            pos += take as u64;
        }
        Ok(())
    }

    /// Fills the buffer with the chunks from the one holding `pos` to the one holding
    /// `end - 1` (as many as fit), verified.
    fn load(&mut self, pos: u64, end: u64) -> Result<(), IoError> {
        let chunk = CHUNK as u64;
        let first = pos / chunk * chunk;
        let last = end.div_ceil(chunk) * chunk;
        let want = (self.buf.len() as u64)
            .min(last - first)
            .min(self.len - first) as usize;
        // O_DIRECT reads whole blocks; past the end of the file the read just stops.
        let ask = want.div_ceil(ALIGN) * ALIGN;
        let buf = &mut self.buf.as_mut_slice()[..ask];
        let mut got = 0;
        while got < want {
            let n = self
                .file
                .read_at(&mut buf[got..], first + got as u64)
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
        self.stats.read += want as u64;
        if let Some(crcs) = &self.chunk_crcs {
            for (i, bytes) in buf[..want].chunks(CHUNK).enumerate() {
                let index = (first / chunk) as usize + i;
                let found = crc32c::crc32c(bytes);
                let expected = crcs[index];
                if found != expected {
                    self.held = 0..0;
                    let start = index as u64 * chunk;
                    return Err(IoError::Checksum {
                        path: self.path.clone(),
                        start,
                        end: start + bytes.len() as u64,
                        found,
                        expected,
                    });
                }
            }
        }
        self.held = first..first + want as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::FileWriter;

    #[test]
    fn ranges_come_back_verified_and_counted() {
        let d = std::env::temp_dir().join(format!("zero-io-reader-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let path = d.join("data");
        let data: Vec<u8> = (0..3 * CHUNK + 777).map(|i| (i * 7 % 253) as u8).collect();
        let mut w = FileWriter::create(&path, 4 * ALIGN).unwrap();
        w.write(&data).unwrap();
        let written = w.finish().unwrap();
        let mut r = RangeReader::open(
            &path,
            written.bytes,
            Some(written.chunk_crc32c.clone()),
            CHUNK,
        )
        .unwrap();
        for (s, l) in [
            (0u64, 10u64),
            (5, 10),
            (CHUNK as u64 - 3, 9),
            (3 * CHUNK as u64, 777),
        ] {
            let mut got = Vec::new();
            r.read(s, l, |_, b| {
                got.extend_from_slice(b);
                Ok::<(), IoError>(())
            })
            .unwrap();
            assert_eq!(got, &data[s as usize..(s + l) as usize]);
        }
        let st = r.stats();
        assert_eq!(st.requested, 10 + 10 + 9 + 777);
        // Chunk 0 once (the second and third ranges reuse it), chunk 1 for the rest of the
        // third, then the tail.
        assert_eq!(st.read, (2 * CHUNK + 777) as u64);
        let err = r.read(data.len() as u64 - 1, 2, |_, _| Ok::<(), IoError>(()));
        assert!(matches!(err, Err(IoError::OutOfRange { .. })));

        // A flipped byte: the chunk holding it fails, naming the file and the bytes.
        let mut bad = data.clone();
        bad[CHUNK + 100] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        let mut r =
            RangeReader::open(&path, written.bytes, Some(written.chunk_crc32c), CHUNK).unwrap();
        r.read(0, 10, |_, _| Ok::<(), IoError>(())).unwrap();
        let err = r
            .read(CHUNK as u64 + 5, 1, |_, _| Ok::<(), IoError>(()))
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
