//! Initial values that are the same on every rank: each parameter follows the model's
//! `Init` hint (constant, uniform, normal, Kaiming as candle computes it) with a random
//! stream seeded from the run's seed and the parameter's name. (candle's own CPU RNG
//! cannot be seeded, so `Init::var` would give every rank different weights.)

use candle_nn::init::{FanInOut, NormalOrUniform};
use candle_nn::Init;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A stable 64-bit hash of `name` (FNV-1a): the same on every rank, build and platform.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The stream parameter `name` draws from.
fn stream(seed: u64, name: &str) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed ^ name_hash(name).rotate_left(17))
}

/// Fills `out` (a parameter of `shape`) as `hint` says, from `seed` and `name`.
pub(crate) fn fill(seed: u64, name: &str, shape: &[usize], hint: &Init, out: &mut [f32]) {
    let mut rng = stream(seed, name);
    let mut uniform = |out: &mut [f32], lo: f64, up: f64| {
        for x in out.iter_mut() {
            *x = rng.gen_range(lo..up.max(lo + f64::MIN_POSITIVE)) as f32;
        }
    };
    match *hint {
        Init::Const(c) => out.iter_mut().for_each(|x| *x = c as f32),
        Init::Uniform { lo, up } => uniform(out, lo, up),
        Init::Randn { mean, stdev } => normal(&mut stream(seed, name), out, mean, stdev),
        Init::Kaiming {
            dist,
            fan,
            non_linearity,
        } => {
            let fan = fan_of(&fan, shape);
            let std = non_linearity.gain() / (fan as f64).sqrt();
            match dist {
                NormalOrUniform::Uniform => {
                    let bound = 3f64.sqrt() * std;
                    uniform(out, -bound, bound)
                }
                NormalOrUniform::Normal => normal(&mut stream(seed, name), out, 0.0, std),
            }
        }
    }
}

/// candle's fan for `shape`.
fn fan_of(fan: &FanInOut, shape: &[usize]) -> usize {
    fan.for_shape(&candle_core::Shape::from_dims(shape)).max(1)
}

/// Normal values by Box–Muller.
fn normal(rng: &mut ChaCha8Rng, out: &mut [f32], mean: f64, std: f64) {
    for pair in out.chunks_mut(2) {
        let u1: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
        let u2: f64 = rng.gen::<f64>();
        let r = (-2.0 * u1.ln()).sqrt();
        let t = std::f64::consts::TAU * u2;
        pair[0] = (mean + std * r * t.cos()) as f32;
        if let Some(x) = pair.get_mut(1) {
            *x = (mean + std * r * t.sin()) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_follow_the_hint_and_depend_only_on_seed_and_name() {
        let seed = 7;
        let mut a = vec![0f32; 4096];
        let mut b = vec![0f32; 4096];
        let hint = candle_nn::init::DEFAULT_KAIMING_NORMAL;
        fill(seed, "w", &[64, 64], &hint, &mut a);
        fill(seed, "w", &[64, 64], &hint, &mut b);
        assert_eq!(a, b);
        fill(seed, "v", &[64, 64], &hint, &mut b);
        assert_ne!(a, b);
        // Kaiming normal, fan-in 64, ReLU gain: std sqrt(2/64).
        let n = a.len() as f64;
        let mean = a.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = a.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        assert!(mean.abs() < 0.01, "{mean}");
        assert!(
            (var.sqrt() / (2.0f64 / 64.0).sqrt() - 1.0).abs() < 0.05,
            "{var}"
        );
        let mut u = vec![0f32; 1001];
        fill(
            seed,
            "u",
            &[1001],
            &Init::Uniform { lo: -0.5, up: 0.25 },
            &mut u,
        );
        assert!(u.iter().all(|&x| (-0.5..0.25).contains(&x)));
        fill(seed, "c", &[1001], &Init::Const(0.75), &mut u);
        assert!(u.iter().all(|&x| x == 0.75));
    }
}
