//! The host staging moves a sub-group in chunks (4 Mi elements by default); cutting the
//! MLP's sub-groups into chunks of 3 elements (`ZERO_OFFLOAD_STAGE_ELEMENTS`, set before
//! any engine starts: this binary holds one test) changes no bit.

use zero_tests::{dataset, full_params, mlp_config, run_ranks, seed, train_step, with_offload};

#[test]
fn chunked_staging_is_bit_identical() {
    std::env::set_var("ZERO_OFFLOAD_STAGE_ELEMENTS", "3");
    let seed = seed("offload_chunks");
    let data = dataset(seed, 4 * 2 * 2 * 3);
    let base = mlp_config(3, "fp16", 3, 0.5, false);
    let run = |cfg: &str| {
        run_ranks(2, cfg, seed, |e| {
            let mut out = Vec::new();
            for s in 0..4 {
                train_step(e, &data, s, None).expect("step");
                let p = full_params(e).expect("params");
                out.extend(p.into_iter().flatten().flatten().map(f32::to_bits));
            }
            out
        })
    };
    let want = run(&base);
    let got = run(&with_offload(
        &base,
        "offload_optimizer",
        &serde_json::json!({"device": "cpu"}),
        Some(11),
    ));
    assert!(got == want, "chunks of 3 changed the result");
}
