//! The host staging moves a sub-group in chunks (4 Mi elements by default); cutting the
//! MLP's sub-groups into chunks of 3 elements (`ZERO_OFFLOAD_STAGE_ELEMENTS`, set before
//! any engine starts: this binary's tests set the same value first) changes no bit: the
//! offloaded step's staging, and with shard groups the window sums that cross back to the
//! device for the replicas' all-reduce.

use std::time::Duration;
use zero_comm::HostGroup;
use zero_runtime::{HostDevice, ZeroConfig};
use zero_tests::{
    bits, dataset, full_params, mlp_config, mlp_modules, run_ranks, run_ranks_config, seed,
    train_step, with_offload,
};

const CHUNK: &str = "3";

#[test]
fn chunked_staging_is_bit_identical() {
    std::env::set_var("ZERO_OFFLOAD_STAGE_ELEMENTS", CHUNK);
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

/// Four ranks as two nodes of two, shard groups of one node (`mics_shard_size` 2),
/// accumulation 3: each partition's window sum crosses back in chunks of 3 for the
/// replicas' all-reduce, and the run keeps the bits of the one without offload.
#[test]
fn chunked_replica_sync_is_bit_identical() {
    std::env::set_var("ZERO_OFFLOAD_STAGE_ELEMENTS", CHUNK);
    let seed = seed("offload_chunks shard groups");
    let (world, steps) = (4, 4);
    let base = mlp_config(3, "fp32", 3, 0.5, true);
    let data = dataset(seed, steps * world * 2 * 3);
    let run = |text: &str| {
        let mut v: serde_json::Value = serde_json::from_str(text).expect("json");
        v["zero_optimization"]["mics_shard_size"] = serde_json::json!(2);
        let mut cfg = ZeroConfig::from_json(&v, world).expect("config");
        cfg.ranks_per_node = Some(2);
        let comms = HostGroup::with_timeout(world, Duration::from_secs(30)).expect("group");
        run_ranks_config(
            comms,
            || HostDevice,
            cfg,
            seed,
            mlp_modules,
            |e| {
                for s in 0..steps {
                    train_step(e, &data, s, None).expect("step");
                }
                full_params(e).expect("params")
            },
        )
    };
    let want = run(&base);
    let got = run(&with_offload(
        &base,
        "offload_optimizer",
        &serde_json::json!({"device": "cpu"}),
        None,
    ));
    for (rank, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!(
            bits(a) == bits(b),
            "rank {rank}: chunks of {CHUNK} changed the result"
        );
    }
}
