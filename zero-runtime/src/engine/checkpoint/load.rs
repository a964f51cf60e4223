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
use super::Piece;
use crate::checkpoint::format::ParamEntry;
use crate::checkpoint::resolve::CheckpointDir as Dir;
use crate::checkpoint::resolve::{resolve_tag, CheckpointDir, StateKind};
use crate::checkpoint::{CheckpointError, LoadOptions};
use crate::device::{AdamState, Device};
use crate::EngineError;
use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use zero_comm::Communicator;
use zero_kernels::DType;

/// What a rank read, held aside until every rank has read successfully.
pub(super) struct Staged<B> {
    /// New optimizer state per bucket.
    pub(super) opt: Vec<StagedOpt<B>>,
    /// Frozen parameters from the checkpoint, the elements this rank holds: (global id,
    /// element range, values).
    pub(super) frozen: Vec<FrozenPiece>,
    /// The new offloaded state, when the state lives off the device.
    pub(super) offload: Option<Staging>,
    pub(super) resume: Resume,
}

/// A bucket's new optimizer state as a load stages it: the master weights always in a
/// buffer of their own, even where the parameters are the master weights (fp32: `apply`
/// copies them there), and the moments.
pub(super) struct StagedOpt<B> {
    master: B,
    exp_avg: B,
    exp_avg_sq: B,
}

impl<B> StagedOpt<B> {
    /// The staged array of `kind`.
    fn array_mut(&mut self, kind: StateKind) -> &mut B {
        match kind {
            StateKind::Master => &mut self.master,
            StateKind::ExpAvg => &mut self.exp_avg,
            StateKind::ExpAvgSq => &mut self.exp_avg_sq,
        }
    }
}

/// Where the run continues from: counters, loss scaler, schedule, client state.
pub(super) struct Resume {
    pub(super) steps: crate::checkpoint::format::Steps,
    /// The loss scaler's state, where it is of this run's precision.
    pub(super) scaler: Option<crate::scaler::ScalerState>,
    pub(super) lr_last_batch_iteration: Option<i64>,
    pub(super) client_state: serde_json::Value,
}

/// Elements `.1` of frozen parameter `.0`, read for this rank.
pub(super) type FrozenPiece = (usize, Range<usize>, Vec<f32>);

/// Where a source hands its values: (offset in the range asked for, values).
pub(super) type Sink<'a> = &'a mut dyn FnMut(usize, &[f32]) -> Result<(), CheckpointError>;

/// Where a load's values come from: a checkpoint's files, or values a front-end read.
pub(super) trait Source {
    /// Whether parameter `id` has values here (else it keeps its current ones).
    fn has(&self, id: usize) -> bool;
    /// Elements `range` of trainable parameter `id`'s array `kind`, handed to `sink` as
    /// (offset in `range`, values).
    fn state(
        &mut self,
        id: usize,
        kind: StateKind,
        range: Range<usize>,
        sink: Sink<'_>,
    ) -> Result<(), CheckpointError>;
    /// Elements `range` of frozen parameter `id` (flattened).
    fn frozen(&mut self, id: usize, range: Range<usize>) -> Result<Vec<f32>, CheckpointError>;
}

/// A checkpoint's files, with the entry found for each parameter.
struct FileSource<'a> {
    ckpt: &'a mut Dir,
    found: &'a [Option<ParamEntry>],
}

impl Source for FileSource<'_> {
    fn has(&self, id: usize) -> bool {
        self.found[id].is_some()
    }

    fn state(
        &mut self,
        id: usize,
        kind: StateKind,
        range: Range<usize>,
        sink: Sink<'_>,
    ) -> Result<(), CheckpointError> {
        match &self.found[id] {
            Some(entry) => self.ckpt.read_state(entry, kind, range, sink),
            None => Ok(()),
        }
    }

    fn frozen(&mut self, id: usize, range: Range<usize>) -> Result<Vec<f32>, CheckpointError> {
        let Some(entry) = &self.found[id] else {
            return Ok(Vec::new());
        };
        if entry.trainable {
            let mut v = vec![0f32; range.len()];
            self.ckpt
                .read_state(entry, StateKind::Master, range, |at, x| {
                    v[at..at + x.len()].copy_from_slice(x);
                    Ok(())
                })?;
            Ok(v)
        } else {
            self.ckpt.read_frozen_range(entry, range)
        }
    }
}

/// Values in memory, by parameter id ([`Engine::import_state`]).
struct MemorySource<'a> {
    params: Vec<Option<&'a ImportedParam>>,
}

impl Source for MemorySource<'_> {
    fn has(&self, id: usize) -> bool {
        self.params[id].is_some()
    }

    fn state(
        &mut self,
        id: usize,
        kind: StateKind,
        range: Range<usize>,
        sink: Sink<'_>,
    ) -> Result<(), CheckpointError> {
        let Some(p) = self.params[id] else {
            return Ok(());
        };
        let zeros;
        let vals: &[f32] = match (kind, &p.moments) {
            (StateKind::Master, _) => &p.master,
            (StateKind::ExpAvg, Some((m, _))) => m,
            (StateKind::ExpAvgSq, Some((_, v))) => v,
            (_, None) => {
                zeros = vec![0f32; range.len()];
                return sink(0, &zeros);
            }
        };
        sink(0, &vals[range])
    }

    fn frozen(&mut self, id: usize, range: Range<usize>) -> Result<Vec<f32>, CheckpointError> {
        Ok(self.params[id]
            .map(|p| p.master[range].to_vec())
            .unwrap_or_default())
    }
}

/// One parameter's whole fp32 state, for [`Engine::import_state`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ImportedParam {
    /// The master weights (for a frozen parameter: its values).
    pub master: Vec<f32>,
    /// Adam's `exp_avg` and `exp_avg_sq`; `None` starts them at zero.
    pub moments: Option<(Vec<f32>, Vec<f32>)>,
}

/// A run's training state read elsewhere (another framework's checkpoint), for
/// [`Engine::import_state`]: every rank passes the same values.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ImportedState {
    /// By the name checkpoints use (`module.param`, or one of its aliases).
    pub params: HashMap<String, ImportedParam>,
    /// Optimizer steps taken (Adam's step count).
    pub optimizer_steps: u64,
    /// Steps skipped on overflow.
    pub skipped_steps: u64,
    /// All steps.
    pub global_steps: u64,
    /// The loss scaler's state (fp16), if recorded.
    pub loss_scaler: Option<crate::scaler::ScalerState>,
    /// The LR schedule's position (`last_batch_iteration`), if recorded.
    pub lr_last_batch_iteration: Option<i64>,
    /// Every parameter of the model must be present, and no other.
    pub strict: bool,
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
        let resolved = if self.shard.rank == 0 {
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
        let (opt, frozen, offload) = self.stage_from(
            &mut FileSource {
                ckpt: &mut ckpt,
                found: &found,
            },
            moments,
        )?;
        self.last_load_stats = ckpt.read_stats();
        let m = ckpt.manifest;
        Ok(Staged {
            opt,
            frozen,
            offload,
            resume: Resume {
                steps: m.steps,
                scaler: (m.precision == self.cfg.precision.name()).then_some(m.loss_scaler),
                lr_last_batch_iteration: Some(m.lr_last_batch_iteration),
                client_state: m.client_state,
            },
        })
    }

    /// Reads what `src` holds for this rank into new buffers: the optimizer state it
    /// holds (moments too with `moments`; without, they start from zero), the frozen
    /// parameters, and the offloaded state. Parameters `src` lacks keep their values.
    #[allow(clippy::type_complexity)]
    pub(super) fn stage_from(
        &mut self,
        src: &mut dyn Source,
        moments: bool,
    ) -> Result<(Vec<StagedOpt<C::Buffer>>, Vec<FrozenPiece>, Option<Staging>), EngineError> {
        let mut opt = Vec::with_capacity(self.trainable_range().len());
        let on_device = if self.offload.is_some() {
            0
        } else {
            self.trainable_range().len()
        };
        for b in 0..on_device {
            let n = self.held_len(b);
            // Start from the current state: parameters the source lacks keep theirs. The
            // master weights are staged in a buffer of their own even where the
            // parameters hold them (fp32): `apply` copies them there.
            let mut master = self.dev.zeros(DType::F32, n)?;
            let (cur_master, at) = self.held_array(b, 0)?;
            self.dev.copy(cur_master, at..at + n, &mut master, 0)?;
            let mut new = StagedOpt {
                master,
                exp_avg: self.dev.zeros(DType::F32, n)?,
                exp_avg_sq: self.dev.zeros(DType::F32, n)?,
            };
            if moments {
                let cur = &self.buckets[b].opt;
                self.dev.copy(&cur.exp_avg, 0..n, &mut new.exp_avg, 0)?;
                self.dev
                    .copy(&cur.exp_avg_sq, 0..n, &mut new.exp_avg_sq, 0)?;
            }
            let start = self.opt_start(b)?;
            for piece in self.held_pieces(b)? {
                if !src.has(piece.param) {
                    continue;
                }
                let at = piece.flat_range.start - start;
                for &(kind, _) in kinds(moments) {
                    let dst = new.array_mut(kind);
                    let dev = &self.dev;
                    src.state(
                        piece.param,
                        kind,
                        piece.tensor_range.clone(),
                        &mut |off, vals| {
                            dev.upload_f32(dst, at + off, vals)
                                .map_err(|e| CheckpointError::Io(e.to_string()))
                        },
                    )?;
                }
            }
            opt.push(new);
        }
        let mut frozen = Vec::new();
        for id in self.frozen_ids() {
            if src.has(id) {
                for r in self.held_ranges(id)? {
                    frozen.push((id, r.clone(), src.frozen(id, r)?));
                }
            }
        }
        // Last, as nothing after it may fail: a staged offload copy must be committed or
        // abandoned.
        let offload = self
            .with_offload(|e, off| e.read_offloaded(off, src, moments))
            .transpose()?;
        Ok((opt, frozen, offload))
    }

    /// Fills a new copy of the offloaded state, sub-group by sub-group: the current
    /// values (parameters the checkpoint lacks keep theirs), moments zeroed unless loaded,
    /// then what the checkpoint holds for this rank's partition.
    fn read_offloaded(
        &self,
        off: &mut Offload,
        src: &mut dyn Source,
        moments: bool,
    ) -> Result<Staging, EngineError> {
        let mut pieces: Vec<Vec<Piece>> = Vec::with_capacity(self.trainable_range().len());
        for b in self.trainable_range() {
            pieces.push(self.held_pieces(b)?);
        }
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
                    if !src.has(piece.param) {
                        continue;
                    }
                    let (lo, hi) = (piece.flat_range.start - start, piece.flat_range.end - start);
                    let (a, z) = (lo.max(g.range.start), hi.min(g.range.end));
                    if a >= z {
                        continue;
                    }
                    let first = piece.tensor_range.start + (a - lo);
                    for &(kind, which) in kinds(moments) {
                        src.state(piece.param, kind, first..first + (z - a), &mut |o, vals| {
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
    pub(super) fn discard(&mut self, staged: Staged<C::Buffer>) {
        if let (Some(st), Some(off)) = (staged.offload, self.offload.as_mut()) {
            off.abandon(st);
        }
    }

    /// Step 3: takes the new state.
    pub(super) fn apply(
        &mut self,
        staged: Staged<C::Buffer>,
        options: LoadOptions,
    ) -> Result<serde_json::Value, EngineError> {
        if let (Some(st), Some(off)) = (staged.offload, self.offload.as_mut()) {
            off.commit(st)?;
        }
        for (b, new) in staged.opt.into_iter().enumerate() {
            let master = if self.buckets[b].opt.master.is_none() {
                // fp32: the parameters are the master weights; the staged ones go there.
                let n = self.held_len(b);
                let (dev, params, at) = self.master_mut(b)?;
                dev.copy(&new.master, 0..n, params, at)?;
                None
            } else {
                Some(new.master)
            };
            self.buckets[b].opt = AdamState {
                master,
                exp_avg: new.exp_avg,
                exp_avg_sq: new.exp_avg_sq,
            };
        }
        for (id, range, values) in staged.frozen {
            self.upload_held(id, range, &values)?;
        }
        self.params_from_master()?;
        let r = staged.resume;
        if !options.load_module_only {
            self.steps = crate::checkpoint::format::Steps {
                optimizer: if options.load_optimizer_states {
                    r.steps.optimizer
                } else {
                    0
                },
                ..r.steps
            };
            if let Some(scaler) = &r.scaler {
                self.scaler.restore(scaler);
            }
            if let (true, Some(it)) = (options.load_lr_scheduler_states, r.lr_last_batch_iteration)
            {
                self.schedule.set_last_batch_iteration(it);
            }
        }
        Ok(r.client_state)
    }

    /// The 16-bit parameters from the fp32 master weights: each rank rounds the range it
    /// holds, and buckets kept whole are all-gathered, as after an optimizer step.
    pub(in crate::engine) fn params_from_master(&mut self) -> Result<(), EngineError> {
        if let Some(r) = self.with_offload(|e, off| e.offloaded_params_from_master(off)) {
            r?;
            return self.publish_params();
        }
        let mut gathers = Vec::new();
        for b in self.trainable_range() {
            let layout = self.plan.buckets[b].layout.clone();
            let part = layout.partition_range(self.shard.rank)?;
            let n = self.held_len(b);
            let offset = self.held_param_offset(b)?;
            // An offloaded partition is written through a device copy.
            let mut tier_copy = self.tier_params_on_device(b)?;
            let state = &mut self.buckets[b];
            let copied = match state.opt.master.as_ref() {
                Some(master) => {
                    let params = match tier_copy.as_mut() {
                        Some(copy) => copy,
                        None => state.params.get_mut()?,
                    };
                    self.dev.copy(master, 0..n, params, offset)
                }
                None => Ok(()), // fp32: the parameters are the master weights
            };
            if let Some(copy) = &tier_copy {
                self.tier_params_back(b, copy)?;
            }
            copied?;
            self.gather_whole(b, part, &mut gathers)?;
        }
        self.finish_gathers(gathers)
    }

    /// Takes a run's training state read elsewhere (another framework's checkpoint):
    /// every parameter's whole fp32 master weights and Adam moments, by name, and the
    /// counters. Each rank keeps what it holds of each parameter; the 16-bit parameters
    /// are rounded from the master weights, as after a load. All or nothing, like
    /// [`load_checkpoint`](Self::load_checkpoint): a rank whose values do not fit the
    /// model (an unknown or missing name, a wrong length) fails every rank, and nothing
    /// changes.
    pub fn import_state(&mut self, state: &ImportedState) -> Result<(), EngineError> {
        self.require_boundary("import_state")?;
        let staged = self.stage_import(state);
        let outcome = staged.as_ref().map(|_| ()).map_err(|e| match e {
            EngineError::Checkpoint(c) => c.clone(),
            other => CheckpointError::Io(other.to_string()),
        });
        if let Err(e) =
            self.agree_outcome(outcome, "agreeing that every rank took the imported state")
        {
            if let Ok(staged) = staged {
                self.discard(staged);
            }
            return Err(e);
        }
        self.apply(staged?, LoadOptions::default())?;
        Ok(())
    }

    fn stage_import(&mut self, state: &ImportedState) -> Result<Staged<C::Buffer>, EngineError> {
        let mismatch = |reason: String| CheckpointError::Mismatch {
            path: "the imported state".into(),
            reason,
        };
        let mut by_name: HashMap<&str, usize> = HashMap::new();
        for id in 0..self.param_count() {
            let spec = self.param_spec(id);
            for alias in &spec.aliases {
                by_name.insert(alias.as_str(), id);
            }
        }
        let names: Vec<String> = (0..self.param_count())
            .map(|id| self.param_name(id))
            .collect();
        for (id, n) in names.iter().enumerate() {
            by_name.insert(n.as_str(), id);
        }
        let mut params: Vec<Option<&ImportedParam>> = vec![None; self.param_count()];
        for (name, p) in &state.params {
            let Some(&id) = by_name.get(name.as_str()) else {
                if state.strict {
                    return Err(
                        mismatch(format!("`{name}` is not a parameter of the model")).into(),
                    );
                }
                continue;
            };
            let numel = self.param_spec(id).numel();
            let lens = [
                Some(p.master.len()),
                p.moments.as_ref().map(|m| m.0.len()),
                p.moments.as_ref().map(|m| m.1.len()),
            ];
            if lens.iter().flatten().any(|&n| n != numel) {
                return Err(mismatch(format!(
                    "`{name}` has {numel} elements in the model, but {:?} values were given",
                    lens.iter().flatten().collect::<Vec<_>>()
                ))
                .into());
            }
            params[id] = Some(p);
        }
        if state.strict {
            if let Some(id) = params.iter().position(|p| p.is_none()) {
                return Err(mismatch(format!(
                    "the model's parameter `{}` has no value",
                    names[id]
                ))
                .into());
            }
        }
        let (opt, frozen, offload) = self.stage_from(&mut MemorySource { params }, true)?;
        Ok(Staged {
            opt,
            frozen,
            offload,
            resume: Resume {
                steps: crate::checkpoint::format::Steps {
                    optimizer: state.optimizer_steps,
                    skipped: state.skipped_steps,
                    global: state.global_steps,
                },
                scaler: state.loss_scaler,
                lr_last_batch_iteration: state.lr_last_batch_iteration,
                client_state: serde_json::Value::Null,
            },
        })
    }

    /// Bytes the last `load_checkpoint` on this rank asked for and read from the
    /// checkpoint's data files (whole chunks of the ranges it loads).
    pub fn last_load_read_stats(&self) -> crate::io::ReadStats {
        self.last_load_stats
    }
}

/// The arrays a load reads: the master weights, and the moments with `moments`.
fn kinds(moments: bool) -> &'static [(StateKind, usize)] {
    if moments {
        &[
            (StateKind::Master, 0),
            (StateKind::ExpAvg, 1),
            (StateKind::ExpAvgSq, 2),
        ]
    } else {
        &[(StateKind::Master, 0)]
    }
}
