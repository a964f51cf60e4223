//! The training examples' data: text from a random order-2 Markov chain whose entropy
//! rate is computed exactly, so a model's loss can be read against the best possible.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The text source: an order-2 Markov chain over `vocab` letters. Each of the vocab²
/// contexts has its own next-letter distribution, drawn at random and made peaky.
pub struct Source {
    pub vocab: usize,
    /// `probs[(a·V + b)·V + c]` = P(next = c | previous two = a, b).
    probs: Vec<f64>,
}

impl Source {
    pub fn new(seed: u64, vocab: usize) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_50c3);
        let mut probs = Vec::with_capacity(vocab * vocab * vocab);
        for _ in 0..vocab * vocab {
            let w: Vec<f64> = (0..vocab).map(|_| rng.gen::<f64>().powi(6)).collect();
            let total: f64 = w.iter().sum();
            probs.extend(w.iter().map(|x| x / total));
        }
        Self { vocab, probs }
    }

    /// The entropy rate in nats per character: Σ over contexts of the stationary
    /// probability times the entropy of its next-letter distribution.
    pub fn entropy_rate(&self) -> f64 {
        let v = self.vocab;
        let n = v * v;
        let mut pi = vec![1.0 / n as f64; n];
        for _ in 0..2000 {
            let mut next = vec![0.0; n];
            for (ab, p) in pi.iter().enumerate() {
                let b = ab % v;
                for c in 0..v {
                    next[b * v + c] += p * self.probs[ab * v + c];
                }
            }
            pi = next;
        }
        (0..n)
            .map(|ab| {
                let h: f64 = self.probs[ab * v..(ab + 1) * v]
                    .iter()
                    .filter(|p| **p > 0.0)
                    .map(|p| -p * p.ln())
                    .sum();
                pi[ab] * h
            })
            .sum()
    }

    /// `n` characters of text from the chain (letter indices).
    pub fn sample(&self, seed: u64, n: usize) -> Vec<u8> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let v = self.vocab;
        let (mut a, mut b) = (0usize, 1usize);
        let mut out = Vec::with_capacity(n);
        for _ in 0..n + 100 {
            let row = &self.probs[(a * v + b) * v..(a * v + b + 1) * v];
            let mut u: f64 = rng.gen();
            let mut c = v - 1;
            for (i, p) in row.iter().enumerate() {
                if u < *p {
                    c = i;
                    break;
                }
                u -= p;
            }
            out.push(c as u8);
            (a, b) = (b, c);
        }
        out.split_off(100) // drop the burn-in
    }
}
