//! The engine's checkpoints: `save_checkpoint`, `load_checkpoint` and `save_16bit_model`,
//! over the format of [`crate::checkpoint`] and the I/O of [`crate::io`].
//!
//! Every rank calls each of them at the same step boundary (no micro-step in progress).
//! The ranks agree through the engine's communicator: rank 0's tag is the one used; every
//! rank's result reaches every rank, and one failure fails them all; a rank that never
//! calls makes the others fail by the communicator's timeout.

mod agree;
mod frozen;
mod hf_load;
mod load;
mod model16;
mod save;
mod set;

pub use hf_load::HfLoadOptions;
pub use load::{ImportedParam, ImportedState};
pub use save::SaveOptions;

use super::Engine;
use crate::device::Device;
use crate::plan::ParamLoc;
use crate::EngineError;
use std::ops::Range;
use zero_comm::Communicator;

/// A piece of one parameter in this rank's buffers: the parameter (global id), the
/// elements of the flattened parameter, and where they are in the bucket's flat layout.
#[derive(Debug, Clone)]
pub(super) struct Piece {
    pub param: usize,
    pub tensor_range: Range<usize>,
    pub flat_range: Range<usize>,
}

/// The fp32 optimizer state of one parameter's elements in this rank's partition (what
/// this rank saves).
#[derive(Debug, Clone, PartialEq)]
pub struct StatePiece {
    /// `module.param`.
    pub name: String,
    /// The elements of the flattened parameter.
    pub elements: Range<usize>,
    /// Master weights.
    pub master: Vec<f32>,
    /// First moment.
    pub exp_avg: Vec<f32>,
    /// Second moment.
    pub exp_avg_sq: Vec<f32>,
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// This rank's partition of the fp32 optimizer state, by parameter: across the ranks
    /// the pieces cover every trainable element once (in stage 0 too, where every rank
    /// holds all of it). For inspection and tests; a copy, read from the device or the
    /// offload tier.
    pub fn optimizer_state(&mut self) -> Result<Vec<StatePiece>, EngineError> {
        let mut out = Vec::new();
        for b in self.trainable_range() {
            let start = self.opt_start(b)?;
            for p in self.partition_pieces(b, self.shard.rank)? {
                let r = p.flat_range.start - start..p.flat_range.end - start;
                let mut arrays: [Vec<f32>; 3] = Default::default();
                for (kind, vals) in arrays.iter_mut().enumerate() {
                    vals.resize(r.len(), 0.0);
                    self.read_held(b, kind, r.clone(), |at, x| {
                        vals[at..at + x.len()].copy_from_slice(x);
                        Ok(())
                    })?;
                }
                let [master, exp_avg, exp_avg_sq] = arrays;
                out.push(StatePiece {
                    name: self.param_name(p.param),
                    elements: p.tensor_range,
                    master,
                    exp_avg,
                    exp_avg_sq,
                });
            }
        }
        Ok(out)
    }

    /// Elements `r` of bucket `b`'s held optimizer array `kind` (0 master, 1 exp_avg,
    /// 2 exp_avg_sq), handed to `sink` as (offset in `r`, values), wherever the state
    /// lives.
    fn read_held(
        &mut self,
        b: usize,
        kind: usize,
        r: Range<usize>,
        mut sink: impl FnMut(usize, &[f32]) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        if let Some(off) = self.offload.as_mut() {
            return off.read(b, kind, r, sink);
        }
        let (buf, at) = self.held_array(b, kind)?;
        let vals = self.dev.download_f32(buf, Self::held_range(at, r))?;
        sink(0, &vals)
    }

    /// The LR the next optimizer step uses (parameter group 0's; every group's:
    /// [`group_lrs`](Self::group_lrs)).
    pub fn lr(&self) -> f64 {
        self.schedule.lr_for(self.groups.base_lrs[0])
    }

    /// `module.param`: the name a checkpoint stores parameter `id` under.
    pub fn param_name(&self, id: usize) -> String {
        let (m, k) = self.plan.module_of(id);
        let module = &self.modules[m];
        let p = &module.params[k];
        if module.name.is_empty() {
            p.name.clone()
        } else {
            format!("{}.{}", module.name, p.name)
        }
    }

    /// Parameter `id`'s spec.
    pub(in crate::engine) fn param_spec(&self, id: usize) -> &crate::model::ParamSpec {
        let (m, k) = self.plan.module_of(id);
        &self.modules[m].params[k]
    }

    /// The number of parameters.
    fn param_count(&self) -> usize {
        self.plan.locs.len()
    }

    /// Where bucket `b`'s optimizer state starts in the flat layout (its buffers hold the
    /// owned partition in stages 1–3, the whole bucket in stage 0).
    pub(in crate::engine) fn opt_start(&self, b: usize) -> Result<usize, EngineError> {
        Ok(if self.policy.shards_optimizer() {
            self.plan.buckets[b]
                .layout
                .partition_range(self.shard.rank)?
                .start
        } else {
            0
        })
    }

    /// The pieces of bucket `b` in `rank`'s partition.
    fn partition_pieces(&self, b: usize, rank: usize) -> Result<Vec<Piece>, EngineError> {
        let plan = &self.plan.buckets[b];
        Ok(plan
            .layout
            .shards(rank)?
            .into_iter()
            .filter(|s| !s.tensor_range.is_empty())
            .map(|s| Piece {
                param: plan.params[s.tensor],
                tensor_range: s.tensor_range,
                flat_range: s.flat_range,
            })
            .collect())
    }

    /// The pieces whose optimizer state this rank holds: its partition of every bucket
    /// (stages 1–3), or every bucket whole (stage 0).
    fn held_pieces(&self, b: usize) -> Result<Vec<Piece>, EngineError> {
        if self.policy.shards_optimizer() {
            return self.partition_pieces(b, self.shard.rank);
        }
        let plan = &self.plan.buckets[b];
        Ok((0..plan.params.len())
            .map(|i| {
                let r = plan.layout.tensor_range(i);
                Piece {
                    param: plan.params[i],
                    tensor_range: 0..r.len(),
                    flat_range: r,
                }
            })
            .collect())
    }

    /// Frozen parameters kept whole on every rank: (global id, offset in the frozen
    /// buffer).
    fn frozen_buffer_params(&self) -> Vec<(usize, usize)> {
        (0..self.param_count())
            .filter_map(|id| match self.plan.locs[id] {
                ParamLoc::Frozen { offset } => Some((id, offset)),
                ParamLoc::Bucket { .. } => None,
            })
            .collect()
    }

    /// Every frozen parameter (whole in the frozen buffer, or in a frozen bucket), by
    /// global id.
    fn frozen_ids(&self) -> Vec<usize> {
        (0..self.param_count())
            .filter(|&id| !self.param_spec(id).trainable)
            .collect()
    }

    /// Saving and loading happen between optimizer steps.
    fn require_boundary(&self, what: &str) -> Result<(), EngineError> {
        if self.window.ended() != 0 || self.pass.ready_count() != 0 || !self.inflight.is_empty() {
            return Err(EngineError::Order(format!(
                "{what} in the middle of a step ({} micro-steps and {} modules done): call it after step() or zero_grad()",
                self.window.ended(),
                self.pass.ready_count()
            )));
        }
        Ok(())
    }
}
