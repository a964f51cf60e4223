//! Shared by the zero-comm test suites.

use zero_comm::HostComm;

/// Runs `f` once per rank, each on its own thread; returns the results in rank order.
pub fn run_ranks<R: Send>(comms: Vec<HostComm>, f: impl Fn(HostComm) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms.into_iter().map(|c| s.spawn(move || f(c))).collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}
