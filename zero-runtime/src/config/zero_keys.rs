//! The `zero_optimization` section's keys (DeepSpeed's `DeepSpeedZeroConfig`).

use super::keys::{DocNames, Fixed, Key, KeyDefault, Section};

/// The `zero_optimization` section. The keys accepted only at DeepSpeed's default sit among
/// the others where their aliases keep the order in which aliases are read.
pub(super) const ZERO: Section = Section {
    path: "zero_optimization",
    names: DocNames::FirstPath,
    keys: &[
        STAGE,
        OVERLAP_COMM,
        CONTIGUOUS_GRADIENTS,
        REDUCE_SCATTER,
        REDUCE_BUCKET_SIZE,
        ALLGATHER_PARTITIONS,
        ALLGATHER_BUCKET_SIZE,
        STAGE3_PREFETCH_BUCKET_SIZE,
        STAGE3_PARAM_PERSISTENCE_THRESHOLD,
        Key::only("load_from_fp32_weights", Fixed::Bool(true)),
        Key::only("elastic_checkpoint", Fixed::Bool(false)),
        Key::only("use_multi_rank_bucket_allreduce", Fixed::Bool(true)),
        Key::only("ignore_unused_parameters", Fixed::Bool(true)),
        Key::only("round_robin_gradients", Fixed::Bool(false)),
        Key::only("legacy_stage1", Fixed::Bool(false)),
        Key::only("stage3_model_persistence_threshold", Fixed::Null)
            .alias("model_persistence_threshold"),
        STAGE3_MAX_LIVE_PARAMETERS,
        STAGE3_MAX_REUSE_DISTANCE,
        STAGE3_GATHER_16BIT_WEIGHTS_ON_MODEL_SAVE,
        Key::only("stage3_module_granularity_threshold", Fixed::Int(0))
            .alias("module_granularity_threshold"),
        Key::only("stage3_use_all_reduce_for_fetch_params", Fixed::Bool(false))
            .alias("use_all_reduce_for_fetch_params"),
        Key::only("stage3_allgather_sequential", Fixed::Bool(false)).alias("allgather_sequential"),
        SUB_GROUP_SIZE,
        OFFLOAD_OPTIMIZER,
        OFFLOAD_PARAM,
        CPU_OFFLOAD,
        CPU_OFFLOAD_PARAM,
        CPU_OFFLOAD_USE_PIN_MEMORY,
        MEMORY_EFFICIENT_LINEAR,
        ZERO_HPZ_PARTITION_SIZE,
        Key::only("zero_quantized_weights", Fixed::Bool(false)).why(
            "ZeRO++'s quantized weight all-gather (qwZ) is not implemented: zero gathers the \
            16-bit weights (DeepSpeed's numbers without qwZ, at twice its gather bytes); remove \
            the key (zero_hpz_partition_size, ZeRO++'s hpZ, is served)",
        ),
        Key::only("zero_quantized_nontrainable_weights", Fixed::Bool(false)).why(
            "ZeRO++'s quantized frozen weights are not implemented: zero keeps and gathers them \
            in the 16-bit dtype; remove the key",
        ),
        Key::only("zero_quantized_gradients", Fixed::Bool(false)).why(
            "ZeRO++'s quantized gradient reduce-scatter (qgZ) is not implemented: zero \
            reduce-scatters the gradients in their dtype (DeepSpeed's numbers without qgZ); \
            remove the key (zero_hpz_partition_size, ZeRO++'s hpZ, is served)",
        ),
        MICS_SHARD_SIZE,
        MICS_HIERARCHICAL_PARAMS_GATHER,
        Key::only(
            "stage3_gather_fp16_weights_on_model_save",
            Fixed::Bool(false),
        ),
        Key::only("compute_grad_norm", Fixed::Bool(true)),
        Key::only("zenflow", Fixed::Null),
        Key::only("parameter_alignment", Fixed::Bool(false)),
        Key::only("pipeline_loading_checkpoint", Fixed::Bool(false)),
        Key::only("override_module_apply", Fixed::Bool(true)),
        Key::only("log_trace_cache_warnings", Fixed::Bool(false)),
        Key::only("enable_sanity_checks", Fixed::Bool(false)),
        Key::only("save_muon_momentum_buffer_in_memory", Fixed::Bool(false)),
        Key::only("leaf_module", Fixed::Null),
    ],
};

/// The ZeRO stage.
pub(super) const STAGE: Key = Key::new("stage", KeyDefault::Count(0)).doc("0–3");

/// Whether reductions overlap the rest of backward.
pub(super) const OVERLAP_COMM: Key = Key::new(
    "overlap_comm",
    KeyDefault::Text("true for stage 3, false otherwise"),
)
.doc("as DeepSpeed's validator");

/// Gradients into contiguous buckets (always, here).
pub(super) const CONTIGUOUS_GRADIENTS: Key =
    Key::new("contiguous_gradients", KeyDefault::Bool(true))
        .doc("gradients always go into contiguous buckets; `false` is noted");

/// Reduce-scatter rather than all-reduce (always, here).
pub(super) const REDUCE_SCATTER: Key = Key::new("reduce_scatter", KeyDefault::Bool(true))
    .doc("`false` is refused: stages 1–3 always reduce-scatter");

/// Elements per reduce bucket.
pub(super) const REDUCE_BUCKET_SIZE: Key =
    Key::new("reduce_bucket_size", KeyDefault::Count(500_000_000))
        .doc("elements per bucket, in backward order");

/// All-gather rather than broadcast (always, here).
pub(super) const ALLGATHER_PARTITIONS: Key =
    Key::new("allgather_partitions", KeyDefault::Bool(true)).doc("`false` (broadcasts) is refused");

/// Elements per all-gather (accepted, noted).
pub(super) const ALLGATHER_BUCKET_SIZE: Key =
    Key::new("allgather_bucket_size", KeyDefault::Count(500_000_000))
        .doc("accepted, noted: parameters are gathered per reduce bucket");

/// The stage-3 prefetch window, in elements.
pub(super) const STAGE3_PREFETCH_BUCKET_SIZE: Key =
    Key::new("stage3_prefetch_bucket_size", KeyDefault::Count(50_000_000))
        .alias("prefetch_bucket_size")
        .stage3(true)
        .doc(
            "the prefetch window: buckets of the next this-many elements of the recorded \
        fetch order are gathered ahead (those already gathered count)",
        );

/// Parameters at most this size stay whole.
pub(super) const STAGE3_PARAM_PERSISTENCE_THRESHOLD: Key = Key::new(
    "stage3_param_persistence_threshold",
    KeyDefault::Count(100_000),
)
.alias("param_persistence_threshold")
.doc(
    "parameters ≤ this stay whole (also shapes the bucket plan of every stage, so \
        stages stay bit-identical). Frozen parameters over it are partitioned at stage 3 \
        too, as DeepSpeed's (a LoRA base holds 1/N per rank), in frozen buckets of their \
        own gathered with their module; below stage 3 they stay whole",
);

/// The cap on gathered elements at stage 3.
pub(super) const STAGE3_MAX_LIVE_PARAMETERS: Key = Key::new(
    "stage3_max_live_parameters",
    KeyDefault::Count(1_000_000_000),
)
.alias("max_live_parameters")
.stage3(true)
.doc("cap on gathered elements");

/// How far ahead a released stage-3 bucket may be kept for reuse.
pub(super) const STAGE3_MAX_REUSE_DISTANCE: Key = Key::new(
    "stage3_max_reuse_distance",
    KeyDefault::Count(1_000_000_000),
)
.alias("max_reuse_distance")
.stage3(true)
.doc(
    "keep a released bucket if the other buckets' elements gathered before its next \
        use are ≤ this (a bucket whose next module is one of its own stays gathered; 0 \
        never keeps)",
);

/// Whether saving a 16-bit model gathers stage 3's sharded parameters.
pub(super) const STAGE3_GATHER_16BIT_WEIGHTS_ON_MODEL_SAVE: Key = Key::new(
    "stage3_gather_16bit_weights_on_model_save",
    KeyDefault::Bool(false),
)
.alias("gather_16bit_weights_on_model_save")
.stage3(false)
.doc(
    "`save_16bit_model` under stage 3 gathers the sharded parameters only when true; \
        otherwise it is an error naming this key (as DeepSpeed)",
);

/// Elements an offloaded optimizer steps as one unit.
pub(super) const SUB_GROUP_SIZE: Key = Key::new("sub_group_size", KeyDefault::Count(1_000_000_000))
    .doc(
        "elements of the owned partition an offloaded optimizer steps as one unit: one \
        NVMe block of 12 bytes per element (the pipeline holds `max(buffer_count, 3)` of \
        them in host memory, so on NVMe choose it so that 36 × sub_group_size bytes fit \
        the host comfortably); the host crossing inside a sub-group goes in chunks of 16 \
        Mi elements whatever its size. Noted as without effect when nothing is offloaded",
    );

/// The optimizer state's offload subsection.
pub(super) const OFFLOAD_OPTIMIZER: Key =
    Key::new("offload_optimizer", KeyDefault::Text("device `none`")).doc(
        "`device`: `cpu` keeps the fp32 master weights and both moments of the owned \
        partition in host memory (ZeRO-Offload), `nvme` in a preallocated swap file \
        `nvme_path/zero/rank{r}/optimizer.swp` (ZeRO-Infinity); **stages 1, 2 and 3** \
        (DeepSpeed takes nvme in stage 3 only; here it works in every stage). At stages \
        2–3 the reduced gradient partitions live in host memory too, in the dtype the \
        step reads (DeepSpeed's stage 3 keeps an accumulation-dtype partition and an \
        fp32 copy there); stage 1's whole gradients stay on the device. The CPU runs the \
        same fused Adam (unscale, clip, Adam, cast) as the device, so results are \
        bit-identical to no offload. `nvme_path` (required for nvme); `pin_memory` \
        (true; read, no effect: on a GPU the crossings always go through pinned 16 MiB \
        chunks, which need no locked-memory limit); `buffer_count` (4; at least 3 are \
        used: read ahead, compute, write behind); `pipeline_read`, `pipeline_write` \
        (read; the pipeline is always on); `fast_init` (read, no effect: initialization \
        writes each block once anyway); `ratio` below 1 (DeepSpeed's stage-3 partial \
        offload) is accepted at stage 3 and offloads the whole state (the same numbers; \
        noted), and is an error at stages 1–2, as in DeepSpeed",
    );

/// The stage-3 parameters' offload subsection.
pub(super) const OFFLOAD_PARAM: Key = Key::new("offload_param", KeyDefault::Text("device `none`"))
    .doc(
        "stage 3 (below it the section is ignored, as DeepSpeed ignores it, and noted: \
        DeepSpeedExamples' sweeps run stage 2 with it): the 16-bit owned partition of \
        every sharded bucket lives in host memory (`cpu`) or in \
        `nvme_path/zero/rank{r}/params.swp` (`nvme`) and crosses to the device only to \
        be all-gathered; persistent buckets (under `stage3_param_persistence_threshold`) \
        stay on the device, as in DeepSpeed. With or without `offload_optimizer`. \
        `nvme_path`, `pin_memory`; `buffer_size` (1e8 elements) must hold the largest \
        partition (checked at start-up, with the number); `buffer_count` (5): on NVMe, \
        one block is open in host memory and `buffer_count − 1` more are read ahead of \
        their gathers in the order the first pass recorded (stage 3's prefetch; \
        `buffer_count: 1` reads each block when it opens), each the size of the largest \
        partition; `max_in_cpu` (1e9) is read but has no effect",
    );

/// Legacy name for `offload_optimizer.device: cpu`.
pub(super) const CPU_OFFLOAD: Key =
    Key::new("cpu_offload", KeyDefault::Bool(false)).doc(LEGACY_OFFLOAD);

/// Legacy name for `offload_param.device: cpu`.
pub(super) const CPU_OFFLOAD_PARAM: Key =
    Key::new("cpu_offload_param", KeyDefault::Bool(false)).doc(LEGACY_OFFLOAD);

/// Legacy name for both `pin_memory` keys.
pub(super) const CPU_OFFLOAD_USE_PIN_MEMORY: Key =
    Key::new("cpu_offload_use_pin_memory", KeyDefault::Bool(false)).doc(LEGACY_OFFLOAD);

/// DeepSpeed's saving of the weight for `F.linear`'s backward (no effect here).
pub(super) const MEMORY_EFFICIENT_LINEAR: Key =
    Key::new("memory_efficient_linear", KeyDefault::Bool(true)).doc(
        "either value (DeepSpeed-Chat writes `false`): DeepSpeed's `true` replaces \
        `F.linear` by a function that saves the weight rather than its transpose for \
        backward; zero's stage 3 always saves the parameter itself, not a view of the \
        gathered bucket, and keeps torch's own `F.linear` arithmetic, so the value \
        changes nothing. A value that is not a boolean is an error",
    );

/// The doc row of the three legacy `cpu_offload*` keys (one row).
const LEGACY_OFFLOAD: &str = "DeepSpeed's legacy names, mapped as DeepSpeed maps them (to \
    `offload_optimizer.device: cpu`, `offload_param.device: cpu`, `pin_memory`); \
    noted";

/// Ranks per shard group (DeepSpeed's MiCS; -1: the whole world).
pub(super) const MICS_SHARD_SIZE: Key = Key::new(
    "mics_shard_size",
    KeyDefault::Text("-1 (the whole world: flat ZeRO)"),
)
.doc(
    "S consecutive ranks form a shard group: parameters (stage 3), gradients (stage ≥ 2) \
    and optimizer state are partitioned over its S ranks and replicated across the N/S \
    groups; gradients are reduce-scattered inside the shard group each micro-step, and \
    the window's sum is all-reduced across the replicas once per optimizer step (as \
    DeepSpeed's MiCS; with `offload_optimizer` at stages 2–3 too, the sum in host memory \
    crossing back to the device for it). S must divide the world size. **Stages 1–3** \
    (DeepSpeed offered MiCS at stage 3 only, and 0.19.8 refuses the key); stage 0 shards \
    nothing and ignores it, noted. See docs/SCALING.md",
);

/// Stage 3's parameter gathers of a shard group that spans nodes: across the nodes first.
pub(super) const MICS_HIERARCHICAL_PARAMS_GATHER: Key =
    Key::new("mics_hierarchical_params_gather", KeyDefault::Bool(false))
        .stage3(true)
        .doc(
            "A shard group that spans nodes (`mics_shard_size` = k whole nodes of G ranks, \
            k > 1) all-gathers parameters in two steps: across the nodes (the k ranks with \
            the same place in their nodes, a block of n/G), then inside the node (the G \
            blocks). The group's ranks hold their partitions in the order this needs (place \
            g of node j holds partition g·k + j), so the gathered bucket needs no copy; the \
            reduce-scatter sums in that rank order (the same numbers to rounding). A rank \
            sends n(k−1)/S of an n-element bucket across nodes instead of n(S−1)/S (G times \
            less) and n(G−1)/G inside the node, and holds a block of n/G while the gather \
            is in flight. A shard group inside one node gathers in one step, as without it. \
            DeepSpeed's MiCS (removed in 0.19.8) also gathered across the nodes first. See \
            docs/SCALING.md",
        );

/// Ranks per hpZ secondary group (ZeRO++).
pub(super) const ZERO_HPZ_PARTITION_SIZE: Key =
    Key::new("zero_hpz_partition_size", KeyDefault::Count(1))
        .stage3(true)
        .doc(
            "ZeRO++'s hpZ: after each micro-step's first all-gather of a bucket every rank \
            keeps a 1/H piece of the 16-bit parameters, and the micro-step's later gathers \
            (backward) read only the H consecutive ranks of its node. H must divide the \
            ranks per node and the world size. Gathers copy bits: the same numbers as \
            without it. See docs/SCALING.md",
        );
