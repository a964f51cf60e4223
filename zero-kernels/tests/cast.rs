mod common;

use common::*;
use half::{bf16, f16};
use zero_kernels::{cast, copy, Element, KernelError};

fn check<S: Element, D: RefRound>(rng: &mut rand_chacha::ChaCha8Rng) {
    for n in LENGTHS {
        let mut src: Vec<S> = wide_vec(rng, n).into_iter().map(S::from_f32).collect();
        plant_non_finite(rng, &mut src);
        let mut dst = vec![poison::<D>(); n];
        cast(&src, &mut dst).expect("equal lengths");
        for (i, (s, d)) in src.iter().zip(&dst).enumerate() {
            let want = D::from_f64_ref(s.to_f32() as f64);
            assert!(
                same(*d, want),
                "{}→{} n={n} i={i}: {s:?} gave {d:?}, want {want:?}",
                S::DTYPE,
                D::DTYPE
            );
        }
    }
}

#[test]
fn every_cast_rounds_to_nearest_even_like_the_f64_reference() {
    let mut rng = seeded("cast");
    check::<f32, f32>(&mut rng);
    check::<f32, f16>(&mut rng);
    check::<f32, bf16>(&mut rng);
    check::<f16, f32>(&mut rng);
    check::<f16, bf16>(&mut rng);
    check::<bf16, f32>(&mut rng);
    check::<bf16, f16>(&mut rng);
    check::<f16, f16>(&mut rng);
    check::<bf16, bf16>(&mut rng);
}

#[test]
fn ties_round_to_even() {
    // 1 + 2^-8 lies halfway between two bf16 values: it rounds down to the even 1.0;
    // 1 + 3·2^-8 rounds up to the even 1 + 2^-6.
    let src = [1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8)];
    let mut dst = [bf16::ZERO; 2];
    cast(&src, &mut dst).unwrap();
    assert_eq!(dst[0].to_f32(), 1.0);
    assert_eq!(dst[1].to_f32(), 1.0 + 2f32.powi(-6));
}

#[test]
fn length_mismatch_is_an_error() {
    let mut dst = [bf16::ZERO; 2];
    let err = cast(&[1.0f32; 3], &mut dst).unwrap_err();
    assert!(matches!(
        err,
        KernelError::LengthMismatch {
            expected: 3,
            actual: 2,
            ..
        }
    ));
    assert!(err.to_string().contains("cast: dst"), "{err}");
}

#[test]
fn result_is_the_same_on_one_thread_and_many() {
    let mut rng = seeded("cast threads");
    let src = wide_vec(&mut rng, (1 << 20) + 3);
    let run = |t| {
        in_pool(t, || {
            let mut d = vec![poison::<bf16>(); src.len()];
            cast(&src, &mut d).unwrap();
            bits(&d)
        })
    };
    assert_eq!(run(1), run(4));
}

fn check_copy<T: Element>(rng: &mut rand_chacha::ChaCha8Rng) {
    for n in LENGTHS {
        let mut src: Vec<T> = wide_vec(rng, n).into_iter().map(T::from_f32).collect();
        plant_non_finite(rng, &mut src);
        let mut dst = vec![poison::<T>(); n];
        copy(&src, &mut dst).expect("equal lengths");
        assert_eq!(bits(&dst), bits(&src), "{} n={n}", T::DTYPE);
    }
}

#[test]
fn copy_is_bit_for_bit_on_any_thread_count() {
    let mut rng = seeded("copy");
    check_copy::<f32>(&mut rng);
    check_copy::<f16>(&mut rng);
    check_copy::<bf16>(&mut rng);
    // NaN payloads survive (a trip through f32 may not keep them).
    let src = [
        bf16::from_bits(0x7fc1),
        bf16::from_bits(0xffa3),
        bf16::from_f32(1.5),
    ];
    let mut dst = [bf16::ZERO; 3];
    copy(&src, &mut dst).unwrap();
    assert_eq!(bits(&dst), bits(&src));
    let big: Vec<f32> = wide_vec(&mut rng, (1 << 20) + 5);
    let run = |t| {
        in_pool(t, || {
            let mut d = vec![poison::<f32>(); big.len()];
            copy(&big, &mut d).unwrap();
            bits(&d)
        })
    };
    assert_eq!(run(1), bits(&big));
    assert_eq!(run(4), bits(&big));
    assert!(copy(&[1.0f32; 3], &mut [0.0f32; 2])
        .unwrap_err()
        .to_string()
        .contains("copy: dst"));
}
