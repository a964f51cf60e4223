//! The training example's model and data: a character-level language model (an MLP over a
//! window of previous characters) learning text from a random order-2 Markov chain whose
//! entropy rate is computed exactly.
#![allow(dead_code)]

use ndarray::{s, Array1, Array2, ArrayView2, Axis};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use zero_comm::Communicator;
use zero_runtime::{Device, Engine, EngineError, ModuleSpec, ParamSpec, StepOutcome};

#[path = "source.rs"]
mod source;
pub use source::Source;

/// Model sizes.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub vocab: usize,
    pub context: usize,
    pub embed: usize,
    pub hidden: usize,
}

impl Shape {
    /// Parameters: embedding, two hidden layers, output layer.
    pub fn modules(&self) -> Vec<ModuleSpec> {
        let (v, k, d, h) = (self.vocab, self.context, self.embed, self.hidden);
        vec![
            ModuleSpec::new("embed", vec![ParamSpec::new("weight", &[v, d])]),
            ModuleSpec::new(
                "fc1",
                vec![
                    ParamSpec::new("weight", &[h, k * d]),
                    ParamSpec::new("bias", &[h]),
                ],
            ),
            ModuleSpec::new(
                "fc2",
                vec![
                    ParamSpec::new("weight", &[h, h]),
                    ParamSpec::new("bias", &[h]),
                ],
            ),
            ModuleSpec::new(
                "head",
                vec![
                    ParamSpec::new("weight", &[v, h]),
                    ParamSpec::new("bias", &[v]),
                ],
            ),
        ]
    }

    pub fn numel(&self) -> usize {
        self.modules()
            .iter()
            .flat_map(|m| m.params.iter().map(|p| p.numel()))
            .sum()
    }

    /// LeCun-uniform weights, zero biases, unit-scale embeddings; the same on every rank.
    pub fn init(&self, seed: u64, id: usize, spec: &ParamSpec, out: &mut [f32]) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_mul(31).wrapping_add(id as u64));
        if spec.name == "bias" {
            out.fill(0.0);
            return;
        }
        let bound = if spec.shape[0] == self.vocab && id == 0 {
            1.0
        } else {
            (3.0 / spec.shape[1] as f32).sqrt()
        };
        out.iter_mut()
            .for_each(|x| *x = rng.gen_range(-bound..bound));
    }
}

/// A batch: `contexts[i·k..(i+1)·k]` predicts `targets[i]`.
pub struct Batch<'a> {
    pub text: &'a [u8],
    pub start: usize,
    pub len: usize,
}

type Params = Vec<Vec<Vec<f32>>>;

fn view<'a>(p: &'a [f32], rows: usize, cols: usize) -> ArrayView2<'a, f32> {
    ArrayView2::from_shape((rows, cols), p).expect("parameter shape")
}

/// What the backward pass needs from the forward pass.
pub struct Cache {
    x: Array2<f32>,
    a1: Array2<f32>,
    a2: Array2<f32>,
    /// Softmax probabilities.
    probs: Array2<f32>,
}

/// Mean cross-entropy (nats) of `batch`, and the activations backward needs.
pub fn forward(sh: &Shape, p: &Params, batch: &Batch) -> (f32, Cache) {
    let (v, k, d, h, n) = (sh.vocab, sh.context, sh.embed, sh.hidden, batch.len);
    let emb = view(&p[0][0], v, d);
    let mut x = Array2::<f32>::zeros((n, k * d));
    for i in 0..n {
        for j in 0..k {
            let c = batch.text[batch.start + i + j] as usize;
            x.slice_mut(s![i, j * d..(j + 1) * d]).assign(&emb.row(c));
        }
    }
    let layer = |inp: &Array2<f32>, w: &[f32], b: &[f32], out: usize, inn: usize| {
        let mut z = inp.dot(&view(w, out, inn).t());
        z += &ArrayView2::from_shape((1, out), b).expect("bias");
        z
    };
    let a1 = layer(&x, &p[1][0], &p[1][1], h, k * d).mapv(f32::tanh);
    let a2 = layer(&a1, &p[2][0], &p[2][1], h, h).mapv(f32::tanh);
    let mut probs = layer(&a2, &p[3][0], &p[3][1], v, h);
    let mut loss = 0.0f32;
    for (i, mut row) in probs.axis_iter_mut(Axis(0)).enumerate() {
        let max = row.fold(f32::NEG_INFINITY, |m, x| m.max(*x));
        row.mapv_inplace(|x| (x - max).exp());
        let sum = row.sum();
        row /= sum;
        let t = batch.text[batch.start + i + k] as usize;
        loss -= row[t].max(1e-30).ln();
    }
    (loss / n as f32, Cache { x, a1, a2, probs })
}

/// Gradients of the mean loss times `factor`, `[module][param]` in registration order.
pub fn backward(sh: &Shape, p: &Params, batch: &Batch, cache: Cache, factor: f32) -> Params {
    let (v, k, d, h, n) = (sh.vocab, sh.context, sh.embed, sh.hidden, batch.len);
    let Cache { x, a1, a2, probs } = cache;
    let mut dz3 = probs;
    for i in 0..n {
        dz3[[i, batch.text[batch.start + i + k] as usize]] -= 1.0;
    }
    dz3 *= factor / n as f32;
    let grads_of = |dz: &Array2<f32>, inp: &Array2<f32>| -> (Vec<f32>, Vec<f32>) {
        let dw = dz.t().dot(inp);
        let db: Array1<f32> = dz.sum_axis(Axis(0));
        (
            dw.as_standard_layout().iter().copied().collect(),
            db.to_vec(),
        )
    };
    let (dw3, db3) = grads_of(&dz3, &a2);
    let mut dz2 = dz3.dot(&view(&p[3][0], v, h));
    dz2.zip_mut_with(&a2, |g, a| *g *= 1.0 - a * a);
    let (dw2, db2) = grads_of(&dz2, &a1);
    let mut dz1 = dz2.dot(&view(&p[2][0], h, h));
    dz1.zip_mut_with(&a1, |g, a| *g *= 1.0 - a * a);
    let (dw1, db1) = grads_of(&dz1, &x);
    let dx = dz1.dot(&view(&p[1][0], h, k * d));
    let mut demb = vec![0f32; v * d];
    for i in 0..n {
        for j in 0..k {
            let c = batch.text[batch.start + i + j] as usize;
            for (e, g) in demb[c * d..(c + 1) * d]
                .iter_mut()
                .zip(dx.slice(s![i, j * d..(j + 1) * d]))
            {
                *e += g;
            }
        }
    }
    vec![vec![demb], vec![dw1, db1], vec![dw2, db2], vec![dw3, db3]]
}

/// Mean cross-entropy of `batch` and, with `factor` ≠ 0, its gradients times `factor`.
pub fn forward_backward(
    sh: &Shape,
    p: &Params,
    batch: &Batch,
    factor: f32,
) -> (f32, Option<Params>) {
    let (loss, cache) = forward(sh, p, batch);
    if factor == 0.0 {
        return (loss, None);
    }
    (loss, Some(backward(sh, p, batch, cache, factor)))
}

/// Where rank `rank`'s micro-batch `micro` of step `step` starts in the training text.
pub fn batch_start(
    step: usize,
    micro: usize,
    rank: usize,
    world: usize,
    accum: usize,
    batch: usize,
) -> usize {
    ((step * accum + micro) * world + rank) * batch
}

/// One optimizer step through the engine: forward with fetch/release, backward with
/// grads_ready in reverse module order, then step(). Returns the mean micro-batch loss.
pub fn train_step<C: Communicator, D: Device<Buffer = C::Buffer>>(
    engine: &mut Engine<C, D>,
    shape: &Shape,
    text: &[u8],
    step: usize,
) -> Result<(f32, StepOutcome), EngineError> {
    let cfg = engine.config().clone();
    let (micro, accum) = (
        cfg.micro_batch_per_rank as usize,
        cfg.gradient_accumulation_steps as usize,
    );
    let (rank, world) = (engine.rank(), engine.world_size());
    let modules = engine.modules().len();
    let mut total = 0.0;
    for k in 0..accum {
        let mut params = Vec::with_capacity(modules);
        for m in 0..modules {
            engine.fetch(m)?;
            params.push(engine.params_f32(m)?);
            engine.release(m)?;
        }
        let batch = Batch {
            text,
            start: batch_start(step, k, rank, world, accum, micro),
            len: micro,
        };
        let (loss, cache) = forward(shape, &params, &batch);
        total += loss;
        // Backward starts with the last module's fetch; one pass gives every layer's
        // gradients, handed to the engine module by module in reverse.
        engine.fetch(modules - 1)?;
        let grads = backward(
            shape,
            &params,
            &batch,
            cache,
            engine.loss_scale_factor() as f32,
        );
        for m in (0..modules).rev() {
            if m != modules - 1 {
                engine.fetch(m)?;
            }
            let g: Vec<&[f32]> = grads[m].iter().map(|v| &v[..]).collect();
            engine.add_grads_f32(m, &g)?;
            engine.grads_ready(m)?;
            engine.release(m)?;
        }
    }
    let out = engine.step()?;
    Ok((total / accum as f32, out))
}

/// Mean loss of the current parameters on `len` held-out characters (a collective in
/// stage 3: call on every rank).
pub fn evaluate<C: Communicator, D: Device<Buffer = C::Buffer>>(
    engine: &mut Engine<C, D>,
    shape: &Shape,
    text: &[u8],
    len: usize,
) -> Result<f32, EngineError> {
    let mut params = Vec::new();
    for m in 0..engine.modules().len() {
        engine.fetch(m)?;
        params.push(engine.params_f32(m)?);
        engine.release(m)?;
    }
    let chunk = 512;
    let mut total = 0.0;
    let mut count = 0;
    let mut start = 0;
    while start + chunk + shape.context <= len.min(text.len()) {
        let (l, _) = forward_backward(
            shape,
            &params,
            &Batch {
                text,
                start,
                len: chunk,
            },
            0.0,
        );
        total += l;
        count += 1;
        start += chunk;
    }
    Ok(total / count.max(1) as f32)
}
