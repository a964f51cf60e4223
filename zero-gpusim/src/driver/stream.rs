//! Streams: each one a thread that runs its operations in order.
//!
//! The host enqueues an operation with what it must wait for (the operations of other
//! streams it is ordered after: an event it waited on, the legacy default stream's
//! implicit synchronization) and its vector clock; the stream's thread waits for those,
//! runs it, and marks it complete. All ordering is decided when operations are enqueued
//! (under the registry lock), so the race check's verdicts do not depend on how the
//! threads happen to interleave.

use super::clock::{Agent, VectorClock};
use super::exec::execute;
use super::exec_ctx::ExecCtx;
use super::shadow::OpLabel;
use super::work::Work;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// An operation queued on a stream.
pub struct Op {
    /// Its tick on its stream (1, 2, …).
    pub tick: u64,
    /// Everything it is ordered after (its own tick included).
    pub vc: Arc<VectorClock>,
    /// Operations of other streams that must complete first.
    pub deps: Vec<(Arc<Stream>, u64)>,
    /// Its name in messages.
    pub label: Arc<OpLabel>,
    /// What it does.
    pub work: Work,
}

/// The enqueue side of a stream (touched only under the registry lock).
#[derive(Debug, Default)]
pub struct Tail {
    /// The last tick handed out.
    pub tick: u64,
    /// The clock of the last operation enqueued.
    pub vc: VectorClock,
}

#[derive(Default)]
struct Inbox {
    ops: VecDeque<Op>,
    closed: bool,
}

/// A stream.
pub struct Stream {
    /// Its agent number (also its handle's low bits).
    pub agent: Agent,
    /// Its device.
    pub device: usize,
    /// `CU_STREAM_NON_BLOCKING`: no implicit synchronization with the legacy stream.
    pub non_blocking: bool,
    /// The device's legacy default stream (handle 0).
    pub legacy: bool,
    /// Borrowed from its creator's view: destroyed by `cuStreamDestroy`.
    pub destroyed: AtomicBool,
    inbox: Mutex<Inbox>,
    wake: Condvar,
    completed: AtomicU64,
    /// The enqueue side.
    pub tail: Mutex<Tail>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.name())
    }
}

/// Every completion rings this, so waiters re-check.
fn progress() -> &'static (Mutex<u64>, Condvar) {
    static P: OnceLock<(Mutex<u64>, Condvar)> = OnceLock::new();
    P.get_or_init(|| (Mutex::new(0), Condvar::new()))
}

fn ring() {
    let (m, cv) = progress();
    let mut g = m.lock().unwrap_or_else(|p| p.into_inner());
    *g = g.wrapping_add(1);
    cv.notify_all();
}

impl Stream {
    /// A new stream with its thread.
    pub fn spawn(agent: Agent, device: usize, non_blocking: bool, legacy: bool) -> Arc<Stream> {
        let s = Arc::new(Stream {
            agent,
            device,
            non_blocking,
            legacy,
            destroyed: AtomicBool::new(false),
            inbox: Mutex::new(Inbox::default()),
            wake: Condvar::new(),
            completed: AtomicU64::new(0),
            tail: Mutex::new(Tail::default()),
        });
        let worker = s.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("gpusim-stream-{agent}"))
            .spawn(move || worker.run());
        if let Err(e) = spawned {
            eprintln!("zero-gpusim: could not start the thread of stream {agent}: {e}");
        }
        s
    }

    /// Its name in messages.
    pub fn name(&self) -> String {
        if self.legacy {
            format!("the legacy default stream of device {}", self.device)
        } else {
            format!("stream {}", self.agent)
        }
    }

    /// The enqueue side, locked.
    pub fn tail(&self) -> MutexGuard<'_, Tail> {
        self.tail.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last completed tick.
    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Acquire)
    }

    /// Queues `op` (built by the caller under the registry lock).
    pub fn push(&self, op: Op) {
        let mut inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
        inbox.ops.push_back(op);
        self.wake.notify_one();
    }

    /// No more operations: the thread ends after the queued ones.
    pub fn close(&self) {
        let mut inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
        inbox.closed = true;
        self.wake.notify_one();
    }

    fn next(&self) -> Option<Op> {
        let mut inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(op) = inbox.ops.pop_front() {
                return Some(op);
            }
            if inbox.closed {
                return None;
            }
            inbox = self.wake.wait(inbox).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn run(self: Arc<Self>) {
        while let Some(op) = self.next() {
            for (dep, tick) in &op.deps {
                if !wait_for(dep, *tick, dependency_timeout()) {
                    super::errors::finding(
                        super::errors::FindingKind::Race,
                        format!(
                            "{} on {} waited {:?} for operation {tick} of {} (an event it \
                             waits for, or the legacy stream's implicit synchronization), \
                             which never ran: a deadlock between streams",
                            op.label,
                            self.name(),
                            dependency_timeout(),
                            dep.name()
                        ),
                    );
                }
            }
            let tick = op.tick;
            let label = op.label.clone();
            // A panic in the stand-in must not kill the stream (every later wait would hang):
            // it becomes a finding naming the operation.
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut op = op;
                let work = std::mem::replace(&mut op.work, Work::Marker);
                let cx = ExecCtx {
                    agent: self.agent,
                    tick: op.tick,
                    vc: &op.vc,
                    label: &op.label,
                };
                execute(work, cx, &self.name())
            }));
            if let Err(p) = ran {
                let what = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                super::errors::finding(
                    super::errors::FindingKind::Kernel,
                    format!(
                        "{label}: zero-gpusim panicked running it on {}: {what}",
                        self.name()
                    ),
                );
            }
            self.completed.store(tick, Ordering::Release);
            ring();
        }
    }
}

/// How long a stream waits for another stream's operation before calling it a deadlock.
fn dependency_timeout() -> Duration {
    Duration::from_secs(
        std::env::var("ZERO_GPUSIM_DEADLOCK_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(300),
    )
}

/// Waits until `s` has completed `tick`, at most `limit`; whether it did.
pub fn wait_for(s: &Stream, tick: u64, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let (m, cv) = progress();
    let mut g = m.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if s.completed() >= tick {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        let wait = (deadline - now).min(Duration::from_millis(200));
        g = cv
            .wait_timeout(g, wait)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}
