use zero_kernels::WeightDecay;
use zero_runtime::config::{SchedulerConfig, WarmupType};
use zero_runtime::{ConfigError, GradAccumDtype, Precision, ZeroConfig};

const MIN: &str = r#""optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}"#;

fn parse(body: &str, world: usize) -> Result<ZeroConfig, ConfigError> {
    let sep = if body.is_empty() { "" } else { "," };
    ZeroConfig::from_json_str(&format!("{{{MIN}{sep}{body}}}"), world)
}

#[test]
fn defaults_are_deepspeeds() {
    let c = parse("", 4).unwrap();
    assert_eq!(
        (
            c.micro_batch_per_rank,
            c.gradient_accumulation_steps,
            c.train_batch_size
        ),
        (1, 1, 4)
    );
    assert_eq!(c.gradient_clipping, 1.0);
    assert_eq!(c.precision, Precision::Fp32);
    assert_eq!(c.zero.stage, 0);
    assert_eq!(c.zero.reduce_bucket_size, 500_000_000);
    assert_eq!(c.zero.prefetch_bucket_size, 50_000_000);
    assert_eq!(c.zero.param_persistence_threshold, 100_000);
    assert!(!c.zero.overlap_comm);
    assert_eq!(c.steps_per_print, 10);
    let c3 = parse(r#""zero_optimization": {"stage": 3}"#, 2).unwrap();
    assert!(
        c3.zero.overlap_comm,
        "overlap_comm defaults to true for stage 3"
    );
}

#[test]
fn scientific_numbers_and_auto_are_accepted() {
    let c = parse(
        r#""zero_optimization": {"stage": 2, "reduce_bucket_size": 5e7, "allgather_bucket_size": "auto"}, "gradient_clipping": "auto""#,
        2,
    )
    .unwrap();
    assert_eq!(c.zero.reduce_bucket_size, 50_000_000);
    assert_eq!(c.gradient_clipping, 1.0);
    assert!(
        c.notes.iter().any(|n| n.contains("allgather_bucket_size")),
        "{:?}",
        c.notes
    );
    let e = parse(r#""zero_optimization": {"reduce_bucket_size": 2.5}"#, 2).unwrap_err();
    assert!(e.to_string().contains("reduce_bucket_size"), "{e}");
}

#[test]
fn any_two_batch_keys_imply_the_third_and_a_bad_triple_is_an_error() {
    let c = parse(
        r#""train_batch_size": 24, "train_micro_batch_size_per_gpu": 2"#,
        4,
    )
    .unwrap();
    assert_eq!(c.gradient_accumulation_steps, 3);
    let c = parse(
        r#""train_batch_size": 24, "gradient_accumulation_steps": 3"#,
        4,
    )
    .unwrap();
    assert_eq!(c.micro_batch_per_rank, 2);
    let c = parse(
        r#""train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3"#,
        4,
    )
    .unwrap();
    assert_eq!(c.train_batch_size, 24);
    let c = parse(
        r#""train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3"#,
        4,
    )
    .unwrap();
    assert_eq!(c.train_batch_size, 24);
    let e = parse(
        r#""train_batch_size": 25, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3"#,
        4,
    )
    .unwrap_err();
    assert!(matches!(e, ConfigError::Inconsistent(_)), "{e}");
    assert!(e.to_string().contains("25"), "{e}");
    let e = parse(
        r#""train_batch_size": 10, "train_micro_batch_size_per_gpu": 4"#,
        2,
    )
    .unwrap_err();
    assert!(e.to_string().contains("not divisible"), "{e}");
}

#[test]
fn misspelled_keys_name_the_closest_known_key() {
    let e = parse(
        r#""zero_optimization": {"stage": 2, "reduce_bucket_sise": 100}"#,
        2,
    )
    .unwrap_err();
    assert_eq!(
        e,
        ConfigError::UnknownKey {
            key: "zero_optimization.reduce_bucket_sise".into(),
            suggestion: Some("reduce_bucket_size".into())
        }
    );
    assert!(
        e.to_string().contains("did you mean `reduce_bucket_size`"),
        "{e}"
    );
    let e = parse(r#""gradient_cliping": 1.0"#, 2).unwrap_err();
    assert!(e.to_string().contains("gradient_clipping"), "{e}");
    let e = parse(r#""fp16": {"enabled": true, "loss_scale_windo": 10}"#, 2).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("fp16.loss_scale_windo") && msg.contains("loss_scale_window"),
        "{msg}"
    );
    let e = parse(r#""completely_unrelated": 1"#, 2).unwrap_err();
    assert_eq!(
        e,
        ConfigError::UnknownKey {
            key: "completely_unrelated".into(),
            suggestion: None
        }
    );
}

#[test]
fn known_but_unsupported_keys_say_so() {
    let e = parse(
        r#""zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}"#,
        2,
    )
    .unwrap_err();
    assert!(matches!(e, ConfigError::Unsupported { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("offload_optimizer.ratio") && msg.contains("Twin-Flow"),
        "{msg}"
    );
    // At stage 3 DeepSpeed's partial offload is accepted: zero offloads all of it.
    let c = parse(
        r#""zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}"#,
        2,
    )
    .unwrap();
    assert!(c.notes.iter().any(|n| n.contains("ratio")), "{:?}", c.notes);
    assert!(parse(
        r#""zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"}}"#,
        2
    )
    .is_ok());
    let e = parse(
        r#""zero_optimization": {"stage": 1, "reduce_scatter": false}"#,
        2,
    )
    .unwrap_err();
    assert!(e.to_string().contains("reduce-scatter"), "{e}");
    let e = parse(
        r#""zero_optimization": {"zero_quantized_weights": true}"#,
        2,
    )
    .unwrap_err();
    assert!(e.to_string().contains("not supported yet"), "{e}");
    // A ZeRO++ config's quantization keys say what zero does instead.
    assert!(
        e.to_string().contains("(qwZ)") && e.to_string().contains("zero_hpz_partition_size"),
        "{e}"
    );
    let e = parse(
        r#""zero_optimization": {"stage": 3, "zero_quantized_gradients": true}"#,
        2,
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("zero_quantized_gradients") && e.to_string().contains("(qgZ)"),
        "{e}"
    );
    // The DeepSpeed default of an unimplemented key changes nothing and is accepted.
    assert!(parse(
        r#""zero_optimization": {"zero_quantized_weights": false}"#,
        2
    )
    .is_ok());
    let e = parse(
        r#""activation_checkpointing": {"partition_activations": true}"#,
        2,
    )
    .unwrap_err();
    assert!(e.to_string().contains("activation_checkpointing"), "{e}");
}

#[test]
fn precision_and_optimizer_sections() {
    let c = parse(
        r#""fp16": {"enabled": true, "initial_scale_power": 8, "hysteresis": 3}"#,
        1,
    )
    .unwrap();
    match c.precision {
        Precision::Fp16(l) => {
            assert_eq!(
                (
                    l.loss_scale,
                    l.initial_scale_power,
                    l.hysteresis,
                    l.loss_scale_window
                ),
                (0.0, 8, 3, 1000)
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        parse(r#""bf16": {"enabled": true}"#, 1).unwrap().precision,
        Precision::Bf16
    );
    let e = parse(r#""bf16": {"enabled": true}, "fp16": {"enabled": true}"#, 1).unwrap_err();
    assert!(matches!(e, ConfigError::Inconsistent(_)));
    let c = ZeroConfig::from_json_str(
        r#"{"optimizer": {"type": "Adam", "params": {"lr": 0.01, "betas": [0.8, 0.99], "weight_decay": 0.1, "adam_w_mode": false}}}"#,
        1,
    )
    .unwrap();
    assert_eq!(adam(&c).decay, WeightDecay::L2);
    assert_eq!((adam(&c).beta1, adam(&c).beta2), (0.8, 0.99));
    let c = ZeroConfig::from_json_str(
        r#"{"optimizer": {"type": "Adam", "params": {"weight_decay": 0.1}}}"#,
        1,
    )
    .unwrap();
    assert_eq!(
        adam(&c).decay,
        WeightDecay::Decoupled,
        "DeepSpeed's Adam defaults to adam_w_mode=true"
    );
    let e = ZeroConfig::from_json_str(
        r#"{"optimizer": {"type": "Adam", "params": {"betas": [0.9, 1.5]}}}"#,
        1,
    )
    .unwrap_err();
    assert!(e.to_string().contains("beta2"), "{e}");
}

#[test]
fn schedulers_parse_with_defaults() {
    let c = parse(
        r#""scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}"#,
        1,
    )
    .unwrap();
    let want = SchedulerConfig::WarmupLr {
        min_lr: 0.0,
        max_lr: None,
        warmup_steps: 10,
        warmup: WarmupType::Log,
    };
    assert_eq!(c.scheduler, Some(want));
    let e = parse(
        r#""scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto"}}"#,
        1,
    )
    .unwrap_err();
    assert!(e.to_string().contains("total_num_steps"), "{e}");
    let e = parse(r#""scheduler": {"type": "OneCycle"}"#, 1).unwrap_err();
    assert!(matches!(e, ConfigError::Unsupported { .. }), "{e}");
}

#[test]
fn not_json_is_an_error() {
    assert!(matches!(
        ZeroConfig::from_json_str("{", 1),
        Err(ConfigError::Json(_))
    ));
}

#[test]
fn offload_keys_take_deepspeeds_names_defaults_and_legacy_forms() {
    use zero_runtime::config::OffloadDevice;
    let c = parse(r#""zero_optimization": {"stage": 3}"#, 2).unwrap();
    let (o, p) = (&c.zero.offload_optimizer, &c.zero.offload_param);
    assert_eq!(
        (o.device, o.pin_memory, o.buffer_count),
        (OffloadDevice::None, true, 4)
    );
    assert_eq!(
        (p.device, p.buffer_count, p.buffer_size, p.max_in_cpu),
        (OffloadDevice::None, 5, 100_000_000, 1_000_000_000)
    );
    assert_eq!(
        (
            c.aio.block_size,
            c.aio.queue_depth,
            c.aio.intra_op_parallelism
        ),
        (1 << 20, 8, 1)
    );
    assert_eq!(c.zero.sub_group_size, 1_000_000_000);

    let c = parse(
        r#""zero_optimization": {"stage": 3, "sub_group_size": 1e6,
            "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme", "pin_memory": false, "buffer_count": 6},
            "offload_param": {"device": "cpu", "buffer_size": 5e7}},
           "aio": {"block_size": 262144, "queue_depth": 16, "thread_count": 4}"#,
        2,
    )
    .unwrap();
    assert_eq!(c.zero.offload_optimizer.device, OffloadDevice::Nvme);
    assert_eq!(
        c.zero.offload_optimizer.nvme_path.as_deref(),
        Some(std::path::Path::new("/nvme"))
    );
    assert!(!c.zero.offload_optimizer.pin_memory);
    assert_eq!(c.zero.offload_param.device, OffloadDevice::Cpu);
    assert_eq!(c.zero.offload_param.buffer_size, 50_000_000);
    assert_eq!(c.zero.sub_group_size, 1_000_000);
    // The older name thread_count is read (DeepSpeed ignores it silently), and said so.
    assert_eq!(c.aio.intra_op_parallelism, 4);
    assert!(
        c.notes.iter().any(|n| n.contains("thread_count")),
        "{:?}",
        c.notes
    );

    // DeepSpeed's legacy keys.
    let c = parse(
        r#""zero_optimization": {"stage": 3, "cpu_offload": true, "cpu_offload_param": true, "cpu_offload_use_pin_memory": true}"#,
        2,
    )
    .unwrap();
    assert_eq!(c.zero.offload_optimizer.device, OffloadDevice::Cpu);
    assert_eq!(c.zero.offload_param.device, OffloadDevice::Cpu);
    assert!(
        c.notes.iter().any(|n| n.contains("cpu_offload")),
        "{:?}",
        c.notes
    );

    // offload_param below stage 3 is ignored, as DeepSpeed ignores it (said in a note);
    // memory_efficient_linear takes either value.
    for stage in 0..3 {
        let c = parse(
            &format!(
                r#""zero_optimization": {{"stage": {stage}, "offload_param": {{"device": "cpu"}}, "memory_efficient_linear": false}}"#
            ),
            2,
        )
        .unwrap();
        assert_eq!(c.zero.offload_param.device, OffloadDevice::None);
        assert!(
            c.notes
                .iter()
                .any(|n| n.contains("offload_param is ignored")),
            "{:?}",
            c.notes
        );
    }
    let e = parse(
        r#""zero_optimization": {"stage": 3, "memory_efficient_linear": "no"}"#,
        2,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("memory_efficient_linear"), "{e}");

    // What is refused, naming the key.
    for (text, key) in [
        (
            r#""zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}"#,
            "nvme_path",
        ),
        (
            r#""zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}"#,
            "stage 1, 2 or 3",
        ),
        (
            r#""zero_optimization": {"stage": 2, "offload_optimizer": {"device": "disk"}}"#,
            "none, cpu or nvme",
        ),
        (r#""aio": {"use_gds": true}"#, "GPUDirect"),
        (
            r#""aio": {"intra_op_parallelism": 2, "thread_count": 3}"#,
            "disagree",
        ),
        (r#""aio": {"block_size": 1000}"#, "4096"),
    ] {
        let e = parse(text, 2).unwrap_err().to_string();
        assert!(e.contains(key), "{text}: {e}");
    }
}

#[test]
fn a_config_without_an_optimizer_has_none_as_in_deepspeed() {
    let c = ZeroConfig::from_json_str(r#"{"zero_optimization": {"stage": 1}}"#, 2).unwrap();
    assert_eq!(c.optimizer, None);
    // A section without a type is no optimizer for DeepSpeed either.
    let c = ZeroConfig::from_json_str(r#"{"optimizer": {"params": {"lr": 0.1}}}"#, 2).unwrap();
    assert_eq!(c.optimizer, None);
}

/// The defaults of the optimizer DeepSpeed 0.19.8 builds for each section
/// (`_configure_basic_optimizer`): FusedAdam / DeepSpeedCPUAdam decay by 0 unless told;
/// `torch_adam` builds torch.optim.AdamW, whose weight decay defaults to 0.01.
#[test]
fn optimizer_defaults_are_deepspeeds() {
    for (text, name, wd, decay) in [
        (r#"{"type": "AdamW"}"#, "adamw", 0.0, WeightDecay::Decoupled),
        (
            r#"{"type": "adamw", "params": {"lr": 0.1}}"#,
            "adamw",
            0.0,
            WeightDecay::Decoupled,
        ),
        (r#"{"type": "Adam"}"#, "adam", 0.0, WeightDecay::Decoupled),
        (
            r#"{"type": "Adam", "params": {"adam_w_mode": false}}"#,
            "adam",
            0.0,
            WeightDecay::L2,
        ),
        (
            r#"{"type": "AdamW", "params": {"torch_adam": true}}"#,
            "adamw",
            0.01,
            WeightDecay::Decoupled,
        ),
        (
            r#"{"type": "Adam", "params": {"torch_adam": true}}"#,
            "adam",
            0.01,
            WeightDecay::Decoupled,
        ),
        (
            r#"{"type": "Adam", "params": {"torch_adam": true, "adam_w_mode": false}}"#,
            "adam",
            0.0,
            WeightDecay::L2,
        ),
    ] {
        let c = ZeroConfig::from_json_str(&format!(r#"{{"optimizer": {text}}}"#), 1).unwrap();
        let o = c.optimizer.clone().unwrap();
        let a = adam(&c);
        assert_eq!(o.name, name, "{text}");
        assert_eq!((a.weight_decay, a.decay), (wd, decay), "{text}");
        assert_eq!(
            (a.beta1, a.beta2, a.eps, a.bias_correction),
            (0.9, 0.999, 1e-8, true),
            "{text}"
        );
        if !text.contains("lr") {
            assert_eq!(a.lr, 1e-3, "{text}");
        }
    }
}

#[test]
fn other_optimizers_are_external_or_refused_by_name() {
    let c = ZeroConfig::from_json_str(
        r#"{"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}}"#,
        1,
    )
    .unwrap();
    let o = c.optimizer.unwrap();
    assert_eq!((o.name.as_str(), o.adam), ("SGD", None));
    assert_eq!(o.params["momentum"], 0.9);
    let e = o.adam().unwrap_err().to_string();
    assert!(e.contains("SGD") && e.contains("torch.optim"), "{e}");
    let c = ZeroConfig::from_json_str(r#"{"optimizer": {"type": "adagrad"}}"#, 1).unwrap();
    assert_eq!(c.optimizer.unwrap().name, "Adagrad");
    for ty in ["Lamb", "OneBitAdam", "Lion", "Muon"] {
        let e = ZeroConfig::from_json_str(&format!(r#"{{"optimizer": {{"type": "{ty}"}}}}"#), 1)
            .unwrap_err();
        assert!(e.to_string().contains(ty), "{e}");
    }
    let e = ZeroConfig::from_json_str(
        r#"{"optimizer": {"type": "Adam", "params": {"max_grad_norm": 1.0}}}"#,
        1,
    )
    .unwrap_err();
    assert!(e.to_string().contains("gradient_clipping"), "{e}");
}

/// The fused Adam's hyper-parameters of a config that has them.
fn adam(c: &ZeroConfig) -> zero_runtime::kernels::AdamConfig {
    c.optimizer
        .as_ref()
        .and_then(|o| o.adam)
        .expect("an Adam optimizer")
}

/// DeepSpeed's keys for features zero does not implement: accepted while disabled (as
/// DeepSpeed's defaults leave them), a named error when enabled; `bfloat16` is `bf16`;
/// keys that change nothing zero computes are accepted.
#[test]
fn deepspeed_keys_are_accepted_when_they_change_nothing_and_named_when_they_would() {
    for ok in [
        r#""torch_autocast": {"enabled": false, "dtype": "bfloat16"}"#,
        r#""hybrid_engine": {"enabled": false, "max_out_tokens": 512}"#,
        r#""compile": {"deepcompile": false}"#,
        r#""tensorboard": {"enabled": false, "output_path": "x"}"#,
        r#""zero_allow_untested_optimizer": true"#,
        r#""zero_force_ds_cpu_optimizer": false"#,
        r#""memory_breakdown": true"#,
        r#""communication_data_type": "fp32""#,
        r#""amp": {"enabled": false}"#,
        r#""steps_per_print": 1e300"#,
    ] {
        parse(ok, 1).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for (bad, named) in [
        (r#""torch_autocast": {"enabled": true}"#, "torch_autocast"),
        (r#""hybrid_engine": {"enabled": true}"#, "hybrid"),
        (r#""compile": {"deepcompile": true}"#, "DeepCompile"),
        (r#""wandb": {"enabled": true}"#, "Weights & Biases"),
        (
            r#""elasticity": {"enabled": true}"#,
            "removed in DeepSpeed 0.19",
        ),
        (
            r#""communication_data_type": "fp32", "bf16": {"enabled": true}"#,
            "communication_data_type",
        ),
        (r#""gradient_allreduce_op": "sum""#, "gradient_allreduce_op"),
    ] {
        let e = parse(bad, 1).unwrap_err().to_string();
        assert!(e.contains(named), "{bad}: {e}");
    }
    assert_eq!(
        parse(r#""bfloat16": {"enabled": true}"#, 1)
            .unwrap()
            .precision,
        Precision::Bf16
    );
    let c = parse(r#""zero_optimization": {"stage": 3, "prefetch_bucket_size": 7, "param_persistence_threshold": 9}"#, 1).unwrap();
    assert_eq!(
        (
            c.zero.prefetch_bucket_size,
            c.zero.param_persistence_threshold
        ),
        (7, 9)
    );
    let e = parse(r#""zero_optimization": {"stage": 3, "prefetch_bucket_size": 7, "stage3_prefetch_bucket_size": 9}"#, 1).unwrap_err();
    assert!(e.to_string().contains("prefetch_bucket_size"), "{e}");
    // A misspelling is still an error with a suggestion.
    let e = parse(r#""zero_allow_untested_optimiser": true"#, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown config key"), "{e}");
}

/// `data_types.grad_accum_dtype`: DeepSpeed's default sums in the training dtype; `fp32`
/// (any of torch's names for it) sums 16-bit gradients in fp32; a third dtype, an unknown
/// name, or a `param_dtype` other than the training dtype are errors naming the key.
#[test]
fn grad_accum_dtype_is_read_as_deepspeed_reads_it() {
    let bf16 = r#""bf16": {"enabled": true}"#;
    let fp16 = r#""fp16": {"enabled": true}"#;
    for (body, want) in [
        (String::new(), GradAccumDtype::Model),
        (bf16.to_string(), GradAccumDtype::Model),
        (
            format!(r#"{bf16}, "data_types": {{"grad_accum_dtype": "bf16"}}"#),
            GradAccumDtype::Model,
        ),
        (
            format!(r#"{bf16}, "data_types": {{"grad_accum_dtype": "fp32"}}"#),
            GradAccumDtype::Fp32,
        ),
        (
            format!(r#"{fp16}, "data_types": {{"grad_accum_dtype": "torch.float32"}}"#),
            GradAccumDtype::Fp32,
        ),
        (
            format!(
                r#"{fp16}, "data_types": {{"grad_accum_dtype": "half", "param_dtype": "fp16"}}"#
            ),
            GradAccumDtype::Model,
        ),
        (
            r#""data_types": {"grad_accum_dtype": "float", "keep_in_fp32_modules": "auto"}"#
                .to_string(),
            GradAccumDtype::Model,
        ),
    ] {
        let c = parse(&body, 1).unwrap_or_else(|e| panic!("{body}: {e}"));
        assert_eq!(c.grad_accum_dtype, want, "{body}");
    }
    for (body, named) in [
        (
            format!(r#"{bf16}, "data_types": {{"grad_accum_dtype": "fp16"}}"#),
            "`fp16` with bf16 training",
        ),
        (
            r#""data_types": {"grad_accum_dtype": "bf16"}"#.to_string(),
            "data_types.grad_accum_dtype",
        ),
        (
            r#""data_types": {"grad_accum_dtype": "int8"}"#.to_string(),
            "`int8`: expected fp32, fp16 or bf16",
        ),
        (
            format!(r#"{bf16}, "data_types": {{"param_dtype": "fp32"}}"#),
            "data_types.param_dtype",
        ),
        (
            r#""data_types": {"buffer_dtype": "bf16"}"#.to_string(),
            "data_types.buffer_dtype",
        ),
    ] {
        let e = parse(&body, 1).unwrap_err().to_string();
        assert!(e.contains(named), "{body}: {e}");
    }
}
