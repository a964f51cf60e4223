//! An unmodified model from candle-transformers, `llama2_c`, trained through zero-candle at
//! whole-model granularity in stages 0-2.
//!
//! Its two pitfalls are handled and checked:
//! - its rotary cache asks the `VarBuilder` for `freq_cis_real` / `freq_cis_imag` and
//!   computes them only if that fails: the `not_parameters` hook makes it fail, so they do
//!   not become trainable parameters;
//! - candle-nn's `RmsNorm` takes the fused `rms_norm` kernel on contiguous input, which
//!   has no backward: the graph is cut at every norm, so only `lm_head` gets a gradient.
//!   The adapter's report names every other parameter, and this test asserts that list.

use candle_core::{Device, Tensor};
use candle_transformers::models::llama2_c::{Cache, Config, Llama};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use zero_candle::{not_parameters, Grouping, Options, ZeroCandle};
use zero_comm::{Communicator, HostGroup};
use zero_runtime::{HostDevice, ZeroConfig};

const STEPS: usize = 20;

fn tiny() -> Config {
    Config {
        dim: 32,
        hidden_dim: 64,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        vocab_size: 32,
        seq_len: 16,
        norm_eps: 1e-5,
    }
}

/// What one run saw on rank 0.
struct Run {
    names: Vec<String>,
    missing: Vec<String>,
    losses: Vec<f32>,
    before: Vec<(String, Vec<u32>)>,
    after: Vec<(String, Vec<u32>)>,
}

fn bits(named: Vec<(String, Tensor)>) -> Vec<(String, Vec<u32>)> {
    named
        .into_iter()
        .map(|(n, t)| {
            let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            (n, v.into_iter().map(f32::to_bits).collect())
        })
        .collect()
}

fn train(stage: u8, world: usize, seed: u64) -> Run {
    let json = format!(
        r#"{{"train_micro_batch_size_per_gpu": 2, "optimizer": {{"type": "AdamW", "params": {{"lr": 0.01, "weight_decay": 0.0}}}},
            "zero_optimization": {{"stage": {stage}, "reduce_bucket_size": 5000}}}}"#
    );
    let cfg = ZeroConfig::from_json_str(&json, world).unwrap();
    let comms = HostGroup::new(world).unwrap();
    let mut runs: Vec<Run> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let cfg = cfg.clone();
                s.spawn(move || {
                    let rank = comm.rank();
                    let options = Options {
                        // Whole-model granularity: the model's blocks are private.
                        grouping: Grouping::Prefix(0),
                        seed,
                        constants: Some(not_parameters(&["freq_cis_real", "freq_cis_imag"])),
                        ..Default::default()
                    };
                    let (zc, (llama, mut cache)) =
                        ZeroCandle::new(cfg, comm, HostDevice, options, |vb| {
                            let cache = Cache::new(false, &tiny(), vb.clone())?;
                            Ok((Llama::load(vb, tiny())?, cache))
                        })
                        .unwrap();
                    let before = bits(zc.named_params().unwrap());
                    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ rank as u64);
                    let mut losses = Vec::new();
                    let mut missing = Vec::new();
                    for _ in 0..STEPS {
                        // A learnable rule: the next token is the current one plus one.
                        let starts: Vec<u32> = (0..2).map(|_| rng.gen_range(0..32)).collect();
                        let seq = |off: u32| -> Vec<u32> {
                            starts
                                .iter()
                                .flat_map(|&s| (0..8).map(move |i| (s + i + off) % 32))
                                .collect()
                        };
                        let x = Tensor::from_vec(seq(0), (2, 8), &Device::Cpu).unwrap();
                        let y = Tensor::from_vec(seq(1), 16, &Device::Cpu).unwrap();
                        let logits = llama.forward(&x, 0, &mut cache).unwrap();
                        let loss =
                            candle_nn::loss::cross_entropy(&logits.reshape((16, 32)).unwrap(), &y)
                                .unwrap();
                        losses.push(loss.to_scalar::<f32>().unwrap());
                        zc.backward(&loss).unwrap();
                        missing = zc.missing_grads().unwrap();
                        zc.step().unwrap();
                    }
                    Run {
                        names: zc.param_names().unwrap(),
                        missing,
                        losses,
                        before,
                        after: bits(zc.named_params().unwrap()),
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &runs[1..] {
        assert_eq!(r.after, runs[0].after, "ranks disagree");
    }
    runs.swap_remove(0)
}

#[test]
fn llama2_c_trains_and_the_fused_rms_norm_is_reported() {
    let seed = rand::random::<u64>();
    println!("seed {seed:#x}");
    let c = tiny();
    let mut first: Option<Vec<(String, Vec<u32>)>> = None;
    for stage in 0..=2 {
        let run = train(stage, 2, seed);
        // The rotary tables are computed by the model, not parameters.
        assert!(
            run.names.iter().all(|n| !n.starts_with("freq_cis")),
            "{:?}",
            run.names
        );
        let expected_count = 3 + c.n_layers * 9; // embedding, final norm, head; 7 linears and 2 norms a layer
        assert_eq!(run.names.len(), expected_count, "{:?}", run.names);
        // Every parameter but lm_head sits behind a fused RmsNorm and is reported.
        let mut expected: Vec<String> = run
            .names
            .iter()
            .filter(|n| *n != "lm_head.weight")
            .cloned()
            .collect();
        let mut missing = run.missing.clone();
        expected.sort();
        missing.sort();
        assert_eq!(missing, expected, "stage {stage}");
        assert!(missing.iter().any(|n| n == "model.norm.weight"));
        assert!(missing
            .iter()
            .any(|n| n == "model.layers.1.input_layernorm.weight"));
        // lm_head learned; the parameters without a gradient kept their bits.
        for ((name, b), (_, a)) in run.before.iter().zip(&run.after) {
            if name == "lm_head.weight" {
                assert_ne!(a, b, "lm_head did not move");
            } else {
                assert_eq!(a, b, "`{name}` moved without a gradient");
            }
        }
        println!("stage {stage}: losses {:?}", run.losses);
        let mean = |l: &[f32]| l.iter().sum::<f32>() / l.len() as f32;
        let (early, late) = (mean(&run.losses[..4]), mean(&run.losses[STEPS - 4..]));
        assert!(
            late < early - 0.3,
            "stage {stage}: lm_head did not learn: {:?}",
            run.losses
        );
        match &first {
            None => first = Some(run.after),
            Some(f) => assert_eq!(&run.after, f, "stage {stage} differs from stage 0"),
        }
    }
}
