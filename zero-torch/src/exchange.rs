//! Rank 0's id (the shared-memory group's nonce, NCCL's unique id) handed out through a
//! Python callable instead of zero's own rendezvous: zero_torch passes one that goes
//! through torch's store (`_dist.id_exchange`), so where torch's group exists zero opens
//! no port of its own.

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::time::Duration;
use zero_comm::launch::rendezvous::ID_BYTES;
use zero_comm::launch::{BootstrapError, IdExchange, LaunchEnv};

/// `exchange(id: bytes | None, timeout_s: float) -> bytes`: rank 0 passes its id, the
/// others `None`; every rank gets rank 0's id back, or an exception by the timeout.
pub struct PyExchange {
    exchange: Py<PyAny>,
    via: &'static str,
}

impl PyExchange {
    /// The callable `exchange`; `via` names what carries the id in errors.
    pub fn new(exchange: Py<PyAny>, via: &'static str) -> Self {
        PyExchange { exchange, via }
    }
}

impl IdExchange for PyExchange {
    fn exchange(
        &mut self,
        env: &LaunchEnv,
        id: Option<[u8; ID_BYTES]>,
        timeout: Duration,
    ) -> Result<[u8; ID_BYTES], BootstrapError> {
        let error = |reason: String| env.exchange_error(self.via, reason);
        // Called with the GIL released (the group starts detached): take it for the call.
        let got: Result<Vec<u8>, String> = Python::attach(|py| {
            let arg = id.map(|id| PyBytes::new(py, &id));
            self.exchange
                .call1(py, (arg, timeout.as_secs_f64()))
                .and_then(|r| r.extract::<Vec<u8>>(py))
                .map_err(|e| e.to_string())
        });
        let got = got.map_err(error)?;
        got.try_into()
            .map_err(|b: Vec<u8>| error(format!("got {} bytes, not {ID_BYTES}", b.len())))
    }
}
