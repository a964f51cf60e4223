//! Shared helpers of the integration tests: a small MLP with a hand-written backward, a
//! trainer loop over the engine, and a single-process Adam reference.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use zero_comm::{Communicator, HostComm, HostGroup};
use zero_runtime::{
    Device, Engine, EngineError, HostDevice, ModuleSpec, ParamSpec, StepOutcome, ZeroConfig,
};

/// Layer widths: input 7 → 13 → 5 → 3 (sizes that divide by nothing useful).
pub const DIMS: [usize; 4] = [7, 13, 5, 3];

/// A fresh seed (or `ZERO_TEST_SEED`), printed.
pub fn seed(test: &str) -> u64 {
    zero_kernels::testing::fresh_seed(test)
}

/// The model: three linear layers (weight `[out, in]`, bias `[out]`), one module each.
pub fn mlp_modules() -> Vec<ModuleSpec> {
    (0..3)
        .map(|l| {
            ModuleSpec::new(
                format!("layer{l}"),
                vec![
                    ParamSpec::new("weight", &[DIMS[l + 1], DIMS[l]]),
                    ParamSpec::new("bias", &[DIMS[l + 1]]),
                ],
            )
        })
        .collect()
}

/// Initial values for parameter `id`, the same on every rank for a seed.
pub fn init_values(seed: u64, id: usize, out: &mut [f32]) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (0x9e37_79b9 * (id as u64 + 1)));
    for v in out {
        *v = rng.gen_range(-0.5..0.5);
    }
}

/// Fixed data: `n` samples of (input, target).
pub fn dataset(seed: u64, n: usize) -> Vec<(Vec<f32>, Vec<f32>)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xda7a);
    (0..n)
        .map(|_| {
            let x: Vec<f32> = (0..DIMS[0]).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let y: Vec<f32> = (0..DIMS[3]).map(|_| rng.gen_range(-1.0..1.0)).collect();
            (x, y)
        })
        .collect()
}

/// Forward and backward of the MLP (tanh after layers 0 and 1, mean squared error) on a
/// batch, with the loss multiplied by `factor`. Returns the unscaled mean loss and the
/// gradients `[layer][weight, bias]`.
pub fn loss_and_grads(
    params: &[Vec<Vec<f32>>],
    batch: &[(Vec<f32>, Vec<f32>)],
    factor: f32,
) -> (f32, Vec<Vec<Vec<f32>>>) {
    let mut grads: Vec<Vec<Vec<f32>>> = params
        .iter()
        .map(|l| l.iter().map(|p| vec![0.0; p.len()]).collect())
        .collect();
    let mut loss = 0f32;
    let scale = factor / (batch.len() * DIMS[3]) as f32;
    for (x, y) in batch {
        let mut acts = vec![x.clone()];
        for l in 0..3 {
            let (w, b) = (&params[l][0], &params[l][1]);
            let inp = &acts[l];
            let mut out: Vec<f32> = (0..DIMS[l + 1])
                .map(|o| {
                    b[o] + (0..DIMS[l])
                        .map(|i| w[o * DIMS[l] + i] * inp[i])
                        .sum::<f32>()
                })
                .collect();
            if l < 2 {
                out.iter_mut().for_each(|v| *v = v.tanh());
            }
            acts.push(out);
        }
        let mut delta: Vec<f32> = acts[3].iter().zip(y).map(|(p, t)| p - t).collect();
        loss += delta.iter().map(|d| d * d).sum::<f32>();
        delta.iter_mut().for_each(|d| *d *= 2.0 * scale);
        for l in (0..3).rev() {
            if l < 2 {
                // Through tanh: d/dz tanh(z) = 1 - tanh².
                delta
                    .iter_mut()
                    .zip(&acts[l + 1])
                    .for_each(|(d, a)| *d *= 1.0 - a * a);
            }
            let inp = &acts[l];
            for o in 0..DIMS[l + 1] {
                for i in 0..DIMS[l] {
                    grads[l][0][o * DIMS[l] + i] += delta[o] * inp[i];
                }
                grads[l][1][o] += delta[o];
            }
            let w = &params[l][0];
            delta = (0..DIMS[l])
                .map(|i| {
                    (0..DIMS[l + 1])
                        .map(|o| w[o * DIMS[l] + i] * delta[o])
                        .sum()
                })
                .collect();
        }
    }
    (loss / (batch.len() * DIMS[3]) as f32, grads)
}

/// Per step: which sample indices rank `r` uses in micro-step `k`.
pub fn micro_batch(
    step: usize,
    k: usize,
    r: usize,
    world: usize,
    micro: usize,
    accum: usize,
) -> std::ops::Range<usize> {
    let start = ((step * accum + k) * world + r) * micro;
    start..start + micro
}

/// A hook to tamper with gradients: `(step, micro, rank, grads)`.
pub type GradHook<'a> = &'a (dyn Fn(usize, usize, usize, &mut Vec<Vec<Vec<f32>>>) + Sync);

/// Runs one optimizer step of the trainer loop on this rank: `accum` micro-steps of
/// fetch → forward → release, then fetch → backward → grads_ready → release in reverse.
pub fn train_step<C: Communicator, D: Device<Buffer = C::Buffer>>(
    engine: &mut Engine<C, D>,
    data: &[(Vec<f32>, Vec<f32>)],
    step: usize,
    hook: Option<GradHook>,
) -> Result<(f32, StepOutcome), EngineError> {
    let cfg = engine.config().clone();
    let (world, rank) = (engine.world_size(), engine.rank());
    let (micro, accum) = (
        cfg.micro_batch_per_rank as usize,
        cfg.gradient_accumulation_steps as usize,
    );
    let mut loss_sum = 0.0;
    for k in 0..accum {
        let batch = &data[micro_batch(step, k, rank, world, micro, accum)];
        let factor = engine.loss_scale_factor() as f32;
        loss_sum += micro_step(engine, batch, factor, |grads| {
            if let Some(h) = hook {
                h(step, k, rank, grads);
            }
        })?;
    }
    let outcome = engine.step()?;
    Ok((loss_sum / accum as f32, outcome))
}

/// One micro-step of the trainer loop on this rank with `batch`: fetch → forward →
/// release for every module, then fetch → backward (the gradients of the loss times
/// `factor`, after `tamper`) → grads_ready → release in reverse. Returns the loss.
pub fn micro_step<C: Communicator, D: Device<Buffer = C::Buffer>>(
    engine: &mut Engine<C, D>,
    batch: &[(Vec<f32>, Vec<f32>)],
    factor: f32,
    tamper: impl FnOnce(&mut Vec<Vec<Vec<f32>>>),
) -> Result<f32, EngineError> {
    let mut params = Vec::new();
    for m in 0..3 {
        engine.fetch(m)?;
        params.push(engine.params_f32(m)?);
        engine.release(m)?;
    }
    let (loss, mut grads) = loss_and_grads(&params, batch, factor);
    tamper(&mut grads);
    for m in (0..3).rev() {
        engine.fetch(m)?;
        let g: Vec<&[f32]> = grads[m].iter().map(|v| &v[..]).collect();
        engine.add_grads_f32(m, &g)?;
        engine.grads_ready(m)?;
        engine.release(m)?;
    }
    Ok(loss)
}

/// Every parameter as f32, `[layer][weight, bias]` (collective in stage 3: call on all
/// ranks).
pub fn full_params<C: Communicator, D: Device<Buffer = C::Buffer>>(
    engine: &mut Engine<C, D>,
) -> Result<Vec<Vec<Vec<f32>>>, EngineError> {
    (0..3)
        .map(|m| {
            engine.fetch(m)?;
            let p = engine.params_f32(m)?;
            engine.release(m)?;
            Ok(p)
        })
        .collect()
}

/// Runs `f` on an engine per rank, each in its own thread; returns rank results in order.
pub fn run_ranks<R: Send>(
    world: usize,
    config: &str,
    seed: u64,
    f: impl Fn(&mut Engine<HostComm, HostDevice>) -> R + Sync,
) -> Vec<R> {
    let comms = HostGroup::with_timeout(world, std::time::Duration::from_secs(30)).expect("group");
    run_ranks_on(comms, || HostDevice, config, seed, f)
}

/// [`run_ranks`] over any backend: one engine per communicator in `comms`, each with a
/// device from `device`, each in its own thread.
pub fn run_ranks_on<C, D, R>(
    comms: Vec<C>,
    device: impl Fn() -> D + Sync,
    config: &str,
    seed: u64,
    f: impl Fn(&mut Engine<C, D>) -> R + Sync,
) -> Vec<R>
where
    C: Communicator,
    D: Device<Buffer = C::Buffer>,
    R: Send,
{
    run_ranks_model(comms, device, config, seed, mlp_modules, f)
}

/// [`run_ranks_on`] with another model registration than [`mlp_modules`] (the same
/// parameters, in other groups, say).
pub fn run_ranks_model<C, D, R>(
    comms: Vec<C>,
    device: impl Fn() -> D + Sync,
    config: &str,
    seed: u64,
    modules: fn() -> Vec<ModuleSpec>,
    f: impl Fn(&mut Engine<C, D>) -> R + Sync,
) -> Vec<R>
where
    C: Communicator,
    D: Device<Buffer = C::Buffer>,
    R: Send,
{
    let cfg = ZeroConfig::from_json_str(config, comms.len()).expect("valid config");
    run_ranks_config(comms, device, cfg, seed, modules, f)
}

/// [`run_ranks_model`] with a config already parsed (and adjusted: `ranks_per_node`, say).
pub fn run_ranks_config<C, D, R>(
    comms: Vec<C>,
    device: impl Fn() -> D + Sync,
    cfg: ZeroConfig,
    seed: u64,
    modules: fn() -> Vec<ModuleSpec>,
    f: impl Fn(&mut Engine<C, D>) -> R + Sync,
) -> Vec<R>
where
    C: Communicator,
    D: Device<Buffer = C::Buffer>,
    R: Send,
{
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let (cfg, f, device) = (cfg.clone(), &f, &device);
                s.spawn(move || {
                    let mut e = Engine::new(cfg, modules(), comm, device(), |id, _, v| {
                        init_values(seed, id, v)
                    })
                    .expect("engine");
                    f(&mut e)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    })
}

/// Parameters of the MLP, `[layer][weight, bias]`, as f32.
pub type Params = Vec<Vec<Vec<f32>>>;

/// Every parameter's bit pattern, in order (for bit-equality assertions).
pub fn bits(p: &Params) -> Vec<u32> {
    p.iter().flatten().flatten().map(|x| x.to_bits()).collect()
}

/// The largest absolute difference between two sets of parameters.
pub fn max_diff(a: &Params, b: &Params) -> f32 {
    a.iter()
        .flatten()
        .flatten()
        .zip(b.iter().flatten().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The single-process reference: plain Adam/AdamW (torch's formula, in f64) on the mean
/// gradient of the whole global batch, clipped as DeepSpeed clips. Master weights start
/// from `round(init)` in the run's precision, as the engine's do.
pub struct Reference {
    /// Parameters `[layer][weight, bias]`.
    pub params: Vec<Vec<Vec<f64>>>,
    m: Vec<Vec<Vec<f64>>>,
    v: Vec<Vec<Vec<f64>>>,
    step: i32,
}

impl Reference {
    /// Starts from the engine's initial values, rounded by `round`.
    pub fn new(seed: u64, round: impl Fn(f32) -> f32) -> Self {
        let mut id = 0;
        let params: Vec<Vec<Vec<f64>>> = (0..3)
            .map(|l| {
                [DIMS[l + 1] * DIMS[l], DIMS[l + 1]]
                    .iter()
                    .map(|&n| {
                        let mut v = vec![0f32; n];
                        init_values(seed, id, &mut v);
                        id += 1;
                        v.iter().map(|x| round(*x) as f64).collect()
                    })
                    .collect()
            })
            .collect();
        let zeros = params
            .iter()
            .map(|l| l.iter().map(|p| vec![0.0; p.len()]).collect())
            .collect::<Vec<Vec<Vec<f64>>>>();
        Self {
            m: zeros.clone(),
            v: zeros,
            params,
            step: 0,
        }
    }

    /// The parameters, rounded to f32.
    pub fn params_f32(&self) -> Params {
        self.params
            .iter()
            .map(|l| {
                l.iter()
                    .map(|p| p.iter().map(|x| *x as f32).collect())
                    .collect()
            })
            .collect()
    }

    /// One step on `batch` (the whole global batch) with the config's hyper-parameters.
    pub fn step(&mut self, cfg: &ZeroConfig, batch: &[(Vec<f32>, Vec<f32>)]) {
        let a = cfg
            .optimizer
            .as_ref()
            .and_then(|o| o.adam)
            .expect("the reference trains the config's Adam");
        self.step_groups(cfg, batch, &|_, _| a);
    }

    /// [`step`](Self::step) with each parameter's own hyper-parameters:
    /// `hyper(layer, k)` for `[layer][k]` (k 0 the weight, 1 the bias), as parameter
    /// groups give them.
    pub fn step_groups(
        &mut self,
        cfg: &ZeroConfig,
        batch: &[(Vec<f32>, Vec<f32>)],
        hyper: &dyn Fn(usize, usize) -> zero_runtime::kernels::AdamConfig,
    ) {
        let p32: Vec<Vec<Vec<f32>>> = self
            .params
            .iter()
            .map(|l| {
                l.iter()
                    .map(|p| p.iter().map(|x| *x as f32).collect())
                    .collect()
            })
            .collect();
        let (_, g) = loss_and_grads(&p32, batch, 1.0);
        let norm = g
            .iter()
            .flatten()
            .flatten()
            .map(|x| (*x as f64).powi(2))
            .sum::<f64>()
            .sqrt();
        let clip = if cfg.gradient_clipping > 0.0 {
            (norm + 1e-6) / cfg.gradient_clipping
        } else {
            1.0
        };
        let coef = if clip > 1.0 { 1.0 / clip } else { 1.0 };
        self.step += 1;
        for (l, (layer, grads)) in self.params.iter_mut().zip(&g).enumerate() {
            for (k, (w, gk)) in layer.iter_mut().zip(grads).enumerate() {
                let a = hyper(l, k);
                let (lr, b1, b2, eps, wd) = (
                    a.lr as f64,
                    a.beta1 as f64,
                    a.beta2 as f64,
                    a.eps as f64,
                    a.weight_decay as f64,
                );
                let (bc1, bc2) = (1.0 - b1.powi(self.step), 1.0 - b2.powi(self.step));
                let (m, v) = (&mut self.m[l][k], &mut self.v[l][k]);
                for (i, gi) in gk.iter().enumerate() {
                    let mut gi = *gi as f64 * coef;
                    match a.decay {
                        zero_runtime::kernels::WeightDecay::L2 => gi += wd * w[i],
                        zero_runtime::kernels::WeightDecay::Decoupled => w[i] -= lr * wd * w[i],
                    }
                    m[i] = b1 * m[i] + (1.0 - b1) * gi;
                    v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
                    w[i] -= (lr / bc1) * m[i] / (v[i].sqrt() / bc2.sqrt() + eps);
                }
            }
        }
    }
}

/// The config the equivalence tests train the MLP with: micro-batch 2, AdamW (lr 0.01,
/// weight decay 0.01), small buckets so every stage has several, and the given stage,
/// precision (`fp32`, `fp16` with dynamic scaling from 2^8, `bf16`), accumulation,
/// gradient clipping (0 disables it) and `overlap_comm`.
pub fn mlp_config(stage: u8, precision: &str, accum: usize, clip: f32, overlap: bool) -> String {
    let precision = match precision {
        "fp16" => r#""fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 8},"#,
        "bf16" => r#""bf16": {"enabled": true},"#,
        _ => "",
    };
    format!(
        r#"{{
            "train_micro_batch_size_per_gpu": {MICRO_BATCH},
            "gradient_accumulation_steps": {accum},
            "gradient_clipping": {clip},
            {precision}
            "optimizer": {{"type": "AdamW", "params": {{"lr": 0.01, "weight_decay": 0.01}}}},
            "zero_optimization": {{
                "stage": {stage},
                "overlap_comm": {overlap},
                "reduce_bucket_size": 64,
                "stage3_param_persistence_threshold": 4,
                "stage3_prefetch_bucket_size": 100,
                "stage3_max_reuse_distance": 0
            }}
        }}"#
    )
}

/// The micro-batch per rank of [`mlp_config`].
pub const MICRO_BATCH: usize = 2;

/// Every rank's fp32 optimizer state, consolidated by parameter name: `(master, exp_avg,
/// exp_avg_sq)` as bit patterns, each parameter whole.
pub type Consolidated = std::collections::BTreeMap<String, [Vec<u32>; 3]>;

/// Consolidates the ranks' [`zero_runtime::StatePiece`]s (each rank's
/// `Engine::optimizer_state()`), checking they cover every element once.
pub fn consolidate(ranks: &[Vec<zero_runtime::StatePiece>]) -> Consolidated {
    let mut out: std::collections::BTreeMap<String, [Vec<Option<u32>>; 3]> = Default::default();
    for pieces in ranks {
        for p in pieces {
            let e = out.entry(p.name.clone()).or_default();
            for (k, vals) in [&p.master, &p.exp_avg, &p.exp_avg_sq]
                .into_iter()
                .enumerate()
            {
                if e[k].len() < p.elements.end {
                    e[k].resize(p.elements.end, None);
                }
                for (i, v) in p.elements.clone().zip(vals) {
                    assert!(e[k][i].is_none(), "{}[{i}] held twice", p.name);
                    e[k][i] = Some(v.to_bits());
                }
            }
        }
    }
    out.into_iter()
        .map(|(name, parts)| {
            let whole = parts.map(|v| {
                v.into_iter()
                    .enumerate()
                    .map(|(i, x)| x.unwrap_or_else(|| panic!("{name}[{i}] held by no rank")))
                    .collect()
            });
            (name, whole)
        })
        .collect()
}

/// `config` with `zero_optimization.{key}` (`offload_optimizer` or `offload_param`) set to
/// `value`, and `sub_group_size` when given.
pub fn with_offload(
    config: &str,
    key: &str,
    value: &serde_json::Value,
    sub_group_size: Option<u64>,
) -> String {
    let mut v: serde_json::Value = serde_json::from_str(config).expect("config is JSON");
    let zero = &mut v["zero_optimization"];
    zero[key] = value.clone();
    if let Some(s) = sub_group_size {
        zero["sub_group_size"] = s.into();
    }
    v.to_string()
}

/// Adam's `eps` for a run compared, within a tolerance, with one that sums its gradients
/// in another order (shard groups against the flat engine, a reference in f64, a
/// micro-step in two passes). Adam's update is about `±lr · g / (|g| + eps)`: with the
/// default eps (1e-8) an element whose gradient cancels to within rounding of zero steps
/// up to `lr` either way on one rounding, so the runs then differ by up to `2 lr` (seen,
/// 2026-12-04, with CI's clock seeds: 1 of 150 seeds put shard groups 8.2e-5 from the flat
/// engine against 1e-6; 9 of 400 failed the reopened micro-step's and the parameter
/// groups' bounds). With eps 1e-3 a rounding `δ` moves an update by at most
/// `lr · δ / eps`, so the tolerances bound the reductions' rounding, and a lost or doubled
/// gradient is still far outside them.
pub const ROUNDING_SAFE_EPS: f64 = 1e-3;

/// `config` with Adam's `eps` [`ROUNDING_SAFE_EPS`].
pub fn with_rounding_safe_eps(config: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(config).expect("config is JSON");
    v["optimizer"]["params"]["eps"] = ROUNDING_SAFE_EPS.into();
    v.to_string()
}

/// The name libtest gives the test function `name` of the module whose `module_path!()` is
/// `module_path`: that path without the crate's name (`checkpoint_crash::crash_child` in the
/// `host` executable), which a test that runs one of its own tests in a child process
/// (`--exact`) must pass, whichever executable the module is compiled into.
pub fn test_name(module_path: &str, name: &str) -> String {
    match module_path.split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    }
}
