//! zero's kernels, compiled by NVRTC to PTX, run by the interpreter and compared bit for
//! bit with the CPU kernels of zero-kernels; the faults the interpreter must catch, each
//! with a clean twin; and the speed of the interpreter.
//!
//! Every test that needs NVRTC prints `SKIPPED <test>: no NVRTC (...)` and passes where
//! there is none (see `nvrtc.rs`).

use super::nvrtc;
use super::testmem::{bytes, pack, Arg, Elem, TestMem};
use super::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use zero_kernels::testing::{canonical_bits, fresh_seed};
use zero_kernels::{bf16, f16, AdamConfig, Element, FlatLayout, WeightDecay};

/// Threads per block of zero's launches.
const THREADS: u32 = 256;
/// Elements per flatten block (`CHUNK` in flatten.cu).
const CHUNK: u64 = 256 * 8 * 4;
const BIG: usize = (1 << 20) + 3;

/// An element type of the kernels.
trait TE: Element + Elem {
    const SUFFIX: &'static str;
}
impl TE for f32 {
    const SUFFIX: &'static str = "f32";
}
impl TE for f16 {
    const SUFFIX: &'static str = "f16";
}
impl TE for bf16 {
    const SUFFIX: &'static str = "bf16";
}

fn module(test: &str, file: &str) -> Option<Module> {
    let ptx = nvrtc::zero_ptx(test, file)?;
    Some(Module::parse(&ptx).unwrap_or_else(|e| panic!("{test}: {file}: {e}")))
}

fn kernel<'m>(m: &'m Module, name: &str) -> &'m Kernel {
    m.kernel(name).unwrap_or_else(|| panic!("no kernel {name}"))
}

/// Blocks for `n` elements at `per_thread` per thread (stream.rs's `blocks`).
fn blocks(n: usize, per_thread: usize) -> u32 {
    n.div_ceil(per_thread * THREADS as usize).clamp(1, 65_535) as u32
}

fn dims(grid: u32, block: u32) -> LaunchDims {
    LaunchDims {
        grid: [grid, 1, 1],
        block: [block, 1, 1],
        dynamic_shared_bytes: 0,
    }
}

fn run(k: &Kernel, grid: u32, args: &[Arg], mem: &mut TestMem, seed: u64) -> LaunchStats {
    let params = pack(k, args);
    launch(
        k,
        &dims(grid, THREADS),
        &params,
        mem,
        &ExecOptions {
            seed,
            max_shared_bytes: 0,
            max_warp_instructions: 0,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Random values, never zero, some negative; `specials`: a few infinities, NaNs and
/// subnormals too.
fn random<T: TE>(rng: &mut ChaCha8Rng, n: usize, specials: bool) -> Vec<T> {
    (0..n)
        .map(|_| {
            let k = rng.gen_range(0..1000);
            let x: f32 = match k {
                0 if specials => f32::INFINITY,
                1 if specials => f32::NAN,
                2 if specials => f32::NEG_INFINITY,
                3 if specials => 1e-40,
                4 if specials => 70000.0,
                _ => {
                    let m: f32 = rng.gen_range(0.001..4.0);
                    if rng.gen_bool(0.5) {
                        -m
                    } else {
                        m
                    }
                }
            };
            T::from_f32(x)
        })
        .collect()
}

fn same_bits<T: TE>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (g, w) = (canonical_bits(got), canonical_bits(want));
    if let Some(i) = (0..g.len()).find(|&i| g[i] != w[i]) {
        panic!(
            "{what}: element {i} of {}: got {:?} ({:#x}), want {:?} ({:#x})",
            g.len(),
            got[i],
            g[i],
            want[i],
            w[i]
        );
    }
}

// ---------------------------------------------------------------------------------------
// Parsing

#[test]
fn all_zero_kernels_parse() {
    let mut total = 0;
    for src in zero_kernels::cuda::SOURCES {
        let Some(m) = module("all_zero_kernels_parse", src.name) else {
            return;
        };
        assert_eq!(m.target(), "sm_90");
        for e in src.entries {
            let k = kernel(&m, e);
            assert!(k.instruction_count() > 0);
            total += 1;
        }
    }
    assert_eq!(total, 32);
}

#[test]
fn nvrtc_versions_parse() {
    for v in ["12.2", "12.9", "13.0", "13.5"] {
        let Some(lib) = nvrtc::wheel(v) else {
            println!("SKIPPED nvrtc_versions_parse for NVRTC {v}: no target/cuda-pip/nvrtc-{v}");
            continue;
        };
        for src in zero_kernels::cuda::SOURCES {
            let ptx = nvrtc::compile(&lib, &src.program(), src.name, &nvrtc::OPTIONS)
                .unwrap_or_else(|e| panic!("NVRTC {v}: {e}"));
            let m = Module::parse(&ptx).unwrap_or_else(|e| panic!("NVRTC {v}, {}: {e}", src.name));
            for e in src.entries {
                assert!(
                    m.kernel(e).is_some(),
                    "NVRTC {v}, {}: no kernel {e}",
                    src.name
                );
            }
            println!("NVRTC {v}: {} parsed (PTX ISA {:?})", src.name, m.version());
        }
    }
}

// ---------------------------------------------------------------------------------------
// cast

fn cast_case<S: TE, D: TE>(m: &Module, n: usize, misalign: bool, rng: &mut ChaCha8Rng, seed: u64) {
    let k = kernel(m, &format!("cast_{}_{}", S::SUFFIX, D::SUFFIX));
    let skip = misalign as usize;
    let src_all: Vec<S> = random(rng, n + skip, true);
    let src = &src_all[skip..];
    let mut want = vec![D::default(); n];
    zero_kernels::cast(src, &mut want).expect("cpu cast");
    let mut mem = TestMem::new();
    let s = mem.alloc_of("src", &src_all) + (skip * S::SIZE) as u64;
    let d_base = mem.alloc_of("dst", &vec![D::from_f32(f32::NAN); n + skip]);
    let d = d_base + (skip * D::SIZE) as u64;
    run(
        k,
        blocks(n, 4),
        &[Arg::U64(s), Arg::U64(d), Arg::U64(n as u64)],
        &mut mem,
        seed,
    );
    let got: Vec<D> = mem.read(d_base);
    same_bits(
        &format!("{} n={n} misaligned={misalign}", k.name()),
        &got[skip..],
        &want,
    );
}

fn cast_pair<S: TE, D: TE>(m: &Module, rng: &mut ChaCha8Rng, seed: u64, big: bool) {
    for n in [0, 1, 7, 1023, 4097] {
        for mis in [false, true] {
            cast_case::<S, D>(m, n, mis, rng, seed);
        }
    }
    if big {
        cast_case::<S, D>(m, BIG, false, rng, seed);
        cast_case::<S, D>(m, BIG, true, rng, seed);
    }
}

#[test]
fn cast_matches_cpu() {
    let seed = fresh_seed("cast_matches_cpu");
    let Some(m) = module("cast_matches_cpu", "cast.cu") else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    cast_pair::<f32, f16>(&m, &mut rng, seed, true);
    cast_pair::<f32, bf16>(&m, &mut rng, seed, true);
    cast_pair::<f16, f32>(&m, &mut rng, seed, true);
    cast_pair::<bf16, f32>(&m, &mut rng, seed, false);
    cast_pair::<f16, bf16>(&m, &mut rng, seed, false);
    cast_pair::<bf16, f16>(&m, &mut rng, seed, true);
}

// ---------------------------------------------------------------------------------------
// adam

/// adam.rs's per-step scalars with a scale of one (the GPU wrapper's).
fn adam_scalars(cfg: &AdamConfig, step: u64) -> [f32; 9] {
    let t = step.min(i32::MAX as u64) as i32;
    let (bc1, bc2) = if cfg.bias_correction {
        (
            1.0 - (cfg.beta1 as f64).powi(t),
            1.0 - (cfg.beta2 as f64).powi(t),
        )
    } else {
        (1.0, 1.0)
    };
    [
        cfg.beta1,
        1.0 - cfg.beta1,
        cfg.beta2,
        1.0 - cfg.beta2,
        cfg.weight_decay,
        cfg.lr * cfg.weight_decay,
        (cfg.lr as f64 / bc1) as f32,
        bc2.sqrt() as f32,
        cfg.eps,
    ]
}

#[derive(Clone, Copy, Debug)]
struct AdamCase {
    n: usize,
    misalign: bool,
    mode: u8,
    found_inf: Option<i32>,
    device_scale: bool,
    with_params: bool,
}

/// Runs one adam launch and compares with the CPU; returns the launch's statistics and
/// the interpreter's wall time.
fn adam_case<G: TE, P: TE>(
    m: &Module,
    c: AdamCase,
    rng: &mut ChaCha8Rng,
    seed: u64,
) -> (LaunchStats, std::time::Duration) {
    let k = kernel(m, &format!("adam_{}_{}", G::SUFFIX, P::SUFFIX));
    let n = c.n;
    let cfg = AdamConfig {
        lr: rng.gen_range(1e-4..1e-2),
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: if c.mode == 0 {
            0.0
        } else {
            rng.gen_range(0.001..0.1)
        },
        decay: if c.mode == 2 {
            WeightDecay::Decoupled
        } else {
            WeightDecay::L2
        },
        bias_correction: true,
    };
    let step = rng.gen_range(1..50u64);
    let scale: f32 = rng.gen_range(0.1..2.0);
    let skip = c.misalign as usize;
    let w0: Vec<f32> = random(rng, n + skip, false);
    let m0: Vec<f32> = random(rng, n + skip, false);
    let v0: Vec<f32> = random::<f32>(rng, n + skip, false)
        .iter()
        .map(|x| x.abs())
        .collect();
    let g: Vec<G> = random(rng, n, false);
    let (mut w, mut mm, mut v) = (
        w0[skip..].to_vec(),
        m0[skip..].to_vec(),
        v0[skip..].to_vec(),
    );
    let mut p = vec![P::default(); n];
    let skipped = c.found_inf.is_some_and(|f| f != 0);
    if !skipped {
        zero_kernels::adam_step::<G, P>(
            &cfg,
            step,
            scale,
            &mut w,
            &mut mm,
            &mut v,
            &g,
            Some(&mut p),
        )
        .expect("cpu adam");
    }
    let mut mem = TestMem::new();
    let off = (skip * 4) as u64;
    let (wb, mb, vb) = (
        mem.alloc_of("w", &w0),
        mem.alloc_of("m", &m0),
        mem.alloc_of("v", &v0),
    );
    let gb = mem.alloc_of("grads", &g);
    let poison = vec![P::from_f32(f32::NAN); n];
    let pb = if c.with_params {
        mem.alloc_of("params", &poison)
    } else {
        0
    };
    let (scale_value, scale_ptr) = if c.device_scale {
        (1.0, mem.alloc_of("scale", &[scale]))
    } else {
        (scale, 0)
    };
    let flag = match c.found_inf {
        Some(f) => mem.alloc_of("found_inf", &[f]),
        None => 0,
    };
    let mut args = vec![
        Arg::U64(wb + off),
        Arg::U64(mb + off),
        Arg::U64(vb + off),
        Arg::U64(gb),
        Arg::U64(pb),
        Arg::U64(n as u64),
    ];
    args.extend(adam_scalars(&cfg, step).iter().map(|&x| Arg::F32(x)));
    args.extend([
        Arg::I32(c.mode as i32),
        Arg::F32(scale_value),
        Arg::U64(scale_ptr),
        Arg::U64(flag),
    ]);
    let t = std::time::Instant::now();
    let stats = run(k, blocks(n, 4), &args, &mut mem, seed);
    let elapsed = t.elapsed();
    let what = format!("{} {c:?}", k.name());
    same_bits(&format!("{what}: master"), &mem.read::<f32>(wb)[skip..], &w);
    same_bits(
        &format!("{what}: exp_avg"),
        &mem.read::<f32>(mb)[skip..],
        &mm,
    );
    same_bits(
        &format!("{what}: exp_avg_sq"),
        &mem.read::<f32>(vb)[skip..],
        &v,
    );
    if c.with_params {
        let got: Vec<P> = mem.read(pb);
        if skipped {
            same_bits(&format!("{what}: params untouched"), &got, &poison);
        } else {
            same_bits(&format!("{what}: params"), &got, &p);
        }
    }
    (stats, elapsed)
}

fn adam_pair<G: TE, P: TE>(m: &Module, rng: &mut ChaCha8Rng, seed: u64) {
    for n in [0, 1, 7, 1023, 4099] {
        for misalign in [false, true] {
            for mode in [0, 1, 2] {
                let c = AdamCase {
                    n,
                    misalign,
                    mode,
                    found_inf: None,
                    device_scale: mode == 1,
                    with_params: true,
                };
                adam_case::<G, P>(m, c, rng, seed);
            }
        }
    }
    for found_inf in [Some(0), Some(1)] {
        let c = AdamCase {
            n: 1023,
            misalign: false,
            mode: 2,
            found_inf,
            device_scale: false,
            with_params: true,
        };
        adam_case::<G, P>(m, c, rng, seed);
    }
    let c = AdamCase {
        n: 777,
        misalign: false,
        mode: 1,
        found_inf: None,
        device_scale: true,
        with_params: false,
    };
    adam_case::<G, P>(m, c, rng, seed);
}

#[test]
fn adam_matches_cpu() {
    let seed = fresh_seed("adam_matches_cpu");
    let Some(m) = module("adam_matches_cpu", "adam.cu") else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    adam_pair::<bf16, bf16>(&m, &mut rng, seed);
    adam_pair::<f16, f16>(&m, &mut rng, seed);
    adam_pair::<f32, bf16>(&m, &mut rng, seed);
    adam_pair::<f32, f32>(&m, &mut rng, seed);
    // The other five, once each.
    let c = AdamCase {
        n: 1029,
        misalign: false,
        mode: 2,
        found_inf: None,
        device_scale: false,
        with_params: true,
    };
    adam_case::<f32, f16>(&m, c, &mut rng, seed);
    adam_case::<f16, f32>(&m, c, &mut rng, seed);
    adam_case::<f16, bf16>(&m, c, &mut rng, seed);
    adam_case::<bf16, f32>(&m, c, &mut rng, seed);
    adam_case::<bf16, f16>(&m, c, &mut rng, seed);
}

/// Interpreter speed on zero's hottest kernel, launched as zero launches it. Prints only.
#[test]
fn interpreter_speed() {
    let seed = fresh_seed("interpreter_speed");
    let Some(m) = module("interpreter_speed", "adam.cu") else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let c = AdamCase {
        n: BIG,
        misalign: false,
        mode: 2,
        found_inf: None,
        device_scale: false,
        with_params: true,
    };
    let (stats, t) = adam_case::<f32, bf16>(&m, c, &mut rng, seed);
    let s = t.as_secs_f64();
    println!(
        "interpreter_speed: adam_f32_bf16 over {} elements ({} blocks of {THREADS}): {:.3} s, {} warp / {} thread instructions, {:.1} M warp-instr/s, {:.1} M thread-instr/s",
        BIG,
        stats.blocks,
        s,
        stats.warp_instructions,
        stats.thread_instructions,
        stats.warp_instructions as f64 / s / 1e6,
        stats.thread_instructions as f64 / s / 1e6
    );
}

// ---------------------------------------------------------------------------------------
// flatten / unflatten

/// flatten_views of ops.rs: tensors and padding gaps (from a buffer of zeros) in one launch.
fn flatten_case<S: TE, D: TE>(
    m: &Module,
    sizes: &[usize],
    align: usize,
    world: usize,
    rng: &mut ChaCha8Rng,
    seed: u64,
) {
    let k = kernel(m, &format!("copy_{}_{}", S::SUFFIX, D::SUFFIX));
    let layout = FlatLayout::new(sizes, D::DTYPE, align, world).expect("layout");
    let srcs: Vec<Vec<S>> = sizes.iter().map(|&n| random(rng, n, true)).collect();
    let refs: Vec<&[S]> = srcs.iter().map(|s| s.as_slice()).collect();
    let mut want = vec![D::default(); layout.total_len()];
    zero_kernels::flatten(&layout, &refs, &mut want).expect("cpu flatten");
    let mut mem = TestMem::new();
    let mut gaps = Vec::new();
    let mut pos = 0;
    for i in 0..sizes.len() {
        let r = layout.tensor_range(i);
        gaps.push(pos..r.start);
        pos = r.end;
    }
    gaps.push(pos..layout.total_len());
    let longest = gaps.iter().map(|g| g.len()).max().unwrap_or(0);
    let zeros = mem.alloc_of("zeros", &vec![S::default(); longest.max(1)]);
    let flat = mem.alloc_of("flat", &vec![D::from_f32(f32::NAN); layout.total_len()]);
    let mut table: Vec<u64> = Vec::new();
    let mut total = 0u64;
    let mut push = |src: u64, start: usize, len: usize, table: &mut Vec<u64>| {
        if len > 0 {
            table.extend([src, flat + (start * D::SIZE) as u64, len as u64, total]);
            total += (len as u64).div_ceil(CHUNK);
        }
    };
    for (i, s) in srcs.iter().enumerate() {
        let (gap, r) = (&gaps[i], layout.tensor_range(i));
        push(zeros, gap.start, gap.len(), &mut table);
        if !s.is_empty() {
            let a = mem.alloc_of(&format!("tensor{i}"), s);
            push(a, r.start, r.len(), &mut table);
        }
    }
    let tail = &gaps[sizes.len()];
    push(zeros, tail.start, tail.len(), &mut table);
    if table.is_empty() {
        return;
    }
    let t = mem.alloc_of("table", &table);
    run(
        k,
        total.max(1) as u32,
        &[Arg::U64(t), Arg::I32((table.len() / 4) as i32)],
        &mut mem,
        seed,
    );
    same_bits(
        &format!("{} flatten {sizes:?} align {align}", k.name()),
        &mem.read::<D>(flat),
        &want,
    );
}

/// unflatten_views of ops.rs.
fn unflatten_case<S: TE, D: TE>(
    m: &Module,
    sizes: &[usize],
    align: usize,
    rng: &mut ChaCha8Rng,
    seed: u64,
) {
    let k = kernel(m, &format!("copy_{}_{}", S::SUFFIX, D::SUFFIX));
    let layout = FlatLayout::new(sizes, S::DTYPE, align, 1).expect("layout");
    let flat: Vec<S> = random(rng, layout.total_len(), true);
    let mut want: Vec<Vec<D>> = sizes.iter().map(|&n| vec![D::default(); n]).collect();
    {
        let mut outs: Vec<&mut [D]> = want.iter_mut().map(|v| v.as_mut_slice()).collect();
        zero_kernels::unflatten(&layout, &flat, &mut outs).expect("cpu unflatten");
    }
    let mut mem = TestMem::new();
    let fb = mem.alloc_of("flat", &flat);
    let mut table = Vec::new();
    let mut total = 0u64;
    let mut outs = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        if n == 0 {
            outs.push(None);
            continue;
        }
        let d = mem.alloc_of(&format!("out{i}"), &vec![D::from_f32(f32::NAN); n]);
        outs.push(Some(d));
        table.extend([
            fb + (layout.tensor_range(i).start * S::SIZE) as u64,
            d,
            n as u64,
            total,
        ]);
        total += (n as u64).div_ceil(CHUNK);
    }
    if table.is_empty() {
        return;
    }
    let t = mem.alloc_of("table", &table);
    run(
        k,
        total as u32,
        &[Arg::U64(t), Arg::I32((table.len() / 4) as i32)],
        &mut mem,
        seed,
    );
    for (i, o) in outs.iter().enumerate() {
        if let Some(d) = o {
            same_bits(
                &format!("{} unflatten tensor {i} of {sizes:?}", k.name()),
                &mem.read::<D>(*d),
                &want[i],
            );
        }
    }
}

fn flatten_pair<S: TE, D: TE>(m: &Module, rng: &mut ChaCha8Rng, seed: u64) {
    let mut sizes = vec![1, 0, 7, 1023, 8193, 3];
    for _ in 0..4 {
        sizes.push(rng.gen_range(1..20_000));
    }
    for align in [1, 64] {
        flatten_case::<S, D>(m, &sizes, align, 3, rng, seed);
        unflatten_case::<S, D>(m, &sizes, align, rng, seed);
    }
    flatten_case::<S, D>(m, &[BIG], 1, 1, rng, seed);
}

#[test]
fn flatten_matches_cpu() {
    let seed = fresh_seed("flatten_matches_cpu");
    let Some(m) = module("flatten_matches_cpu", "flatten.cu") else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    flatten_pair::<f32, f32>(&m, &mut rng, seed);
    flatten_pair::<f16, f16>(&m, &mut rng, seed);
    flatten_pair::<bf16, bf16>(&m, &mut rng, seed);
    flatten_pair::<f32, f16>(&m, &mut rng, seed);
    flatten_pair::<f32, bf16>(&m, &mut rng, seed);
    flatten_pair::<f16, f32>(&m, &mut rng, seed);
    flatten_pair::<bf16, f32>(&m, &mut rng, seed);
}

// ---------------------------------------------------------------------------------------
// reduce / accumulate

/// reduce.cu's `nan_max`: NaN wins.
fn nan_max(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a > b {
        a
    } else {
        b
    }
}

/// Elements, sources, destinations, operation (0 sum, 1 avg, 2 max), and whether the
/// last source is also the first destination.
type ReduceShape = (usize, usize, usize, i32, bool);

fn reduce_case<T: TE>(m: &Module, shape: ReduceShape, rng: &mut ChaCha8Rng, seed: u64) {
    let (n, nsrc, ndst, op, in_place) = shape;
    let k = kernel(m, &format!("reduce_{}", T::SUFFIX));
    let srcs: Vec<Vec<T>> = (0..nsrc).map(|_| random(rng, n, op == 2)).collect();
    let world = nsrc as f32;
    let want: Vec<T> = (0..n)
        .map(|i| {
            let mut acc = srcs[0][i].to_f32();
            for s in &srcs[1..] {
                let x = s[i].to_f32();
                acc = if op == 2 { nan_max(acc, x) } else { acc + x };
            }
            if op == 1 {
                acc /= world;
            }
            T::from_f32(acc)
        })
        .collect();
    let mut mem = TestMem::new();
    let src_addrs: Vec<u64> = srcs
        .iter()
        .enumerate()
        .map(|(i, s)| mem.alloc_of(&format!("src{i}"), s))
        .collect();
    let mut dst_addrs: Vec<u64> = (0..ndst)
        .map(|i| mem.alloc_of(&format!("dst{i}"), &vec![T::from_f32(f32::NAN); n]))
        .collect();
    if in_place {
        // The last source is also the first destination.
        dst_addrs[0] = src_addrs[nsrc - 1];
    }
    let table = |a: &[u64]| {
        let mut t = [0u64; 64];
        t[..a.len()].copy_from_slice(a);
        Arg::Bytes(bytes(&t))
    };
    let args = [
        table(&src_addrs),
        Arg::I32(nsrc as i32),
        table(&dst_addrs),
        Arg::I32(ndst as i32),
        Arg::U64(n as u64),
        Arg::I32(op),
        Arg::F32(world),
    ];
    run(k, blocks(n, 4), &args, &mut mem, seed);
    for (d, &a) in dst_addrs.iter().enumerate() {
        same_bits(
            &format!(
                "{} n={n} nsrc={nsrc} op={op} in_place={in_place} dst {d}",
                k.name()
            ),
            &mem.read::<T>(a),
            &want,
        );
    }
}

fn accumulate_case<T: TE>(m: &Module, n: usize, rng: &mut ChaCha8Rng, seed: u64) {
    let k = kernel(m, &format!("accumulate_{}", T::SUFFIX));
    let acc: Vec<f32> = random(rng, n, false);
    let src: Vec<T> = random(rng, n, true);
    let want: Vec<f32> = acc.iter().zip(&src).map(|(a, s)| a + s.to_f32()).collect();
    let mut mem = TestMem::new();
    let (a, s) = (mem.alloc_of("acc", &acc), mem.alloc_of("src", &src));
    run(
        k,
        blocks(n, 4),
        &[Arg::U64(a), Arg::U64(s), Arg::U64(n as u64)],
        &mut mem,
        seed,
    );
    same_bits(&format!("{} n={n}", k.name()), &mem.read::<f32>(a), &want);
}

fn reduce_type<T: TE>(m: &Module, rng: &mut ChaCha8Rng, seed: u64) {
    for op in [0, 1, 2] {
        for (n, nsrc, ndst) in [
            (1, 1, 1),
            (7, 2, 1),
            (1023, 3, 2),
            (4100, 8, 3),
            (999, 64, 1),
        ] {
            reduce_case::<T>(m, (n, nsrc, ndst, op, false), rng, seed);
            reduce_case::<T>(m, (n, nsrc, ndst, op, true), rng, seed);
        }
    }
    reduce_case::<T>(m, (BIG, 2, 1, 0, true), rng, seed);
    for n in [0, 1, 7, 1023, BIG] {
        accumulate_case::<T>(m, n, rng, seed);
    }
}

#[test]
fn reduce_matches_cpu() {
    let seed = fresh_seed("reduce_matches_cpu");
    let Some(m) = module("reduce_matches_cpu", "reduce.cu") else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    reduce_type::<f32>(&m, &mut rng, seed);
    reduce_type::<f16>(&m, &mut rng, seed);
    reduce_type::<bf16>(&m, &mut rng, seed);
}

// ---------------------------------------------------------------------------------------
// stats

/// stats_view of stream.rs: per-block partials, then stats_finish. Returns (sum, flag).
fn stats_run<T: TE>(m: &Module, x: &[T], seed: u64) -> (f64, bool) {
    let k = kernel(m, &format!("stats_{}", T::SUFFIX));
    let fin = kernel(m, "stats_finish");
    let n = x.len();
    let nblocks = n.div_ceil(THREADS as usize).min(1024);
    let mut mem = TestMem::new();
    let xb = mem.alloc_of("x", x);
    let sums = mem.alloc_of("sums", &vec![0f64; nblocks]);
    let flags = mem.alloc_of("flags", &vec![0i32; nblocks]);
    let sum = mem.alloc_of("sum", &[0f64]);
    let flag = mem.alloc_of("flag", &[0i32]);
    run(
        k,
        nblocks as u32,
        &[
            Arg::U64(xb),
            Arg::U64(n as u64),
            Arg::U64(sums),
            Arg::U64(flags),
        ],
        &mut mem,
        seed,
    );
    run(
        fin,
        1,
        &[
            Arg::U64(sums),
            Arg::U64(flags),
            Arg::I32(nblocks as i32),
            Arg::U64(sum),
            Arg::U64(flag),
        ],
        &mut mem,
        seed,
    );
    (mem.read::<f64>(sum)[0], mem.read::<i32>(flag)[0] != 0)
}

fn stats_type<T: TE>(m: &Module, rng: &mut ChaCha8Rng, seed: u64) {
    for n in [1, 7, 1023, 300_001, BIG] {
        for specials in [false, true] {
            let x: Vec<T> = random(rng, n, specials);
            let want = zero_kernels::grad_stats(&x);
            let (sum, flag) = stats_run(m, &x, seed);
            let what = format!("stats_{} n={n} specials={specials}", T::SUFFIX);
            assert_eq!(flag, want.non_finite, "{what}: flag");
            if want.sum_sq.is_finite() {
                let rel = ((sum - want.sum_sq) / want.sum_sq).abs();
                assert!(
                    rel <= 1e-12,
                    "{what}: sum {sum} vs cpu {} (relative {rel:e})",
                    want.sum_sq
                );
            } else {
                assert_eq!(
                    sum.is_nan(),
                    want.sum_sq.is_nan(),
                    "{what}: sum {sum} vs {}",
                    want.sum_sq
                );
            }
        }
    }
}

#[test]
fn stats_matches_cpu() {
    let seed = fresh_seed("stats_matches_cpu");
    let Some(m) = module("stats_matches_cpu", "stats.cu") else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    stats_type::<f32>(&m, &mut rng, seed);
    stats_type::<f16>(&m, &mut rng, seed);
    stats_type::<bf16>(&m, &mut rng, seed);
}

#[test]
fn warp_order_does_not_change_results() {
    let seed = fresh_seed("warp_order_does_not_change_results");
    let Some(m) = module("warp_order_does_not_change_results", "stats.cu") else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let x: Vec<f32> = random(&mut rng, 70_001, false);
    let first = stats_run(&m, &x, seed);
    for s in 1..6u64 {
        let again = stats_run(&m, &x, seed.wrapping_add(s * 0x9e37_79b9));
        assert_eq!(
            first.0.to_bits(),
            again.0.to_bits(),
            "sum differs for seed offset {s}"
        );
        assert_eq!(first.1, again.1);
    }
    let Some(ex) = exchange_module("warp_order_does_not_change_results", true) else {
        return;
    };
    let outs: Vec<Vec<f32>> = (0..5u64)
        .map(|s| exchange_run(&ex, seed.wrapping_add(s)).expect("clean exchange"))
        .collect();
    assert!(outs.iter().all(|o| o == &outs[0]));
}

// ---------------------------------------------------------------------------------------
// Faults the interpreter must catch, each with a clean twin.

fn custom(test: &str, src: &str) -> Option<Module> {
    let ptx = nvrtc::program_ptx(test, src)?;
    Some(Module::parse(&ptx).unwrap_or_else(|e| panic!("{test}: {e}")))
}

fn fault_of(r: Result<LaunchStats, ExecError>) -> (String, [u32; 3], u32, String, String) {
    match r {
        Err(ExecError::Fault {
            kernel,
            thread,
            line,
            text,
            message,
            ..
        }) => (kernel, thread, line, text, message),
        other => panic!("expected a fault, got {other:?}"),
    }
}

#[test]
fn write_past_the_end_is_caught() {
    let src = r#"extern "C" __global__ void past_end(float* out, int n, int extra) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n + extra) out[i] = 1.0f;
}"#;
    let Some(m) = custom("write_past_the_end_is_caught", src) else {
        return;
    };
    let k = kernel(&m, "past_end");
    for extra in [0, 1] {
        let mut mem = TestMem::new();
        let out = mem.alloc_of("out", &vec![0f32; 100]);
        let params = pack(k, &[Arg::U64(out), Arg::I32(100), Arg::I32(extra)]);
        let r = launch(k, &dims(1, 128), &params, &mut mem, &ExecOptions::default());
        if extra == 0 {
            r.expect("clean twin");
            assert!(mem.read::<f32>(out).iter().all(|&x| x == 1.0));
            continue;
        }
        let e = r.expect_err("one past the end");
        let s = e.to_string();
        let (kname, thread, line, text, message) = fault_of(Err(e));
        assert_eq!(kname, "past_end");
        assert_eq!(thread, [100, 0, 0], "{s}");
        assert!(line > 0 && text.starts_with("st.global"), "{s}");
        assert!(
            message.contains("`out`") && message.contains("past its end"),
            "{s}"
        );
        println!("caught: {s}");
    }
}

fn exchange_module(test: &str, sync: bool) -> Option<Module> {
    let src = format!(
        r#"{}
extern "C" __global__ void exchange(const float* in, float* out) {{
    __shared__ float s[256];
    s[threadIdx.x] = in[threadIdx.x] * 2.0f;
#ifdef SYNC
    __syncthreads();
#endif
    out[threadIdx.x] = s[255 - threadIdx.x];
}}"#,
        if sync { "#define SYNC" } else { "" }
    );
    custom(test, &src)
}

fn exchange_run(m: &Module, seed: u64) -> Result<Vec<f32>, ExecError> {
    let k = kernel(m, "exchange");
    let mut mem = TestMem::new();
    let input: Vec<f32> = (0..256).map(|i| i as f32 + 0.5).collect();
    let (i, o) = (
        mem.alloc_of("in", &input),
        mem.alloc_of("out", &[0f32; 256]),
    );
    launch(
        k,
        &dims(1, 256),
        &pack(k, &[Arg::U64(i), Arg::U64(o)]),
        &mut mem,
        &ExecOptions {
            seed,
            max_shared_bytes: 0,
            max_warp_instructions: 0,
        },
    )?;
    Ok(mem.read(o))
}

#[test]
fn shared_race_without_barrier_is_caught_for_every_seed() {
    let (Some(racy), Some(clean)) = (
        exchange_module(
            "shared_race_without_barrier_is_caught_for_every_seed",
            false,
        ),
        exchange_module("shared_race_without_barrier_is_caught_for_every_seed", true),
    ) else {
        return;
    };
    for seed in 0..12u64 {
        let out = exchange_run(&clean, seed).expect("with __syncthreads");
        assert!(out
            .iter()
            .enumerate()
            .all(|(i, &x)| x == (255 - i) as f32 * 2.0 + 1.0));
        let e = exchange_run(&racy, seed).expect_err("race");
        let s = e.to_string();
        let (_, _, _, _, message) = fault_of(Err(e));
        assert!(
            message.contains("race") && message.contains("no bar.sync between them"),
            "seed {seed}: {s}"
        );
        assert!(message.matches("line").count() >= 2, "both lines: {s}");
        if seed == 0 {
            println!("caught: {s}");
        }
    }
}

#[test]
fn uninitialized_shared_read_is_caught() {
    let src = r#"extern "C" __global__ void half_init(float* out, int writers) {
    __shared__ float s[64];
    if (threadIdx.x < writers) s[threadIdx.x] = 1.0f + threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];
}"#;
    let Some(m) = custom("uninitialized_shared_read_is_caught", src) else {
        return;
    };
    let k = kernel(&m, "half_init");
    for writers in [64, 32] {
        let mut mem = TestMem::new();
        let out = mem.alloc_of("out", &[0f32; 64]);
        let r = launch(
            k,
            &dims(1, 64),
            &pack(k, &[Arg::U64(out), Arg::I32(writers)]),
            &mut mem,
            &ExecOptions::default(),
        );
        if writers == 64 {
            r.expect("clean twin");
            continue;
        }
        let e = r.expect_err("uninitialized");
        let s = e.to_string();
        let (_, thread, _, text, message) = fault_of(Err(e));
        assert!(message.contains("uninitialized shared memory"), "{s}");
        assert!(thread[0] >= 32, "{s}");
        assert!(text.starts_with("ld.shared"), "{s}");
        println!("caught: {s}");
    }
}

#[test]
fn misaligned_vector_load_is_caught() {
    let src = r#"extern "C" __global__ void vec_load(const float* in, float* out, int shift) {
    const float4 v = ((const float4*)(in + shift))[threadIdx.x];
    out[threadIdx.x] = v.x + v.y + v.z + v.w;
}"#;
    let Some(m) = custom("misaligned_vector_load_is_caught", src) else {
        return;
    };
    let k = kernel(&m, "vec_load");
    for shift in [4, 1] {
        let mut mem = TestMem::new();
        let input: Vec<f32> = (0..200).map(|i| i as f32).collect();
        let (i, o) = (mem.alloc_of("in", &input), mem.alloc_of("out", &[0f32; 32]));
        let r = launch(
            k,
            &dims(1, 32),
            &pack(k, &[Arg::U64(i), Arg::U64(o), Arg::I32(shift)]),
            &mut mem,
            &ExecOptions::default(),
        );
        if shift == 4 {
            r.expect("aligned twin");
            continue;
        }
        let e = r.expect_err("misaligned");
        let s = e.to_string();
        let (_, thread, _, text, message) = fault_of(Err(e));
        assert!(
            message.contains("misaligned address") && message.contains("16 bytes"),
            "{s}"
        );
        assert!(text.contains(".v4."), "{s}");
        assert_eq!(thread, [0, 0, 0]);
        println!("caught: {s}");
    }
}

#[test]
fn launch_limits_are_checked() {
    let Some(m) = module("launch_limits_are_checked", "flatten.cu") else {
        return;
    };
    let k = kernel(&m, "copy_f32_f32");
    assert_eq!(k.max_threads(), Some(256));
    let mut mem = TestMem::new();
    let src = mem.alloc_of("src", &[1.5f32; 10]);
    let dst = mem.alloc_of("dst", &[0f32; 10]);
    let table = mem.alloc_of("table", &[src, dst, 10, 0]);
    let params = pack(k, &[Arg::U64(table), Arg::I32(1)]);
    let opts = ExecOptions::default();
    launch(k, &dims(1, 256), &params, &mut mem, &opts).expect("256 threads");
    assert_eq!(mem.read::<f32>(dst), vec![1.5f32; 10]);
    match launch(k, &dims(1, 512), &params, &mut mem, &opts) {
        Err(ExecError::LaunchLimit {
            kernel,
            limit,
            value: 512,
            max: 256,
        }) => {
            assert_eq!(kernel, "copy_f32_f32");
            assert!(limit.contains(".maxntid"), "{limit}");
        }
        other => panic!("{other:?}"),
    }
    let Some(c) = module("launch_limits_are_checked", "cast.cu") else {
        return;
    };
    let k = kernel(&c, "cast_f32_f16");
    let params = pack(k, &[Arg::U64(src), Arg::U64(dst), Arg::U64(0)]);
    launch(k, &dims(1, 1024), &params, &mut mem, &opts).expect("1024 threads");
    match launch(k, &dims(1, 1025), &params, &mut mem, &opts) {
        Err(ExecError::LaunchLimit {
            value: 1025,
            max: 1024,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    let shape = LaunchDims {
        grid: [1, 1, 1],
        block: [32, 32, 2],
        dynamic_shared_bytes: 0,
    };
    assert!(matches!(
        launch(k, &shape, &params, &mut mem, &opts),
        Err(ExecError::LaunchLimit { value: 2048, .. })
    ));
    assert!(matches!(
        launch(k, &dims(1, 32), &params[..8], &mut mem, &opts),
        Err(ExecError::ParamSize {
            expected: 24,
            actual: 8,
            ..
        })
    ));
    let big_shared = LaunchDims {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        dynamic_shared_bytes: 64 * 1024,
    };
    match launch(k, &big_shared, &params, &mut mem, &opts) {
        Err(e @ ExecError::LaunchLimit { .. }) => {
            assert!(e.to_string().contains("shared memory"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    let allowed = ExecOptions {
        seed: 0,
        max_shared_bytes: 100 * 1024,
        max_warp_instructions: 0,
    };
    launch(k, &big_shared, &params, &mut mem, &allowed).expect("opted in to 100 KiB");
}

#[test]
fn unsupported_instruction_is_a_parse_error() {
    let racy = r#"extern "C" __global__ void count(int* c) { atomicAdd(c, 1); }"#;
    let plain = r#"extern "C" __global__ void count(int* c) { c[threadIdx.x] = 1; }"#;
    let Some(ptx) = nvrtc::program_ptx("unsupported_instruction_is_a_parse_error", racy) else {
        return;
    };
    let e = Module::parse(&ptx).expect_err("atomics are not interpreted");
    let s = e.to_string();
    assert!(matches!(e, PtxError::Unsupported { .. }), "{s}");
    assert!(s.contains("atom") && e.line() > 0, "{s}");
    println!("refused: {s}");
    let ptx = nvrtc::program_ptx("unsupported_instruction_is_a_parse_error", plain).expect("nvrtc");
    Module::parse(&ptx).expect("clean twin parses");
}

// ---------------------------------------------------------------------------------------
// Arithmetic beyond zero's kernels, as NVRTC writes it.

const ALU_SRC: &str = r#"
extern "C" __global__ void alu(const int* xs, const int* ys, const float* fs, const float* gs, const double* ds, unsigned* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int x = xs[i], y = ys[i];
    unsigned ux = (unsigned)x, uy = (unsigned)y;
    float f = fs[i], g = gs[i];
    double d = ds[i];
    unsigned* o = out + 40 * i;
    o[0] = x / y; o[1] = x % y; o[2] = ux / uy; o[3] = ux % uy;
    o[4] = min(x, y); o[5] = max(x, y); o[6] = min(ux, uy); o[7] = abs(x);
    o[8] = __clz(x); o[9] = __popc(x); o[10] = __brev(x); o[11] = __ffs(x);
    o[12] = x << (y & 31); o[13] = x >> (y & 31); o[14] = ux >> (y & 31);
    long long w = (long long)x * y; o[15] = (unsigned)w; o[16] = (unsigned)(w >> 32);
    o[17] = __mulhi(x, y); o[18] = __umulhi(ux, uy); o[19] = __byte_perm(x, y, 0x5140);
    o[20] = (unsigned)(short)x; o[21] = (unsigned char)x;
    o[22] = __float_as_uint(fminf(f, g)); o[23] = __float_as_uint(fmaxf(f, g));
    o[24] = __float_as_uint(fabsf(f)); o[25] = __float_as_uint(copysignf(f, g));
    o[26] = __float_as_uint(__fmaf_rn(f, g, f)); o[27] = __float_as_uint(sqrtf(f));
    o[28] = __float_as_uint(__fdiv_rn(f, g)); o[29] = __float_as_uint(__frcp_rn(g));
    o[30] = __float2int_rn(f); o[31] = __float2int_rz(f); o[32] = __float2int_rd(f); o[33] = __float2uint_ru(f);
    o[34] = __float_as_uint(rintf(f)) ^ __float_as_uint(floorf(g)) ^ __float_as_uint(ceilf(f)) ^ __float_as_uint(truncf(g));
    o[35] = __float_as_uint(__saturatef(f));
    o[36] = __float_as_uint((float)(d * d + d)) ^ (unsigned)(long long)d;
    o[37] = __float_as_uint(__int2float_rn(x)) ^ __float_as_uint(__uint2float_rn(ux)) ^ __float_as_uint((float)w);
    o[38] = (f < g) | ((f != g) << 1) | ((f >= g) << 2) | ((f == f) << 3) | ((d > 1.5) << 4);
    o[39] = (unsigned)(long long)f;
}
"#;

fn canon32(x: f32) -> u32 {
    if x.is_nan() {
        0x7fff_ffff
    } else {
        x.to_bits()
    }
}

fn alu_reference(x: i32, y: i32, f: f32, g: f32, d: f64) -> [u32; 40] {
    let (ux, uy) = (x as u32, y as u32);
    let w = x as i64 * y as i64;
    let fmin = |a: f32, b: f32| {
        if a.is_nan() {
            b
        } else if b.is_nan() {
            a
        } else {
            a.min(b)
        }
    };
    let fmax = |a: f32, b: f32| {
        if a.is_nan() {
            b
        } else if b.is_nan() {
            a
        } else {
            a.max(b)
        }
    };
    let perm = |a: u32, b: u32, s: u32| {
        let bytes = ((b as u64) << 32) | a as u64;
        (0..4)
            .map(|k| (((bytes >> (8 * ((s >> (4 * k)) & 7))) & 0xff) as u32) << (8 * k))
            .sum::<u32>()
    };
    let sat = |v: f32| {
        if v.is_nan() || v <= 0.0 {
            0.0
        } else if v > 1.0 {
            1.0
        } else {
            v
        }
    };
    let sh = (y & 31) as u32;
    [
        (x / y) as u32,
        (x % y) as u32,
        ux / uy,
        ux % uy,
        x.min(y) as u32,
        x.max(y) as u32,
        ux.min(uy),
        x.unsigned_abs(),
        x.leading_zeros(),
        x.count_ones(),
        ux.reverse_bits(),
        if x == 0 { 0 } else { x.trailing_zeros() + 1 },
        ux << sh,
        (x >> sh) as u32,
        ux >> sh,
        w as u32,
        (w >> 32) as u32,
        (w >> 32) as u32,
        ((ux as u64 * uy as u64) >> 32) as u32,
        perm(ux, uy, 0x5140),
        x as i16 as i32 as u32,
        x as u8 as u32,
        canon32(fmin(f, g)),
        canon32(fmax(f, g)),
        canon32(f.abs()),
        canon32(f.copysign(g)),
        canon32(f.mul_add(g, f)),
        canon32(f.sqrt()),
        canon32(f / g),
        canon32(1.0 / g),
        f.round_ties_even() as i32 as u32,
        f.trunc() as i32 as u32,
        f.floor() as i32 as u32,
        f.ceil() as u32,
        canon32(f.round_ties_even()) ^ canon32(g.floor()) ^ canon32(f.ceil()) ^ canon32(g.trunc()),
        canon32(sat(f)),
        canon32((d * d + d) as f32) ^ (d as i64 as u32),
        canon32(x as f32) ^ canon32(ux as f32) ^ canon32(w as f32),
        (f < g) as u32
            | ((f != g) as u32) << 1
            | ((f >= g) as u32) << 2
            | (!f.is_nan() as u32) << 3
            | ((d > 1.5) as u32) << 4,
        f as i64 as u32,
    ]
}

#[test]
fn integer_and_float_intrinsics_match_rust() {
    let seed = fresh_seed("integer_and_float_intrinsics_match_rust");
    let Some(m) = custom("integer_and_float_intrinsics_match_rust", ALU_SRC) else {
        return;
    };
    let k = kernel(&m, "alu");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = 2000usize;
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    let mut fs = Vec::new();
    let mut gs = Vec::new();
    let mut ds = Vec::new();
    let pick_f = |rng: &mut ChaCha8Rng| -> f32 {
        match rng.gen_range(0..40) {
            0 => f32::NAN,
            1 => f32::INFINITY,
            2 => -f32::INFINITY,
            3 => 1e-40,
            4 => -3e9,
            5 => 2.5,
            6 => -2.5,
            _ => rng.gen_range(-100.0f32..100.0),
        }
    };
    for _ in 0..n {
        let x: i32 = if rng.gen_bool(0.1) {
            i32::MIN
        } else {
            rng.gen()
        };
        let mut y: i32 = if rng.gen_bool(0.5) {
            rng.gen_range(-40..40)
        } else {
            rng.gen()
        };
        if y == 0 || (y == -1 && x == i32::MIN) {
            y = 7;
        }
        let x = if x == i32::MIN && rng.gen_bool(0.5) {
            x + 1
        } else {
            x
        };
        xs.push(x);
        ys.push(y);
        fs.push(pick_f(&mut rng));
        gs.push(pick_f(&mut rng));
        ds.push(rng.gen_range(-1e6f64..1e6));
    }
    let mut mem = TestMem::new();
    let (xb, yb) = (mem.alloc_of("xs", &xs), mem.alloc_of("ys", &ys));
    let (fb, gb, db) = (
        mem.alloc_of("fs", &fs),
        mem.alloc_of("gs", &gs),
        mem.alloc_of("ds", &ds),
    );
    let out = mem.alloc_of("out", &vec![0u32; 40 * n]);
    let args = [
        Arg::U64(xb),
        Arg::U64(yb),
        Arg::U64(fb),
        Arg::U64(gb),
        Arg::U64(db),
        Arg::U64(out),
        Arg::I32(n as i32),
    ];
    run(
        k,
        n.div_ceil(THREADS as usize) as u32,
        &args,
        &mut mem,
        seed,
    );
    let got: Vec<u32> = mem.read(out);
    for i in 0..n {
        let want = alu_reference(xs[i], ys[i], fs[i], gs[i], ds[i]);
        for (j, &w) in want.iter().enumerate() {
            // abs(INT_MIN) and the float-to-int conversions of out-of-range values are
            // what the GPU gives (saturated), as Rust's `as` does.
            let g = got[40 * i + j];
            let g = if (22..30).contains(&j) || j == 35 {
                canon32(f32::from_bits(g))
            } else {
                g
            };
            assert_eq!(
                g, w,
                "element {i} output {j}: x={} y={} f={:?} g={:?} d={}",
                xs[i], ys[i], fs[i], gs[i], ds[i]
            );
        }
    }
}
