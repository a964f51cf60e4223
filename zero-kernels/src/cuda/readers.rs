//! The streams that read a device buffer since its last write, so a later write or free
//! waits for all of them (ARCHITECTURE.md, invariant 19).
//!
//! `cudarc` keeps one read event and one write event per allocation. A write on stream W
//! waits for the last recorded read and the last write, so a read on stream A followed
//! by a read on stream B leaves only B's read in the event: A's read is forgotten. If W
//! is not A, W's write would overwrite the buffer while A still reads it; and the free
//! when the buffer is dropped (queued on the stream it was allocated on) would release
//! memory A still reads (found by zero-gpusim on the one-device group's broadcast: the
//! root's buffer, read by the comm stream and then by its rank's stream, was freed on the
//! rank's stream with nothing ordering the free after the comm stream's read).
//!
//! [`StreamReaders`] follows the reads and writes of one buffer and names the forgotten
//! readers; `GpuBuffer` makes a write (`GpuStream::write`, `write_addr`) and its own free
//! wait for an event recorded on each of them first.

use std::sync::{Arc, Mutex};
use zero_sys::cudarc::driver::CudaStream;

/// A stream's identity: its handle's address, plus one (so the null default stream is 1
/// and 0 is never a stream).
pub(crate) type StreamId = u64;

/// A stream that read the buffer: its identity, and the stream itself to order against
/// (absent in unit tests).
#[derive(Debug, Clone)]
pub(crate) struct Reader {
    pub(crate) id: StreamId,
    pub(crate) stream: Option<Arc<CudaStream>>,
}

#[derive(Debug, Default)]
struct Log {
    /// The stream whose read is in `cudarc`'s read event.
    last: Option<Reader>,
    /// Streams whose reads were displaced from the read event since the last write.
    forgotten: Vec<Reader>,
}

/// Reads and writes of one buffer by stream.
#[derive(Debug, Default)]
pub(crate) struct StreamReaders {
    log: Mutex<Log>,
}

impl StreamReaders {
    /// `reader` reads the buffer.
    pub(crate) fn read(&self, reader: Reader) {
        let Ok(mut log) = self.log.lock() else {
            return;
        };
        let id = reader.id;
        if let Some(prev) = log.last.replace(reader) {
            if prev.id != id && !log.forgotten.iter().any(|f| f.id == prev.id) {
                log.forgotten.push(prev);
            }
        }
        log.forgotten.retain(|s| s.id != id);
    }

    /// Stream `writer` writes the buffer: the readers its write does not wait for (they
    /// must be waited for first). The log starts afresh.
    pub(crate) fn write(&self, writer: StreamId) -> Vec<Reader> {
        let Ok(mut log) = self.log.lock() else {
            return Vec::new();
        };
        let racing = log
            .forgotten
            .iter()
            .filter(|s| s.id != writer)
            .cloned()
            .collect();
        *log = Log::default();
        racing
    }

    /// The forgotten readers other than `owner` (for the free on `owner`'s stream).
    pub(crate) fn forgotten_except(&self, owner: StreamId) -> Vec<Reader> {
        let Ok(log) = self.log.lock() else {
            return Vec::new();
        };
        log.forgotten
            .iter()
            .filter(|s| s.id != owner)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{Reader, StreamId, StreamReaders};

    const COMM: u64 = 0x7000_0001;
    const RANK: u64 = 0x7100_0001;
    const OTHER: u64 = 0x7200_0001;

    fn r(id: StreamId) -> Reader {
        Reader { id, stream: None }
    }

    fn ids(v: Vec<Reader>) -> Vec<StreamId> {
        v.into_iter().map(|x| x.id).collect()
    }

    #[test]
    fn comm_read_then_rank_read_then_rank_write_is_caught() {
        let s = StreamReaders::default();
        s.read(r(COMM));
        s.read(r(RANK));
        assert_eq!(ids(s.forgotten_except(RANK)), [COMM]);
        assert_eq!(ids(s.write(RANK)), [COMM]);
        // The log starts afresh after a write.
        assert!(s.write(RANK).is_empty());
    }

    #[test]
    fn orders_cudarc_does_wait_for_are_fine() {
        // The last reader is in the read event: the write waits for it.
        let s = StreamReaders::default();
        s.read(r(COMM));
        assert!(s.write(RANK).is_empty());
        // The forgotten reader writes: its own stream orders its read first.
        s.read(r(COMM));
        s.read(r(RANK));
        assert!(s.write(COMM).is_empty());
        // One stream reading many times forgets nothing.
        s.read(r(RANK));
        s.read(r(RANK));
        assert!(s.write(COMM).is_empty());
        // A forgotten stream that reads again is the last reader again.
        s.read(r(COMM));
        s.read(r(RANK));
        s.read(r(COMM));
        assert_eq!(ids(s.write(OTHER)), [RANK]);
    }

    #[test]
    fn every_forgotten_reader_is_named() {
        let s = StreamReaders::default();
        s.read(r(COMM));
        s.read(r(OTHER));
        s.read(r(RANK));
        assert_eq!(ids(s.write(RANK)), [COMM, OTHER]);
    }
}
