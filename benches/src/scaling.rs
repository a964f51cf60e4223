//! A model of ZeRO-3's communication per micro-batch at scale (issue 50, item 6): elements
//! each rank sends, split by the tier of link they cross, for flat ZeRO-3, shard groups
//! (DeepSpeed's `mics_shard_size`) and hpZ (`zero_hpz_partition_size`), then the time those
//! bytes take on given links and the tokens per GPU per micro-batch that hide it.
//!
//! Everything here is arithmetic on byte counts: no run, no cluster. docs/SCALING.md holds
//! the formulas, the sources of the constants and the table `--bin scaling` prints.
//!
//! Conventions:
//! - Elements sent per rank follow zero-comm's ring convention (`zero_comm::stats`): an
//!   all-gather or reduce-scatter of `n` elements over `k` ranks sends `n(k−1)/k`, an
//!   all-reduce `2n(k−1)/k`.
//! - Ranks are numbered node by node (ranks `iG..iG+G−1` on node `i`) and groups are
//!   consecutive and aligned to nodes. A group whose ranks all sit on one node is
//!   intra-node; a group that spans nodes is inter-node, all of its elements counted at
//!   the inter-node link's bandwidth (its ring crosses the slow link, and with one NIC per
//!   GPU every rank's share of the ring runs at NIC speed: NCCL's bus bandwidth).

use std::fmt;

/// How ranks are placed and sharded: N ranks, G per node, shard groups of S, hpZ of H.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// N: ranks in the world.
    pub ranks: u64,
    /// G: GPUs (ranks) per node.
    pub gpus_per_node: u64,
    /// S: ranks one copy of the model states is partitioned over (`mics_shard_size`);
    /// `S = N` is flat ZeRO-3. The `N / S` shard groups are replicas of each other.
    pub shard_size: u64,
    /// H: hpZ's secondary partition size (`zero_hpz_partition_size`). As in DeepSpeed,
    /// 1 means hpZ is off: the backward all-gather spans the shard group like the forward.
    pub hpz: u64,
    /// `mics_hierarchical_params_gather`: a shard group of k whole nodes gathers across
    /// the nodes first (a block of Ψ/G over the k ranks of a place), then inside the node.
    pub hierarchical: bool,
}

/// Why a [`Layout`] cannot be modelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutError(pub String);

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LayoutError {}

impl Layout {
    /// Flat ZeRO-3 over all `ranks`.
    pub fn flat(ranks: u64, gpus_per_node: u64) -> Self {
        Self::shard_groups(ranks, gpus_per_node, ranks)
    }

    /// Shard groups of `shard_size` ranks, replicated `ranks / shard_size` times.
    pub fn shard_groups(ranks: u64, gpus_per_node: u64, shard_size: u64) -> Self {
        Self {
            ranks,
            gpus_per_node,
            shard_size,
            hpz: 1,
            hierarchical: false,
        }
    }

    /// The same layout with hpZ's secondary partition over `hpz` ranks of a node.
    pub fn with_hpz(self, hpz: u64) -> Self {
        Self { hpz, ..self }
    }

    /// The same layout with hierarchical gathers (`mics_hierarchical_params_gather`).
    pub fn with_hierarchical(self) -> Self {
        Self {
            hierarchical: true,
            ..self
        }
    }

    /// k, the nodes of a shard group, where its gathers go across the nodes first: the
    /// key is on and the shard group is more than one whole node.
    fn hierarchical_nodes(&self) -> Option<u64> {
        let (s, g) = (self.shard_size, self.gpus_per_node);
        (self.hierarchical && g > 1 && s > g && s % g == 0).then(|| s / g)
    }

    /// R = N / S: replicas of the model states.
    pub fn replicas(&self) -> u64 {
        self.ranks / self.shard_size
    }

    /// Nodes the world occupies (the last may be partly used when N < G).
    pub fn nodes(&self) -> u64 {
        self.ranks.div_ceil(self.gpus_per_node)
    }

    /// Checks the shape the formulas assume: groups that divide the world and are aligned
    /// to nodes, and an hpZ partition inside a node and inside the shard group.
    pub fn validate(&self) -> Result<(), LayoutError> {
        let Self {
            ranks: n,
            gpus_per_node: g,
            shard_size: s,
            hpz: h,
            hierarchical: _,
        } = *self;
        let err = |m: String| Err(LayoutError(m));
        if n == 0 || g == 0 || s == 0 || h == 0 {
            return err(format!("sizes must be positive: N={n} G={g} S={s} H={h}"));
        }
        if n > g && n % g != 0 {
            return err(format!("N={n} spans nodes but is not a multiple of G={g}"));
        }
        if n % s != 0 {
            return err(format!("S={s} does not divide N={n}"));
        }
        if !(g % s == 0 || s % g == 0) {
            return err(format!(
                "S={s} neither divides G={g} nor is a multiple of it: groups would straddle nodes"
            ));
        }
        if g % h != 0 {
            return err(format!("H={h} does not divide the node size G={g}"));
        }
        if h > s {
            return err(format!("H={h} is larger than the shard group S={s}"));
        }
        if s % h != 0 {
            return err(format!("H={h} does not divide S={s}"));
        }
        Ok(())
    }

    /// The tier of a group of `size` consecutive, node-aligned ranks.
    fn tier_of_block(&self, size: u64) -> Tier {
        if size <= self.gpus_per_node {
            Tier::Intra
        } else {
            Tier::Inter
        }
    }

    /// The tier of a replica group: ranks `i, i+S, i+2S, …`, which share a node only when
    /// the whole world does.
    fn tier_of_replicas(&self) -> Tier {
        if self.ranks <= self.gpus_per_node {
            Tier::Intra
        } else {
            Tier::Inter
        }
    }
}

/// The class of link a collective's ring crosses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// Every rank of the group on one node (NVLink).
    Intra,
    /// The group spans nodes (the ring crosses the network).
    Inter,
}

/// A collective kind, counted by the ring convention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Sends `n(k−1)/k` of its output `n`.
    AllGather,
    /// Sends `n(k−1)/k` of its input `n`.
    ReduceScatter,
    /// Sends `2n(k−1)/k`.
    AllReduce,
}

/// One collective of the micro-batch, its payload expressed per model parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Collective {
    /// What it moves, in words.
    pub what: &'static str,
    /// Its kind.
    pub op: Op,
    /// k: ranks in its group.
    pub group: u64,
    /// `n / Ψ`: the collective's length per model parameter (1 for the whole model, 1/S
    /// for one shard).
    pub payload: f64,
    /// How many times it runs per micro-batch (1, or 1/A when once per optimizer step).
    pub per_micro_batch: f64,
    /// The link its ring crosses.
    pub tier: Tier,
}

impl Collective {
    /// Elements this rank sends per micro-batch, per model parameter.
    pub fn sent_per_param(&self) -> f64 {
        let k = self.group as f64;
        let ring = self.payload * (k - 1.0) / k;
        let per_call = match self.op {
            Op::AllGather | Op::ReduceScatter => ring,
            Op::AllReduce => 2.0 * ring,
        };
        per_call * self.per_micro_batch
    }
}

/// A quantity per tier: elements per parameter, elements, bytes or seconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Tiers {
    /// Over links inside a node.
    pub intra: f64,
    /// Over links between nodes.
    pub inter: f64,
}

impl Tiers {
    /// Both tiers together.
    pub fn total(&self) -> f64 {
        self.intra + self.inter
    }

    /// Both tiers multiplied by `k`.
    pub fn scale(&self, k: f64) -> Self {
        Self {
            intra: self.intra * k,
            inter: self.inter * k,
        }
    }

    fn add(&mut self, tier: Tier, x: f64) {
        match tier {
            Tier::Intra => self.intra += x,
            Tier::Inter => self.inter += x,
        }
    }
}

/// The collectives of one micro-batch under `layout`, with `accumulation` (A) micro-batches
/// per optimizer step. Collectives over one rank are left out (they send nothing).
///
/// - forward all-gather of the 16-bit parameters over the shard group (S; N when flat);
///   with hierarchical gathers on a shard group of k whole nodes, two all-gathers instead:
///   across the nodes (k ranks, a block of Ψ/G) and inside the node (G ranks, Ψ);
/// - backward all-gather: over the shard group, or with hpZ (H > 1) over the H ranks of the
///   node that hold the secondary partition kept after the forward gather;
/// - gradient reduce-scatter over the shard group, every micro-batch;
/// - with R = N/S > 1 replicas, the reduced shard (Ψ/S) all-reduced across the R replicas
///   once per optimizer step, as DeepSpeed's MiCS does (`allreduce_mics_shard_grads`
///   returns early off the accumulation boundary): 1/A of it per micro-batch.
pub fn collectives(layout: &Layout, accumulation: u64) -> Result<Vec<Collective>, LayoutError> {
    layout.validate()?;
    if accumulation == 0 {
        return Err(LayoutError("accumulation must be at least 1".into()));
    }
    let s = layout.shard_size;
    let shard_tier = layout.tier_of_block(s);
    let mut out = Vec::new();
    shard_group_gather(&mut out, layout, "forward all-gather of parameters");
    if layout.hpz > 1 {
        out.push(Collective {
            what: "backward all-gather of parameters (hpZ, within the node)",
            op: Op::AllGather,
            group: layout.hpz,
            payload: 1.0,
            per_micro_batch: 1.0,
            tier: layout.tier_of_block(layout.hpz),
        });
    } else {
        shard_group_gather(&mut out, layout, "backward all-gather of parameters");
    }
    out.push(Collective {
        what: "gradient reduce-scatter in the shard group",
        op: Op::ReduceScatter,
        group: s,
        payload: 1.0,
        per_micro_batch: 1.0,
        tier: shard_tier,
    });
    let r = layout.replicas();
    if r > 1 {
        out.push(Collective {
            what: "all-reduce of the reduced shard across replicas",
            op: Op::AllReduce,
            group: r,
            payload: 1.0 / s as f64,
            per_micro_batch: 1.0 / accumulation as f64,
            tier: layout.tier_of_replicas(),
        });
    }
    out.retain(|c| c.group > 1);
    Ok(out)
}

/// One all-gather of the parameters over the shard group: in one step, or across the
/// nodes first in two (see [`collectives`]).
fn shard_group_gather(out: &mut Vec<Collective>, layout: &Layout, what: &'static str) {
    let s = layout.shard_size;
    match layout.hierarchical_nodes() {
        None => out.push(Collective {
            what,
            op: Op::AllGather,
            group: s,
            payload: 1.0,
            per_micro_batch: 1.0,
            tier: layout.tier_of_block(s),
        }),
        Some(k) => {
            out.push(Collective {
                what,
                op: Op::AllGather,
                group: k,
                payload: 1.0 / layout.gpus_per_node as f64,
                per_micro_batch: 1.0,
                tier: Tier::Inter,
            });
            out.push(Collective {
                what,
                op: Op::AllGather,
                group: layout.gpus_per_node,
                payload: 1.0,
                per_micro_batch: 1.0,
                tier: Tier::Intra,
            });
        }
    }
}

/// Elements each rank sends per micro-batch per model parameter, by tier: the formulas.
pub fn elements_per_param(layout: &Layout, accumulation: u64) -> Result<Tiers, LayoutError> {
    let mut t = Tiers::default();
    for c in collectives(layout, accumulation)? {
        t.add(c.tier, c.sent_per_param());
    }
    Ok(t)
}

/// Elements each rank sends per micro-batch, by tier, for a model of `psi` parameters.
pub fn elements_per_rank(
    psi: u64,
    layout: &Layout,
    accumulation: u64,
) -> Result<Tiers, LayoutError> {
    Ok(elements_per_param(layout, accumulation)?.scale(psi as f64))
}

/// The per-parameter factors of a *measured* run, to use in [`project`] in place of
/// [`elements_per_param`]: the elements one rank's counters reported per tier over
/// `micro_batches` micro-batches of a model of `psi` parameters.
///
/// The factors hold for the layout (N, G, S, H, A) they were measured at, whatever Ψ (up
/// to alignment padding and parameters kept whole under
/// `stage3_param_persistence_threshold`), so a small model run at the target layout
/// gives the large model's factors; extrapolating to another N needs the formulas.
pub fn factors_from_measured_counts(
    intra_elements: u64,
    inter_elements: u64,
    psi: u64,
    micro_batches: u64,
) -> Tiers {
    let per = (psi as f64) * (micro_batches as f64);
    Tiers {
        intra: intra_elements as f64 / per,
        inter: inter_elements as f64 / per,
    }
}

/// Model states per GPU in bytes: 16Ψ/S (2 + 2 bytes of 16-bit parameters and gradients,
/// 12 of fp32 master, momentum and variance, all partitioned over the shard group), plus
/// hpZ's secondary partition, 2Ψ/H, when on. Activations and gathered buffers not counted.
pub fn model_state_bytes_per_gpu(psi: u64, layout: &Layout) -> f64 {
    let psi = psi as f64;
    let states = 16.0 * psi / layout.shard_size as f64;
    let secondary = if layout.hpz > 1 {
        2.0 * psi / layout.hpz as f64
    } else {
        0.0
    };
    states + secondary
}

/// A link class: what its spec says and what collectives reach on it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// Its name.
    pub name: &'static str,
    /// The spec, in words.
    pub spec: &'static str,
    /// Bytes per second per GPU per direction the spec allows.
    pub spec_bytes_per_s: f64,
    /// Bytes per second per GPU that collectives reach (NCCL's bus bandwidth): the
    /// figure [`project`] divides by.
    pub achieved_bytes_per_s: f64,
    /// Where the numbers come from.
    pub source: &'static str,
}

/// NVLink 4 on an H100 SXM (intra-node), as docs/SCALING.md cites it.
pub const NVLINK4_H100: Link = Link {
    name: "NVLink 4, H100/H200 SXM (intra-node)",
    spec: "900 GB/s bidirectional per GPU, 450 GB/s per direction",
    spec_bytes_per_s: 450e9,
    achieved_bytes_per_s: 370e9,
    source: "spec: MLCommons H200 system description; achieved: NCCL ring bus bandwidth \
             365–370 GB/s on 8 GPUs (NVIDIA/nccl #1455, nccl-tests #212, #272)",
};

/// InfiniBand NDR, one 400 Gb/s NIC per GPU (inter-node).
pub const IB_NDR_400: Link = Link {
    name: "InfiniBand NDR, one 400 Gb/s NIC per GPU (inter-node)",
    spec: "400 Gb/s = 50 GB/s per direction per GPU",
    spec_bytes_per_s: 50e9,
    achieved_bytes_per_s: 47e9,
    source: "achieved: \"46-48GB/s per NIC\" (NVIDIA, in NVIDIA/nccl-tests #290)",
};

/// The two tiers' bandwidths `project` uses, bytes per second per GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Links {
    /// Inside a node.
    pub intra_bytes_per_s: f64,
    /// Between nodes.
    pub inter_bytes_per_s: f64,
}

impl Links {
    /// The achieved figures of two [`Link`]s.
    pub fn achieved(intra: &Link, inter: &Link) -> Self {
        Self {
            intra_bytes_per_s: intra.achieved_bytes_per_s,
            inter_bytes_per_s: inter.achieved_bytes_per_s,
        }
    }
}

/// H100 SXM dense bf16 peak, FLOP/s (1,979 is the 2:4-sparsity figure).
pub const H100_BF16_DENSE_FLOPS: f64 = 989e12;

/// The compute side: a GPU's peak, the MFU it reaches, and the flops per parameter per
/// token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Compute {
    /// Peak FLOP/s.
    pub peak_flops: f64,
    /// Model FLOPs utilization reached, 0..1.
    pub mfu: f64,
    /// FLOPs per parameter per token: 6 (forward 2, backward 4; no activation recompute,
    /// attention's own FLOPs left out).
    pub flops_per_param_token: f64,
}

/// An H100 at 40% MFU with 6Ψ flops per token.
pub const H100_AT_40: Compute = Compute {
    peak_flops: H100_BF16_DENSE_FLOPS,
    mfu: 0.40,
    flops_per_param_token: 6.0,
};

/// One micro-batch's communication on the links, per GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Projection {
    /// Bytes sent per tier.
    pub bytes: Tiers,
    /// Seconds per tier: bytes / the tier's bandwidth.
    pub seconds: Tiers,
    /// Tokens per GPU per micro-batch whose compute (6Ψ flops each at the achieved rate)
    /// lasts as long as the communication, the two tiers taken one after the other
    /// (`seconds.total()`): above it, communication can hide behind compute.
    pub hide_tokens: f64,
    /// The same with the tiers overlapping each other (`max` of the two): a lower bound.
    pub hide_tokens_tiers_overlapped: f64,
}

/// Time of one micro-batch's communication for `psi` parameters whose per-parameter
/// factors are `factors` (from [`elements_per_param`] or [`factors_from_measured_counts`]),
/// `bytes_per_element` each (2 for 16-bit).
pub fn project(
    psi: u64,
    factors: Tiers,
    bytes_per_element: f64,
    links: &Links,
    compute: &Compute,
) -> Projection {
    let bytes = factors.scale(psi as f64 * bytes_per_element);
    let seconds = Tiers {
        intra: bytes.intra / links.intra_bytes_per_s,
        inter: bytes.inter / links.inter_bytes_per_s,
    };
    let flops_per_token = compute.flops_per_param_token * psi as f64;
    let tokens_per_s = compute.peak_flops * compute.mfu / flops_per_token;
    Projection {
        bytes,
        seconds,
        hide_tokens: seconds.total() * tokens_per_s,
        hide_tokens_tiers_overlapped: seconds.intra.max(seconds.inter) * tokens_per_s,
    }
}

/// A Llama-style decoder's shape: SwiGLU MLP, RMSNorm, untied embedding and output head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelShape {
    /// Its name.
    pub name: &'static str,
    /// Vocabulary.
    pub vocab: u64,
    /// Hidden size.
    pub hidden: u64,
    /// Decoder layers.
    pub layers: u64,
    /// MLP width.
    pub intermediate: u64,
    /// Attention heads.
    pub heads: u64,
    /// Key/value heads (grouped-query attention when fewer than `heads`).
    pub kv_heads: u64,
}

impl ModelShape {
    /// Parameters: embedding and head `2Vh`, per layer `2h²` (q, o) + `2h·h·kv/heads`
    /// (k, v) + `3h·I` (gate, up, down) + `2h` (norms), and the final norm `h`.
    pub fn params(&self) -> u64 {
        let h = self.hidden;
        let kv = h * self.kv_heads / self.heads;
        let layer = 2 * h * h + 2 * h * kv + 3 * h * self.intermediate + 2 * h;
        2 * self.vocab * h + self.layers * layer + h
    }
}

/// Where the shapes come from.
pub const MODEL_SOURCE: &str =
    "Touvron et al., Llama 2 (arXiv 2307.09288), and the config.json of \
     meta-llama/Llama-2-{7b,13b,70b}-hf";

/// Llama-2-7B (same shape as LLaMA-7B).
pub const LLAMA_7B: ModelShape = ModelShape {
    name: "Llama-2-7B",
    vocab: 32000,
    hidden: 4096,
    layers: 32,
    intermediate: 11008,
    heads: 32,
    kv_heads: 32,
};

/// Llama-2-13B.
pub const LLAMA_13B: ModelShape = ModelShape {
    name: "Llama-2-13B",
    vocab: 32000,
    hidden: 5120,
    layers: 40,
    intermediate: 13824,
    heads: 40,
    kv_heads: 40,
};

/// Llama-2-70B (grouped-query attention, 8 key/value heads).
pub const LLAMA_70B: ModelShape = ModelShape {
    name: "Llama-2-70B",
    vocab: 32000,
    hidden: 8192,
    layers: 80,
    intermediate: 28672,
    heads: 64,
    kv_heads: 8,
};

/// A named layout rule for the table: builds the layout for N ranks of G per node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheme {
    /// Its name in the table.
    pub name: &'static str,
    /// S in nodes (0: flat, S = N).
    pub shard_nodes: u64,
    /// H in GPUs (1: off).
    pub hpz: u64,
    /// Hierarchical gathers, across the nodes first (`mics_hierarchical_params_gather`).
    pub hierarchical: bool,
}

impl Scheme {
    /// The layout for `ranks` ranks of `gpus_per_node` per node, if it fits.
    pub fn layout(&self, ranks: u64, gpus_per_node: u64) -> Result<Layout, LayoutError> {
        let base = if self.shard_nodes == 0 {
            Layout::flat(ranks, gpus_per_node)
        } else {
            Layout::shard_groups(ranks, gpus_per_node, self.shard_nodes * gpus_per_node)
        };
        let l = base.with_hpz(self.hpz);
        let l = if self.hierarchical {
            l.with_hierarchical()
        } else {
            l
        };
        l.validate()?;
        Ok(l)
    }
}

/// The schemes of the table, with G = 8: flat, flat + hpZ, shard groups of one node (with
/// and without hpZ), and of two nodes (with and without hpZ, with and without hierarchical
/// gathers; for models whose states do not fit in one node).
pub const SCHEMES: [Scheme; 8] = [
    Scheme {
        name: "flat ZeRO-3",
        shard_nodes: 0,
        hpz: 1,
        hierarchical: false,
    },
    Scheme {
        name: "flat + hpZ (H=8)",
        shard_nodes: 0,
        hpz: 8,
        hierarchical: false,
    },
    Scheme {
        name: "shard groups, 1 node (S=8)",
        shard_nodes: 1,
        hpz: 1,
        hierarchical: false,
    },
    Scheme {
        name: "S=8 + hpZ (H=8)",
        shard_nodes: 1,
        hpz: 8,
        hierarchical: false,
    },
    Scheme {
        name: "shard groups, 2 nodes (S=16)",
        shard_nodes: 2,
        hpz: 1,
        hierarchical: false,
    },
    Scheme {
        name: "S=16 + hpZ (H=8)",
        shard_nodes: 2,
        hpz: 8,
        hierarchical: false,
    },
    Scheme {
        name: "S=16, hierarchical gathers",
        shard_nodes: 2,
        hpz: 1,
        hierarchical: true,
    },
    Scheme {
        name: "S=16 + hpZ (H=8), hierarchical gathers",
        shard_nodes: 2,
        hpz: 8,
        hierarchical: true,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    const PSI: u64 = 1000;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    fn assert_tiers(got: Tiers, intra: f64, inter: f64) {
        assert!(
            close(got.intra, intra) && close(got.inter, inter),
            "got intra {} inter {}, want {intra} {inter}",
            got.intra,
            got.inter
        );
    }

    // N=4 ranks, G=2 per node (2 nodes), Ψ=1000, A=1, by hand:
    // flat: three collectives over 4 ranks spanning both nodes, 1000·3/4 = 750 each.
    #[test]
    fn flat_small_case_by_hand() {
        let t = elements_per_rank(PSI, &Layout::flat(4, 2), 1).unwrap();
        assert_tiers(t, 0.0, 2250.0);
    }

    // flat + hpZ H=2: forward gather 750 inter, backward gather over 2 ranks of a node
    // 1000·1/2 = 500 intra, reduce-scatter 750 inter.
    #[test]
    fn flat_hpz_small_case_by_hand() {
        let t = elements_per_rank(PSI, &Layout::flat(4, 2).with_hpz(2), 1).unwrap();
        assert_tiers(t, 500.0, 1500.0);
    }

    // flat with hierarchical gathers (k=2 nodes of G=2): each gather is a block of
    // 1000/G = 500 over the 2 nodes (250 inter), then 1000 over the node's 2 ranks (500
    // intra); the reduce-scatter 750 inter. With hpZ H=2 only the forward gather goes
    // across first. Either way the total is the one-step gathers' (the same elements, split
    // between the tiers), and shard groups inside one node are unchanged.
    #[test]
    fn hierarchical_small_case_by_hand() {
        let l = Layout::flat(4, 2).with_hierarchical();
        assert_tiers(elements_per_rank(PSI, &l, 1).unwrap(), 1000.0, 1250.0);
        assert_tiers(
            elements_per_rank(PSI, &l.with_hpz(2), 1).unwrap(),
            1000.0,
            1000.0,
        );
        for plain in [
            Layout::flat(4, 2),
            Layout::flat(4, 2).with_hpz(2),
            Layout::shard_groups(64, 8, 16),
            Layout::shard_groups(1024, 8, 32).with_hpz(8),
        ] {
            let a = elements_per_rank(PSI, &plain, 3).unwrap();
            let b = elements_per_rank(PSI, &plain.with_hierarchical(), 3).unwrap();
            assert!(close(a.total(), b.total()), "{plain:?}: {a:?} {b:?}");
            assert!(b.inter < a.inter, "{plain:?}: {a:?} {b:?}");
        }
        let one_node = Layout::shard_groups(16, 8, 8);
        assert_eq!(
            elements_per_rank(PSI, &one_node, 1).unwrap(),
            elements_per_rank(PSI, &one_node.with_hierarchical(), 1).unwrap()
        );
        // The formula of docs/SCALING.md: S = kG, per gather (k−1)/S inter and (G−1)/G intra.
        let (g, s, k) = (8.0, 16.0, 2.0);
        let l = Layout::shard_groups(1024, 8, 16).with_hierarchical();
        let r = 64.0;
        let t = elements_per_param(&l, 1).unwrap();
        assert_tiers(
            t,
            2.0 * (g - 1.0) / g,
            2.0 * (k - 1.0) / s + (s - 1.0) / s + 2.0 * (r - 1.0) / (s * r),
        );
    }

    // S=2 (one node): gathers and reduce-scatter over 2 ranks, 500 each, intra; the shard of
    // 500 all-reduced over R=2 replicas on different nodes: 2·500·1/2 = 500 inter.
    #[test]
    fn shard_groups_small_case_by_hand() {
        let l = Layout::shard_groups(4, 2, 2);
        assert_eq!(l.replicas(), 2);
        assert_tiers(elements_per_rank(PSI, &l, 1).unwrap(), 1500.0, 500.0);
        // Once per optimizer step of A=4 micro-batches: 500/4 per micro-batch.
        assert_tiers(elements_per_rank(PSI, &l, 4).unwrap(), 1500.0, 125.0);
        // hpZ with H=2=S: the backward gather is over the same 2 ranks of the node.
        assert_tiers(
            elements_per_rank(PSI, &l.with_hpz(2), 1).unwrap(),
            1500.0,
            500.0,
        );
    }

    #[test]
    fn collectives_of_the_small_case() {
        let c = collectives(&Layout::shard_groups(4, 2, 2), 1).unwrap();
        let ops: Vec<_> = c.iter().map(|c| (c.op, c.group, c.tier)).collect();
        assert_eq!(
            ops,
            [
                (Op::AllGather, 2, Tier::Intra),
                (Op::AllGather, 2, Tier::Intra),
                (Op::ReduceScatter, 2, Tier::Intra),
                (Op::AllReduce, 2, Tier::Inter),
            ]
        );
        assert!(close(c[3].payload, 0.5));
    }

    fn layouts() -> Vec<(Layout, u64)> {
        let mut v = Vec::new();
        for g in [1, 2, 4, 8] {
            for n in [1, 2, 4, 8, 16, 64, 256, 1024] {
                for s in [1, 2, 4, 8, 16, 32, 64, 256, 1024] {
                    for h in [1, 2, 4, 8] {
                        for a in [1, 3, 8] {
                            let l = Layout::shard_groups(n, g, s).with_hpz(h);
                            if l.validate().is_ok() {
                                v.push((l, a));
                            }
                        }
                    }
                }
            }
        }
        assert!(v.len() > 500);
        v
    }

    #[test]
    fn shard_group_of_the_world_is_flat() {
        for (l, a) in layouts() {
            if l.shard_size == l.ranks {
                let flat = Layout::flat(l.ranks, l.gpus_per_node).with_hpz(l.hpz);
                assert_eq!(flat, l);
                assert_eq!(
                    elements_per_param(&l, a).unwrap(),
                    elements_per_param(&flat, a).unwrap()
                );
                // No replicas: the accumulation steps change nothing.
                assert_eq!(
                    elements_per_param(&l, a).unwrap(),
                    elements_per_param(&l, 1).unwrap()
                );
            }
        }
        // Flat is 3Ψ(N−1)/N in all.
        for n in [2u64, 4, 8, 16, 1024] {
            let t = elements_per_param(&Layout::flat(n, 8), 1).unwrap();
            assert!(close(t.total(), 3.0 * (n - 1) as f64 / n as f64));
        }
    }

    #[test]
    fn hpz_of_one_adds_nothing() {
        for (l, a) in layouts() {
            if l.hpz != 1 {
                continue;
            }
            // Independently of `collectives`: 3Ψ(S−1)/S on the shard group's tier, plus
            // the replicas' all-reduce 2(Ψ/S)(R−1)/R per step, on the replicas' tier.
            let (s, r) = (l.shard_size as f64, l.replicas() as f64);
            let mut want = Tiers::default();
            want.add(l.tier_of_block(l.shard_size), 3.0 * (s - 1.0) / s);
            want.add(l.tier_of_replicas(), 2.0 / s * (r - 1.0) / r / a as f64);
            let got = elements_per_param(&l, a).unwrap();
            assert!(
                close(got.intra, want.intra) && close(got.inter, want.inter),
                "{l:?}"
            );
            assert_eq!(model_state_bytes_per_gpu(1000, &l), 16.0 * 1000.0 / s);
        }
    }

    #[test]
    fn hpz_of_the_shard_group_in_one_node_adds_nothing() {
        for (l, a) in layouts() {
            if l.hpz == l.shard_size && l.shard_size <= l.gpus_per_node {
                let off = Layout { hpz: 1, ..l };
                let (on, base) = (elements_per_param(&l, a), elements_per_param(&off, a));
                assert_eq!(on.unwrap(), base.unwrap(), "{l:?}");
            }
        }
    }

    #[test]
    fn hpz_never_adds_volume_and_moves_the_backward_gather_into_the_node() {
        for (l, a) in layouts() {
            let off = Layout { hpz: 1, ..l };
            let on = elements_per_param(&l, a).unwrap();
            let base = elements_per_param(&off, a).unwrap();
            assert!(on.total() <= base.total() + 1e-12);
            assert!(on.inter <= base.inter + 1e-12);
            if l.hpz > 1 && l.shard_size > l.gpus_per_node {
                // The spanning backward gather, Ψ(S−1)/S, became Ψ(H−1)/H on the node.
                let s = l.shard_size as f64;
                let h = l.hpz as f64;
                assert!(close(base.inter - on.inter, (s - 1.0) / s));
                assert!(close(on.intra - base.intra, (h - 1.0) / h));
            }
        }
    }

    #[test]
    fn nothing_crosses_nodes_on_one_node() {
        for (l, a) in layouts() {
            let t = elements_per_param(&l, a).unwrap();
            if l.ranks <= l.gpus_per_node {
                assert_eq!(t.inter, 0.0, "{l:?}");
            }
            if l.ranks > l.gpus_per_node && l.ranks > 1 {
                assert!(t.inter > 0.0, "{l:?}");
            }
        }
    }

    #[test]
    fn shard_groups_of_a_node_send_less_across_nodes_than_flat() {
        for n in [16u64, 64, 256, 1024] {
            let flat = elements_per_param(&Layout::flat(n, 8), 1).unwrap();
            let sg = elements_per_param(&Layout::shard_groups(n, 8, 8), 1).unwrap();
            // Inter: 2(1/8)(R−1)/R against 3(N−1)/N.
            let r = (n / 8) as f64;
            assert!(close(sg.inter, 2.0 / 8.0 * (r - 1.0) / r));
            assert!(close(sg.intra, 3.0 * 7.0 / 8.0));
            assert!(sg.inter < flat.inter / 10.0);
        }
    }

    #[test]
    fn measured_factors_reproduce_the_formulas() {
        let links = Links::achieved(&NVLINK4_H100, &IB_NDR_400);
        for (l, a) in layouts() {
            let f = elements_per_param(&l, a).unwrap();
            // What a rank's counters would report over `a` micro-batches (one step).
            let psi = 1u64 << 20;
            let mb = a;
            let intra = (f.intra * psi as f64 * mb as f64).round() as u64;
            let inter = (f.inter * psi as f64 * mb as f64).round() as u64;
            let m = factors_from_measured_counts(intra, inter, psi, mb);
            assert!(close(m.intra, f.intra) && close(m.inter, f.inter), "{l:?}");
            let p = project(7_000_000_000, m, 2.0, &links, &H100_AT_40);
            let q = project(7_000_000_000, f, 2.0, &links, &H100_AT_40);
            assert!(close(p.hide_tokens, q.hide_tokens));
        }
        // The small case by hand: Ψ=1000 over 3 micro-batches, S=2, N=4, G=2.
        let m = factors_from_measured_counts(3 * 1500, 3 * 500, PSI, 3);
        assert_eq!(
            m,
            Tiers {
                intra: 1.5,
                inter: 0.5
            }
        );
    }

    #[test]
    fn projection_by_hand() {
        // 1000 parameters, 1.5/0.5 elements each, 2 bytes: 3000 B intra, 1000 B inter.
        let links = Links {
            intra_bytes_per_s: 300.0,
            inter_bytes_per_s: 50.0,
        };
        let compute = Compute {
            peak_flops: 6000.0 * 10.0,
            mfu: 0.5,
            flops_per_param_token: 6.0,
        };
        let p = project(
            PSI,
            Tiers {
                intra: 1.5,
                inter: 0.5,
            },
            2.0,
            &links,
            &compute,
        );
        assert_tiers(p.bytes, 3000.0, 1000.0);
        assert_tiers(p.seconds, 10.0, 20.0);
        // 30 s of communication at 30,000 flop/s = 900,000 flops = 150 tokens of 6,000.
        assert!(close(p.hide_tokens, 150.0));
        assert!(close(p.hide_tokens_tiers_overlapped, 100.0));
    }

    #[test]
    fn the_rule_of_thumb_of_the_anchors() {
        // Flat ZeRO-3 across nodes: T ≥ F/BW·(N−1)/N, whatever Ψ: ≈ 8,400 at 40% MFU.
        let links = Links::achieved(&NVLINK4_H100, &IB_NDR_400);
        for psi in [LLAMA_7B.params(), LLAMA_70B.params()] {
            let f = elements_per_param(&Layout::flat(1024, 8), 1).unwrap();
            let p = project(psi, f, 2.0, &links, &H100_AT_40);
            let want = 989e12 * 0.4 / 47e9 * 1023.0 / 1024.0;
            assert!(close(p.hide_tokens, want), "{}", p.hide_tokens);
        }
    }

    #[test]
    fn llama_parameter_counts() {
        // The counts Hugging Face's checkpoints report.
        assert_eq!(LLAMA_7B.params(), 6_738_415_616);
        assert_eq!(LLAMA_13B.params(), 13_015_864_320);
        assert_eq!(LLAMA_70B.params(), 68_976_648_192);
    }

    #[test]
    fn layouts_that_do_not_fit_are_refused() {
        assert!(Layout::shard_groups(12, 8, 4).validate().is_err()); // N not whole nodes
        assert!(Layout::shard_groups(16, 8, 3).validate().is_err()); // S ∤ N
        assert!(Layout::shard_groups(24, 8, 12).validate().is_err()); // straddles
        assert!(Layout::flat(16, 8).with_hpz(3).validate().is_err()); // H ∤ G
        assert!(Layout::shard_groups(16, 8, 4)
            .with_hpz(8)
            .validate()
            .is_err()); // H > S
        assert!(collectives(&Layout::flat(8, 8), 0).is_err());
        assert!(Layout::flat(4, 8).validate().is_ok()); // part of one node
        assert!(SCHEMES[4].layout(8, 8).is_err()); // S=16 > N=8
    }

    #[test]
    fn memory_per_gpu() {
        let l = Layout::shard_groups(64, 8, 8).with_hpz(8);
        assert!(close(
            model_state_bytes_per_gpu(800, &l),
            16.0 * 100.0 + 2.0 * 100.0
        ));
        assert!(close(
            model_state_bytes_per_gpu(640, &Layout::flat(64, 8)),
            160.0
        ));
    }
}
