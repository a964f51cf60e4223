//! The CPU kernels' test vectors on the GPU: cast, Adam and flatten must give the CPU's
//! bits (no FMA, IEEE division and square root on both sides), stats the same flag and the
//! same sum to 1e-12. Without a GPU each test prints a visible skip.

mod common;

use common::*;
use half::{bf16, f16};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use zero_kernels::cuda::{AdamViews, Combine, Gpu, GpuElement, GradScale};
use zero_kernels::testing::gpu_or_skip;
use zero_kernels::{
    adam_step, cast, flatten, grad_stats, unflatten, AdamConfig, Element, FlatLayout,
};

fn cast_case<S: GpuElement, D: GpuElement>(g: &'static Gpu, rng: &mut ChaCha8Rng) {
    for n in LENGTHS {
        let mut src: Vec<S> = wide_vec(rng, n).into_iter().map(S::from_f32).collect();
        plant_non_finite(rng, &mut src);
        let (mut cpu, mut dev) = (vec![poison::<D>(); n], vec![poison::<D>(); n]);
        cast(&src, &mut cpu).unwrap();
        g.cast(&src, &mut dev).unwrap();
        assert!(
            bits(&cpu) == bits(&dev) || cpu.iter().zip(&dev).all(|(a, b)| same(*a, *b)),
            "{}→{} n={n}",
            S::SUFFIX,
            D::SUFFIX
        );
    }
}

#[test]
fn casts_match_the_cpu() {
    let Some(g) = gpu_or_skip("casts") else {
        return;
    };
    let mut rng = seeded("gpu casts");
    cast_case::<f32, bf16>(g, &mut rng);
    cast_case::<f32, f16>(g, &mut rng);
    cast_case::<bf16, f32>(g, &mut rng);
    cast_case::<f16, f32>(g, &mut rng);
    cast_case::<f16, bf16>(g, &mut rng);
    cast_case::<bf16, f16>(g, &mut rng);
}

fn adam_case<G: GpuElement, P: GpuElement>(g: &'static Gpu, rng: &mut ChaCha8Rng, copy: bool) {
    for n in LENGTHS {
        let mut cfg = if rng.gen_bool(0.5) {
            AdamConfig::adam(1e-3)
        } else {
            AdamConfig::adamw(1e-3)
        };
        cfg.weight_decay = if rng.gen_bool(0.3) { 0.0 } else { 0.05 };
        let step = rng.gen_range(1..100);
        let w: Vec<f32> = random_vec(rng, n, -1.0, 1.0);
        let m: Vec<f32> = random_vec(rng, n, -0.1, 0.1);
        let v: Vec<f32> = random_vec(rng, n, 0.0, 0.01);
        let mut grads: Vec<G> = random_vec(rng, n, -2000.0, 2000.0);
        plant_non_finite(rng, &mut grads);
        let run = |on_gpu: bool| {
            let (mut w, mut m, mut v) = (w.clone(), m.clone(), v.clone());
            let mut p = vec![poison::<P>(); n];
            let out = copy.then_some(&mut p[..]);
            if on_gpu {
                g.adam_step(
                    &cfg,
                    step,
                    1.0 / 1024.0,
                    &mut w,
                    &mut m,
                    &mut v,
                    &grads,
                    out,
                )
                .unwrap();
            } else {
                adam_step(
                    &cfg,
                    step,
                    1.0 / 1024.0,
                    &mut w,
                    &mut m,
                    &mut v,
                    &grads,
                    out,
                )
                .unwrap();
            }
            (bits(&w), bits(&m), bits(&v), bits(&p))
        };
        assert!(
            run(false) == run(true),
            "adam G={} P={} n={n} copy={copy}: GPU bits differ from the CPU's",
            G::SUFFIX,
            P::SUFFIX
        );
    }
}

#[test]
fn adam_matches_the_cpu_bit_for_bit() {
    let Some(g) = gpu_or_skip("adam") else { return };
    let mut rng = seeded("gpu adam");
    adam_case::<bf16, bf16>(g, &mut rng, true);
    adam_case::<f16, f16>(g, &mut rng, true);
    adam_case::<f32, bf16>(g, &mut rng, true);
    adam_case::<f32, f32>(g, &mut rng, false);
}

#[test]
fn stats_match_the_cpu() {
    let Some(g) = gpu_or_skip("stats") else {
        return;
    };
    let mut rng = seeded("gpu stats");
    for n in LENGTHS {
        let mut x: Vec<bf16> = random_vec(&mut rng, n, -3.0, 3.0);
        let (cpu, dev) = (grad_stats(&x), g.grad_stats(&x).unwrap());
        assert_eq!(cpu.non_finite, dev.non_finite, "n={n}");
        assert!(
            (cpu.sum_sq - dev.sum_sq).abs() <= 1e-12 * cpu.sum_sq.max(1e-300),
            "n={n}: {} vs {}",
            cpu.sum_sq,
            dev.sum_sq
        );
        if n > 0 {
            plant_non_finite(&mut rng, &mut x);
            assert!(
                g.grad_stats(&x).unwrap().non_finite,
                "n={n}: planted inf/NaN missed"
            );
        }
    }
}

#[test]
fn flatten_matches_the_cpu() {
    let Some(g) = gpu_or_skip("flatten") else {
        return;
    };
    let mut rng = seeded("gpu flatten");
    let mut sizes = LENGTHS.to_vec();
    sizes.extend((0..2000).map(|_| rng.gen_range(0..300)));
    let layout = FlatLayout::with_default_alignment(&sizes, bf16::DTYPE, 4).unwrap();
    let tensors: Vec<Vec<f32>> = sizes
        .iter()
        .map(|&n| random_vec(&mut rng, n, -100.0, 100.0))
        .collect();
    let srcs: Vec<&[f32]> = tensors.iter().map(|t| &t[..]).collect();
    let (mut cpu, mut dev) = (
        vec![poison::<bf16>(); layout.total_len()],
        vec![poison::<bf16>(); layout.total_len()],
    );
    flatten(&layout, &srcs, &mut cpu).unwrap();
    g.flatten(&layout, &srcs, &mut dev).unwrap();
    assert!(
        bits(&cpu) == bits(&dev),
        "flatten f32→bf16 of {} tensors differs from the CPU",
        sizes.len()
    );
}

/// Flattens queued back to back on one stream, never synchronized between them: more
/// calls than the stream's table slots, tables and padding gaps growing and shrinking, so
/// the device tables and the padding zeros kept from call to call are reused, grown and
/// replaced while earlier launches may still read them. Each result is the CPU's.
#[test]
fn back_to_back_flattens_reuse_their_tables_safely() {
    let Some(g) = gpu_or_skip("back-to-back flattens") else {
        return;
    };
    let mut rng = seeded("gpu back-to-back flattens");
    let st = g.new_stream().unwrap();
    let mut runs = Vec::new();
    // (tensors, world): the world size sets the tail's padding, the longest gap.
    for (count, world) in [
        (3, 1),
        (2500, 2),
        (5, 64),
        (1, 1),
        (700, 512),
        (40, 3),
        (2, 1),
        (1200, 8),
    ] {
        let sizes: Vec<usize> = (0..count).map(|_| rng.gen_range(0..400)).collect();
        let layout = FlatLayout::with_default_alignment(&sizes, bf16::DTYPE, world).unwrap();
        let tensors: Vec<Vec<f32>> = sizes
            .iter()
            .map(|&n| random_vec(&mut rng, n, -100.0, 100.0))
            .collect();
        let dev: Vec<_> = tensors
            .iter()
            .map(|t| st.upload::<f32>(t).unwrap())
            .collect();
        let mut flat = st
            .upload::<bf16>(&vec![poison::<bf16>(); layout.total_len()])
            .unwrap();
        let views: Vec<_> = dev
            .iter()
            .zip(&sizes)
            .map(|(t, &n)| t.view::<f32>(0..n).unwrap())
            .collect();
        let total = layout.total_len();
        st.flatten_views(
            &layout,
            &views,
            &mut flat.view_mut::<bf16>(0..total).unwrap(),
        )
        .unwrap();
        drop(views);
        runs.push((layout, tensors, dev, flat));
    }
    for (i, (layout, tensors, _, flat)) in runs.iter().enumerate() {
        let srcs: Vec<&[f32]> = tensors.iter().map(|t| &t[..]).collect();
        let mut cpu = vec![poison::<bf16>(); layout.total_len()];
        flatten(layout, &srcs, &mut cpu).unwrap();
        let got = st.download::<bf16>(flat, 0..layout.total_len()).unwrap();
        assert!(
            bits(&cpu) == bits(&got),
            "flatten {i} of {} tensors, queued after {i} others, differs from the CPU",
            tensors.len()
        );
    }
}

#[test]
fn unflatten_matches_the_cpu() {
    let Some(g) = gpu_or_skip("unflatten") else {
        return;
    };
    let mut rng = seeded("gpu unflatten");
    let mut sizes = LENGTHS.to_vec();
    sizes.extend((0..2000).map(|_| rng.gen_range(0..300)));
    let layout = FlatLayout::with_default_alignment(&sizes, bf16::DTYPE, 3).unwrap();
    let flat: Vec<bf16> = random_vec(&mut rng, layout.total_len(), -100.0, 100.0);
    let mut cpu: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![poison::<f32>(); n]).collect();
    let mut dev = cpu.clone();
    let mut cpu_refs: Vec<&mut [f32]> = cpu.iter_mut().map(|t| &mut t[..]).collect();
    unflatten(&layout, &flat, &mut cpu_refs).unwrap();
    let mut dev_refs: Vec<&mut [f32]> = dev.iter_mut().map(|t| &mut t[..]).collect();
    g.unflatten(&layout, &flat, &mut dev_refs).unwrap();
    assert!(
        cpu == dev,
        "unflatten bf16→f32 of {} tensors differs",
        sizes.len()
    );
}

/// The host collectives' reduction: ranks in order, in f32, rounded once.
fn reduce_reference<T: Element>(srcs: &[Vec<T>], op: Combine) -> Vec<T> {
    (0..srcs[0].len())
        .map(|i| {
            let mut acc = srcs[0][i].to_f32();
            for s in &srcs[1..] {
                let x = s[i].to_f32();
                acc = match op {
                    Combine::Max if acc.is_nan() || x.is_nan() => f32::NAN,
                    Combine::Max => acc.max(x),
                    _ => acc + x,
                };
            }
            if op == Combine::Avg {
                acc /= srcs.len() as f32;
            }
            T::from_f32(acc)
        })
        .collect()
}

fn reduce_case<T: GpuElement>(g: &'static Gpu, rng: &mut ChaCha8Rng) {
    let st = g.default_stream();
    for ranks in [1, 2, 3, 4] {
        for n in LENGTHS {
            for op in [Combine::Sum, Combine::Avg, Combine::Max] {
                let mut srcs: Vec<Vec<T>> = (0..ranks)
                    .map(|_| random_vec(rng, n, -50.0, 50.0))
                    .collect();
                plant_non_finite(rng, &mut srcs[ranks - 1]);
                let want = reduce_reference(&srcs, op);
                // Out of place into an offset of a poisoned buffer (reduce-scatter's shape).
                let bufs: Vec<_> = srcs.iter().map(|s| st.upload(s).unwrap()).collect();
                let mut out = st.upload(&vec![poison::<T>(); n + 5]).unwrap();
                let refs: Vec<_> = bufs.iter().map(|b| (b, 0)).collect();
                st.reduce(&refs, &mut [(&mut out, 5)], n, op).unwrap();
                let got: Vec<T> = st.download(&out, 5..n + 5).unwrap();
                assert!(
                    bits(&got) == bits(&want),
                    "reduce {op:?} {} ranks={ranks} n={n}",
                    T::SUFFIX
                );
                // In place on every rank (all-reduce's shape).
                let mut bufs: Vec<_> = srcs.iter().map(|s| st.upload(s).unwrap()).collect();
                let mut refs: Vec<_> = bufs.iter_mut().collect();
                st.reduce_in_place(&mut refs, n, op).unwrap();
                for b in &bufs {
                    let got: Vec<T> = st.download(b, 0..n).unwrap();
                    assert!(
                        bits(&got) == bits(&want),
                        "all-reduce {op:?} ranks={ranks} n={n}"
                    );
                }
            }
        }
    }
}

#[test]
fn reductions_match_the_host_collectives_bit_for_bit() {
    let Some(g) = gpu_or_skip("reduce") else {
        return;
    };
    let mut rng = seeded("gpu reduce");
    reduce_case::<f32>(g, &mut rng);
    reduce_case::<f16>(g, &mut rng);
    reduce_case::<bf16>(g, &mut rng);
}

#[test]
fn accumulate_matches_the_cpu() {
    let Some(g) = gpu_or_skip("accumulate") else {
        return;
    };
    let mut rng = seeded("gpu accumulate");
    let st = g.default_stream();
    for n in LENGTHS {
        let acc: Vec<f32> = random_vec(&mut rng, n, -10.0, 10.0);
        let x: Vec<bf16> = random_vec(&mut rng, n, -10.0, 10.0);
        let want: Vec<f32> = acc.iter().zip(&x).map(|(a, x)| a + x.to_f32()).collect();
        let mut dacc = st.upload(&acc).unwrap();
        let dx = st.upload(&x).unwrap();
        st.accumulate(&mut dacc, 0, &dx, 0..n).unwrap();
        let got: Vec<f32> = st.download(&dacc, 0..n).unwrap();
        assert!(bits(&got) == bits(&want), "accumulate n={n}");
    }
    accumulate_16_case::<bf16>(g, &mut rng);
    accumulate_16_case::<f16>(g, &mut rng);
}

/// A 16-bit accumulator (`data_types.grad_accum_dtype` the training dtype) takes its own
/// dtype: each element is the f64 sum rounded to `T` (the f32 sum of two 16-bit values,
/// rounded once more, lands there), at an offset, non-finite values carried; another
/// dtype is refused.
fn accumulate_16_case<T: GpuElement>(g: &'static Gpu, rng: &mut ChaCha8Rng) {
    let st = g.default_stream();
    for n in LENGTHS {
        let acc: Vec<T> = random_vec(rng, n + 3, -10.0, 10.0);
        let mut x: Vec<T> = random_vec(rng, n, -10.0, 10.0);
        plant_non_finite(rng, &mut x);
        let mut want = acc.clone();
        for (a, v) in want[3..].iter_mut().zip(&x) {
            *a = T::from_f32((f64::from(a.to_f32()) + f64::from(v.to_f32())) as f32);
        }
        let mut dacc = st.upload(&acc).unwrap();
        let dx = st.upload(&x).unwrap();
        st.accumulate(&mut dacc, 3, &dx, 0..n).unwrap();
        let got: Vec<T> = st.download(&dacc, 0..n + 3).unwrap();
        assert!(
            bits(&got) == bits(&want) || got.iter().zip(&want).all(|(a, b)| same(*a, *b)),
            "accumulate into {} n={n}",
            T::SUFFIX
        );
        let wrong = st.upload(&vec![1.0f32; n.max(1)]).unwrap();
        let e = st.accumulate(&mut dacc, 0, &wrong, 0..n.max(1));
        assert!(e.is_err(), "{} accumulator took f32", T::SUFFIX);
    }
}

#[test]
fn adam_skips_on_the_device_when_the_found_inf_flag_is_set() {
    let Some(g) = gpu_or_skip("adam found_inf") else {
        return;
    };
    let mut rng = seeded("gpu adam found_inf");
    let st = g.default_stream();
    let n = 1023;
    let w: Vec<f32> = random_vec(&mut rng, n, -1.0, 1.0);
    let grads: Vec<bf16> = random_vec(&mut rng, n, -1.0, 1.0);
    let (mut dw, mut dm, mut dv) = (
        st.upload(&w).unwrap(),
        st.upload(&vec![0.5f32; n]).unwrap(),
        st.upload(&vec![0.25f32; n]).unwrap(),
    );
    let mut dp = st.upload(&vec![poison::<bf16>(); n]).unwrap();
    let dg = st.upload(&grads).unwrap();
    let scale = st.upload(&[1.0f32]).unwrap();
    let one = [1i32];
    // A pageable upload through the one copy helper, synchronized before `one` goes.
    let mut flag = st.cuda().alloc_zeros::<i32>(1).unwrap();
    zero_kernels::cuda::copy_htod(st.cuda(), &one, &mut flag).unwrap();
    st.synchronize().unwrap();
    st.adam(
        &AdamConfig::adamw(1e-2),
        1,
        GradScale::Device(&scale.view::<f32>(0..1).unwrap()),
        Some(&flag.slice(0..1)),
        AdamViews {
            master: &mut dw.view_mut::<f32>(0..n).unwrap(),
            exp_avg: &mut dm.view_mut::<f32>(0..n).unwrap(),
            exp_avg_sq: &mut dv.view_mut::<f32>(0..n).unwrap(),
        },
        &dg.view::<bf16>(0..n).unwrap(),
        Some(&mut dp.view_mut::<bf16>(0..n).unwrap()),
    )
    .unwrap();
    assert!(
        bits(&st.download::<f32>(&dw, 0..n).unwrap()) == bits(&w),
        "weights moved"
    );
    assert!(st
        .download::<f32>(&dm, 0..n)
        .unwrap()
        .iter()
        .all(|&x| x == 0.5));
    assert!(st
        .download::<f32>(&dv, 0..n)
        .unwrap()
        .iter()
        .all(|&x| x == 0.25));
    let p: Vec<bf16> = st.download(&dp, 0..n).unwrap();
    assert!(
        bits(&p) == bits(&vec![poison::<bf16>(); n]),
        "params written"
    );
}

fn pinned_case<T: GpuElement>(g: &'static Gpu, rng: &mut ChaCha8Rng) {
    // A new stream, and the default stream, where cudarc records no event of its own on
    // pinned memory unless it manages several streams: the staging's own events must
    // order the copies either way.
    for st in [g.new_stream().unwrap(), g.default_stream()] {
        pinned_on_stream::<T>(&st, rng);
    }
}

fn pinned_on_stream<T: GpuElement>(st: &zero_kernels::cuda::GpuStream, rng: &mut ChaCha8Rng) {
    // Unequal lengths are an error naming both, never a copy past either end.
    let dev = st.zeros(T::DTYPE, 4).unwrap();
    let four = dev.view::<T>(0..4).unwrap();
    let mut nine = vec![poison::<T>(); 9];
    let e = zero_kernels::cuda::copy_dtoh(st.cuda(), &four, &mut nine).unwrap_err();
    assert!(
        e.to_string().contains('9') && e.to_string().contains('4'),
        "{e}"
    );
    assert!(st.download_pinned(&four, &mut nine).is_err());
    assert_eq!(
        bits(&nine),
        bits(&[poison::<T>(); 9]),
        "a refused copy wrote"
    );
    // Odd lengths, empty, more than one 16 MiB pinned chunk, and more than two (the
    // download's two buffers alternate).
    let big = (16 << 20) / std::mem::size_of::<T>() + 3;
    for n in LENGTHS.into_iter().chain([big, 2 * big + 5]) {
        let mut src: Vec<T> = wide_vec(rng, n).into_iter().map(T::from_f32).collect();
        plant_non_finite(rng, &mut src);
        let want = bits(&src);
        let offset = 5;
        let mut dev = st.zeros(T::DTYPE, n + offset + 2).unwrap();
        st.upload_pinned(&src, &mut dev, offset).unwrap();
        // The call returned before the DMA ran: the host slice is free at once.
        src.iter_mut().for_each(|x| *x = poison::<T>());
        let mut back = vec![poison::<T>(); n];
        let view = dev.view::<T>(offset..offset + n).unwrap();
        st.download_pinned(&view, &mut back).unwrap();
        assert_eq!(bits(&back), want, "{} n={n}", T::SUFFIX);
    }
}

#[test]
fn pinned_uploads_and_downloads_move_bits() {
    let Some(g) = gpu_or_skip("pinned transfers") else {
        return;
    };
    let mut rng = seeded("gpu pinned transfers");
    pinned_case::<f32>(g, &mut rng);
    pinned_case::<f16>(g, &mut rng);
    pinned_case::<bf16>(g, &mut rng);
}

/// Copies between our buffers and memory another library owns (a PyTorch tensor), with
/// that library's stream: the "tensor" here is a buffer written asynchronously on a
/// second stream, so a missing event in either direction reads or returns stale values.
fn foreign_case<T: GpuElement>(g: &'static Gpu, rng: &mut ChaCha8Rng) {
    use zero_kernels::cuda::ForeignSlice;
    let ours = g.new_stream().unwrap();
    let theirs = g.new_stream().unwrap();
    let owner = ours
        .borrow_foreign(theirs.cuda().cu_stream() as usize as u64)
        .unwrap();
    for n in LENGTHS {
        let mut x: Vec<T> = wide_vec(rng, n).into_iter().map(T::from_f32).collect();
        plant_non_finite(rng, &mut x);
        let base: Vec<T> = random_vec(rng, n, -50.0, 50.0);
        // Their tensor: poisoned, then overwritten by a copy queued on their stream only.
        let staged = theirs.upload(&x).unwrap();
        let mut tensor = theirs.upload(&vec![poison::<T>(); n.max(1)]).unwrap();
        theirs.copy(&staged, 0..n, &mut tensor, 0).unwrap();
        let (addr, guard) = tensor.read_addr(theirs.cuda());
        drop(guard);
        let slice = ForeignSlice {
            addr,
            len: n,
            dtype: T::DTYPE,
        };
        // In: a plain copy into an offset of a poisoned buffer.
        let mut buf = ours.upload(&vec![poison::<T>(); n + 3]).unwrap();
        ours.crossing(&owner, |s| s.copy_from_foreign(&slice, &mut buf, 3))
            .unwrap();
        let got: Vec<T> = ours.download(&buf, 3..n + 3).unwrap();
        assert!(
            got.iter().zip(&x).all(|(a, b)| same(*a, *b)),
            "copy from a tensor {} n={n}",
            T::SUFFIX
        );
        // In: added into a gradient (the host collectives' sum and rounding).
        let mut acc = ours.upload(&base).unwrap();
        ours.crossing(&owner, |s| s.add_from_foreign(&slice, &mut acc, 0))
            .unwrap();
        let want = reduce_reference(&[base.clone(), x.clone()], Combine::Sum);
        let got: Vec<T> = ours.download(&acc, 0..n).unwrap();
        assert!(
            got.iter().zip(&want).all(|(a, b)| same(*a, *b)),
            "add from a tensor {} n={n}",
            T::SUFFIX
        );
        // Out: into a second tensor of theirs, read back on their stream.
        let out = theirs.upload(&vec![poison::<T>(); n.max(1)]).unwrap();
        let (out_addr, guard) = out.read_addr(theirs.cuda());
        drop(guard);
        let out_slice = ForeignSlice {
            addr: out_addr,
            len: n,
            dtype: T::DTYPE,
        };
        ours.crossing(&owner, |s| s.copy_to_foreign(&acc, 0..n, &out_slice))
            .unwrap();
        let back: Vec<T> = theirs.download(&out, 0..n).unwrap();
        assert!(
            back.iter().zip(&want).all(|(a, b)| same(*a, *b)),
            "copy into a tensor {} n={n}",
            T::SUFFIX
        );
        // A wrong length or dtype is an error naming it, and writes nothing.
        let short = ForeignSlice {
            len: n + 1,
            ..slice
        };
        assert!(
            ours.crossing(&owner, |s| s.copy_from_foreign(&short, &mut acc, 0))
                .is_err(),
            "a tensor of {} elements was taken for {n}",
            n + 1
        );
        assert!(
            ours.crossing(&owner, |s| s.copy_to_foreign(&acc, 0..n, &short))
                .is_err(),
            "{n} elements were written into a tensor of {}",
            n + 1
        );
        let other = if T::DTYPE == zero_kernels::DType::F32 {
            zero_kernels::DType::BF16
        } else {
            zero_kernels::DType::F32
        };
        let wrong = ForeignSlice {
            dtype: other,
            ..slice
        };
        let e = ours
            .crossing(&owner, |s| s.add_from_foreign(&wrong, &mut acc, 0))
            .unwrap_err();
        assert!(e.to_string().contains(&other.to_string()), "{e}");
        let got: Vec<T> = ours.download(&acc, 0..n).unwrap();
        assert!(
            got.iter().zip(&want).all(|(a, b)| same(*a, *b)),
            "a refused copy wrote"
        );
    }
    // The legacy default stream (PyTorch's default current stream) borrows too.
    ours.borrow_foreign(0).unwrap();
}

#[test]
fn foreign_tensors_cross_in_both_directions_with_events() {
    let Some(g) = gpu_or_skip("foreign tensors") else {
        return;
    };
    let mut rng = seeded("gpu foreign tensors");
    foreign_case::<f32>(g, &mut rng);
    foreign_case::<f16>(g, &mut rng);
    foreign_case::<bf16>(g, &mut rng);
}

/// Memory a framework's tensors view (zero-torch's parameters on a GPU): a leased buffer
/// written in place by the engine's stream is read through the lease's address on the
/// framework's stream (ordered by a crossing), still after the engine dropped its buffer,
/// and freed with the last lease; a leased buffer refuses to grow (its memory would move
/// from under the views), and shrinks in place.
fn lease_case<T: GpuElement>(g: &'static Gpu, rng: &mut ChaCha8Rng) {
    use zero_kernels::cuda::ForeignSlice;
    let ours = g.new_stream().unwrap();
    let theirs = g.new_stream().unwrap();
    let engine = theirs
        .borrow_foreign(ours.cuda().cu_stream() as usize as u64)
        .unwrap();
    for n in LENGTHS {
        let first: Vec<T> = random_vec(rng, n, -50.0, 50.0);
        let mut x: Vec<T> = wide_vec(rng, n).into_iter().map(T::from_f32).collect();
        plant_non_finite(rng, &mut x);
        let mut buf = ours.upload(&first).unwrap();
        let lease = buf.lease();
        assert!(buf.is_leased());
        assert!(
            lease.bytes() >= n * T::DTYPE.size_of(),
            "{} bytes",
            lease.bytes()
        );
        assert_eq!(lease.ordinal(), g.ordinal);
        // The engine's step writes in place, on its stream, after the lease was taken.
        let staged = ours.upload(&x).unwrap();
        ours.copy(&staged, 0..n, &mut buf, 0).unwrap();
        let view = ForeignSlice {
            addr: lease.addr(),
            len: n,
            dtype: T::DTYPE,
        };
        let read = |what: &str| {
            let mut out = theirs.upload(&vec![poison::<T>(); n.max(1)]).unwrap();
            theirs
                .crossing(&engine, |s| s.copy_from_foreign(&view, &mut out, 0))
                .unwrap();
            let got: Vec<T> = theirs.download(&out, 0..n).unwrap();
            assert!(
                got.iter().zip(&x).all(|(a, b)| same(*a, *b)),
                "{what}: a view of a leased {} buffer, n={n}",
                T::SUFFIX
            );
        };
        read("the engine alive");
        // Growing would move the memory: refused. Shrinking keeps it.
        let cap = buf.capacity();
        let e = ours.resize(&mut buf, cap + 1).unwrap_err();
        assert!(e.to_string().contains("leased"), "{e}");
        ours.resize(&mut buf, n / 2).unwrap();
        assert_eq!(buf.len(), n / 2);
        // The engine goes first: the view keeps the memory and its values.
        drop(buf);
        read("the engine dropped");
        let second = lease.clone();
        drop(lease);
        read("one of two leases dropped");
        drop(second);
        // The leases go first: the buffer frees its allocation itself when dropped.
        let mut kept = ours.upload(&x).unwrap();
        drop(kept.lease());
        ours.copy(&staged, 0..n, &mut kept, 0).unwrap();
        let back: Vec<T> = ours.download(&kept, 0..n).unwrap();
        assert!(back.iter().zip(&x).all(|(a, b)| same(*a, *b)));
        drop(kept);
    }
    // Every free queued by the last leases ran cleanly.
    ours.synchronize().unwrap();
    theirs.synchronize().unwrap();
}

#[test]
fn leased_memory_outlives_its_buffer_until_the_last_lease() {
    let Some(g) = gpu_or_skip("leases") else {
        return;
    };
    let mut rng = seeded("gpu leases");
    lease_case::<f32>(g, &mut rng);
    lease_case::<f16>(g, &mut rng);
    lease_case::<bf16>(g, &mut rng);
}
