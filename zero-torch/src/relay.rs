//! The relay of the CPU inter-node tier (docs/GLOO_TIER.md): zero_comm's [`Relay`] over a
//! Python object (`zero_torch._gloo_tier.GlooRelay`) that moves the bytes with torch's
//! gloo group. The buffers cross as DLPack views of the engine's own memory (no copy);
//! the arithmetic stays in zero_comm's `RelayComm`.
//!
//! Engine calls run with the GIL released, so each relay call takes it back for the call
//! (as `PyExchange` does).

use crate::tensors::element;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use zero_comm::{HostBuffer, Relay};
use zero_sys::python::dlpack::host_capsule;

/// One rank's relay over a `GlooRelay` (its `rank`, `world_size` and byte-moving methods).
pub struct PyRelay {
    relay: Py<PyAny>,
    rank: usize,
    world: usize,
}

impl PyRelay {
    /// Reads `relay`'s rank and size.
    pub fn new(py: Python<'_>, relay: Py<PyAny>) -> PyResult<Self> {
        let rank = relay.getattr(py, "rank")?.extract(py)?;
        let world = relay.getattr(py, "world_size")?.extract(py)?;
        Ok(PyRelay { relay, rank, world })
    }

    /// `relay.<name>(*args)`, the GIL taken for the call; a Python exception as its text.
    fn call<T>(
        &self,
        name: &str,
        args: impl for<'py> FnOnce(Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyTuple>>,
        out: impl for<'py> FnOnce(Bound<'py, PyAny>) -> PyResult<T>,
    ) -> Result<T, String> {
        Python::attach(|py| {
            let args = args(py)?;
            out(self.relay.bind(py).call_method1(name, args)?)
        })
        .map_err(|e| e.to_string())
    }
}

/// A DLPack capsule over all of `buf` (the Python side views it as bytes).
fn view<'py>(py: Python<'py>, buf: &HostBuffer) -> PyResult<Bound<'py, PyAny>> {
    host_capsule(py, buf.lease(), element(buf.dtype()), 0, &[buf.len()])
}

fn tuple<'py>(
    py: Python<'py>,
    items: Vec<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
    pyo3::types::PyTuple::new(py, items)
}

fn counts<'py>(py: Python<'py>, c: &[usize]) -> PyResult<Bound<'py, PyAny>> {
    Ok(c.to_vec().into_pyobject(py)?.into_any())
}

impl Relay for PyRelay {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn exchange(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, String> {
        self.call(
            "exchange",
            |py| tuple(py, vec![PyBytes::new(py, mine).into_any()]),
            |r| r.extract::<Vec<Vec<u8>>>(),
        )
    }

    fn all_to_all(
        &self,
        send: &HostBuffer,
        send_counts: &[usize],
        recv: &mut HostBuffer,
        recv_counts: &[usize],
    ) -> Result<(), String> {
        // `recv` is written through its view while this call holds it mutably.
        let recv: &HostBuffer = recv;
        self.call(
            "all_to_all",
            |py| {
                let items = vec![
                    view(py, send)?,
                    counts(py, send_counts)?,
                    view(py, recv)?,
                    counts(py, recv_counts)?,
                ];
                tuple(py, items)
            },
            |_| Ok(()),
        )
    }

    fn all_gather(
        &self,
        send: &HostBuffer,
        recv: &mut HostBuffer,
        piece_counts: &[usize],
    ) -> Result<(), String> {
        let recv: &HostBuffer = recv;
        self.call(
            "all_gather",
            |py| {
                let items = vec![view(py, send)?, view(py, recv)?, counts(py, piece_counts)?];
                tuple(py, items)
            },
            |_| Ok(()),
        )
    }

    fn broadcast(&self, buf: &mut HostBuffer, root: usize) -> Result<(), String> {
        let buf: &HostBuffer = buf;
        self.call(
            "broadcast",
            |py| {
                let items = vec![view(py, buf)?, root.into_pyobject(py)?.into_any()];
                tuple(py, items)
            },
            |_| Ok(()),
        )
    }

    fn barrier(&self) -> Result<(), String> {
        self.call("barrier", |py| tuple(py, vec![]), |_| Ok(()))
    }

    fn subgroup(&self, ranks: &[usize]) -> Result<Box<dyn Relay>, String> {
        let sub = self.call(
            "subgroup",
            |py| tuple(py, vec![counts(py, ranks)?]),
            |r| Ok(r.unbind()),
        )?;
        Python::attach(|py| PyRelay::new(py, sub))
            .map(|r| Box::new(r) as Box<dyn Relay>)
            .map_err(|e| e.to_string())
    }
}
