//! `load_checkpoint`: all or nothing, at any world size and stage.
//!
//! 1. Rank 0 resolves the tag (`latest` when none is given) and tells every rank.
//! 2. Every rank checks the manifest against its model (names, shapes; strictness), then
//!    reads the byte ranges of its new partitions — whatever world size, stage and
//!    bucket size saved them — into new buffers, each chunk's checksum verified.
//! 3. The ranks agree: if any failed, every rank returns an error and its engine is as it
//!    was. Otherwise the new buffers replace the old, the 16-bit parameters are rebuilt
//!    from the fp32 master weights (and all-gathered where the stage keeps them whole),
//!    and the counters, loss scale and LR schedule are restored.

use super::super::offload::{Offload, Staging};
use super::super::Engine;
use super::save::precision_name;
use super::Piece;
use crate::checkpoint::format::ParamEntry;
use crate::checkpoint::resolve::CheckpointDir as Dir;
use crate::checkpoint::resolve::{resolve_tag, CheckpointDir, StateKind};
use crate::checkpoint::{CheckpointError, LoadOptions, Manifest};
use crate::device::{AdamState, Device};
use crate::EngineError;
use std::collections::HashMap;
use std::path::Path;
use zero_comm::Communicator;
use zero_kernels::DType;

/// What a rank read, held aside until every rank has read successfully.
struct Staged<B> {
    /// New optimizer state per bucket.
    opt: Vec<AdamState<B>>,
    /// Frozen parameters from the checkpoint: (offset in the frozen buffer, values).
    frozen: Vec<(usize, Vec<f32>)>,
    /// The new offloaded state, when the state lives off the device.
    offload: Option<Staging>,
    manifest: Manifest,
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// Loads checkpoint `tag` (or the one `dir/latest` names) into this engine, whatever
    /// world size, stage, bucket size and 16-bit dtype saved it; returns the client state
    /// saved with it. Every rank calls it at the same step boundary. Nothing changes on any
    /// rank unless every rank read everything it needs (see [`LoadOptions`] for what is
    /// loaded).
    pub fn load_checkpoint(
        &mut self,
        dir: &Path,
        tag: Option<&str>,
        options: LoadOptions,
    ) -> Result<serde_json::Value, EngineError> {
        self.require_boundary("load_checkpoint")?;
        let resolved = if self.rank == 0 {
            resolve_tag(dir, tag)
        } else {
            Ok(String::new())
        };
        let told = self.broadcast_text(
            &match &resolved {
                Ok(t) => format!("+{t}"),
                Err(e) => format!("!{e}"),
            },
            "agreeing on the tag to load",
        )?;
        let tag = match (resolved, told.strip_prefix('+')) {
            (Err(e), _) => return Err(e.into()),
            (Ok(_), Some(t)) => t.to_string(),
            (Ok(_), None) => {
                return Err(CheckpointError::RankFailed {
                    rank: 0,
                    message: told.trim_start_matches('!').to_string(),
                }
                .into())
            }
        };
        let staged = self.read_checkpoint(dir, &tag, options);
        let outcome = staged.as_ref().map(|_| ()).map_err(|e| match e {
            EngineError::Checkpoint(c) => c.clone(),
            other => CheckpointError::Io(other.to_string()),
        });
        if let Err(e) = self.agree_outcome(outcome, "agreeing that every rank read its part") {
            if let Ok(staged) = staged {
                self.discard(staged);
            }
            return Err(e);
        }
        self.apply(staged?, options)
    }

    /// Step 2: checks the manifest and reads this rank's part into new buffers.
    fn read_checkpoint(
        &mut self,
        dir: &Path,
        tag: &str,
        options: LoadOptions,
    ) -> Result<Staged<C::Buffer>, EngineError> {
        // Windows of 8 MiB: the first window of each range is read while the caller waits,
        // the rest ahead of it.
        let mut ckpt = CheckpointDir::open(dir, Some(tag))?.with_buffer(16 << 20);
        let manifest_path = ckpt.path.join(crate::checkpoint::format::MANIFEST);
        let mismatch = |reason: String| CheckpointError::Mismatch {
            path: manifest_path.display().to_string(),
            reason,
        };
        let saved: HashMap<String, ParamEntry> = ckpt
            .manifest
            .params
            .iter()
            .map(|p| (p.name.clone(), p.clone()))
            .collect();
        let mut found: Vec<Option<ParamEntry>> = Vec::with_capacity(self.param_count());
        for id in 0..self.param_count() {
            let name = self.param_name(id);
            let spec = self.param_spec(id);
            match saved.get(&name) {
                Some(p) if p.shape != spec.shape => {
                    return Err(mismatch(format!(
                        "parameter `{name}` has shape {:?} in the checkpoint and {:?} in the model",
                        p.shape, spec.shape
                    ))
                    .into())
                }
                Some(p) if spec.trainable && !p.trainable => {
                    return Err(mismatch(format!(
                        "parameter `{name}` is frozen in the checkpoint but trained in the model: there is no optimizer state to load"
                    ))
                    .into())
                }
                Some(p) => found.push(Some(p.clone())),
                None if options.strict => {
                    return Err(mismatch(format!(
                        "the model's parameter `{name}` is not in the checkpoint (load with strict = false to keep its current value)"
                    ))
                    .into())
                }
                None => found.push(None),
            }
        }
        if options.strict {
            let ours: std::collections::HashSet<String> = (0..self.param_count())
                .map(|id| self.param_name(id))
                .collect();
            if let Some(extra) = ckpt
                .manifest
                .params
                .iter()
                .find(|p| !ours.contains(&p.name))
            {
                return Err(mismatch(format!(
                    "the checkpoint's parameter `{}` is not in the model (load with strict = false to ignore it)",
                    extra.name
                ))
                .into());
            }
        }
        let moments = options.load_optimizer_states && !options.load_module_only;
        let mut opt = Vec::with_capacity(self.buckets.len());
        let on_device = if self.offload.is_some() {
            0
        } else {
            self.buckets.len()
        };
        for b in 0..on_device {
            let cur = &self.buckets[b].opt;
            let n = self.dev.len(&cur.master);
            // Start from the current state: parameters the checkpoint lacks keep theirs.
            let mut new = AdamState {
                master: self.dev.zeros(DType::F32, n)?,
                exp_avg: self.dev.zeros(DType::F32, n)?,
                exp_avg_sq: self.dev.zeros(DType::F32, n)?,
            };
            self.dev.copy(&cur.master, 0..n, &mut new.master, 0)?;
            if moments {
                self.dev.copy(&cur.exp_avg, 0..n, &mut new.exp_avg, 0)?;
                self.dev
                    .copy(&cur.exp_avg_sq, 0..n, &mut new.exp_avg_sq, 0)?;
            }
            let start = self.opt_start(b)?;
            for piece in self.held_pieces(b)? {
                let Some(entry) = &found[piece.param] else {
                    continue;
                };
                let at = piece.flat_range.start - start;
                let kinds: &[(StateKind, usize)] = if moments {
                    &[
                        (StateKind::Master, 0),
                        (StateKind::ExpAvg, 1),
                        (StateKind::ExpAvgSq, 2),
                    ]
                } else {
                    &[(StateKind::Master, 0)]
                };
                for &(kind, which) in kinds {
                    let dst = match which {
                        0 => &mut new.master,
                        1 => &mut new.exp_avg,
                        _ => &mut new.exp_avg_sq,
                    };
                    let dev = &self.dev;
                    ckpt.read_state(entry, kind, piece.tensor_range.clone(), |off, vals| {
                        dev.upload_f32(dst, at + off, vals)
                            .map_err(|e| CheckpointError::Io(e.to_string()))
                    })?;
                }
            }
            opt.push(new);
        }
        let mut frozen = Vec::new();
        for (id, offset) in self.frozen_params() {
            if let Some(entry) = &found[id] {
                let values = if entry.trainable {
                    let mut v = vec![0f32; entry.numel()];
                    ckpt.read_state(entry, StateKind::Master, 0..entry.numel(), |at, x| {
                        v[at..at + x.len()].copy_from_slice(x);
                        Ok(())
                    })?;
                    v
                } else {
                    ckpt.read_frozen(entry)?
                };
                frozen.push((offset, values));
            }
        }
        // Last, as nothing after it may fail: a staged offload copy must be committed or
        // abandoned.
        let offload = match self.offload.take() {
            Some(mut off) => {
                let r = self.read_offloaded(&mut off, &mut ckpt, &found, moments);
                self.offload = Some(off);
                Some(r?)
            }
            None => None,
        };
        self.last_load_stats = ckpt.read_stats();
        Ok(Staged {
            opt,
            frozen,
            offload,
            manifest: ckpt.manifest,
        })
    }

    /// Fills a new copy of the offloaded state, sub-group by sub-group: the current
    /// values (parameters the checkpoint lacks keep theirs), moments zeroed unless loaded,
    /// then what the checkpoint holds for this rank's partition.
    fn read_offloaded(
        &self,
        off: &mut Offload,
        ckpt: &mut Dir,
        found: &[Option<ParamEntry>],
        moments: bool,
    ) -> Result<Staging, EngineError> {
        let mut pieces: Vec<Vec<Piece>> = Vec::with_capacity(self.buckets.len());
        for b in 0..self.buckets.len() {
            pieces.push(self.held_pieces(b)?);
        }
        let kinds: &[(StateKind, usize)] = if moments {
            &[
                (StateKind::Master, 0),
                (StateKind::ExpAvg, 1),
                (StateKind::ExpAvgSq, 2),
            ]
        } else {
            &[(StateKind::Master, 0)]
        };
        let mut st = off.begin_staging(true)?;
        let filled = (|| -> Result<(), EngineError> {
            for i in 0..off.groups.len() {
                let g = off.groups[i].clone();
                off.begin_region(&mut st, i, true)?;
                if !moments {
                    let zeros = vec![0f32; g.range.len()];
                    off.put(&mut st, i, 1, 0, &zeros)?;
                    off.put(&mut st, i, 2, 0, &zeros)?;
                }
                let start = self.opt_start(g.bucket)?;
                for piece in &pieces[g.bucket] {
                    let Some(entry) = &found[piece.param] else {
                        continue;
                    };
                    let (lo, hi) = (piece.flat_range.start - start, piece.flat_range.end - start);
                    let (a, z) = (lo.max(g.range.start), hi.min(g.range.end));
                    if a >= z {
                        continue;
                    }
                    let first = piece.tensor_range.start + (a - lo);
                    for &(kind, which) in kinds {
                        ckpt.read_state(entry, kind, first..first + (z - a), |o, vals| {
                            off.put(&mut st, i, which, a - g.range.start + o, vals)
                                .map_err(|e| CheckpointError::Io(e.to_string()))
                        })?;
                    }
                }
                off.end_region(&mut st, i)?;
            }
            Ok(())
        })();
        match filled {
            Ok(()) => Ok(st),
            Err(e) => {
                off.abandon(st);
                Err(e)
            }
        }
    }

    /// A load another rank failed: drops what this rank staged.
    fn discard(&mut self, staged: Staged<C::Buffer>) {
        if let (Some(st), Some(off)) = (staged.offload, self.offload.as_mut()) {
            off.abandon(st);
        }
    }

    /// Step 3: takes the new state.
    fn apply(
        &mut self,
        staged: Staged<C::Buffer>,
        options: LoadOptions,
    ) -> Result<serde_json::Value, EngineError> {
        if let (Some(st), Some(off)) = (staged.offload, self.offload.as_mut()) {
            off.commit(st)?;
        }
        for (b, opt) in staged.opt.into_iter().enumerate() {
            self.buckets[b].opt = opt;
        }
        for (offset, values) in &staged.frozen {
            self.dev.upload_f32(&mut self.frozen, *offset, values)?;
        }
        self.params_from_master()?;
        let m = &staged.manifest;
        if !options.load_module_only {
            self.optimizer_steps = if options.load_optimizer_states {
                m.steps.optimizer
            } else {
                0
            };
            self.skipped_steps = m.steps.skipped;
            self.global_steps = m.steps.global;
            if m.precision == precision_name(&self.cfg.precision) {
                self.scaler.restore(&m.loss_scaler);
            }
            if options.load_lr_scheduler_states {
                self.schedule
                    .set_last_batch_iteration(m.lr_last_batch_iteration);
            }
        }
        Ok(staged.manifest.client_state)
    }

    /// The 16-bit parameters from the fp32 master weights: each rank rounds the range it
    /// holds, and buckets kept whole are all-gathered, as after an optimizer step.
    pub(super) fn params_from_master(&mut self) -> Result<(), EngineError> {
        if self.offload.is_some() {
            self.offloaded_params_from_master()?;
            return self.publish_params();
        }
        let mut gathers = Vec::new();
        for b in 0..self.buckets.len() {
            let layout = self.plan.buckets[b].layout.clone();
            let part = layout.partition_range(self.rank)?;
            let mut params = self.take_params(b)?;
            let master = &self.buckets[b].opt.master;
            let n = self.dev.len(master);
            let offset = if self.policy.shards_optimizer() && !self.params_sharded(b) {
                part.start
            } else {
                0
            };
            let copied = self.dev.copy(master, 0..n, &mut params, offset);
            if let Err(e) = copied {
                self.put_params(b, params)?;
                return Err(e);
            }
            self.return_params(b, params, part, &mut gathers)?;
        }
        self.finish_gathers(gathers)
    }

    /// Bytes the last `load_checkpoint` on this rank asked for and read from the
    /// checkpoint's data files (whole chunks of the ranges it loads).
    pub fn last_load_read_stats(&self) -> crate::io::ReadStats {
        self.last_load_stats
    }
}
