//! The streams that read a device buffer since its last write, for checking the
//! last-reader rule (ARCHITECTURE.md, invariant 19).
//!
//! `cudarc` keeps one read event and one write event per allocation. A write on stream W
//! waits for the last recorded read and the last write, so a read on stream A followed
//! by a read on stream B leaves only B's read in the event: A's read is forgotten. If W
//! is not A, W's write may then overwrite the buffer while A still reads it. So: **a
//! buffer read by one stream and then by another must not next be written by a stream
//! other than the first reader** (in the engine: a buffer read by the comm stream, then
//! by a rank's stream, must never then be written by that rank's stream).
//!
//! [`StreamReaders`] follows the reads and writes of one buffer and names the forgotten
//! readers a write would race with; `GpuBuffer` checks it in debug builds on every use
//! made through a stream (`GpuStream::read` / `GpuStream::write`, `read_addr`,
//! `write_addr`).

use std::sync::Mutex;

/// A stream's identity: its handle's address, plus one (so the null default stream is 1
/// and 0 is never a stream).
pub(crate) type StreamId = u64;

#[derive(Debug, Default)]
struct Log {
    /// The stream whose read is in `cudarc`'s read event.
    last: Option<StreamId>,
    /// Streams whose reads were displaced from the read event since the last write.
    forgotten: Vec<StreamId>,
}

/// Reads and writes of one buffer by stream.
#[derive(Debug, Default)]
pub(crate) struct StreamReaders {
    log: Mutex<Log>,
}

impl StreamReaders {
    /// `stream` reads the buffer.
    pub(crate) fn read(&self, stream: StreamId) {
        let Ok(mut log) = self.log.lock() else {
            return;
        };
        if let Some(prev) = log.last.replace(stream) {
            if prev != stream && !log.forgotten.contains(&prev) {
                log.forgotten.push(prev);
            }
        }
        log.forgotten.retain(|s| *s != stream);
    }

    /// `stream` writes the buffer: `Err` with the streams whose reads the write does not
    /// wait for. The log starts afresh either way.
    pub(crate) fn write(&self, stream: StreamId) -> Result<(), Vec<StreamId>> {
        let Ok(mut log) = self.log.lock() else {
            return Ok(());
        };
        let racing: Vec<StreamId> = log
            .forgotten
            .iter()
            .copied()
            .filter(|s| *s != stream)
            .collect();
        *log = Log::default();
        if racing.is_empty() {
            Ok(())
        } else {
            Err(racing)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::StreamReaders;

    const COMM: u64 = 0x7000_0001;
    const RANK: u64 = 0x7100_0001;
    const OTHER: u64 = 0x7200_0001;

    #[test]
    fn comm_read_then_rank_read_then_rank_write_is_caught() {
        let r = StreamReaders::default();
        r.read(COMM);
        r.read(RANK);
        assert_eq!(r.write(RANK), Err(vec![COMM]));
        // The log starts afresh after a write.
        assert_eq!(r.write(RANK), Ok(()));
    }

    #[test]
    fn orders_cudarc_does_wait_for_are_fine() {
        // The last reader is in the read event: the write waits for it.
        let r = StreamReaders::default();
        r.read(COMM);
        assert_eq!(r.write(RANK), Ok(()));
        // The forgotten reader writes: its own stream orders its read first.
        r.read(COMM);
        r.read(RANK);
        assert_eq!(r.write(COMM), Ok(()));
        // One stream reading many times forgets nothing.
        r.read(RANK);
        r.read(RANK);
        assert_eq!(r.write(COMM), Ok(()));
        // A forgotten stream that reads again is the last reader again.
        r.read(COMM);
        r.read(RANK);
        r.read(COMM);
        assert_eq!(r.write(OTHER), Err(vec![RANK]));
    }

    #[test]
    fn every_forgotten_reader_is_named() {
        let r = StreamReaders::default();
        r.read(COMM);
        r.read(OTHER);
        r.read(RANK);
        assert_eq!(r.write(RANK), Err(vec![COMM, OTHER]));
    }
}
