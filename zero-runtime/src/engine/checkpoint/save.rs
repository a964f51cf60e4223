//! `save_checkpoint`: each rank streams its partition's fp32 state into its files; rank 0
//! commits with the manifest, then `latest`.
//!
//! The commit protocol, so a crash never loses the last good checkpoint:
//! 1. rank 0's tag goes to every rank;
//! 2. every rank writes its files under temporary names, `fsync`s and renames them;
//! 3. every rank's result (its files, sizes and checksums, or its error) reaches every
//!    rank: one failure fails all, and nothing is committed;
//! 4. rank 0 writes the manifest (temporary name, `fsync`, rename, `fsync` of the folder),
//!    and only then `latest` the same way; its outcome reaches every rank.
//!
//! A tag without a manifest is invisible to load, so a crash anywhere before step 4 leaves
//! `latest` naming the previous checkpoint, complete.

use super::super::Engine;
use super::agree::{clip, TEXT_MAX};
use super::Piece;
use crate::checkpoint::format::{
    dtype_name, moment_key, safetensors_header, FileEntry, FileKind, Fragment, IndexedFile,
    Manifest, ParamEntry, RankIndex, TensorSpec, FORMAT, FORMAT_VERSION, LATEST, MANIFEST,
};
use crate::checkpoint::CheckpointError;
use crate::config::TagValidation;
use crate::device::Device;
use crate::io::{write_file, FileWriter, IoError, WrittenFile, CHUNK, DEFAULT_BUFFER};
use crate::plan::ParamLoc;
use crate::EngineError;
use std::collections::HashMap;
use std::path::Path;
use zero_comm::Communicator;
use zero_kernels::DType;

/// A tag must name one folder.
fn check_tag(tag: &str) -> Result<(), CheckpointError> {
    if tag.is_empty()
        || tag == "."
        || tag == ".."
        || tag.contains(['/', '\\', '\0'])
        || tag.starts_with('.')
        || tag.len() > 255
    {
        return Err(CheckpointError::Tag(format!(
            "`{tag}` cannot be a folder name (no path separators, not empty, not starting with '.', at most 255 bytes)"
        )));
    }
    Ok(())
}

fn entry(w: &WrittenFile, rank: usize, kind: FileKind) -> FileEntry {
    FileEntry {
        name: w
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        rank,
        kind,
        bytes: w.bytes,
        crc32c: w.crc32c,
    }
}

/// A name no earlier save used: the time, hashed with the process.
fn new_save_id() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let h = crc32c::crc32c(format!("{t}-{}", std::process::id()).as_bytes());
    format!("{:x}{h:08x}", t % 1_000_000_000)
}

/// A piece's elements as `f32` bytes, streamed from `buf` (`start` = where the buffer
/// begins in the flat layout).
fn stream_f32<D: Device>(
    dev: &D,
    w: &mut FileWriter,
    buf: &D::Buffer,
    range: std::ops::Range<usize>,
) -> Result<(), EngineError> {
    w.write_with(4 * range.len(), |at, dst| {
        let vals: &mut [f32] = bytemuck::try_cast_slice_mut(dst)
            .map_err(|e| EngineError::Internal(format!("I/O buffer not aligned for f32: {e}")))?;
        let first = range.start + at / 4;
        dev.download_f32_into(buf, first..first + vals.len(), vals)
    })
}

/// The safetensors metadata of one of a rank's checkpoint files.
pub(super) fn file_meta(kind: &str, rank: usize, world: usize) -> HashMap<String, String> {
    HashMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("kind".to_string(), kind.to_string()),
        ("rank".to_string(), rank.to_string()),
        ("world_size".to_string(), world.to_string()),
    ])
}

impl From<IoError> for EngineError {
    fn from(e: IoError) -> Self {
        CheckpointError::from(e).into()
    }
}

/// How [`Engine::save_checkpoint_with`] saves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SaveOptions {
    /// Leave the frozen parameters out (DeepSpeed's `exclude_frozen_parameters`, what the
    /// Trainer asks for a PEFT model): the checkpoint holds the trained parameters only,
    /// and a load with `strict = false` keeps the model's frozen values.
    pub exclude_frozen_parameters: bool,
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// [`save_checkpoint_with`](Self::save_checkpoint_with) with the default options.
    pub fn save_checkpoint(
        &mut self,
        dir: &Path,
        tag: Option<&str>,
        client_state: serde_json::Value,
    ) -> Result<String, EngineError> {
        self.save_checkpoint_with(dir, tag, client_state, SaveOptions::default())
    }

    /// Saves this rank's part of a checkpoint of the whole run to `dir/TAG/`, and, once
    /// every rank's part is on disk, commits it (manifest, then `dir/latest`). Every rank
    /// calls it at the same step boundary. `tag` defaults to `global_step{N}`; rank 0's is
    /// the one used (`checkpoint.tag_validation` says what a differing tag on another rank
    /// does). `client_state` comes back from [`load_checkpoint`](Self::load_checkpoint).
    /// Returns the tag.
    ///
    /// Any rank's failure fails every rank, and the previous checkpoint stays `latest`.
    pub fn save_checkpoint_with(
        &mut self,
        dir: &Path,
        tag: Option<&str>,
        client_state: serde_json::Value,
        options: SaveOptions,
    ) -> Result<String, EngineError> {
        self.require_boundary("save_checkpoint")?;
        self.on_replica_zero(
            "saving a checkpoint",
            |e| e.save_shard_group(dir, tag, client_state, options),
            |tag| tag.clone(),
            |tag| tag,
        )
    }

    /// The save of one shard group: every rank of it writes its part (see
    /// [`save_checkpoint_with`](Self::save_checkpoint_with)).
    fn save_shard_group(
        &mut self,
        dir: &Path,
        tag: Option<&str>,
        client_state: serde_json::Value,
        options: SaveOptions,
    ) -> Result<String, EngineError> {
        let mine = tag
            .map(str::to_string)
            .unwrap_or_else(|| format!("global_step{}", self.steps.global));
        // Rank 0's tag, and a fresh name for this save's files, to every rank.
        let told =
            self.broadcast_text(&format!("{}\n{mine}", new_save_id()), "agreeing on the tag")?;
        let (save_id, tag) = told.split_once('\n').unwrap_or(("", told.as_str()));
        let (save_id, tag) = (save_id.to_string(), tag.to_string());
        check_tag(&tag)?;
        self.validate_tag(&mine, &tag)?;
        let folder = dir.join(&tag);
        let written = self.write_rank_files(&folder, &save_id, options);
        // Each rank's files (name, bytes, crc32c) or its error, to every rank.
        let record = match &written {
            Ok(files) => serde_json::to_string(files).unwrap_or_default(),
            Err(e) => format!("!{}", clip(&e.to_string(), TEXT_MAX - 1)),
        };
        let records = self.gather_texts(&record, "collecting every rank's saved files")?;
        let failed = records
            .iter()
            .enumerate()
            .find(|(_, r)| r.starts_with('!'))
            .map(|(rank, r)| (rank, r[1..].to_string()));
        if let Some((rank, message)) = failed {
            if let Ok(files) = &written {
                for f in files {
                    let _ = std::fs::remove_file(folder.join(&f.name));
                }
            }
            return Err(match written {
                Err(e) => e,
                Ok(_) => CheckpointError::RankFailed { rank, message }.into(),
            });
        }
        let mut files = Vec::new();
        for (rank, r) in records.iter().enumerate() {
            let list: Vec<FileEntry> =
                serde_json::from_str(r).map_err(|e| CheckpointError::RankFailed {
                    rank,
                    message: format!("its result did not arrive whole ({e})"),
                })?;
            files.extend(list);
        }
        let commit = if self.shard.rank == 0 {
            self.commit(dir, &tag, files, client_state, options)
        } else {
            Ok(())
        };
        let failure = commit
            .as_ref()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        let verdict = self.broadcast_text(clip(&failure, TEXT_MAX), "committing the checkpoint")?;
        match commit {
            Err(e) => Err(e),
            Ok(()) if !verdict.is_empty() => Err(CheckpointError::RankFailed {
                rank: 0,
                message: verdict,
            }
            .into()),
            Ok(()) => {
                self.remove_stale_files(&folder, &save_id);
                Ok(tag)
            }
        }
    }

    /// After a commit under a tag that existed: this rank's files of earlier saves, which
    /// the new manifest no longer lists.
    fn remove_stale_files(&self, folder: &Path, save_id: &str) {
        let mine = format!("rank{:05}-", self.shard.rank);
        let Ok(entries) = std::fs::read_dir(folder) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let ours =
                name.starts_with(&mine) || (self.shard.rank == 0 && name.starts_with("frozen-"));
            if ours && !name.contains(save_id) && !name.ends_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// `checkpoint.tag_validation`: the ranks whose own tag differs from rank 0's.
    fn validate_tag(&mut self, mine: &str, tag: &str) -> Result<(), EngineError> {
        let mode = self.cfg.checkpoint.tag_validation;
        if mode == TagValidation::Ignore {
            return Ok(());
        }
        let flag = if mine == tag { "" } else { mine };
        let all = self.gather_texts(flag, "comparing the ranks' tags")?;
        let differ: Vec<String> = all
            .iter()
            .enumerate()
            .filter(|(_, t)| !t.is_empty())
            .map(|(r, t)| format!("rank {r} `{t}`"))
            .collect();
        if differ.is_empty() {
            return Ok(());
        }
        let msg = format!(
            "rank 0's tag is `{tag}`, but {} (checkpoint.tag_validation)",
            differ.join(", ")
        );
        match mode {
            TagValidation::Fail => Err(CheckpointError::Tag(msg).into()),
            _ => {
                if self.shard.rank == 0 {
                    eprintln!("warning: {msg}; saving under `{tag}`");
                }
                Ok(())
            }
        }
    }

    /// Streams elements `r` of bucket `b`'s held array `kind` into `w`: from the device
    /// straight into the writer's buffer, or from the offload tier (on NVMe, the swap file).
    fn save_state(
        &mut self,
        w: &mut FileWriter,
        b: usize,
        kind: usize,
        r: std::ops::Range<usize>,
    ) -> Result<(), EngineError> {
        match self.offload.as_mut() {
            Some(off) => off.read(b, kind, r, |_, vals| {
                w.write(bytemuck::cast_slice(vals))
                    .map_err(EngineError::from)
            }),
            None => {
                let (buf, at) = self.held_array(b, kind)?;
                stream_f32(&self.dev, w, buf, Self::held_range(at, r))
            }
        }
    }

    /// Writes this rank's master, moments, (rank 0) frozen and index files.
    fn write_rank_files(
        &mut self,
        folder: &Path,
        save_id: &str,
        options: SaveOptions,
    ) -> Result<Vec<FileEntry>, EngineError> {
        let rank = self.shard.rank;
        let name = |kind: FileKind| folder.join(kind.file_name(rank, save_id));
        let made = std::fs::create_dir_all(folder)
            .map_err(|e| CheckpointError::Io(format!("creating {}: {e}", folder.display())));
        let mut written: Vec<(WrittenFile, FileKind)> = Vec::new();
        // First, as every rank joins the frozen buckets' gathers whatever else fails.
        if !options.exclude_frozen_parameters {
            let file = self.write_frozen_file(&name(FileKind::Frozen), made.is_ok())?;
            written.extend(file.map(|w| (w, FileKind::Frozen)));
        }
        made?;
        let mut pieces: Vec<(usize, Piece)> = Vec::new();
        for b in self.trainable_range() {
            pieces.extend(
                self.partition_pieces(b, self.shard.rank)?
                    .into_iter()
                    .map(|p| (b, p)),
            );
        }
        let world = self.shard.size;
        let meta = |kind: &str| file_meta(kind, rank, world);
        let spec = |name: String, len: usize| TensorSpec {
            name,
            dtype: DType::F32,
            shape: vec![len],
        };

        // Master weights.
        let tensors: Vec<TensorSpec> = pieces
            .iter()
            .map(|(_, p)| spec(self.param_name(p.param), p.tensor_range.len()))
            .collect();
        let mut w = FileWriter::create(&name(FileKind::Master), DEFAULT_BUFFER)?;
        w.write(&safetensors_header(&tensors, meta("master"))?)?;
        for (b, p) in &pieces {
            let start = self.opt_start(*b)?;
            let r = p.flat_range.start - start..p.flat_range.end - start;
            self.save_state(&mut w, *b, 0, r)?;
        }
        written.push((w.finish()?, FileKind::Master));

        // Moments: exp_avg then exp_avg_sq of each piece.
        let tensors: Vec<TensorSpec> = pieces
            .iter()
            .flat_map(|(_, p)| {
                let name = self.param_name(p.param);
                let n = p.tensor_range.len();
                [
                    spec(moment_key(&name, "exp_avg"), n),
                    spec(moment_key(&name, "exp_avg_sq"), n),
                ]
            })
            .collect();
        let mut w = FileWriter::create(&name(FileKind::Moments), DEFAULT_BUFFER)?;
        w.write(&safetensors_header(&tensors, meta("moments"))?)?;
        for (b, p) in &pieces {
            let start = self.opt_start(*b)?;
            let r = p.flat_range.start - start..p.flat_range.end - start;
            self.save_state(&mut w, *b, 1, r.clone())?;
            self.save_state(&mut w, *b, 2, r)?;
        }
        written.push((w.finish()?, FileKind::Moments));

        // The index: every file with its chunk checksums.
        let index = RankIndex {
            rank: self.shard.rank,
            chunk_bytes: CHUNK,
            files: written
                .iter()
                .map(|(w, kind)| IndexedFile {
                    entry: entry(w, self.shard.rank, *kind),
                    chunk_crc32c: w.chunk_crc32c.clone(),
                })
                .collect(),
        };
        let text = serde_json::to_vec(&index).map_err(|e| CheckpointError::Io(e.to_string()))?;
        let idx = write_file(&name(FileKind::Index), &text)?;
        let mut entries: Vec<FileEntry> = written
            .iter()
            .map(|(w, kind)| entry(w, self.shard.rank, *kind))
            .collect();
        entries.push(entry(&idx, self.shard.rank, FileKind::Index));
        Ok(entries)
    }

    /// Rank 0: the manifest (crash-safe), then `latest`.
    fn commit(
        &self,
        dir: &Path,
        tag: &str,
        files: Vec<FileEntry>,
        client_state: serde_json::Value,
        options: SaveOptions,
    ) -> Result<(), EngineError> {
        let mut params = Vec::with_capacity(self.param_count());
        for id in 0..self.param_count() {
            let spec = self.param_spec(id);
            if !spec.trainable && options.exclude_frozen_parameters {
                continue;
            }
            let fragments = match self.plan.locs[id] {
                ParamLoc::Bucket { bucket, index } if spec.trainable => self.plan.buckets[bucket]
                    .layout
                    .tensor_shards(index)?
                    .into_iter()
                    .filter(|s| !s.tensor_range.is_empty())
                    .map(|s| Fragment {
                        rank: s.rank,
                        offset: s.tensor_range.start,
                        len: s.tensor_range.len(),
                    })
                    .collect(),
                // Frozen values are in the frozen file, whole.
                _ => Vec::new(),
            };
            params.push(ParamEntry {
                name: self.param_name(id),
                shape: spec.shape.clone(),
                trainable: spec.trainable,
                fragments,
                aliases: spec.aliases.clone(),
            });
        }
        let manifest = Manifest {
            format: FORMAT.into(),
            format_version: FORMAT_VERSION,
            tag: tag.into(),
            stage: self.policy.stage,
            world_size: self.shard.size,
            precision: self.cfg.precision.name().into(),
            dtype: dtype_name(self.dtype).into(),
            master_dtype: "F32".into(),
            steps: self.steps,
            loss_scaler: self.scaler.state(),
            lr_last_batch_iteration: self.schedule.last_batch_iteration(),
            config: self.cfg.source.clone(),
            client_state,
            params,
            files,
        };
        let text =
            serde_json::to_vec_pretty(&manifest).map_err(|e| CheckpointError::Io(e.to_string()))?;
        write_file(&dir.join(tag).join(MANIFEST), &text)?;
        write_file(&dir.join(LATEST), tag.as_bytes())?;
        Ok(())
    }
}
