//! The driver's state: contexts, streams, events, modules and functions, behind one lock,
//! and the handles the application holds for them.
//!
//! Handles are numbers with a tag per kind in their high bits, never pointers, so a stale
//! or foreign handle is recognised and named instead of dereferenced.

use super::clock::{VectorClock, HOST};
use super::config::config;
use super::event::{Event, Recorded};
use super::module::{Function, LoadedModule};
use super::shadow::OpLabel;
use super::stream::{Op, Stream};
use super::work::Work;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// The tag of context handles.
pub const CTX_TAG: u64 = 0x0000_c0c0_0000_0000;
/// The tag of stream handles.
pub const STREAM_TAG: u64 = 0x0000_5a5a_0000_0000;
/// The tag of event handles.
pub const EVENT_TAG: u64 = 0x0000_e0e0_0000_0000;
/// The tag of module handles.
pub const MODULE_TAG: u64 = 0x0000_3d3d_0000_0000;
/// The tag of function handles.
pub const FUNCTION_TAG: u64 = 0x0000_f0f0_0000_0000;
const TAG_MASK: u64 = 0xffff_ffff_0000_0000;

/// A device's primary context.
#[derive(Default)]
pub struct Context {
    /// `cuDevicePrimaryCtxRetain` count.
    pub retains: u32,
    /// Its legacy default stream, made on first retain.
    pub legacy: Option<Arc<Stream>>,
}

/// Everything the API calls share.
pub struct Registry {
    /// `cuInit` was called.
    pub initialized: bool,
    /// Primary contexts, by visible ordinal.
    pub contexts: Vec<Context>,
    /// Streams by agent.
    pub streams: HashMap<u32, Arc<Stream>>,
    /// Events by id.
    pub events: HashMap<u64, Arc<Event>>,
    /// Modules by id.
    pub modules: HashMap<u64, Arc<LoadedModule>>,
    /// Functions by id.
    pub functions: HashMap<u64, Arc<Function>>,
    /// What the host has synchronized with.
    pub host_vc: VectorClock,
    next_agent: u32,
    next_id: u64,
}

/// The registry, locked. Never held while waiting for a stream.
pub fn registry() -> MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(|| {
        Mutex::new(Registry {
            initialized: false,
            contexts: (0..config().visible.len())
                .map(|_| Context::default())
                .collect(),
            streams: HashMap::new(),
            events: HashMap::new(),
            modules: HashMap::new(),
            functions: HashMap::new(),
            host_vc: VectorClock::default(),
            next_agent: HOST + 1,
            next_id: 1,
        })
    })
    .lock()
    .unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    /// The calling thread's current context (its device), if any.
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The calling thread's current device.
pub fn current() -> Option<usize> {
    CURRENT.with(Cell::get)
}

/// Makes `device` (or none) current on the calling thread.
pub fn set_current(device: Option<usize>) {
    CURRENT.with(|c| c.set(device));
}

/// The handle of `device`'s primary context.
pub fn ctx_handle(device: usize) -> u64 {
    CTX_TAG | (device as u64 + 1)
}

/// The device of a context handle.
pub fn ctx_device(handle: u64) -> Option<usize> {
    (handle & TAG_MASK == CTX_TAG && handle & !TAG_MASK > 0)
        .then(|| (handle & !TAG_MASK) as usize - 1)
}

/// The kind tag and number of a handle, if it has one of ours.
pub fn untag(handle: u64, tag: u64) -> Option<u64> {
    (handle & TAG_MASK == tag).then_some(handle & !TAG_MASK)
}

impl Registry {
    /// A fresh id for events, modules and functions.
    pub fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// A new stream on `device`.
    pub fn new_stream(&mut self, device: usize, non_blocking: bool) -> Arc<Stream> {
        let agent = self.next_agent;
        self.next_agent += 1;
        let s = Stream::spawn(agent, device, non_blocking, false);
        self.streams.insert(agent, s.clone());
        s
    }

    /// `device`'s legacy default stream (made with its context).
    pub fn legacy(&mut self, device: usize) -> Arc<Stream> {
        if let Some(s) = self.contexts.get(device).and_then(|c| c.legacy.clone()) {
            return s;
        }
        let agent = self.next_agent;
        self.next_agent += 1;
        let s = Stream::spawn(agent, device, false, true);
        self.streams.insert(agent, s.clone());
        if let Some(c) = self.contexts.get_mut(device) {
            c.legacy = Some(s.clone());
        }
        s
    }

    /// The stream a handle names: 0 and `CU_STREAM_LEGACY` (1) are the current device's
    /// legacy stream. `Err` says why the handle is no stream.
    pub fn stream(&mut self, handle: u64) -> Result<Arc<Stream>, String> {
        if handle == 0 || handle == 1 {
            let Some(dev) = current() else {
                return Err(
                    "the default stream needs a current context (none is set on this thread)"
                        .into(),
                );
            };
            return Ok(self.legacy(dev));
        }
        if handle == 2 {
            return Err("the per-thread default stream (CU_STREAM_PER_THREAD) is not implemented by zero-gpusim".into());
        }
        let Some(agent) = untag(handle, STREAM_TAG) else {
            return Err(format!("{handle:#x} is not a stream handle of this driver"));
        };
        match self.streams.get(&(agent as u32)) {
            Some(s) if !s.destroyed.load(std::sync::atomic::Ordering::Relaxed) => Ok(s.clone()),
            Some(_) => Err(format!("stream {agent} was destroyed (cuStreamDestroy)")),
            None => Err(format!("{handle:#x} is not a stream of this driver")),
        }
    }

    /// Queues `work` on `s` after `wait` (an event's record), with the legacy stream's
    /// implicit synchronization; its label is `what` and where it runs. The tick.
    pub fn enqueue(
        &mut self,
        s: &Arc<Stream>,
        work: Work,
        what: &str,
        wait: Option<&Recorded>,
    ) -> u64 {
        let mut deps: Vec<(Arc<Stream>, u64)> = Vec::new();
        let mut joined = self.host_vc.clone();
        if let Some(r) = wait {
            deps.push((r.stream.clone(), r.tick));
            joined.join(&r.vc);
        }
        if s.legacy {
            // The legacy stream waits for every blocking stream of its device.
            for other in self.streams.values() {
                if other.device == s.device && !other.legacy && !other.non_blocking {
                    let t = other.tail();
                    deps.push((other.clone(), t.tick));
                    joined.join(&t.vc);
                }
            }
        } else if !s.non_blocking {
            let l = self.legacy(s.device);
            let t = l.tail();
            deps.push((l.clone(), t.tick));
            joined.join(&t.vc);
        }
        let mut tail = s.tail();
        tail.vc.join(&joined);
        tail.tick += 1;
        let tick = tail.tick;
        tail.vc.raise(s.agent, tick);
        let op = Op {
            tick,
            vc: Arc::new(tail.vc.clone()),
            deps,
            label: Arc::new(OpLabel(format!(
                "{what} (operation {tick} on {})",
                s.name()
            ))),
            work,
        };
        drop(tail);
        s.push(op);
        tick
    }

    /// The stream's tail: its last tick and clock.
    pub fn tail_of(&self, s: &Stream) -> (u64, VectorClock) {
        let t = s.tail();
        (t.tick, t.vc.clone())
    }
}
