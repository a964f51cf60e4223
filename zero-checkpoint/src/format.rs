//! The manifest, the per-rank index, file names, and safetensors headers.
//!
//! Safetensors headers are built and parsed with the `safetensors` crate's own `Metadata`
//! (its validation of dtypes, shapes and contiguous offsets included). The bytes around
//! them are streamed by [`crate::io`] rather than by the crate's `serialize_to_file`, which
//! needs every tensor's bytes at once, writes in place with no `fsync` or temporary name,
//! and computes no checksum; and read with `pread` rather than the crate's
//! `SafeTensors::deserialize`, which needs the whole file in memory or mapped, so that a
//! rank reads only the byte ranges it loads. Any safetensors reader opens the files (the
//! tests check the crate's and the Python package's).

use super::CheckpointError;
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::Dtype;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use zero_kernels::DType;

/// The manifest's `format`.
pub const FORMAT: &str = "zero-checkpoint";
/// The manifest's `format_version`; a reader refuses any other.
pub const FORMAT_VERSION: u32 = 1;
/// The manifest's file name.
pub const MANIFEST: &str = "manifest.json";
/// The file naming the newest tag.
pub const LATEST: &str = "latest";
/// The key suffixes of the moments file.
pub const MOMENTS: [&str; 2] = ["exp_avg", "exp_avg_sq"];

/// What a file of a checkpoint holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// A rank's fragments of the fp32 master weights.
    Master,
    /// A rank's fragments of `exp_avg` and `exp_avg_sq`.
    Moments,
    /// A rank's index: its files' sizes and chunk checksums.
    Index,
    /// Frozen parameters, whole, in the 16-bit dtype (rank 0).
    Frozen,
}

impl FileKind {
    /// The file's name for `rank` in the save `save_id`. Every save writes new names, so
    /// saving again under an existing tag never touches the files its current manifest
    /// lists until the new manifest has replaced it.
    pub fn file_name(self, rank: usize, save_id: &str) -> String {
        match self {
            FileKind::Master => format!("rank{rank:05}-master-{save_id}.safetensors"),
            FileKind::Moments => format!("rank{rank:05}-moments-{save_id}.safetensors"),
            FileKind::Index => format!("rank{rank:05}-index-{save_id}.json"),
            FileKind::Frozen => format!("frozen-{save_id}.safetensors"),
        }
    }
}

/// The key of a moment of parameter `name`.
pub fn moment_key(name: &str, which: &str) -> String {
    format!("{name}.{which}")
}

/// One fragment of a flattened parameter, held by `rank`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fragment {
    /// The rank whose files hold it.
    pub rank: usize,
    /// Its first element in the flattened parameter.
    pub offset: usize,
    /// Its element count.
    pub len: usize,
}

/// One parameter: its shape, and where its fp32 state is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamEntry {
    /// `module.param`.
    pub name: String,
    /// The global shape.
    pub shape: Vec<usize>,
    /// Trained (fragments in the rank files) or frozen (whole in `frozen.safetensors`).
    pub trainable: bool,
    /// The fragments, in order of offset, covering the parameter exactly (trainable only).
    pub fragments: Vec<Fragment>,
    /// Other full names of the same tensor (tied weights); absent in older manifests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
}

impl ParamEntry {
    /// Element count.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A file of the checkpoint with its size and CRC-32C.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Its name in the tag's folder.
    pub name: String,
    /// The rank that wrote it.
    pub rank: usize,
    /// What it holds.
    pub kind: FileKind,
    /// Its length in bytes.
    pub bytes: u64,
    /// CRC-32C of all of it.
    pub crc32c: u32,
}

/// Step counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Steps {
    /// Optimizer steps taken (the Adam step).
    pub optimizer: u64,
    /// Steps skipped on overflow.
    pub skipped: u64,
    /// All steps.
    pub global: u64,
}

/// The loss scaler's state, as a checkpoint records it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScalerState {
    /// The current scale.
    pub scale: f64,
    /// Dynamic scaling only: its counters.
    pub dynamic: Option<DynamicState>,
}

/// The dynamic loss scaler's counters (the good-step count since the last overflow is
/// `cur_iter - last_overflow_iter - 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DynamicState {
    /// `cur_iter`.
    pub cur_iter: i64,
    /// `last_overflow_iter`.
    pub last_overflow_iter: i64,
    /// `cur_hysteresis`.
    pub cur_hysteresis: u64,
}

/// `DIR/TAG/manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: String,
    /// [`FORMAT_VERSION`].
    pub format_version: u32,
    /// The tag.
    pub tag: String,
    /// The ZeRO stage it was saved at.
    pub stage: u8,
    /// The world size it was saved at.
    pub world_size: usize,
    /// `fp32`, `fp16` or `bf16`.
    pub precision: String,
    /// The parameters' (and frozen file's) dtype: `F32`, `F16` or `BF16`.
    pub dtype: String,
    /// The optimizer state's dtype: always `F32`.
    pub master_dtype: String,
    /// Step counters.
    pub steps: Steps,
    /// The loss scaler.
    pub loss_scaler: ScalerState,
    /// The LR schedule's `last_batch_iteration`.
    pub lr_last_batch_iteration: i64,
    /// The run's DeepSpeed configuration.
    pub config: serde_json::Value,
    /// The trainer's own state, returned by load.
    pub client_state: serde_json::Value,
    /// Every parameter, in registration order.
    pub params: Vec<ParamEntry>,
    /// Every file of the checkpoint but the manifest.
    pub files: Vec<FileEntry>,
}

impl Manifest {
    /// Parses and checks a manifest read from `path`.
    pub fn parse(bytes: &[u8], path: &str) -> Result<Self, CheckpointError> {
        let bad = |reason: String| CheckpointError::Format {
            path: path.to_string(),
            reason,
        };
        let v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not a JSON manifest ({e})")))?;
        match (v.get("format"), v.get("format_version")) {
            (Some(f), _) if f != FORMAT => {
                return Err(bad(format!("format {f}, expected \"{FORMAT}\"")))
            }
            (_, Some(n)) if n.as_u64() != Some(FORMAT_VERSION as u64) => {
                return Err(bad(format!(
                    "format version {n}; this zero reads version {FORMAT_VERSION}"
                )))
            }
            (None, _) | (_, None) => return Err(bad("no format or format_version".into())),
            _ => {}
        }
        let m: Manifest =
            serde_json::from_value(v).map_err(|e| bad(format!("malformed manifest ({e})")))?;
        m.check().map_err(bad)?;
        Ok(m)
    }

    /// Internal consistency: fragments cover each parameter exactly, ranks and files
    /// exist.
    fn check(&self) -> Result<(), String> {
        if self.world_size == 0 || self.stage > 3 {
            return Err(format!(
                "world size {} / stage {}",
                self.world_size, self.stage
            ));
        }
        parse_dtype(&self.dtype).ok_or_else(|| format!("unknown dtype {}", self.dtype))?;
        let mut names = std::collections::HashSet::new();
        for p in &self.params {
            if !names.insert(p.name.as_str()) {
                return Err(format!("parameter `{}` is listed twice", p.name));
            }
            let n = p
                .shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .ok_or_else(|| format!("parameter `{}`: shape {:?} overflows", p.name, p.shape))?;
            if !p.trainable {
                continue;
            }
            let mut at = 0usize;
            for f in &p.fragments {
                if f.rank >= self.world_size || f.offset != at || f.len == 0 {
                    return Err(format!(
                        "parameter `{}`: fragment {f:?} does not continue at {at} on a rank below {}",
                        p.name, self.world_size
                    ));
                }
                at = at
                    .checked_add(f.len)
                    .ok_or_else(|| format!("parameter `{}`: fragments overflow", p.name))?;
            }
            if at != n {
                return Err(format!(
                    "parameter `{}`: fragments cover {at} of {n} elements",
                    p.name
                ));
            }
        }
        Ok(())
    }

    /// The file of `kind` written by `rank`.
    pub fn file(&self, rank: usize, kind: FileKind) -> Option<&FileEntry> {
        self.files.iter().find(|f| f.rank == rank && f.kind == kind)
    }

    /// The 16-bit dtype.
    pub fn dtype(&self) -> DType {
        parse_dtype(&self.dtype).unwrap_or(DType::F32)
    }
}

/// `DIR/TAG/rankNNNNN.index.json`: one rank's data files with their chunk checksums.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankIndex {
    /// The rank.
    pub rank: usize,
    /// Bytes per checksummed chunk.
    pub chunk_bytes: usize,
    /// Its files.
    pub files: Vec<IndexedFile>,
}

/// A data file and the CRC-32C of each of its chunks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexedFile {
    /// Its size and whole-file checksum.
    #[serde(flatten)]
    pub entry: FileEntry,
    /// CRC-32C per chunk.
    pub chunk_crc32c: Vec<u32>,
}

/// Our dtype's safetensors name.
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "F32",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
    }
}

/// A safetensors dtype name as ours.
pub fn parse_dtype(s: &str) -> Option<DType> {
    match s {
        "F32" => Some(DType::F32),
        "F16" => Some(DType::F16),
        "BF16" => Some(DType::BF16),
        _ => None,
    }
}

fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
    }
}

/// One tensor of a safetensors file to be written: name, dtype, shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Its key.
    pub name: String,
    /// Its dtype.
    pub dtype: DType,
    /// Its shape.
    pub shape: Vec<usize>,
}

impl TensorSpec {
    /// Bytes of its data.
    pub fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size_of()
    }
}

/// The first bytes of a safetensors file holding `tensors` in this order: the header
/// length (u64, little-endian), then the JSON header padded with spaces to a multiple of 8
/// bytes, as the safetensors crate writes it. The data follows, tensor after tensor.
pub fn safetensors_header(
    tensors: &[TensorSpec],
    metadata: HashMap<String, String>,
) -> Result<Vec<u8>, CheckpointError> {
    let mut at = 0usize;
    let infos: Vec<(String, TensorInfo)> = tensors
        .iter()
        .map(|t| {
            let n = t.bytes();
            let info = TensorInfo {
                dtype: st_dtype(t.dtype),
                shape: t.shape.clone(),
                data_offsets: (at, at + n),
            };
            at += n;
            (t.name.clone(), info)
        })
        .collect();
    let meta = Metadata::new(Some(metadata), infos).map_err(|e| CheckpointError::Format {
        path: "(a new safetensors file)".into(),
        reason: format!("invalid header: {e}"),
    })?;
    let mut json = serde_json::to_vec(&meta).map_err(|e| CheckpointError::Format {
        path: "(a new safetensors file)".into(),
        reason: e.to_string(),
    })?;
    json.resize(json.len().div_ceil(8) * 8, b' ');
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    Ok(out)
}

/// Where each tensor's bytes are in a safetensors file, parsed from its header.
#[derive(Debug, Clone)]
pub struct SafetensorsIndex {
    /// Absolute byte range and info of each tensor, by name.
    pub tensors: HashMap<String, (std::ops::Range<u64>, TensorInfo)>,
    /// The file's length the header implies.
    pub file_len: u64,
}

/// The largest header we accept (the safetensors crate's limit).
pub const MAX_HEADER: u64 = 100_000_000;

/// Parses a safetensors header: `len8` is the file's first 8 bytes, `header` the next
/// `u64::from_le_bytes(len8)` bytes; `file_len` the file's length, which must match.
pub fn parse_safetensors_header(
    header: &[u8],
    file_len: u64,
    path: &str,
) -> Result<SafetensorsIndex, CheckpointError> {
    let bad = |reason: String| CheckpointError::Format {
        path: path.to_string(),
        reason,
    };
    let meta: Metadata = serde_json::from_slice(header)
        .map_err(|e| bad(format!("not a safetensors header ({e})")))?;
    let base = 8 + header.len() as u64;
    let data_len = meta.data_len() as u64;
    if base + data_len != file_len {
        return Err(bad(format!(
            "the header describes {} bytes, the file has {file_len}",
            base + data_len
        )));
    }
    let tensors = meta
        .tensors()
        .into_iter()
        .map(|(name, info)| {
            let (s, e) = info.data_offsets;
            (name, (base + s as u64..base + e as u64, info.clone()))
        })
        .collect();
    Ok(SafetensorsIndex { tensors, file_len })
}

/// The header length in a safetensors file's first 8 bytes, checked against the file.
pub fn header_len(first8: &[u8], file_len: u64, path: &str) -> Result<u64, CheckpointError> {
    let n = u64::from_le_bytes(first8.try_into().map_err(|_| CheckpointError::Format {
        path: path.to_string(),
        reason: "shorter than a safetensors header".into(),
    })?);
    if n > MAX_HEADER || n + 8 > file_len {
        return Err(CheckpointError::Format {
            path: path.to_string(),
            reason: format!("header length {n} does not fit a file of {file_len} bytes"),
        });
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_header_is_what_the_safetensors_crate_reads() {
        let tensors = vec![
            TensorSpec {
                name: "a.w".into(),
                dtype: DType::F32,
                shape: vec![3],
            },
            TensorSpec {
                name: "b".into(),
                dtype: DType::BF16,
                shape: vec![2, 2],
            },
        ];
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        let mut file = safetensors_header(&tensors, meta).unwrap();
        assert_eq!((file.len() - 8) % 8, 0);
        file.extend((0..12u8).chain(0..8u8));
        let st = safetensors::SafeTensors::deserialize(&file).unwrap();
        assert_eq!(
            st.tensor("a.w").unwrap().data(),
            &(0..12u8).collect::<Vec<_>>()[..]
        );
        assert_eq!(st.tensor("b").unwrap().shape(), &[2, 2]);
        let n = header_len(&file[..8], file.len() as u64, "f").unwrap() as usize;
        let idx = parse_safetensors_header(&file[8..8 + n], file.len() as u64, "f").unwrap();
        assert_eq!(idx.tensors["b"].0, (8 + n as u64 + 12)..(8 + n as u64 + 20));
        let err = parse_safetensors_header(&file[8..8 + n], file.len() as u64 + 1, "f");
        assert!(err.unwrap_err().to_string().contains("the file has"));
    }
}
