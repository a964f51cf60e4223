//! One training step of the GPT example's model (1.24M parameters, 16 sequences of 16
//! letters, fp32) through zero-candle at 1 rank, stage 0, against the same model trained
//! by candle alone with `candle_nn::AdamW`, in one run. Both sides run the same candle
//! forward and backward; they differ in what follows: zero-candle's gradient taps copy
//! each gradient into the engine's flat buffer and the fused Adam updates it and writes
//! the parameters back in place, while candle's AdamW runs ~10 tensor ops per parameter.
//! Before criterion, a paired pass alternates the two and prints the ratio of medians.
//!
//! ```sh
//! cargo bench --bench candle_step
//! ```

use candle_core::{Device, Tensor};
use candle_nn::{Optimizer, VarMap};
use criterion::{criterion_group, criterion_main, Criterion};
use std::time::{Duration, Instant};
use zero_candle::gpt::{self, Gpt, GptConfig};
use zero_candle::{Options, ZeroCandle};
use zero_comm::{HostComm, HostGroup};
use zero_runtime::{HostDevice, ZeroConfig};

const BATCH: usize = 16;
const PAIRED: usize = 30;
const SEED: u64 = 7;

fn batch(step: usize) -> (Tensor, Tensor) {
    let t = GptConfig::example().context;
    let v = GptConfig::example().vocab as u64;
    let mut s = (step as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % v) as u32
    };
    let seq: Vec<u32> = (0..BATCH * (t + 1)).map(|_| next()).collect();
    let ids: Vec<u32> = seq.chunks(t + 1).flat_map(|c| c[..t].to_vec()).collect();
    let targets: Vec<u32> = seq.chunks(t + 1).flat_map(|c| c[1..].to_vec()).collect();
    (
        Tensor::from_vec(ids, (BATCH, t), &Device::Cpu).expect("ids"),
        Tensor::from_vec(targets, (BATCH, t), &Device::Cpu).expect("targets"),
    )
}

/// One side of the comparison: `step` runs training step `step` and returns its time.
trait Side {
    fn step(&mut self, step: usize) -> Duration;
}

/// candle alone.
struct Plain {
    model: Gpt,
    opt: candle_nn::AdamW,
}

impl Plain {
    fn new() -> Self {
        let map = VarMap::new();
        let vb = zero_candle::seeded_var_builder(&map, SEED, None, &Device::Cpu);
        let model = Gpt::new(gpt::parts(&GptConfig::example(), vb).expect("model"));
        let params = candle_nn::ParamsAdamW {
            lr: 1e-3,
            weight_decay: 0.0,
            ..Default::default()
        };
        let opt = candle_nn::AdamW::new(map.all_vars(), params).expect("AdamW");
        Self { model, opt }
    }
}

impl Side for Plain {
    fn step(&mut self, step: usize) -> Duration {
        let (x, y) = batch(step);
        let t0 = Instant::now();
        let loss = self.model.loss(&x, &y, 0).expect("forward");
        self.opt.backward_step(&loss).expect("step");
        t0.elapsed()
    }
}

/// Through zero-candle.
struct Zero {
    model: Gpt,
    zc: ZeroCandle<HostComm, HostDevice>,
}

impl Zero {
    fn new() -> Self {
        let cfg = ZeroConfig::from_json_str(
            r#"{"train_micro_batch_size_per_gpu": 16, "gradient_clipping": 0.0,
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}},
                "zero_optimization": {"stage": 0}}"#,
            1,
        )
        .expect("config");
        let comm = HostGroup::new(1).expect("group").remove(0);
        let options = Options {
            grouping: GptConfig::grouping(),
            seed: SEED,
            ..Default::default()
        };
        let (zc, parts) = ZeroCandle::new(cfg, comm, HostDevice, options, |vb| {
            gpt::parts(&GptConfig::example(), vb)
        })
        .expect("zero-candle");
        Self {
            model: Gpt::new(parts),
            zc,
        }
    }
}

impl Side for Zero {
    fn step(&mut self, step: usize) -> Duration {
        let (x, y) = batch(step);
        let t0 = Instant::now();
        let loss = self.model.loss(&x, &y, 0).expect("forward");
        self.zc.backward(&loss).expect("backward");
        self.zc.step().expect("step");
        t0.elapsed()
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn candle_step(c: &mut Criterion) {
    let (mut plain, mut zero) = (Plain::new(), Zero::new());
    for s in 0..3 {
        plain.step(s);
        zero.step(s);
    }
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for s in 0..PAIRED {
        a.push(plain.step(s).as_secs_f64() * 1e3);
        b.push(zero.step(s).as_secs_f64() * 1e3);
    }
    let (a, b) = (median(a), median(b));
    println!(
        "candle_step paired, GPT {} params, {BATCH}x{} letters, fp32: candle+AdamW {a:.2} ms, zero-candle stage 0 {b:.2} ms per step (median of {PAIRED} alternating), zero/candle = {:.3}",
        GptConfig::example().numel(),
        GptConfig::example().context,
        b / a
    );
    let mut g = c.benchmark_group("candle_step");
    let mut n = 0;
    let sides: [(&str, &mut dyn Side); 2] = [
        ("candle_adamw", &mut plain),
        ("zero_candle_stage0", &mut zero),
    ];
    for (name, side) in sides {
        g.bench_function(name, |bch| {
            bch.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        n += 1;
                        side.step(n)
                    })
                    .sum()
            })
        });
    }
    g.finish();
}

criterion_group! { name = benches; config = zero_benches::config(); targets = candle_step }
criterion_main!(benches);
