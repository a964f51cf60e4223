//! Optimizer parameter groups: each parameter belongs to one (`ParamSpec::group`), and each
//! group steps with its own hyper-parameters, as a torch optimizer's `param_groups` do.
//!
//! The bucket plan does not change with groups: a bucket may hold parameters of several
//! groups. What a rank holds of a bucket's optimizer state (its partition, or the whole
//! bucket in stage 0) is cut into *runs*, stretches of one group each; the fused Adam runs
//! once per run. Alignment padding joins the run before it (its gradient and state are
//! zero, and stay zero under every group's update).

use super::Engine;
use crate::device::{AdamRun, Device};
use crate::plan::Plan;
use crate::EngineError;
use std::ops::Range;
use zero_comm::Communicator;
use zero_kernels::AdamConfig;

/// The optimizer parameter groups, and the runs of one group each that they cut what a
/// rank holds of each bucket into.
#[derive(Debug)]
pub(super) struct Groups {
    /// Each group's hyper-parameters (`lr`: the group's base LR).
    pub(super) adam: Vec<AdamConfig>,
    /// Each group's base LR in full precision (the schedule starts from it).
    pub(super) base_lrs: Vec<f64>,
    /// Per bucket: the runs of its held optimizer range, each with its group.
    pub(super) runs: Vec<Vec<(Range<usize>, usize)>>,
}

/// Bucket `b`'s runs over `held` (its range in the bucket's flat layout that this rank
/// steps), as ranges relative to `held.start`, each with its group; together they cover
/// `0..held.len()`.
pub(super) fn bucket_runs(
    plan: &Plan,
    b: usize,
    held: Range<usize>,
    group_of: impl Fn(usize) -> usize,
) -> Vec<(Range<usize>, usize)> {
    let bucket = &plan.buckets[b];
    let mut runs: Vec<(Range<usize>, usize)> = Vec::new();
    for (i, &param) in bucket.params.iter().enumerate() {
        let t = bucket.layout.tensor_range(i);
        let (s, e) = (t.start.max(held.start), t.end.min(held.end));
        if s >= e {
            continue;
        }
        runs.push((s - held.start..e - held.start, group_of(param)));
    }
    let n = held.len();
    if runs.is_empty() {
        return if n == 0 { Vec::new() } else { vec![(0..n, 0)] };
    }
    // Padding joins the run before it (the first run also takes what precedes it).
    runs[0].0.start = 0;
    for i in 1..runs.len() {
        let next = runs[i].0.start;
        runs[i - 1].0.end = next;
    }
    if let Some(last) = runs.last_mut() {
        last.0.end = n;
    }
    let mut merged: Vec<(Range<usize>, usize)> = Vec::with_capacity(runs.len());
    for (r, g) in runs {
        match merged.last_mut() {
            Some((prev, pg)) if *pg == g && prev.end == r.start => prev.end = r.end,
            _ => merged.push((r, g)),
        }
    }
    merged
}

/// One parameter's stretch of an external optimizer's shard of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalPiece {
    /// The parameter's module index.
    pub module: usize,
    /// Its index among the module's parameters.
    pub param: usize,
    /// Where it lies in the group's shard.
    pub shard: Range<usize>,
    /// Which of the parameter's elements (in its flat order) those are.
    pub elements: Range<usize>,
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// The number of optimizer parameter groups (one more than the highest
    /// [`ParamSpec::group`](crate::ParamSpec::group)).
    pub fn group_count(&self) -> usize {
        self.groups.adam.len()
    }

    /// Group `g`'s hyper-parameters; its `lr` is the group's base LR (what an LR schedule
    /// starts from, or the LR itself without one).
    pub fn group(&self, g: usize) -> Result<AdamConfig, EngineError> {
        self.groups.adam.get(g).copied().ok_or_else(|| {
            EngineError::InvalidModel(format!(
                "parameter group {g} does not exist (the model has {} group(s))",
                self.groups.adam.len()
            ))
        })
    }

    /// Sets group `g`'s hyper-parameters, from the next optimizer step on (a front-end
    /// calls it when a torch `param_groups[g]` entry changes, or a client LR scheduler
    /// moves its `lr`). Checked as the optimizer checks them; an error changes nothing.
    pub fn set_group(&mut self, g: usize, cfg: AdamConfig) -> Result<(), EngineError> {
        self.group(g)?;
        cfg.validate().map_err(|e| {
            EngineError::Config(crate::ConfigError::InvalidValue {
                key: format!("param_groups[{g}]"),
                reason: e.to_string(),
            })
        })?;
        self.groups.adam[g] = cfg;
        self.groups.base_lrs[g] = cfg.lr as f64;
        Ok(())
    }

    /// Sets group `g`'s base LR in full precision (what a schedule starts from, as
    /// DeepSpeed's schedulers compute in f64; the step rounds the result to f32).
    pub fn set_group_lr(&mut self, g: usize, lr: f64) -> Result<(), EngineError> {
        let cfg = AdamConfig {
            lr: lr as f32,
            ..self.group(g)?
        };
        self.set_group(g, cfg)?;
        self.groups.base_lrs[g] = lr;
        Ok(())
    }

    /// The LR each group's next optimizer step uses (the schedule applied to each
    /// group's base LR).
    pub fn group_lrs(&self) -> Vec<f64> {
        self.groups
            .base_lrs
            .iter()
            .map(|&lr| self.schedule.lr_for(lr))
            .collect()
    }

    /// Where each parameter of group `g` lies in the group's external shard (see
    /// [`external_group_len`](Self::external_group_len)): the elements of it this rank
    /// steps, in shard order. In stage 0 every parameter is whole, so a front-end can hand
    /// an optimizer views shaped like the parameters, as DeepSpeed's stage 0 steps them.
    pub fn external_group_pieces(&self, g: usize) -> Result<Vec<ExternalPiece>, EngineError> {
        self.group(g)?;
        let mut pieces = Vec::new();
        let mut at = 0;
        for (b, bucket) in self.plan.trainable().iter().enumerate() {
            let held = self.opt_start(b)?;
            for (run, rg) in &self.groups.runs[b] {
                if *rg != g {
                    continue;
                }
                let (s0, e0) = (held + run.start, held + run.end);
                for (i, &id) in bucket.params.iter().enumerate() {
                    let t = bucket.layout.tensor_range(i);
                    let (s, e) = (t.start.max(s0), t.end.min(e0));
                    if s >= e {
                        continue;
                    }
                    let (module, param) = self.plan.module_of(id);
                    pieces.push(ExternalPiece {
                        module,
                        param,
                        shard: at + (s - s0)..at + (e - s0),
                        elements: s - t.start..e - t.start,
                    });
                }
                at += run.len();
            }
        }
        Ok(pieces)
    }

    /// Bucket `b`'s runs with the hyper-parameters of this step.
    pub(super) fn adam_runs(&self, b: usize) -> Vec<AdamRun> {
        self.groups.runs[b]
            .iter()
            .map(|(range, g)| AdamRun {
                range: range.clone(),
                cfg: AdamConfig {
                    lr: self.schedule.lr_for(self.groups.base_lrs[*g]) as f32,
                    ..self.groups.adam[*g]
                },
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ModuleSpec, ParamSpec};
    use zero_kernels::DType;

    #[test]
    fn runs_cover_the_held_range_and_follow_groups() {
        // Three f32 tensors of 10, 70 and 5 elements, starting every 512 bytes (128
        // elements): offsets 0, 128, 256; a world of 2 splits 512 into 0..256 and 256..512.
        let modules = vec![ModuleSpec::new(
            "m",
            vec![
                ParamSpec::new("a", &[10]).in_group(1),
                ParamSpec::new("b", &[70]),
                ParamSpec::new("c", &[5]).in_group(1),
            ],
        )];
        let plan = Plan::new(&modules, DType::F32, 2, 1 << 20, 0, false).unwrap();
        assert_eq!(plan.buckets.len(), 1);
        let group = |id: usize| modules[0].params[id].group;
        let total = plan.buckets[0].layout.total_len();
        let whole = bucket_runs(&plan, 0, 0..total, group);
        let part0 = bucket_runs(
            &plan,
            0,
            plan.buckets[0].layout.partition_range(0).unwrap(),
            group,
        );
        let part1 = bucket_runs(
            &plan,
            0,
            plan.buckets[0].layout.partition_range(1).unwrap(),
            group,
        );
        for runs in [&whole, &part0, &part1] {
            assert_eq!(runs.first().unwrap().0.start, 0, "{runs:?}");
            for w in runs.windows(2) {
                assert_eq!(w[0].0.end, w[1].0.start, "{runs:?}");
                assert_ne!(w[0].1, w[1].1, "{runs:?}");
            }
        }
        assert_eq!(whole.last().unwrap().0.end, total);
        // Every element of a tensor is in its group's run.
        for (i, &id) in plan.buckets[0].params.iter().enumerate() {
            let t = plan.buckets[0].layout.tensor_range(i);
            for x in t {
                let (_, g) = whole.iter().find(|(r, _)| r.contains(&x)).unwrap();
                assert_eq!(*g, group(id));
            }
        }
    }

    #[test]
    fn an_empty_held_range_has_no_runs() {
        let modules = vec![ModuleSpec::new("m", vec![ParamSpec::new("a", &[3])])];
        let plan = Plan::new(&modules, DType::F32, 1, 1 << 20, 0, false).unwrap();
        assert!(bucket_runs(&plan, 0, 0..0, |_| 0).is_empty());
    }
}
