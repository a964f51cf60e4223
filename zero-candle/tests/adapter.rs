//! The adapter's own promises: stage 3 holds parameters in candle storage only while in
//! use, parameters without a gradient are named and left unchanged, and bad models or
//! options are errors that name the problem.

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::VarBuilder;
use zero_candle::gpt::{self, Gpt, GptConfig};
use zero_candle::{Grouping, Options, ZeroCandle};
use zero_comm::{Communicator, HostComm, HostGroup};
use zero_runtime::{HostDevice, ZeroConfig};

const CFG: GptConfig = GptConfig {
    vocab: 8,
    context: 6,
    dim: 32,
    heads: 2,
    blocks: 3,
};

fn config(stage: u8, world: usize) -> ZeroConfig {
    let json = format!(
        r#"{{"train_micro_batch_size_per_gpu": 2, "bf16": {{"enabled": true}},
            "optimizer": {{"type": "AdamW", "params": {{"lr": 0.01}}}},
            "zero_optimization": {{"stage": {stage}, "reduce_bucket_size": 4000, "stage3_param_persistence_threshold": 0}}}}"#
    );
    ZeroConfig::from_json_str(&json, world).unwrap()
}

/// Runs `f` on every rank of a `world`-rank host group; rank 0's result.
fn on_ranks<R: Send>(world: usize, f: impl Fn(HostComm) -> R + Sync) -> R {
    let comms = HostGroup::new(world).unwrap();
    let mut out: Vec<R> = std::thread::scope(|s| {
        let hs: Vec<_> = comms.into_iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    out.swap_remove(0)
}

/// (bytes at rest after wrapping, peak while training, at rest after training).
fn candle_bytes(stage: u8) -> (usize, usize, usize) {
    on_ranks(2, |comm| {
        let r = comm.rank() as u32;
        let options = Options {
            grouping: GptConfig::grouping(),
            seed: 9,
            ..Default::default()
        };
        let (zc, parts) = ZeroCandle::new(config(stage, 2), comm, HostDevice, options, |vb| {
            gpt::parts(&CFG, vb)
        })
        .unwrap();
        let model = Gpt::wrapped(&zc, parts).unwrap();
        let start = zc.candle_param_bytes().unwrap().0;
        for step in 0..3u32 {
            let ids: Vec<u32> = (0..12).map(|i| (i * 3 + step + r) % 8).collect();
            let x = Tensor::from_vec(ids.clone(), (2, 6), &Device::Cpu).unwrap();
            let y = Tensor::from_vec(
                ids.iter().map(|i| (i + 1) % 8).collect(),
                (2, 6),
                &Device::Cpu,
            )
            .unwrap();
            zc.backward(&model.loss(&x, &y, 0).unwrap()).unwrap();
            zc.step().unwrap();
        }
        let (now, peak) = zc.candle_param_bytes().unwrap();
        (start, peak, now)
    })
}

#[test]
fn stage3_holds_parameters_in_candle_only_while_in_use() {
    let whole = 4 * CFG.numel();
    let d = CFG.dim;
    let block = 4 * (2 * d + 3 * d * d + d * d + d + 4 * d * d + 4 * d + 4 * d * d + d);
    let (start, peak, end) = candle_bytes(3);
    println!("stage 3: {start} B at rest, peak {peak} B, {end} B after; whole model {whole} B, one block {block} B");
    assert_eq!(
        (start, end),
        (0, 0),
        "stage 3 left parameters in candle storage"
    );
    assert!(
        peak >= block,
        "a block was never filled whole ({peak} < {block})"
    );
    assert!(
        peak <= 2 * block,
        "peak {peak} B: more than two blocks at once (whole model {whole} B)"
    );
    let (start, peak, end) = candle_bytes(0);
    assert_eq!(
        (start, peak, end),
        (whole, whole, whole),
        "stage 0 keeps the model in candle"
    );
}

#[test]
fn a_parameter_without_a_gradient_is_named_and_left_alone() {
    let (missing, before, after) = on_ranks(2, |comm| {
        let (zc, (a, _unused)) =
            ZeroCandle::new(config(2, 2), comm, HostDevice, Options::default(), |vb| {
                Ok((
                    candle_nn::linear(3, 2, vb.pp("a"))?,
                    candle_nn::linear(3, 2, vb.pp("unused"))?,
                ))
            })
            .unwrap();
        let before = zc.named_params().unwrap();
        let x = Tensor::new(&[[1f32, 2., 3.], [0.5, -1., 2.]], &Device::Cpu).unwrap();
        zc.backward(&a.forward(&x).unwrap().sqr().unwrap().mean_all().unwrap())
            .unwrap();
        let missing = zc.missing_grads().unwrap();
        let message = zc.missing_grads_message().unwrap().unwrap();
        assert!(
            message.contains("unused.weight") && message.contains("RmsNorm"),
            "{message}"
        );
        zc.step().unwrap();
        (missing, before, zc.named_params().unwrap())
    });
    assert_eq!(missing, ["unused.weight", "unused.bias"]);
    for ((name, b), (_, a)) in before.iter().zip(&after) {
        let (b, a) = (
            b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        );
        if name.starts_with("unused") {
            assert_eq!(a, b, "{name} moved");
        } else {
            assert_ne!(a, b, "{name} did not train");
        }
    }
}

fn build_error(
    options: Options,
    build: impl Fn(VarBuilder<'_>) -> candle_core::Result<Vec<Tensor>> + Sync,
) -> String {
    on_ranks(1, |comm| {
        match ZeroCandle::new(config(0, 1), comm, HostDevice, options.clone(), &build) {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        }
    })
}

#[test]
fn bad_models_and_options_are_errors_naming_the_problem() {
    let e = build_error(Options::default(), |vb| {
        Ok(vec![vb.get_with_hints_dtype(
            4,
            "w",
            candle_nn::Init::Const(0.),
            DType::F16,
        )?])
    });
    assert!(e.contains("`w`") && e.contains("f32"), "{e}");
    let e = build_error(Options::default(), |_| Ok(vec![]));
    assert!(e.contains("no parameters"), "{e}");
    let custom = Options {
        grouping: Grouping::Custom(std::sync::Arc::new(|_: &str| "elsewhere".to_string())),
        ..Default::default()
    };
    let e = build_error(custom, |vb| Ok(vec![vb.get(4, "layer.w")?]));
    assert!(e.contains("`layer.w`") && e.contains("elsewhere"), "{e}");
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let e = build_error(Options::default(), |vb| {
        let name = if calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            "first"
        } else {
            "second"
        };
        Ok(vec![vb.get(4, name)?])
    });
    assert!(e.contains("`second`") && e.contains("same tensors"), "{e}");
    let e = on_ranks(1, |comm| {
        let (zc, _) = ZeroCandle::new(config(3, 1), comm, HostDevice, Options::default(), |vb| {
            vb.get(4, "a.w")
        })
        .unwrap();
        zc.wrap("b", ()).err().unwrap().to_string()
    });
    assert!(e.contains("`b`") && e.contains("a"), "{e}");
}

#[test]
fn frozen_parameters_keep_their_values_and_are_not_reported() {
    let (missing, before, after) = on_ranks(2, |comm| {
        let options = Options {
            frozen: Some(std::sync::Arc::new(|name: &str| name.starts_with("base."))),
            ..Default::default()
        };
        let (zc, (base, head)) = ZeroCandle::new(config(1, 2), comm, HostDevice, options, |vb| {
            Ok((
                candle_nn::linear(3, 4, vb.pp("base"))?,
                candle_nn::linear(4, 1, vb.pp("head"))?,
            ))
        })
        .unwrap();
        let before = zc.named_params().unwrap();
        let x = Tensor::new(&[[1f32, 2., 3.], [0.5, -1., 2.]], &Device::Cpu).unwrap();
        for _ in 0..2 {
            let y = head
                .forward(&base.forward(&x).unwrap().tanh().unwrap())
                .unwrap();
            zc.backward(&y.sqr().unwrap().mean_all().unwrap()).unwrap();
            zc.step().unwrap();
        }
        (
            zc.missing_grads().unwrap(),
            before,
            zc.named_params().unwrap(),
        )
    });
    assert!(missing.is_empty(), "{missing:?}");
    for ((name, b), (_, a)) in before.iter().zip(&after) {
        let (b, a) = (
            b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        );
        assert_eq!(name.starts_with("base."), a == b, "{name}");
    }
}

#[test]
fn an_overflowing_fp16_step_is_skipped_and_changes_nothing() {
    // A loss scale of 2^40 overflows fp16 gradients: the step is skipped on every rank,
    // the parameters candle reads keep their bits, and the scale comes down until steps
    // go through.
    let json = r#"{"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": true, "initial_scale_power": 40, "hysteresis": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "zero_optimization": {"stage": 2}}"#;
    let (first, before, after_skip, later) = on_ranks(2, |comm| {
        let cfg = ZeroConfig::from_json_str(json, 2).unwrap();
        let (zc, layer) = ZeroCandle::new(cfg, comm, HostDevice, Options::default(), |vb| {
            candle_nn::linear(3, 2, vb.pp("l"))
        })
        .unwrap();
        let x = Tensor::new(&[[1f32, 2., 3.], [0.5, -1., 2.]], &Device::Cpu).unwrap();
        let read = || {
            layer
                .weight()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        };
        let before = read();
        let loss = |zc: &ZeroCandle<_, _>| {
            zc.backward(
                &layer
                    .forward(&x)
                    .unwrap()
                    .sqr()
                    .unwrap()
                    .mean_all()
                    .unwrap(),
            )
            .unwrap();
            zc.step().unwrap()
        };
        let first = loss(&zc);
        let after_skip = read();
        let mut later = first.skipped;
        for _ in 0..40 {
            later = loss(&zc).skipped;
            if !later {
                break;
            }
        }
        (first.skipped, before, after_skip, later)
    });
    assert!(first, "2^40 should overflow fp16");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&after_skip),
        bits(&before),
        "a skipped step changed the parameters"
    );
    assert!(!later, "the loss scale never came down far enough to step");
}

/// An identity whose backward runs `probe` (to look at the engine mid-backward).
struct Probe(std::sync::Arc<dyn Fn() + Send + Sync>);

impl candle_core::CustomOp1 for Probe {
    fn name(&self) -> &'static str {
        "probe"
    }

    fn cpu_fwd(
        &self,
        s: &candle_core::CpuStorage,
        l: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let candle_core::CpuStorage::F32(v) = s else {
            unreachable!("f32 model")
        };
        let (a, b) = l.contiguous_offsets().expect("contiguous");
        Ok((
            candle_core::CpuStorage::F32(v[a..b].to_vec()),
            l.shape().clone(),
        ))
    }

    fn bwd(&self, _: &Tensor, _: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        (self.0)();
        Ok(Some(grad.clone()))
    }
}

#[test]
fn a_layers_reduction_starts_while_backward_goes_on() {
    // y = b(tanh(probe(a(x)))): when backward reaches the probe, b's gradients are all in,
    // so b's bucket must already have been reduced; a's not yet.
    let (at_probe, b_elems, total) = on_ranks(2, |comm| {
        // Buckets of at most 100 elements: each layer gets its own.
        let json = r#"{"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "zero_optimization": {"stage": 2, "reduce_bucket_size": 100}}"#;
        let cfg = ZeroConfig::from_json_str(json, 2).unwrap();
        let (zc, (a, b)) = ZeroCandle::new(cfg, comm, HostDevice, Options::default(), |vb| {
            Ok((
                candle_nn::linear(5, 64, vb.pp("a"))?,
                candle_nn::linear(64, 3, vb.pp("b"))?,
            ))
        })
        .unwrap();
        let zc = std::sync::Arc::new(zc);
        let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
        let probe = {
            let (zc, seen) = (zc.clone(), seen.clone());
            Probe(std::sync::Arc::new(move || {
                *seen.lock().unwrap() =
                    Some(zc.with_engine(|e| e.comm_stats().total_elements()).unwrap());
            }))
        };
        let before = zc.with_engine(|e| e.comm_stats().total_elements()).unwrap();
        let x = Tensor::new(
            &[[1f32, 2., 3., 4., 5.], [0.5, -1., 2., 0., 1.]],
            &Device::Cpu,
        )
        .unwrap();
        let h = a.forward(&x).unwrap().apply_op1(probe).unwrap();
        let y = b.forward(&h.tanh().unwrap()).unwrap();
        zc.backward(&y.sqr().unwrap().mean_all().unwrap()).unwrap();
        let after = zc.with_engine(|e| e.comm_stats().total_elements()).unwrap();
        let at_probe = seen.lock().unwrap().expect("the probe's backward ran") - before;
        (at_probe, 64 * 3 + 3, after - before)
    });
    println!("elements sent when backward reached the probe: {at_probe}; after backward: {total}; b has {b_elems}");
    assert!(at_probe > 0, "nothing was reduced before backward finished");
    assert!(
        at_probe < total,
        "a's reduction should come after the probe"
    );
}

#[test]
fn a_stage3_wrapper_sharing_a_bucket_is_noted() {
    let notes = |bucket: u64| {
        on_ranks(1, |comm| {
            let json = format!(
                r#"{{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {{"stage": 3, "reduce_bucket_size": {bucket}, "stage3_param_persistence_threshold": 0}}}}"#
            );
            let cfg = ZeroConfig::from_json_str(&json, 1).unwrap();
            let options = Options {
                grouping: GptConfig::grouping(),
                ..Default::default()
            };
            let (zc, parts) =
                ZeroCandle::new(cfg, comm, HostDevice, options, |vb| gpt::parts(&CFG, vb)).unwrap();
            drop(Gpt::wrapped(&zc, parts).unwrap());
            zc.notes().unwrap()
        })
    };
    // Buckets of 4,000 elements split where the parts do.
    assert_eq!(notes(4000), Vec::<String>::new());
    // One bucket for the whole model: every part shares it.
    let all = notes(1_000_000);
    assert_eq!(all.len(), CFG.blocks + 2, "{all:?}");
    assert!(
        all[0].contains("`embed` shares a gathered bucket with head.out")
            && all[0].contains("5 more"),
        "{all:?}"
    );
}
