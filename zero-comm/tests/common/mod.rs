//! Shared by the zero-comm test suites.

/// Runs `f` once per rank, each on its own thread; returns the results in rank order.
#[allow(dead_code)] // not every suite uses it
pub fn run_ranks<C: Send, R: Send>(comms: Vec<C>, f: impl Fn(C) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms.into_iter().map(|c| s.spawn(move || f(c))).collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

/// A TCP port free right now on the loopback interface, for a rendezvous.
#[allow(dead_code)] // not every suite uses it
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
