//! The engine on the GPU gives the host engine's results: the same trainer loop at world
//! sizes 1–4 (the one-device group: ranks as threads sharing the GPU), stages 0–3, fp32,
//! fp16 and bf16, accumulation 1 and 3 (bf16 summed in bf16 and in fp32).
//! - Without clipping every kernel and reduction gives the host's bits, so the parameters
//!   must be bit-identical to the host engine's, on every rank.
//! - With clipping the norm is summed in a different (fixed) order on the GPU, so the
//!   clip factor may differ in its last bit: the parameters must stay within the bounds
//!   the host engine keeps against the f64 reference.
//!
//! - NCCL at world size 1 (NCCL takes one GPU per rank) gives the host engine's bits too.
//! - The steps write the parameters into the memory a framework leased (zero-torch's
//!   parameter views on a GPU), read through the lease on another stream.
//!
//! Without a GPU (or, for the NCCL test, without libnccl) each test prints a visible skip.

use std::ops::Range;
use std::time::Duration;
use zero_comm::nccl::{LaunchEnv, NcclComm};
use zero_comm::{Communicator, DeviceComm, DeviceGroup, HostGroup};
use zero_kernels::cuda::{ForeignSlice, ForeignStream, GpuBuffer, GpuLease, GpuStream};
use zero_kernels::testing::gpu_or_skip;
use zero_kernels::DType;
use zero_runtime::{CudaDevice, Device, Engine, HostDevice, ZeroConfig};
use zero_tests::{
    dataset, full_params, mlp_config, mlp_modules, run_ranks_config, run_ranks_on, seed,
    train_step, MICRO_BATCH,
};

const STEPS: usize = 8;
const MICRO: usize = MICRO_BATCH;

fn config(stage: u8, precision: &str, accum: usize, clip: f32) -> String {
    mlp_config(stage, precision, accum, clip, false)
}

type Params = Vec<Vec<Vec<f32>>>;

/// Trains on `world` ranks; returns every rank's final parameters.
fn train(on_gpu: bool, world: usize, cfg: &str, seed: u64, accum: usize) -> Vec<Params> {
    let data = dataset(seed, STEPS * world * MICRO * accum);
    if on_gpu {
        on_gpu_ranks(world, cfg, seed, |e| run(e, &data))
    } else {
        let comms = HostGroup::with_timeout(world, Duration::from_secs(60)).expect("host group");
        run_ranks_on(comms, || HostDevice, cfg, seed, |e| run(e, &data))
    }
}

/// Runs `f` on an engine per rank of a `world`-rank group on the GPU (ranks as threads
/// sharing it); returns the ranks' results in order.
fn on_gpu_ranks<R: Send>(
    world: usize,
    cfg: &str,
    seed: u64,
    f: impl Fn(&mut Engine<DeviceComm, CudaDevice>) -> R + Sync,
) -> Vec<R> {
    let comms = DeviceGroup::with_timeout(world, Duration::from_secs(60)).expect("device group");
    run_ranks_on(comms, || CudaDevice::new().expect("device"), cfg, seed, f)
}

/// `stream` as `reader` borrows it: by its raw handle, as torch passes its own.
fn borrow(reader: &GpuStream, stream: &GpuStream) -> ForeignStream {
    reader
        .borrow_foreign(stream.cuda().cu_stream() as usize as u64)
        .expect("a stream of the same GPU")
}

/// Queues on `reader`, in a crossing with `with`, a copy of elements `range` (of `dtype`)
/// of the memory `lease` shares into a new buffer: what a torch kernel reading a
/// parameter that views the engine's buffer does. Download it to see what was read.
fn read_through(
    reader: &GpuStream,
    with: &ForeignStream,
    lease: &GpuLease,
    range: Range<usize>,
    dtype: DType,
) -> GpuBuffer {
    let view = ForeignSlice {
        addr: lease.addr() + (range.start * dtype.size_of()) as u64,
        len: range.len(),
        dtype,
    };
    let mut out = GpuBuffer::zeros(reader.cuda(), dtype, range.len()).expect("alloc");
    reader
        .crossing(with, |s| s.copy_from_foreign(&view, &mut out, 0))
        .expect("a read through the lease");
    out
}

/// Whether `got` holds `want`'s bits (any NaN equal to any NaN).
fn same_bits(got: &[f32], want: &[f32]) -> bool {
    zero_kernels::testing::canonical_bits(got) == zero_kernels::testing::canonical_bits(want)
}

fn run<C: Communicator, D: Device<Buffer = C::Buffer>>(
    e: &mut Engine<C, D>,
    data: &[(Vec<f32>, Vec<f32>)],
) -> Params {
    for s in 0..STEPS {
        train_step(e, data, s, None).expect("step");
    }
    full_params(e).expect("params")
}

/// Bits in which any NaN equals any NaN (zero_kernels::testing::canonical_bits).
fn bits(p: &Params) -> Vec<u32> {
    let flat: Vec<f32> = p.iter().flatten().flatten().copied().collect();
    zero_kernels::testing::canonical_bits(&flat)
}

#[test]
fn gpu_engine_gives_the_host_engines_bits_without_clipping() {
    if gpu_or_skip("GPU engine, no clipping").is_none() {
        return;
    }
    let seed = seed("engine_gpu bits");
    for world in 1..=4 {
        for stage in 0..=3 {
            // bf16 sums its micro-steps in bf16 (DeepSpeed's default grad_accum_dtype) or,
            // asked, in fp32.
            for (precision, sums) in [
                ("fp32", "fp32"),
                ("fp16", "fp16"),
                ("bf16", "bf16"),
                ("bf16", "fp32"),
            ] {
                for accum in [1, 3] {
                    if precision != sums && accum == 1 {
                        continue;
                    }
                    let cfg = config(stage, precision, accum, 0.0).replacen(
                        '{',
                        &format!(r#"{{"data_types": {{"grad_accum_dtype": "{sums}"}},"#),
                        1,
                    );
                    let host = train(false, world, &cfg, seed, accum);
                    let dev = train(true, world, &cfg, seed, accum);
                    for (r, p) in dev.iter().enumerate() {
                        assert!(
                            bits(p) == bits(&host[0]),
                            "world {world} stage {stage} {precision} summed in {sums}, accum \
                             {accum}: GPU rank {r} differs from the host engine (seed {seed})"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn gpu_engine_with_clipping_stays_within_the_host_bounds() {
    if gpu_or_skip("GPU engine, clipping").is_none() {
        return;
    }
    let seed = seed("engine_gpu clipping");
    for (precision, mean_bound, max_bound) in [
        ("fp32", 2e-5, 1e-2),
        ("fp16", 1e-3, 0.05),
        ("bf16", 4e-3, 0.05),
    ] {
        for world in [1, 3] {
            let cfg = config(2, precision, 1, 0.5);
            let host = train(false, world, &cfg, seed, 1);
            let dev = train(true, world, &cfg, seed, 1);
            let d: Vec<f32> = bits(&host[0])
                .iter()
                .zip(bits(&dev[0]))
                .map(|(a, b)| (f32::from_bits(*a) - f32::from_bits(b)).abs())
                .collect();
            let mean = d.iter().sum::<f32>() / d.len() as f32;
            let max = d.iter().fold(0f32, |m, x| m.max(*x));
            println!("{precision} world {world}: mean |Δ| {mean:.2e}, max |Δ| {max:.2e}");
            assert!(
                mean <= mean_bound && max <= max_bound,
                "{precision} world {world} (seed {seed})"
            );
            for p in &dev[1..] {
                assert!(bits(p) == bits(&dev[0]), "ranks differ on the GPU");
            }
        }
    }
}

#[test]
fn nccl_engine_at_world_one_gives_the_host_engines_bits() {
    if gpu_or_skip("NCCL engine").is_none() {
        return;
    }
    if let Err(e) = zero_sys::nccl::Nccl::get() {
        zero_kernels::testing::skip_gpu_test("NCCL engine", &e.to_string());
        return;
    }
    let seed = seed("engine_gpu nccl");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let env = LaunchEnv::local(0, 1, port);
    for stage in 0..=3 {
        for precision in ["fp32", "bf16"] {
            let cfg = config(stage, precision, 1, 0.0);
            let host = train(false, 1, &cfg, seed, 1);
            let comm = NcclComm::init(&env, Duration::from_secs(60)).expect("NCCL init");
            let data = dataset(seed, STEPS * MICRO);
            let dev = run_ranks_on(
                vec![comm],
                || CudaDevice::new().expect("device"),
                &cfg,
                seed,
                |e| run(e, &data),
            );
            assert!(
                bits(&dev[0]) == bits(&host[0]),
                "stage {stage} {precision}: NCCL engine differs from the host engine (seed {seed})"
            );
        }
    }
}

/// zero-torch's parameters on a GPU view the engine's buffers through leases (issue 35):
/// the engine must write every step into the memory it leased, never into a new
/// allocation. Stages 0–2 (every parameter whole), fp32 and bf16, two ranks: each
/// parameter is leased before the first step and read through the lease's address on
/// another stream (ordered by a crossing, as torch's current stream is) after the last;
/// the values are the engine's own, bit for bit, and the buffer holding each parameter
/// is still the leased one.
#[test]
fn gpu_engine_steps_write_the_leased_parameters_in_place() {
    let Some(g) = gpu_or_skip("leased parameters") else {
        return;
    };
    let seed = seed("engine_gpu leases");
    let world = 2;
    let data = dataset(seed, STEPS * world * MICRO);
    for stage in 0..=2 {
        for precision in ["fp32", "bf16"] {
            let cfg = config(stage, precision, 1, 0.0);
            let problems = on_gpu_ranks(world, &cfg, seed, |e| {
                let ours = e.device().stream().cuda().clone();
                let addr = |b: &GpuBuffer| b.read_addr(&ours).0;
                let mut leased = Vec::new();
                for m in 0..e.modules().len() {
                    for k in 0..e.modules()[m].params.len() {
                        let (buf, range) = e.param_buffer(m, k).expect("a parameter");
                        leased.push((m, k, buf.lease(), range));
                    }
                }
                for s in 0..STEPS {
                    train_step(e, &data, s, None).expect("step");
                }
                let want = full_params(e).expect("params");
                let theirs = g.new_stream().expect("a stream");
                let engine = borrow(&theirs, e.device().stream());
                let dtype = e.dtype();
                let mut problems = Vec::new();
                for (m, k, lease, range) in &leased {
                    let (buf, now) = e.param_buffer(*m, *k).expect("a parameter");
                    if addr(buf) != lease.addr() || now != *range {
                        problems.push(format!("module {m} parameter {k} moved"));
                        continue;
                    }
                    let out = read_through(&theirs, &engine, lease, range.clone(), dtype);
                    let got = theirs.download_f32(&out, 0..range.len()).expect("download");
                    if !same_bits(&got, &want[*m][*k]) {
                        problems.push(format!("module {m} parameter {k} differs"));
                    }
                }
                problems
            });
            for (rank, p) in problems.iter().enumerate() {
                assert!(
                    p.is_empty(),
                    "stage {stage} {precision} rank {rank}: {p:?} (seed {seed})"
                );
            }
        }
    }
}

/// Stage 3 on a GPU with zero-torch's gathered views: after each fetch a module's
/// parameters are read through leases on the gathered bucket on another stream (torch's,
/// ordered by a crossing), the leases go, the engine's stream waits for that stream, and
/// only then is the module released (its bucket freed or kept). Between training steps,
/// two ranks, fp32 and bf16: the values read are the module's own, and the stand-in sees
/// no read after a free.
#[test]
fn gpu_stage_3_gathered_buckets_are_read_through_leases_before_their_release() {
    let Some(g) = gpu_or_skip("leased gathered buckets") else {
        return;
    };
    let seed = seed("engine_gpu gathered leases");
    let world = 2;
    let data = dataset(seed, STEPS * world * MICRO);
    for precision in ["fp32", "bf16"] {
        let cfg = config(3, precision, 1, 0.0);
        let problems = on_gpu_ranks(world, &cfg, seed, |e| {
            let theirs = g.new_stream().expect("a stream");
            let engine = borrow(&theirs, e.device().stream());
            let side = g.new_stream().expect("a stream");
            let elsewhere = borrow(&theirs, &side);
            let torch = borrow(e.device().stream(), &theirs);
            let dtype = e.dtype();
            let mut problems = Vec::new();
            for s in 0..3 {
                train_step(e, &data, s, None).expect("step");
                for m in 0..e.modules().len() {
                    e.fetch(m).expect("fetch");
                    let want = e.params_f32(m).expect("params");
                    let mut reads = Vec::new();
                    // What Runtime.gather does: torch waits for the all-gather.
                    theirs.crossing(&engine, |_| Ok(())).expect("crossing");
                    for (k, want) in want.iter().enumerate() {
                        let (buf, range) = e.param_buffer(m, k).expect("a parameter");
                        let lease = buf.lease();
                        // Torch's kernel reads the view, unknown to the engine (the
                        // copy's crossing orders it with a third stream only).
                        let out = read_through(&theirs, &elsewhere, &lease, range, dtype);
                        drop(lease);
                        reads.push((k, out, want.clone()));
                    }
                    // What Runtime.scatter does: the engine waits for torch's reads.
                    e.device()
                        .stream()
                        .crossing(&torch, |_| Ok(()))
                        .expect("crossing");
                    e.release(m).expect("release");
                    // Torch's reads are checked only now, after the release was queued.
                    for (k, out, want) in reads.drain(..) {
                        let got = theirs.download_f32(&out, 0..want.len()).expect("download");
                        if !same_bits(&got, &want) {
                            problems.push(format!("step {s} module {m} parameter {k}"));
                        }
                    }
                }
                e.abandon_pass().expect("abandon");
            }
            problems
        });
        for (rank, p) in problems.iter().enumerate() {
            assert!(
                p.is_empty(),
                "{precision} rank {rank}: {p:?} differ (seed {seed})"
            );
        }
    }
}

/// Shard groups and hpZ (issue 50) on the GPU: four ranks of a device group split into
/// shard groups of 2 (their sub-groups on streams of their own) with hpZ over 2 give the
/// host engine's bits for the same layout, at stages 2 and 3, in fp32 and bf16.
#[test]
fn gpu_engine_with_shard_groups_and_hpz_gives_the_host_engines_bits() {
    if gpu_or_skip("GPU engine, shard groups and hpZ").is_none() {
        return;
    }
    let seed = seed("gpu shard groups");
    for stage in [2u8, 3] {
        for precision in ["fp32", "bf16"] {
            let hpz = if stage == 3 { 2 } else { 1 };
            let cfg = config(stage, precision, 2, 0.0).replace(
                r#""stage3_max_reuse_distance": 0"#,
                &format!(
                    r#""stage3_max_reuse_distance": 0, "mics_shard_size": 2, "zero_hpz_partition_size": {hpz}"#
                ),
            );
            assert!(cfg.contains("mics_shard_size"), "{cfg}");
            let host = train(false, 4, &cfg, seed, 2);
            let dev = train(true, 4, &cfg, seed, 2);
            for (r, (h, d)) in host.iter().zip(&dev).enumerate() {
                assert!(
                    bits(h) == bits(d),
                    "stage {stage} {precision} rank {r}: the GPU's shard groups differ from the host's (seed {seed})"
                );
            }
        }
    }
    // With the optimizer's partitions in host memory: each window sum crosses back to the
    // device for the replicas' all-reduce at the step, on the GPU as on the host.
    let offloaded = zero_tests::with_offload(
        &config(3, "bf16", 2, 0.0).replace(
            r#""stage3_max_reuse_distance": 0"#,
            r#""stage3_max_reuse_distance": 0, "mics_shard_size": 2"#,
        ),
        "offload_optimizer",
        &serde_json::json!({"device": "cpu"}),
        None,
    );
    assert!(offloaded.contains("mics_shard_size"), "{offloaded}");
    let host = train(false, 4, &offloaded, seed, 2);
    let dev = train(true, 4, &offloaded, seed, 2);
    for (r, (h, d)) in host.iter().zip(&dev).enumerate() {
        assert!(
            bits(h) == bits(d),
            "offloaded rank {r}: the GPU's shard groups differ from the host's (seed {seed})"
        );
    }
    // mics_hierarchical_params_gather on two nodes of two: a shard group of both nodes
    // gathers across the nodes (a sub-communicator of 2), then inside each node (another
    // of 2), its ranks holding their partitions place-major, on the GPU as on the host.
    let text = config(3, "bf16", 2, 0.0).replace(
        r#""stage3_max_reuse_distance": 0"#,
        r#""stage3_max_reuse_distance": 0, "mics_hierarchical_params_gather": true"#,
    );
    assert!(text.contains("mics_hierarchical"), "{text}");
    let two_nodes = |text: &str| {
        let mut cfg = ZeroConfig::from_json_str(text, 4).expect("valid config");
        cfg.ranks_per_node = Some(2);
        assert!(cfg.zero.hierarchical_gather || !text.contains("hierarchical"));
        cfg
    };
    let data = dataset(seed, STEPS * 4 * MICRO * 2);
    let comms = DeviceGroup::with_timeout(4, Duration::from_secs(60)).expect("device group");
    let dev = run_ranks_config(
        comms,
        || CudaDevice::new().expect("device"),
        two_nodes(&text),
        seed,
        mlp_modules,
        |e| run(e, &data),
    );
    let comms = HostGroup::with_timeout(4, Duration::from_secs(60)).expect("host group");
    let host = run_ranks_config(
        comms,
        || HostDevice,
        two_nodes(&text),
        seed,
        mlp_modules,
        |e| run(e, &data),
    );
    for (r, (h, d)) in host.iter().zip(&dev).enumerate() {
        assert!(
            bits(h) == bits(d),
            "hierarchical gathers, rank {r}: the GPU's differ from the host's (seed {seed})"
        );
    }
}
