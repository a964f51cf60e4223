//! Hugging Face checkpoints, read a byte range at a time: a folder holding
//! `model.safetensors`, or shards listed by `model.safetensors.index.json` (as
//! `save_pretrained` writes them). Opening parses every file's header (where each tensor's
//! bytes are); [`HfCheckpoint::read_f32`] then reads an element range of one tensor — its
//! aligned blocks and nothing else, through [`RangeReader`] — widened to `f32`. So a rank
//! that holds a shard of a tensor reads that shard's bytes, not the file.

use crate::format::{header_len, parse_dtype, parse_safetensors_header};
use crate::io::{RangeReader, ReadStats};
use crate::resolve::decode;
use crate::CheckpointError;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use zero_kernels::DType;

/// The single-file checkpoint's name.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The sharded checkpoint's index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// One tensor of the checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct HfTensor {
    /// Index into the checkpoint's files.
    pub file: usize,
    /// Its element type, where it is one zero reads as weights (F32, F16, BF16).
    pub dtype: Option<DType>,
    /// Its element type as the file names it (`I64` for an integer buffer, say).
    pub stored: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its bytes in the file.
    pub bytes: Range<u64>,
}

impl HfTensor {
    /// Its element count.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// What reading cost: bytes asked for and read (rounded to whole blocks), files opened
/// (headers included), and the time spent.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HfReadStats {
    /// Bytes of tensors asked for.
    pub requested: u64,
    /// Bytes read from the files, headers included.
    pub read: u64,
    /// Files opened.
    pub files: usize,
    /// Time spent opening and reading.
    pub elapsed: Duration,
}

/// An open Hugging Face checkpoint folder.
#[derive(Debug)]
pub struct HfCheckpoint {
    dir: PathBuf,
    files: Vec<(PathBuf, RangeReader)>,
    tensors: BTreeMap<String, HfTensor>,
    header_bytes: u64,
    elapsed: Duration,
}

fn format_error(path: &Path, reason: impl Into<String>) -> CheckpointError {
    CheckpointError::Format {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

impl HfCheckpoint {
    /// Opens the checkpoint in `dir`: the shards its index lists, or its one file. Every
    /// file's header is read and checked against the file's length (a truncated file is an
    /// error naming it); every tensor the index lists must be in the file it names.
    /// `buffer` bytes of I/O buffer per file (two windows; a few MiB is plenty).
    pub fn open(dir: &Path, buffer: usize) -> Result<Self, CheckpointError> {
        let t0 = Instant::now();
        let index_path = dir.join(INDEX_FILE);
        // The files, and for a sharded checkpoint the tensor → file map of its index.
        let (names, listed): (Vec<String>, Option<BTreeMap<String, String>>) =
            if index_path.is_file() {
                let text = std::fs::read(&index_path).map_err(|e| {
                    CheckpointError::Io(format!("reading {}: {e}", index_path.display()))
                })?;
                let v: serde_json::Value = serde_json::from_slice(&text)
                    .map_err(|e| format_error(&index_path, format!("not JSON ({e})")))?;
                let map = v
                    .get("weight_map")
                    .and_then(|m| m.as_object())
                    .ok_or_else(|| format_error(&index_path, "no `weight_map` object"))?;
                let mut listed = BTreeMap::new();
                let mut files: Vec<String> = Vec::new();
                for (tensor, file) in map {
                    let file = file.as_str().ok_or_else(|| {
                        format_error(&index_path, format!("`{tensor}` maps to no file name"))
                    })?;
                    if !files.iter().any(|f| f == file) {
                        files.push(file.to_string());
                    }
                    listed.insert(tensor.clone(), file.to_string());
                }
                (files, Some(listed))
            } else if dir.join(SINGLE_FILE).is_file() {
                (vec![SINGLE_FILE.to_string()], None)
            } else {
                return Err(CheckpointError::NotFound {
                    path: dir.display().to_string(),
                    reason: format!("neither {INDEX_FILE} nor {SINGLE_FILE} is there"),
                });
            };
        let mut files = Vec::with_capacity(names.len());
        let mut tensors = BTreeMap::new();
        let mut header_bytes = 0;
        for (i, name) in names.iter().enumerate() {
            let path = dir.join(name);
            if !path.is_file() {
                return Err(CheckpointError::NotFound {
                    path: path.display().to_string(),
                    reason: format!("the shard {INDEX_FILE} lists is missing"),
                });
            }
            let len = std::fs::metadata(&path)
                .map_err(|e| {
                    CheckpointError::Io(format!("reading the size of {}: {e}", path.display()))
                })?
                .len();
            let mut reader = RangeReader::open(&path, len, None, buffer)?;
            let shown = path.display().to_string();
            if len < 8 {
                return Err(format_error(&path, "shorter than a safetensors header"));
            }
            let mut first8 = [0u8; 8];
            reader.read(0, 8, |_, b| {
                first8.copy_from_slice(b);
                Ok::<(), CheckpointError>(())
            })?;
            let n = header_len(&first8, len, &shown)?;
            let mut header = Vec::with_capacity(n as usize);
            reader.read(8, n, |_, b| {
                header.extend_from_slice(b);
                Ok::<(), CheckpointError>(())
            })?;
            header_bytes += 8 + n;
            let index = parse_safetensors_header(&header, len, &shown)?;
            for (tensor, (bytes, info)) in index.tensors {
                let stored = format!("{:?}", info.dtype);
                let dtype = parse_dtype(&stored);
                if let Some(listed) = &listed {
                    if listed.get(&tensor).is_some_and(|f| f != name) {
                        return Err(format_error(
                            &index_path,
                            format!(
                                "`{tensor}` is listed in {} but found in {name}",
                                listed[&tensor]
                            ),
                        ));
                    }
                }
                tensors.insert(
                    tensor,
                    HfTensor {
                        file: i,
                        dtype,
                        stored,
                        shape: info.shape.clone(),
                        bytes,
                    },
                );
            }
            files.push((path, reader));
        }
        if let Some(listed) = &listed {
            if let Some((tensor, file)) = listed.iter().find(|(t, _)| !tensors.contains_key(*t)) {
                return Err(format_error(
                    &dir.join(file),
                    format!("{INDEX_FILE} lists `{tensor}` in this file, which does not hold it"),
                ));
            }
        }
        Ok(HfCheckpoint {
            dir: dir.to_path_buf(),
            files,
            tensors,
            header_bytes,
            elapsed: t0.elapsed(),
        })
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every tensor, by name.
    pub fn tensors(&self) -> &BTreeMap<String, HfTensor> {
        &self.tensors
    }

    /// The file that holds `tensor`.
    pub fn file_of(&self, tensor: &HfTensor) -> &Path {
        &self.files[tensor.file].0
    }

    /// Reads elements `elems` of tensor `name` (flattened), widened to `f32`, into `out`
    /// (of `elems`' length): the aligned blocks that hold them and no more.
    pub fn read_f32(
        &mut self,
        name: &str,
        elems: Range<usize>,
        out: &mut [f32],
    ) -> Result<(), CheckpointError> {
        let t0 = Instant::now();
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| CheckpointError::NotFound {
                path: self.dir.display().to_string(),
                reason: format!("no tensor `{name}`"),
            })?;
        if elems.end > t.numel() || elems.len() != out.len() {
            return Err(format_error(
                &self.files[t.file].0,
                format!(
                    "`{name}`: elements {elems:?} ({} values wanted) of a tensor of {}",
                    out.len(),
                    t.numel()
                ),
            ));
        }
        let dtype = t.dtype.ok_or_else(|| {
            format_error(
                &self.files[t.file].0,
                format!(
                    "tensor `{name}` is {}: zero reads F32, F16 and BF16 weights",
                    t.stored
                ),
            )
        })?;
        let size = dtype.size_of() as u64;
        let start = t.bytes.start + elems.start as u64 * size;
        let len = elems.len() as u64 * size;
        // Pieces may split an element: carry its first bytes over.
        let mut pending: Vec<u8> = Vec::new();
        let mut done = 0usize;
        self.files[t.file].1.read(start, len, |_, bytes| {
            pending.extend_from_slice(bytes);
            let whole = pending.len() / size as usize * size as usize;
            let vals = decode(&pending[..whole], dtype);
            out[done..done + vals.len()].copy_from_slice(&vals);
            done += vals.len();
            pending.drain(..whole);
            Ok::<(), CheckpointError>(())
        })?;
        self.elapsed += t0.elapsed();
        Ok(())
    }

    /// Tensor `name`'s bytes, whole, whatever its element type (a buffer's, say).
    pub fn read_raw(&mut self, name: &str) -> Result<Vec<u8>, CheckpointError> {
        let t0 = Instant::now();
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| CheckpointError::NotFound {
                path: self.dir.display().to_string(),
                reason: format!("no tensor `{name}`"),
            })?;
        let mut out = Vec::with_capacity((t.bytes.end - t.bytes.start) as usize);
        self.files[t.file]
            .1
            .read(t.bytes.start, t.bytes.end - t.bytes.start, |_, b| {
                out.extend_from_slice(b);
                Ok::<(), CheckpointError>(())
            })?;
        self.elapsed += t0.elapsed();
        Ok(out)
    }

    /// What reading cost so far.
    pub fn stats(&self) -> HfReadStats {
        let mut s = HfReadStats {
            files: self.files.len(),
            elapsed: self.elapsed,
            ..Default::default()
        };
        for (_, r) in &self.files {
            let ReadStats { requested, read } = r.stats();
            s.requested += requested;
            s.read += read;
        }
        s.requested -= self.header_bytes;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;

    fn bytes_f32(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn bytes_bf16(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect()
    }

    /// Writes `tensors` (name, dtype, shape, bytes) as one safetensors file.
    fn write(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2654435761) ^ seed) % 1000)
            .map(|x| x as f32 / 37.0 - 13.0)
            .collect()
    }

    #[test]
    fn element_ranges_of_a_sharded_checkpoint_read_back_widened() {
        let d = tempfile::tempdir().unwrap();
        let a = values(100_000, 1);
        let b = values(3 * 7, 2);
        let c = values(5000, 3);
        write(
            &d.path().join("model-00001-of-00002.safetensors"),
            &[
                ("a.weight", Dtype::F32, vec![1000, 100], bytes_f32(&a)),
                ("b", Dtype::BF16, vec![3, 7], bytes_bf16(&b)),
            ],
        );
        write(
            &d.path().join("model-00002-of-00002.safetensors"),
            &[("c.bias", Dtype::BF16, vec![5000], bytes_bf16(&c))],
        );
        let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": {
            "a.weight": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
            "c.bias": "model-00002-of-00002.safetensors"}});
        std::fs::write(d.path().join(INDEX_FILE), index.to_string()).unwrap();
        let mut ck = HfCheckpoint::open(d.path(), 1 << 20).unwrap();
        assert_eq!(ck.tensors().len(), 3);
        assert_eq!(ck.tensors()["a.weight"].shape, vec![1000, 100]);
        let before = ck.stats();
        let mut out = vec![f32::NAN; 333];
        ck.read_f32("a.weight", 50_001..50_334, &mut out).unwrap();
        assert_eq!(out, &a[50_001..50_334]);
        let cost = ck.stats().read - before.read;
        assert!(cost <= 2 * 4096, "333 floats cost {cost} bytes");
        let mut out = vec![f32::NAN; 4];
        ck.read_f32("c.bias", 4996..5000, &mut out).unwrap();
        let want: Vec<f32> = c[4996..]
            .iter()
            .map(|x| half::bf16::from_f32(*x).to_f32())
            .collect();
        assert_eq!(out, want);
        let mut out = vec![0f32; 21];
        ck.read_f32("b", 0..21, &mut out).unwrap();
        assert_eq!(out[20], half::bf16::from_f32(b[20]).to_f32());
        let s = ck.stats();
        assert_eq!(s.requested, 333 * 4 + 4 * 2 + 21 * 2);
        assert_eq!(s.files, 2);
        // Out of range, or a name it lacks: errors naming the tensor.
        let err = ck
            .read_f32("b", 20..22, &mut [0.0; 2])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`b`"), "{err}");
        let err = ck
            .read_f32("nope", 0..1, &mut [0.0])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`nope`"), "{err}");
    }

    #[test]
    fn damaged_folders_are_errors_naming_the_file() {
        let d = tempfile::tempdir().unwrap();
        let err = HfCheckpoint::open(d.path(), 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(INDEX_FILE) && err.contains(SINGLE_FILE),
            "{err}"
        );
        // A truncated single file.
        let path = d.path().join(SINGLE_FILE);
        write(
            &path,
            &[("w", Dtype::F32, vec![64], bytes_f32(&values(64, 4)))],
        );
        let full = std::fs::read(&path).unwrap();
        std::fs::write(&path, &full[..full.len() - 5]).unwrap();
        let err = HfCheckpoint::open(d.path(), 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(err.contains(SINGLE_FILE), "{err}");
        // A corrupt header: its JSON garbled, the length intact.
        write(
            &path,
            &[("w", Dtype::F32, vec![64], bytes_f32(&values(64, 4)))],
        );
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[8] = b'#';
        std::fs::write(&path, &bytes).unwrap();
        let err = HfCheckpoint::open(d.path(), 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(err.contains(SINGLE_FILE), "{err}");
        // A dtype zero does not read as weights: listed, read raw, refused as f32.
        let raw: Vec<u8> = (1..=16).collect();
        write(&path, &[("ids", Dtype::I32, vec![4], raw.clone())]);
        let mut ck = HfCheckpoint::open(d.path(), 1 << 20).unwrap();
        assert_eq!(ck.tensors()["ids"].stored, "I32");
        assert_eq!(ck.read_raw("ids").unwrap(), raw);
        let err = ck
            .read_f32("ids", 0..4, &mut [0.0; 4])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`ids`") && err.contains("I32"), "{err}");
        drop(ck);
        // An index naming a missing shard, and one placing a tensor in the wrong file.
        std::fs::remove_file(&path).unwrap();
        write(
            &d.path().join("one.safetensors"),
            &[("w", Dtype::F32, vec![2], bytes_f32(&[1.0, 2.0]))],
        );
        let index = |map: serde_json::Value| {
            std::fs::write(
                d.path().join(INDEX_FILE),
                serde_json::json!({"weight_map": map}).to_string(),
            )
            .unwrap()
        };
        index(serde_json::json!({"w": "one.safetensors", "v": "two.safetensors"}));
        let err = HfCheckpoint::open(d.path(), 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("two.safetensors") && err.contains("missing"),
            "{err}"
        );
        index(serde_json::json!({"w": "one.safetensors", "v": "one.safetensors"}));
        let err = HfCheckpoint::open(d.path(), 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("one.safetensors") && err.contains("`v`"),
            "{err}"
        );
    }
}
