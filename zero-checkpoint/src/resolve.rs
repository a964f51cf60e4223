//! Finding a checkpoint, and reading its parameters' fp32 state back by ranges.

use super::format::{
    header_len, moment_key, parse_safetensors_header, FileKind, Manifest, RankIndex,
    SafetensorsIndex, LATEST, MANIFEST,
};
use super::{CheckpointError, ParamEntry};
use crate::io::{RangeReader, ReadStats, DEFAULT_BUFFER};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The tag to load: `tag`, or the one `DIR/latest` names. Either way the tag's manifest
/// must exist: a tag without one is a save that did not finish, and does not exist.
pub fn resolve_tag(dir: &Path, tag: Option<&str>) -> Result<String, CheckpointError> {
    let tag = match tag {
        Some(t) => t.to_string(),
        None => {
            let latest = dir.join(LATEST);
            let text = std::fs::read_to_string(&latest).map_err(|e| CheckpointError::NotFound {
                path: latest.display().to_string(),
                reason: format!(
                    "{e}; pass a tag, or save a checkpoint to {} first",
                    dir.display()
                ),
            })?;
            let t = text.trim().to_string();
            if t.is_empty() {
                return Err(CheckpointError::NotFound {
                    path: latest.display().to_string(),
                    reason: "it names no tag".into(),
                });
            }
            t
        }
    };
    let manifest = dir.join(&tag).join(MANIFEST);
    if !manifest.is_file() {
        return Err(CheckpointError::NotFound {
            path: manifest.display().to_string(),
            reason: format!(
                "tag `{tag}` has no manifest (it does not exist, or its save did not finish)"
            ),
        });
    }
    Ok(tag)
}

/// Which fp32 state of a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateKind {
    /// The master weights.
    Master,
    /// `exp_avg`.
    ExpAvg,
    /// `exp_avg_sq`.
    ExpAvgSq,
}

/// An open checkpoint: its manifest, and readers of its files opened on demand.
#[derive(Debug)]
pub struct CheckpointDir {
    /// `DIR/TAG`.
    pub path: PathBuf,
    /// The tag.
    pub tag: String,
    /// The manifest.
    pub manifest: Manifest,
    buffer: usize,
    indexes: HashMap<usize, RankIndex>,
    files: HashMap<String, (RangeReader, SafetensorsIndex)>,
}

impl CheckpointDir {
    /// Opens `dir`'s checkpoint `tag` (or `latest`'s), reading only its manifest.
    pub fn open(dir: &Path, tag: Option<&str>) -> Result<Self, CheckpointError> {
        let tag = resolve_tag(dir, tag)?;
        let path = dir.join(&tag);
        let manifest_path = path.join(MANIFEST);
        let bytes = std::fs::read(&manifest_path).map_err(|e| CheckpointError::NotFound {
            path: manifest_path.display().to_string(),
            reason: e.to_string(),
        })?;
        let manifest = Manifest::parse(&bytes, &manifest_path.display().to_string())?;
        Ok(Self {
            path,
            tag,
            manifest,
            buffer: DEFAULT_BUFFER,
            indexes: HashMap::new(),
            files: HashMap::new(),
        })
    }

    /// Sets the read buffer of each file opened from now on.
    pub fn with_buffer(mut self, bytes: usize) -> Self {
        self.buffer = bytes;
        self
    }

    fn file_path(&self, name: &str) -> String {
        self.path.join(name).display().to_string()
    }

    /// The name of `rank`'s file of `kind`, from the manifest.
    pub fn file_name(&self, rank: usize, kind: FileKind) -> Result<String, CheckpointError> {
        self.manifest
            .file(rank, kind)
            .map(|f| f.name.clone())
            .ok_or_else(|| CheckpointError::Format {
                path: self.file_path(MANIFEST),
                reason: format!(
                    "lists no {kind:?} file of rank {rank} (world size {})",
                    self.manifest.world_size
                ),
            })
    }

    /// Rank `rank`'s index, checked against the manifest's size and CRC-32C.
    pub fn rank_index(&mut self, rank: usize) -> Result<&RankIndex, CheckpointError> {
        if !self.indexes.contains_key(&rank) {
            let name = self.file_name(rank, FileKind::Index)?;
            let path = self.file_path(&name);
            let entry = self
                .manifest
                .file(rank, FileKind::Index)
                .cloned()
                .ok_or_else(|| CheckpointError::Format {
                    path: self.file_path(MANIFEST),
                    reason: format!("lists no index of rank {rank}"),
                })?;
            let bytes = std::fs::read(&path).map_err(|e| CheckpointError::NotFound {
                path: path.clone(),
                reason: format!("rank {rank}'s index is missing ({e})"),
            })?;
            if bytes.len() as u64 != entry.bytes || crc32c::crc32c(&bytes) != entry.crc32c {
                return Err(CheckpointError::Format {
                    path,
                    reason: format!(
                        "{} bytes with crc32c {:08x}, the manifest says {} bytes with {:08x}: the file is damaged",
                        bytes.len(),
                        crc32c::crc32c(&bytes),
                        entry.bytes,
                        entry.crc32c
                    ),
                });
            }
            let index: RankIndex =
                serde_json::from_slice(&bytes).map_err(|e| CheckpointError::Format {
                    path: path.clone(),
                    reason: format!("malformed index ({e})"),
                })?;
            if index.chunk_bytes != crate::io::CHUNK || index.rank != rank {
                return Err(CheckpointError::Format {
                    path,
                    reason: format!(
                        "rank {} with {}-byte chunks, expected rank {rank} with {}",
                        index.rank,
                        index.chunk_bytes,
                        crate::io::CHUNK
                    ),
                });
            }
            self.indexes.insert(rank, index);
        }
        Ok(&self.indexes[&rank])
    }

    /// Opens data file `name` of `rank` (verified against its index), parsing its header.
    fn open_file(&mut self, rank: usize, name: &str) -> Result<(), CheckpointError> {
        if self.files.contains_key(name) {
            return Ok(());
        }
        let path = self.path.join(name);
        let shown = path.display().to_string();
        let indexed = self
            .rank_index(rank)?
            .files
            .iter()
            .find(|f| f.entry.name == name)
            .cloned()
            .ok_or_else(|| CheckpointError::Format {
                path: shown.clone(),
                reason: format!("not in rank {rank}'s index"),
            })?;
        if !path.is_file() {
            return Err(CheckpointError::NotFound {
                path: shown,
                reason: format!("rank {rank}'s file is missing"),
            });
        }
        let mut reader = RangeReader::open(
            &path,
            indexed.entry.bytes,
            Some(indexed.chunk_crc32c),
            self.buffer,
        )?;
        let mut first8 = [0u8; 8];
        reader.read(0, 8, |_, b| {
            first8.copy_from_slice(b);
            Ok::<(), CheckpointError>(())
        })?;
        let n = header_len(&first8, reader.len(), &shown)?;
        let mut header = Vec::with_capacity(n as usize);
        reader.read(8, n, |_, b| {
            header.extend_from_slice(b);
            Ok::<(), CheckpointError>(())
        })?;
        let index = parse_safetensors_header(&header, reader.len(), &shown)?;
        self.files.insert(name.to_string(), (reader, index));
        Ok(())
    }

    /// Reads elements `range` of `param`'s `kind` state, in order, handing them to `sink`
    /// as (offset in the range, values). Only the fragments' byte ranges that hold them
    /// are read.
    pub fn read_state(
        &mut self,
        param: &ParamEntry,
        kind: StateKind,
        range: std::ops::Range<usize>,
        mut sink: impl FnMut(usize, &[f32]) -> Result<(), CheckpointError>,
    ) -> Result<(), CheckpointError> {
        if !param.trainable || range.end > param.numel() {
            return Err(CheckpointError::Format {
                path: self.file_path(super::format::MANIFEST),
                reason: format!(
                    "parameter `{}`: elements {range:?} of a {} parameter of {} elements",
                    param.name,
                    if param.trainable {
                        "trainable"
                    } else {
                        "frozen"
                    },
                    param.numel()
                ),
            });
        }
        for f in &param.fragments {
            let (lo, hi) = (range.start.max(f.offset), range.end.min(f.offset + f.len));
            if lo >= hi {
                continue;
            }
            let (file, key) = match kind {
                StateKind::Master => (
                    self.file_name(f.rank, FileKind::Master)?,
                    param.name.clone(),
                ),
                StateKind::ExpAvg => (
                    self.file_name(f.rank, FileKind::Moments)?,
                    moment_key(&param.name, "exp_avg"),
                ),
                StateKind::ExpAvgSq => (
                    self.file_name(f.rank, FileKind::Moments)?,
                    moment_key(&param.name, "exp_avg_sq"),
                ),
            };
            self.open_file(f.rank, &file)?;
            let shown = self.file_path(&file);
            let (reader, index) = self
                .files
                .get_mut(&file)
                .ok_or_else(|| CheckpointError::Io(format!("{shown} is not open")))?;
            let (bytes, info) = index
                .tensors
                .get(&key)
                .ok_or_else(|| CheckpointError::Format {
                    path: shown.clone(),
                    reason: format!("no tensor `{key}` (parameter `{}`)", param.name),
                })?;
            if info.dtype != safetensors::Dtype::F32 || info.shape != [f.len] {
                return Err(CheckpointError::Format {
                    path: shown,
                    reason: format!(
                        "tensor `{key}` is {:?} {:?}, the manifest says F32 [{}]",
                        info.dtype, info.shape, f.len
                    ),
                });
            }
            let start = bytes.start + 4 * (lo - f.offset) as u64;
            let base = lo - range.start;
            let misaligned = || CheckpointError::Format {
                path: shown.clone(),
                reason: format!("tensor `{key}` is not aligned to 4 bytes"),
            };
            reader.read(start, 4 * (hi - lo) as u64, |at, b| {
                // Pieces split at chunk boundaries, multiples of 4 from the start of the
                // file, and f32 data starts at a multiple of 4: whole values.
                if at % 4 != 0 || b.len() % 4 != 0 {
                    return Err(misaligned());
                }
                match bytemuck::try_cast_slice::<u8, f32>(b) {
                    Ok(vals) if cfg!(target_endian = "little") => {
                        sink(base + at as usize / 4, vals)
                    }
                    _ => sink(base + at as usize / 4, &decode(b, zero_kernels::DType::F32)),
                }
            })?;
        }
        Ok(())
    }

    /// Reads frozen parameter `param` whole, widened to `f32`.
    pub fn read_frozen(&mut self, param: &ParamEntry) -> Result<Vec<f32>, CheckpointError> {
        self.read_frozen_range(param, 0..param.numel())
    }

    /// Reads elements `range` of frozen parameter `param` (flattened), widened to `f32`:
    /// only their bytes (a stage-3 rank reads its own partition's).
    pub fn read_frozen_range(
        &mut self,
        param: &ParamEntry,
        range: std::ops::Range<usize>,
    ) -> Result<Vec<f32>, CheckpointError> {
        let file = self.file_name(0, FileKind::Frozen)?;
        let name = file.as_str();
        self.open_file(0, name)?;
        let shown = self.file_path(name);
        let (reader, index) = self
            .files
            .get_mut(name)
            .ok_or_else(|| CheckpointError::Io(format!("{shown} is not open")))?;
        let (bytes, info) =
            index
                .tensors
                .get(&param.name)
                .ok_or_else(|| CheckpointError::Format {
                    path: shown.clone(),
                    reason: format!("no frozen parameter `{}`", param.name),
                })?;
        let dtype = match info.dtype {
            safetensors::Dtype::F32 => zero_kernels::DType::F32,
            safetensors::Dtype::F16 => zero_kernels::DType::F16,
            safetensors::Dtype::BF16 => zero_kernels::DType::BF16,
            other => {
                return Err(CheckpointError::Format {
                    path: shown,
                    reason: format!("`{}` has dtype {other:?}", param.name),
                })
            }
        };
        if info.shape != param.shape {
            return Err(CheckpointError::Format {
                path: shown,
                reason: format!(
                    "`{}` has shape {:?}, the manifest says {:?}",
                    param.name, info.shape, param.shape
                ),
            });
        }
        let size = dtype.size_of() as u64;
        if range.end > param.numel() || (bytes.end - bytes.start) != param.numel() as u64 * size {
            return Err(CheckpointError::Format {
                path: shown,
                reason: format!(
                    "`{}` holds {} bytes for {} elements (elements {range:?} asked for)",
                    param.name,
                    bytes.end - bytes.start,
                    param.numel()
                ),
            });
        }
        let (start, len) = (
            bytes.start + range.start as u64 * size,
            range.len() as u64 * size,
        );
        let mut raw = Vec::with_capacity(len as usize);
        reader.read(start, len, |_, b| {
            raw.extend_from_slice(b);
            Ok::<(), CheckpointError>(())
        })?;
        Ok(decode(&raw, dtype))
    }

    /// What the open files were asked for and read, summed.
    pub fn read_stats(&self) -> ReadStats {
        self.files
            .values()
            .fold(ReadStats::default(), |a, (r, _)| ReadStats {
                requested: a.requested + r.stats().requested,
                read: a.read + r.stats().read,
            })
    }
}

/// Little-endian values of `dtype` widened to `f32`.
pub fn decode(raw: &[u8], dtype: zero_kernels::DType) -> Vec<f32> {
    use zero_kernels::DType;
    match dtype {
        DType::F32 => raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::F16 => raw
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        DType::BF16 => raw
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
    }
}
