mod common;

use common::*;
use half::{bf16, f16};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use zero_kernels::{
    flatten, tensor_views, tensor_views_mut, unflatten, Element, FlatLayout, KernelError,
};

/// Flattens fresh tensors of every tested length from `S` into `D`, checks each element
/// and the zeroed padding, then unflattens into `B` and checks again.
fn round_trip<S: Element, D: RefRound, B: RefRound>(rng: &mut ChaCha8Rng) {
    let mut sizes = LENGTHS.to_vec();
    sizes.extend((0..20).map(|_| rng.gen_range(0..300)));
    let align = [1, 8, 64][rng.gen_range(0..3)];
    let world = rng.gen_range(1..6);
    let layout = FlatLayout::new(&sizes, D::DTYPE, align, world).unwrap();
    let mut tensors: Vec<Vec<S>> = sizes
        .iter()
        .map(|&n| random_vec(rng, n, -100.0, 100.0))
        .collect();
    plant_non_finite(rng, &mut tensors[3]);
    let srcs: Vec<&[S]> = tensors.iter().map(|t| &t[..]).collect();
    let mut flat = vec![poison::<D>(); layout.total_len()];
    flatten(&layout, &srcs, &mut flat).unwrap();
    let ctx = format!(
        "{}→{}→{} align={align} world={world}",
        S::DTYPE,
        D::DTYPE,
        B::DTYPE
    );
    let mut is_tensor = vec![false; flat.len()];
    for (i, t) in tensors.iter().enumerate() {
        let r = layout.tensor_range(i);
        for (j, e) in r.clone().enumerate() {
            is_tensor[e] = true;
            let want = D::from_f64_ref(t[j].to_f32() as f64);
            assert!(
                same(flat[e], want),
                "{ctx}: tensor {i}[{j}] = {:?}, want {want:?}",
                flat[e]
            );
        }
    }
    for (e, _) in is_tensor.iter().enumerate().filter(|(_, t)| !**t) {
        assert_eq!(
            flat[e].to_f32().to_bits(),
            0,
            "{ctx}: padding {e} not zeroed"
        );
    }
    let mut outs: Vec<Vec<B>> = sizes.iter().map(|&n| vec![poison::<B>(); n]).collect();
    let mut dsts: Vec<&mut [B]> = outs.iter_mut().map(|t| &mut t[..]).collect();
    unflatten(&layout, &flat, &mut dsts).unwrap();
    for (i, t) in outs.iter().enumerate() {
        for (j, got) in t.iter().enumerate() {
            let want = B::from_f64_ref(flat[layout.tensor_range(i).start + j].to_f32() as f64);
            assert!(
                same(*got, want),
                "{ctx}: unflattened {i}[{j}] = {got:?}, want {want:?}"
            );
        }
    }
}

#[test]
fn flatten_and_unflatten_convert_in_one_pass() {
    let mut rng = seeded("flatten");
    round_trip::<f32, bf16, f32>(&mut rng);
    round_trip::<f32, f16, bf16>(&mut rng);
    round_trip::<bf16, f32, bf16>(&mut rng);
    round_trip::<f16, f32, f16>(&mut rng);
    round_trip::<bf16, bf16, bf16>(&mut rng);
    round_trip::<f32, f32, f32>(&mut rng);
}

#[test]
fn views_alias_the_flat_buffer() {
    let mut rng = seeded("views");
    let layout = FlatLayout::new(&[5, 0, 7], f32::DTYPE, 4, 3).unwrap();
    let mut flat: Vec<f32> = random_vec(&mut rng, layout.total_len(), -1.0, 1.0);
    {
        let mut views = tensor_views_mut(&layout, &mut flat).unwrap();
        assert_eq!(
            views.iter().map(|v| v.len()).collect::<Vec<_>>(),
            vec![5, 0, 7]
        );
        views[2][6] = 42.0;
    }
    assert_eq!(flat[layout.tensor_range(2).end - 1], 42.0);
    let views = tensor_views(&layout, &flat).unwrap();
    assert_eq!(views[0], &flat[0..5]);
}

#[test]
fn result_is_the_same_on_one_thread_and_many() {
    let mut rng = seeded("flatten threads");
    let sizes: Vec<usize> = (0..2000)
        .map(|_| rng.gen_range(1..2000))
        .chain([(1 << 20) + 3])
        .collect();
    let layout = FlatLayout::with_default_alignment(&sizes, bf16::DTYPE, 4).unwrap();
    let tensors: Vec<Vec<f32>> = sizes
        .iter()
        .map(|&n| random_vec(&mut rng, n, -1.0, 1.0))
        .collect();
    let srcs: Vec<&[f32]> = tensors.iter().map(|t| &t[..]).collect();
    let run = |threads| {
        in_pool(threads, || {
            let mut flat = vec![poison::<bf16>(); layout.total_len()];
            flatten(&layout, &srcs, &mut flat).unwrap();
            bits(&flat)
        })
    };
    assert!(run(1) == run(4));
}

#[test]
fn wrong_shapes_are_errors_that_name_the_tensor() {
    let layout = FlatLayout::new(&[3, 4], f32::DTYPE, 1, 1).unwrap();
    let (a, b) = ([1.0f32; 3], [1.0f32; 5]);
    let mut flat = vec![0f32; layout.total_len()];
    let err = flatten(&layout, &[&a[..], &b[..]], &mut flat).unwrap_err();
    assert!(err.to_string().contains("tensor 1"), "{err}");
    let err = flatten(&layout, &[&a[..]], &mut flat).unwrap_err();
    assert!(matches!(
        err,
        KernelError::TensorCountMismatch {
            expected: 2,
            actual: 1,
            ..
        }
    ));
    let mut short = vec![0f32; 2];
    let err = flatten(&layout, &[&a[..], &b[..4]], &mut short).unwrap_err();
    assert!(err.to_string().contains("flat buffer"), "{err}");
}
