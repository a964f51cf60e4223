//! The bucket plan: the one flat layout every stage shares.
//!
//! Trainable parameters are laid out in *backward* order (last module first) into buckets
//! of at most `reduce_bucket_size` elements (a module larger than that gets a bucket of
//! its own). Each bucket is a [`FlatLayout`] split into `world` equal aligned partitions:
//! rank `r` owns partition `r` of every bucket. A bucket is the unit of every collective:
//! one reduction of its gradients, one all-gather of its parameters (and, in stage 3, the
//! unit fetched before use).
//!
//! Parameters of at most `stage3_param_persistence_threshold` elements go to separate
//! *persistent* buckets, in the same backward order. The plan is the same for every stage,
//! so partitions, and with them the summation order of the gradient norm, do not depend on
//! the stage: stages 0–3 give the same bits.

use crate::model::ModuleSpec;
use crate::EngineError;
use zero_kernels::{align_elems, DType, FlatLayout};

/// Where one parameter lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamLoc {
    /// Tensor `index` of bucket `bucket`.
    Bucket {
        /// The bucket.
        bucket: usize,
        /// Its tensor index in the bucket's layout.
        index: usize,
    },
    /// Frozen: `offset` in the frozen buffer.
    Frozen {
        /// Start in the frozen buffer.
        offset: usize,
    },
}

/// One bucket of the plan.
#[derive(Debug, Clone)]
pub struct BucketPlan {
    /// Layout of its parameters, partitioned over the world.
    pub layout: FlatLayout,
    /// Its parameters (global ids), in layout order.
    pub params: Vec<usize>,
    /// Modules with parameters in it.
    pub modules: Vec<usize>,
    /// Whether its parameters stay whole on every rank in stage 3.
    pub persistent: bool,
}

/// The plan for a model.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Buckets in the order their gradients become ready.
    pub buckets: Vec<BucketPlan>,
    /// Where each parameter (global id, module order) lives.
    pub locs: Vec<ParamLoc>,
    /// For each module, its non-persistent bucket (fetched in stage 3).
    pub fetch_bucket: Vec<Option<usize>>,
    /// For each module, the buckets holding its trainable parameters.
    pub module_buckets: Vec<Vec<usize>>,
    /// Elements of frozen parameters.
    pub frozen_len: usize,
}

impl Plan {
    /// Builds the plan (see the module docs).
    pub fn new(
        modules: &[ModuleSpec],
        dtype: DType,
        world: usize,
        bucket_size: usize,
        persistence_threshold: usize,
    ) -> Result<Self, EngineError> {
        let mut first_param = Vec::with_capacity(modules.len());
        let mut count = 0;
        for m in modules {
            first_param.push(count);
            count += m.params.len();
        }
        let mut locs = vec![ParamLoc::Frozen { offset: 0 }; count];
        let mut frozen_len: usize = 0;
        let mut buckets: Vec<BucketPlan> = Vec::new();
        // Open buckets being filled: [normal, persistent], as (params, modules, numel).
        let mut open: [(Vec<usize>, Vec<usize>, usize); 2] = Default::default();
        let close = |slot: &mut (Vec<usize>, Vec<usize>, usize),
                     persistent: bool,
                     buckets: &mut Vec<BucketPlan>,
                     locs: &mut Vec<ParamLoc>|
         -> Result<(), EngineError> {
            if slot.0.is_empty() {
                return Ok(());
            }
            let (params, mods, _) = std::mem::take(slot);
            let sizes: Vec<usize> = params
                .iter()
                .map(|&p| numel_of(modules, &first_param, p))
                .collect();
            let layout = FlatLayout::new(&sizes, dtype, align_elems(dtype), world)?;
            for (index, &p) in params.iter().enumerate() {
                locs[p] = ParamLoc::Bucket {
                    bucket: buckets.len(),
                    index,
                };
            }
            buckets.push(BucketPlan {
                layout,
                params,
                modules: mods,
                persistent,
            });
            Ok(())
        };
        for (mi, m) in modules.iter().enumerate().rev() {
            let mut add = [Vec::new(), Vec::new()];
            for (k, p) in m.params.iter().enumerate() {
                let id = first_param[mi] + k;
                if !p.trainable {
                    // Frozen parameters start aligned too (a torch view of the buffer is).
                    let align = align_elems(dtype);
                    let offset = frozen_len.div_ceil(align) * align;
                    locs[id] = ParamLoc::Frozen { offset };
                    frozen_len = offset + p.numel();
                } else {
                    add[usize::from(p.numel() <= persistence_threshold)].push(id);
                }
            }
            for (slot, ids) in add.into_iter().enumerate() {
                if ids.is_empty() {
                    continue;
                }
                let n: usize = ids
                    .iter()
                    .map(|&p| numel_of(modules, &first_param, p))
                    .sum();
                if open[slot].2 > 0 && open[slot].2 + n > bucket_size {
                    close(&mut open[slot], slot == 1, &mut buckets, &mut locs)?;
                }
                open[slot].0.extend(ids);
                open[slot].1.push(mi);
                open[slot].2 += n;
            }
        }
        for (slot, o) in open.iter_mut().enumerate() {
            close(o, slot == 1, &mut buckets, &mut locs)?;
        }
        let mut fetch_bucket = vec![None; modules.len()];
        let mut module_buckets = vec![Vec::new(); modules.len()];
        for (b, plan) in buckets.iter().enumerate() {
            for &m in &plan.modules {
                module_buckets[m].push(b);
                if !plan.persistent {
                    fetch_bucket[m] = Some(b);
                }
            }
        }
        Ok(Self {
            buckets,
            locs,
            fetch_bucket,
            module_buckets,
            frozen_len,
        })
    }

    /// Trainable elements (Ψ), padding excluded.
    pub fn numel(&self) -> usize {
        self.buckets.iter().map(|b| b.layout.numel()).sum()
    }

    /// Trainable elements with padding (Ψ'): what the collectives move.
    pub fn padded_numel(&self) -> usize {
        self.buckets.iter().map(|b| b.layout.total_len()).sum()
    }
}

fn numel_of(modules: &[ModuleSpec], first: &[usize], p: usize) -> usize {
    let m = first.partition_point(|&f| f <= p) - 1;
    modules[m].params[p - first[m]].numel()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ParamSpec;

    fn model() -> Vec<ModuleSpec> {
        vec![
            ModuleSpec::new(
                "a",
                vec![ParamSpec::new("w", &[10, 10]), ParamSpec::new("b", &[10])],
            ),
            ModuleSpec::new(
                "b",
                vec![ParamSpec::new("w", &[10, 30]), ParamSpec::frozen("e", &[4])],
            ),
            ModuleSpec::new(
                "c",
                vec![ParamSpec::new("w", &[30, 2]), ParamSpec::new("b", &[2])],
            ),
        ]
    }

    #[test]
    fn buckets_follow_backward_order_and_size() {
        let p = Plan::new(&model(), DType::BF16, 2, 400, 10).unwrap();
        // Backward: c (60 + persistent 2), b (300 + frozen 4), a (100 + persistent 10).
        // Normal: [c, b] = 360 ≤ 400, then a (460 > 400 closes it). Persistent: [c.b, a.b].
        let kinds: Vec<(Vec<usize>, bool)> = p
            .buckets
            .iter()
            .map(|b| (b.modules.clone(), b.persistent))
            .collect();
        assert_eq!(
            kinds,
            vec![(vec![2, 1], false), (vec![0], false), (vec![2, 0], true)]
        );
        assert_eq!(p.locs[3], ParamLoc::Frozen { offset: 0 });
        assert_eq!(p.fetch_bucket, vec![Some(1), Some(0), Some(0)]);
        assert_eq!(p.module_buckets[0], vec![1, 2]);
        assert_eq!(p.numel(), 100 + 10 + 300 + 60 + 2);
        assert_eq!(p.frozen_len, 4);
        assert!(p
            .buckets
            .iter()
            .all(|b| b.layout.total_len() % (2 * align_elems(b.layout.dtype())) == 0));
    }
}
