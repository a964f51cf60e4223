//! Events: a point in a stream that other streams and the host can wait for.

use super::clock::VectorClock;
use super::stream::Stream;
use std::sync::{Arc, Mutex, MutexGuard};

/// Where an event was last recorded.
#[derive(Clone)]
pub struct Recorded {
    /// The stream.
    pub stream: Arc<Stream>,
    /// The record's tick on it.
    pub tick: u64,
    /// Everything before the record.
    pub vc: Arc<VectorClock>,
}

/// An event.
pub struct Event {
    /// Its number.
    pub id: u64,
    /// `cuEventCreate` flags.
    pub flags: u32,
    /// Its device.
    pub device: usize,
    rec: Mutex<Option<Recorded>>,
}

impl Event {
    /// A new, never-recorded event.
    pub fn new(id: u64, flags: u32, device: usize) -> Event {
        Event {
            id,
            flags,
            device,
            rec: Mutex::new(None),
        }
    }

    /// Its last record (`None`: never recorded, which CUDA treats as complete).
    pub fn recorded(&self) -> MutexGuard<'_, Option<Recorded>> {
        self.rec.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether its last record has run.
    pub fn complete(&self) -> bool {
        match &*self.recorded() {
            None => true,
            Some(r) => r.stream.completed() >= r.tick,
        }
    }
}
