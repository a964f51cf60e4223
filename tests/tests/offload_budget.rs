//! A host-memory budget too small for the offloaded state stops the engine at start-up
//! with an error naming what needed how much, and how to raise it — never an allocation
//! failure mid-run. (`ZERO_HOST_MEMORY_BUDGET` is process-wide: this binary holds one
//! test.)

use serde_json::json;
use zero_runtime::{Engine, HostDevice, ZeroConfig};
use zero_tests::{init_values, mlp_config, mlp_modules, with_offload};

#[test]
fn a_host_budget_too_small_is_an_error_at_start_up() {
    std::env::set_var("ZERO_HOST_MEMORY_BUDGET", "1000");
    let cfg = with_offload(
        &mlp_config(1, "bf16", 1, 0.0, false),
        "offload_optimizer",
        &json!({"device": "cpu"}),
        None,
    );
    let cfg = ZeroConfig::from_json_str(&cfg, 1).unwrap();
    let comm = zero_comm::HostGroup::new(1).unwrap().remove(0);
    let e = Engine::new(cfg, mlp_modules(), comm, HostDevice, |id, _, v| {
        init_values(1, id, v)
    })
    .err()
    .expect("the budget is too small")
    .to_string();
    assert!(
        e.contains("host memory")
            && e.contains("budget of 1000")
            && e.contains("ZERO_HOST_MEMORY_BUDGET"),
        "{e}"
    );
}
