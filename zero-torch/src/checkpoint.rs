//! Reading a checkpoint's parameters whole, without an engine: the job of DeepSpeed's
//! `zero_to_fp32.py`, on zero's format (any stage, any world size it was saved at).

use crate::errors::CheckpointError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::path::PathBuf;
use zero_runtime::checkpoint::resolve::CheckpointDir;
use zero_runtime::checkpoint::resolve::StateKind;

/// One parameter: its names (the first, then aliases of tied weights), shape, whether it
/// was trained, and its fp32 values as little-endian bytes.
type Entry<'py> = (Vec<String>, Vec<usize>, bool, Bound<'py, PyBytes>);

/// [`Entry`] with the values still as numbers.
type Read = (Vec<String>, Vec<usize>, bool, Vec<f32>);

/// Every parameter of checkpoint `tag` (or `latest`'s) of `dir` as fp32: the master weights
/// of trained parameters, the saved values of frozen ones.
#[pyfunction]
#[pyo3(signature = (checkpoint_dir, tag=None))]
pub fn read_fp32_state<'py>(
    py: Python<'py>,
    checkpoint_dir: PathBuf,
    tag: Option<String>,
) -> PyResult<Vec<Entry<'py>>> {
    let err = |e: zero_runtime::CheckpointError| CheckpointError::new_err(e.to_string());
    let values: Vec<Read> = py.detach(|| {
        let mut ckpt = CheckpointDir::open(&checkpoint_dir, tag.as_deref()).map_err(err)?;
        let params = ckpt.manifest.params.clone();
        let mut out = Vec::with_capacity(params.len());
        for p in &params {
            let values = if p.trainable {
                let mut v = vec![0f32; p.numel()];
                ckpt.read_state(p, StateKind::Master, 0..p.numel(), |at, got| {
                    v[at..at + got.len()].copy_from_slice(got);
                    Ok(())
                })
                .map_err(err)?;
                v
            } else {
                ckpt.read_frozen(p).map_err(err)?
            };
            let names = std::iter::once(p.name.clone())
                .chain(p.aliases.iter().cloned())
                .collect();
            out.push((names, p.shape.clone(), p.trainable, values));
        }
        Ok::<_, PyErr>(out)
    })?;
    Ok(values
        .into_iter()
        .map(|(names, shape, trained, v)| {
            (
                names,
                shape,
                trained,
                PyBytes::new(py, bytemuck::cast_slice(&v)),
            )
        })
        .collect())
}

/// The client state saved with checkpoint `tag` (or `latest`'s) of `dir`, as JSON text.
#[pyfunction]
#[pyo3(signature = (checkpoint_dir, tag=None))]
pub fn read_client_state(checkpoint_dir: PathBuf, tag: Option<String>) -> PyResult<String> {
    let ckpt = CheckpointDir::open(&checkpoint_dir, tag.as_deref())
        .map_err(|e| CheckpointError::new_err(e.to_string()))?;
    Ok(ckpt.manifest.client_state.to_string())
}

/// What checkpoint `tag` (or `latest`'s) of `dir` records besides its tensors, as JSON text:
/// `tag`, `stage`, `world_size`, `precision`, `steps` (`optimizer`, `skipped`, `global`),
/// `lr_last_batch_iteration`, `config` and `client_state`.
#[pyfunction]
#[pyo3(signature = (checkpoint_dir, tag=None))]
pub fn read_checkpoint_summary(checkpoint_dir: PathBuf, tag: Option<String>) -> PyResult<String> {
    let ckpt = CheckpointDir::open(&checkpoint_dir, tag.as_deref())
        .map_err(|e| CheckpointError::new_err(e.to_string()))?;
    let m = &ckpt.manifest;
    Ok(serde_json::json!({
        "tag": m.tag,
        "stage": m.stage,
        "world_size": m.world_size,
        "precision": m.precision,
        "steps": {"optimizer": m.steps.optimizer, "skipped": m.steps.skipped, "global": m.steps.global},
        "lr_last_batch_iteration": m.lr_last_batch_iteration,
        "config": m.config,
        "client_state": m.client_state,
    })
    .to_string())
}

/// One tensor of a Hugging Face checkpoint read whole: its name, its element type as the
/// file names it (`F32`, `I64`, ...), its shape, and its little-endian bytes.
type RawTensor<'py> = (String, String, Vec<usize>, Bound<'py, PyBytes>);

/// Tensors `names` of the Hugging Face checkpoint in `path`, whole and as stored (the
/// model's buffers, which the engine does not hold).
#[pyfunction]
pub fn read_hf_tensors<'py>(
    py: Python<'py>,
    path: PathBuf,
    names: Vec<String>,
) -> PyResult<Vec<RawTensor<'py>>> {
    use zero_runtime::checkpoint::hf::HfCheckpoint;
    let err = |e: zero_runtime::CheckpointError| CheckpointError::new_err(e.to_string());
    let read: Vec<(String, String, Vec<usize>, Vec<u8>)> = py.detach(|| {
        let mut ck = HfCheckpoint::open(&path, 1 << 20).map_err(err)?;
        names
            .iter()
            .map(|n| {
                let bytes = ck.read_raw(n).map_err(err)?;
                let t = &ck.tensors()[n];
                Ok((n.clone(), t.stored.clone(), t.shape.clone(), bytes))
            })
            .collect::<PyResult<Vec<_>>>()
    })?;
    Ok(read
        .into_iter()
        .map(|(n, d, s, b)| (n, d, s, PyBytes::new(py, &b)))
        .collect())
}
