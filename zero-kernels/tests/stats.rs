mod common;

use common::*;
use half::{bf16, f16};
use rand_chacha::ChaCha8Rng;
use zero_kernels::{grad_stats, Element, GradStats};

fn check<T: Element>(rng: &mut ChaCha8Rng) {
    for n in LENGTHS {
        let mut x: Vec<T> = random_vec(rng, n, -3.0, 3.0);
        let st = grad_stats(&x);
        let want: f64 = x.iter().map(|e| (e.to_f32() as f64).powi(2)).sum();
        assert!(!st.non_finite, "{} n={n}: finite input flagged", T::DTYPE);
        assert!(
            (st.sum_sq - want).abs() <= 1e-12 * want,
            "{} n={n}: {} vs {want}",
            T::DTYPE,
            st.sum_sq
        );
        if n > 0 {
            // Each kind of non-finite value alone is found, wherever it is.
            for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
                let i = rand::Rng::gen_range(rng, 0..n);
                let keep = x[i];
                x[i] = T::from_f32(bad);
                assert!(
                    grad_stats(&x).non_finite,
                    "{} n={n}: {bad} at {i} missed",
                    T::DTYPE
                );
                x[i] = keep;
            }
        }
    }
}

#[test]
fn sum_of_squares_and_non_finite_match_the_f64_reference() {
    let mut rng = seeded("grad_stats");
    check::<f32>(&mut rng);
    check::<f16>(&mut rng);
    check::<bf16>(&mut rng);
}

#[test]
fn result_is_bitwise_the_same_on_one_thread_and_many() {
    let mut rng = seeded("grad_stats threads");
    let x: Vec<f32> = random_vec(&mut rng, (1 << 22) + 5, -1.0, 1.0);
    let one = in_pool(1, || grad_stats(&x));
    let many = in_pool(4, || grad_stats(&x));
    assert_eq!(one.sum_sq.to_bits(), many.sum_sq.to_bits());
}

#[test]
fn empty_input_gives_empty_stats_and_merge_is_ordered() {
    assert_eq!(grad_stats::<bf16>(&[]), GradStats::EMPTY);
    let a = GradStats {
        sum_sq: 1.0,
        non_finite: false,
    };
    let b = GradStats {
        sum_sq: 2.0,
        non_finite: true,
    };
    assert_eq!(
        a.merge(b),
        GradStats {
            sum_sq: 3.0,
            non_finite: true
        }
    );
}
