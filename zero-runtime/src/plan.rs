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
//! *persistent* buckets, in the same backward order. The plan of the trainable parameters is
//! the same for every stage, so partitions, and with them the summation order of the
//! gradient norm, do not depend on the stage: stages 0–3 give the same bits.
//!
//! Frozen parameters (no gradient, no optimizer state) sit in one whole buffer on every
//! rank, except where `partition_frozen` (stage 3, as DeepSpeed's): those over the
//! persistence threshold then go to *frozen buckets* of their own, in the same backward
//! order and sizes, partitioned and gathered with their module like the trainable ones.
//! Frozen buckets come after every trainable bucket (indexes `trainable_buckets..`), so
//! the trainable buckets, and the bits, are the same with and without them.

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
    /// Whether its parameters are frozen: gathered for use, never reduced or stepped.
    pub frozen: bool,
}

/// The plan for a model.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Trainable buckets in the order their gradients become ready, then the frozen
    /// buckets (stage 3) in the same backward order.
    pub buckets: Vec<BucketPlan>,
    /// The number of trainable buckets: `buckets[..trainable_buckets]`.
    pub trainable_buckets: usize,
    /// Where each parameter (global id, module order) lives.
    pub locs: Vec<ParamLoc>,
    /// For each module, its non-persistent buckets (fetched in stage 3): the trainable
    /// one, then the frozen one.
    pub fetch_buckets: Vec<Vec<usize>>,
    /// For each module, the buckets holding its trainable parameters.
    pub module_buckets: Vec<Vec<usize>>,
    /// Elements of the frozen parameters kept whole on every rank (the frozen buffer).
    pub frozen_len: usize,
    /// Each module's first parameter id: parameters are numbered in module order.
    first_param: Vec<usize>,
}

impl Plan {
    /// The id of parameter `k` of module `m` (ids count parameters in module order).
    pub fn param_id(&self, m: usize, k: usize) -> usize {
        self.first_param[m] + k
    }

    /// The module of parameter `id`, and its index in the module: the module whose first
    /// parameter is the last one at or before `id`.
    pub fn module_of(&self, id: usize) -> (usize, usize) {
        let m = self.first_param.partition_point(|&f| f <= id) - 1;
        (m, id - self.first_param[m])
    }

    /// Builds the plan (see the module docs). `partition_frozen`: frozen parameters over
    /// `persistence_threshold` go to frozen buckets (stage 3).
    pub fn new(
        modules: &[ModuleSpec],
        dtype: DType,
        world: usize,
        bucket_size: usize,
        persistence_threshold: usize,
        partition_frozen: bool,
    ) -> Result<Self, EngineError> {
        let mut first_param = Vec::with_capacity(modules.len());
        let mut count = 0;
        for m in modules {
            first_param.push(count);
            count += m.params.len();
        }
        let mut locs = vec![ParamLoc::Frozen { offset: 0 }; count];
        let mut frozen_len: usize = 0;
        // Closed buckets: [trainable, frozen].
        let mut closed: [Vec<Closed>; 2] = Default::default();
        // Open buckets being filled: [normal, persistent, frozen], as (params, modules, numel).
        let mut open: [(Vec<usize>, Vec<usize>, usize); 3] = Default::default();
        let close = |slot: usize,
                     open: &mut [(Vec<usize>, Vec<usize>, usize); 3],
                     closed: &mut [Vec<Closed>; 2]| {
            if !open[slot].0.is_empty() {
                let (params, mods, _) = std::mem::take(&mut open[slot]);
                closed[usize::from(slot == 2)].push((params, mods, slot == 1));
            }
        };
        for (mi, m) in modules.iter().enumerate().rev() {
            let mut add = [Vec::new(), Vec::new(), Vec::new()];
            for (k, p) in m.params.iter().enumerate() {
                let id = first_param[mi] + k;
                let small = p.numel() <= persistence_threshold;
                if !p.trainable && (small || !partition_frozen) {
                    // Frozen parameters start aligned too (a torch view of the buffer is).
                    let align = align_elems(dtype);
                    let offset = frozen_len.div_ceil(align) * align;
                    locs[id] = ParamLoc::Frozen { offset };
                    frozen_len = offset + p.numel();
                } else if !p.trainable {
                    add[2].push(id);
                } else {
                    add[usize::from(small)].push(id);
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
                    close(slot, &mut open, &mut closed);
                }
                open[slot].0.extend(ids);
                open[slot].1.push(mi);
                open[slot].2 += n;
            }
        }
        for slot in 0..open.len() {
            close(slot, &mut open, &mut closed);
        }
        let [trainable, frozen] = closed;
        let trainable_buckets = trainable.len();
        let mut buckets = Vec::with_capacity(trainable.len() + frozen.len());
        for (frozen, (params, mods, persistent)) in trainable
            .into_iter()
            .map(|b| (false, b))
            .chain(frozen.into_iter().map(|b| (true, b)))
        {
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
                frozen,
            });
        }
        let mut fetch_buckets = vec![Vec::new(); modules.len()];
        let mut module_buckets = vec![Vec::new(); modules.len()];
        for (b, plan) in buckets.iter().enumerate() {
            for &m in &plan.modules {
                if !plan.frozen {
                    module_buckets[m].push(b);
                }
                if !plan.persistent {
                    fetch_buckets[m].push(b);
                }
            }
        }
        Ok(Self {
            buckets,
            trainable_buckets,
            locs,
            fetch_buckets,
            module_buckets,
            frozen_len,
            first_param,
        })
    }

    /// The trainable buckets (gradients and optimizer state).
    pub fn trainable(&self) -> &[BucketPlan] {
        &self.buckets[..self.trainable_buckets]
    }

    /// Frozen elements partitioned in frozen buckets (Φ), padding excluded.
    pub fn frozen_bucket_numel(&self) -> usize {
        self.buckets[self.trainable_buckets..]
            .iter()
            .map(|b| b.layout.numel())
            .sum()
    }

    /// Frozen elements with padding in frozen buckets (Φ'): what their gathers move.
    pub fn frozen_bucket_padded_numel(&self) -> usize {
        self.buckets[self.trainable_buckets..]
            .iter()
            .map(|b| b.layout.total_len())
            .sum()
    }

    /// Trainable elements (Ψ), padding excluded.
    pub fn numel(&self) -> usize {
        self.trainable().iter().map(|b| b.layout.numel()).sum()
    }

    /// Trainable elements with padding (Ψ'): what the collectives move.
    pub fn padded_numel(&self) -> usize {
        self.trainable().iter().map(|b| b.layout.total_len()).sum()
    }
}

/// A bucket filled: its parameters, its modules, whether it is persistent.
type Closed = (Vec<usize>, Vec<usize>, bool);

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
        let p = Plan::new(&model(), DType::BF16, 2, 400, 10, false).unwrap();
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
        assert_eq!(p.fetch_buckets, vec![vec![1], vec![0], vec![0]]);
        assert_eq!(p.trainable_buckets, 3);
        assert_eq!(p.module_buckets[0], vec![1, 2]);
        assert_eq!(p.numel(), 100 + 10 + 300 + 60 + 2);
        assert_eq!(p.frozen_len, 4);
        assert!(p
            .buckets
            .iter()
            .all(|b| b.layout.total_len() % (2 * align_elems(b.layout.dtype())) == 0));
    }

    #[test]
    fn frozen_parameters_get_buckets_of_their_own_when_partitioned() {
        // b.e frozen, 40 elements: over the threshold 10, so partitioned at stage 3.
        let mut m = model();
        m[1].params[1] = ParamSpec::frozen("e", &[40]);
        m.push(ModuleSpec::new("d", vec![ParamSpec::frozen("w", &[500])]));
        let whole = Plan::new(&m, DType::BF16, 2, 400, 10, false).unwrap();
        let part = Plan::new(&m, DType::BF16, 2, 400, 10, true).unwrap();
        // The trainable buckets are the same either way (and so are the bits).
        assert_eq!(part.trainable_buckets, whole.trainable_buckets);
        for (a, b) in whole.buckets.iter().zip(part.trainable()) {
            assert_eq!(
                (&a.params, &a.modules, a.persistent),
                (&b.params, &b.modules, b.persistent)
            );
            assert_eq!(a.layout.total_len(), b.layout.total_len());
        }
        // d at 0, then b.e at the next aligned offset (512 for bf16).
        assert_eq!(whole.frozen_len, 512 + 40);
        assert_eq!(part.frozen_len, 0);
        // Backward order: d (500, a bucket of its own), then b's e (40).
        let frozen: Vec<(Vec<usize>, bool)> = part.buckets[part.trainable_buckets..]
            .iter()
            .map(|b| (b.modules.clone(), b.frozen))
            .collect();
        assert_eq!(frozen, vec![(vec![3], true), (vec![1], true)]);
        let t = part.trainable_buckets;
        assert_eq!(
            part.locs[3],
            ParamLoc::Bucket {
                bucket: t + 1,
                index: 0
            }
        );
        assert_eq!(
            part.locs[6],
            ParamLoc::Bucket {
                bucket: t,
                index: 0
            }
        );
        assert_eq!(part.fetch_buckets[1], vec![0, t + 1]);
        assert_eq!(part.fetch_buckets[3], vec![t]);
        assert!(part.module_buckets[3].is_empty());
        assert_eq!(part.numel(), whole.numel());
        assert_eq!(part.frozen_bucket_numel(), 540);
    }
}
