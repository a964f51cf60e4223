//! Prints docs/SCALING.md's projection: communication per micro-batch of ZeRO-3, shard
//! groups and hpZ for Llama-2 7B/13B/70B on 8 to 1,024 H100s, as markdown. A model
//! computed from byte counts (`zero_benches::scaling`), not a measurement.
//!
//! `cargo run -p zero-benches --release --bin scaling [-- --accumulation A]`

use zero_benches::scaling::{
    elements_per_param, model_state_bytes_per_gpu, project, Compute, Layout, Links, ModelShape,
    Scheme, H100_AT_40, IB_NDR_400, LLAMA_13B, LLAMA_70B, LLAMA_7B, MODEL_SOURCE, NVLINK4_H100,
    SCHEMES,
};

const GPUS: [u64; 5] = [8, 16, 64, 256, 1024];
const GPUS_PER_NODE: u64 = 8;
const BYTES_PER_ELEMENT: f64 = 2.0;
const HBM_BYTES: f64 = 80e9;

/// `1234567` as `1,234,567`.
fn thousands(x: u64) -> String {
    let digits = x.to_string();
    let head = match digits.len() % 3 {
        0 => 3,
        r => r,
    };
    let mut out = digits[..head].to_string();
    for group in digits.as_bytes()[head..].chunks(3) {
        out.push(',');
        out.push_str(std::str::from_utf8(group).expect("ASCII digits"));
    }
    out
}

/// The schemes that fit `n` GPUs, each layout once (at N = 16, shard groups of 2 nodes
/// are flat ZeRO-3; at N = 8, every scheme without hpZ is).
fn layouts(n: u64) -> Vec<(&'static Scheme, Layout)> {
    let mut out: Vec<(&'static Scheme, Layout)> = Vec::new();
    for scheme in &SCHEMES {
        if let Ok(layout) = scheme.layout(n, GPUS_PER_NODE) {
            if out.iter().all(|(_, l)| *l != layout) {
                out.push((scheme, layout));
            }
        }
    }
    out
}

fn usage() -> ! {
    eprintln!(
        "usage: scaling [--accumulation A]   (A: micro-batches per optimizer step, default 1)"
    );
    std::process::exit(2)
}

fn main() {
    let mut accumulation = 1u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--accumulation" => {
                accumulation = match args.next().and_then(|v| v.parse().ok()) {
                    Some(v) if v >= 1 => v,
                    _ => usage(),
                }
            }
            _ => usage(),
        }
    }
    let links = Links::achieved(&NVLINK4_H100, &IB_NDR_400);
    let compute: Compute = H100_AT_40;
    let models: [ModelShape; 3] = [LLAMA_7B, LLAMA_13B, LLAMA_70B];

    println!(
        "Printed by `cargo run -p zero-benches --release --bin scaling{}`. A model computed \
         from byte counts, not a measured cluster.",
        if accumulation == 1 {
            String::new()
        } else {
            format!(" -- --accumulation {accumulation}")
        }
    );
    println!();
    println!(
        "Assumptions: G = {GPUS_PER_NODE} GPUs per node; 16-bit parameters and gradients \
         ({BYTES_PER_ELEMENT} bytes per element); A = {accumulation} micro-batch(es) per \
         optimizer step (the replicas' all-reduce runs once per step); the two tiers' \
         transfers one after the other (not overlapping each other); compute \
         {}Ψ flops per token (no activation recompute, attention's own flops left out) at \
         {:.0}% MFU of {:.0} TFLOP/s = {:.1} TFLOP/s per GPU.",
        compute.flops_per_param_token,
        compute.mfu * 100.0,
        compute.peak_flops / 1e12,
        compute.peak_flops * compute.mfu / 1e12
    );
    println!();
    println!("| tier | link | spec | used (achieved bus bandwidth) | source |");
    println!("|---|---|---|---|---|");
    for (tier, l) in [("intra", &NVLINK4_H100), ("inter", &IB_NDR_400)] {
        println!(
            "| {tier} | {} | {} | {:.0} GB/s | {} |",
            l.name,
            l.spec,
            l.achieved_bytes_per_s / 1e9,
            l.source
        );
    }
    println!();
    println!("| model | parameters Ψ | hidden | layers | heads (key/value) | MLP width |");
    println!("|---|---:|---:|---:|---:|---:|");
    for m in &models {
        println!(
            "| {} | {} | {} | {} | {} ({}) | {} |",
            m.name,
            thousands(m.params()),
            m.hidden,
            m.layers,
            m.heads,
            m.kv_heads,
            thousands(m.intermediate)
        );
    }
    println!();
    println!("Shapes: {MODEL_SOURCE}.");
    println!();

    println!("### Elements per parameter per micro-batch, and the tokens that hide them");
    println!();
    println!(
        "Elements each GPU sends per micro-batch, per model parameter (×Ψ), by tier. The \
         tokens per GPU per micro-batch at which compute lasts as long as communication do \
         not depend on the model: both grow with Ψ."
    );
    println!();
    println!(
        "| GPUs | nodes | scheme | S | R | H | intra ×Ψ | inter ×Ψ | tokens/GPU to hide (tiers serial) | (tiers overlapped) |"
    );
    println!("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    let psi_any = LLAMA_7B.params();
    for n in GPUS {
        for (scheme, layout) in layouts(n) {
            let f = elements_per_param(&layout, accumulation).expect("a valid layout");
            let p = project(psi_any, f, BYTES_PER_ELEMENT, &links, &compute);
            println!(
                "| {} | {} | {} | {} | {} | {} | {:.3} | {:.3} | {} | {} |",
                thousands(n),
                layout.nodes(),
                scheme.name,
                layout.shard_size,
                layout.replicas(),
                if layout.hpz > 1 {
                    layout.hpz.to_string()
                } else {
                    "off".into()
                },
                f.intra,
                f.inter,
                thousands(p.hide_tokens.round() as u64),
                thousands(p.hide_tokens_tiers_overlapped.round() as u64)
            );
        }
    }
    println!();

    for m in &models {
        let psi = m.params();
        println!(
            "### {}: time per micro-batch and model states per GPU (Ψ = {:.2} B)",
            m.name,
            psi as f64 / 1e9
        );
        println!();
        println!(
            "| GPUs | scheme | intra GB | inter GB | intra ms | inter ms | total ms | model states GB/GPU |"
        );
        println!("|---:|---|---:|---:|---:|---:|---:|---:|");
        for n in GPUS {
            for (scheme, layout) in layouts(n) {
                let f = elements_per_param(&layout, accumulation).expect("a valid layout");
                let p = project(psi, f, BYTES_PER_ELEMENT, &links, &compute);
                let states = model_state_bytes_per_gpu(psi, &layout);
                println!(
                    "| {} | {} | {:.2} | {:.2} | {:.1} | {:.1} | {:.1} | {:.1}{} |",
                    thousands(n),
                    scheme.name,
                    p.bytes.intra / 1e9,
                    p.bytes.inter / 1e9,
                    p.seconds.intra * 1e3,
                    p.seconds.inter * 1e3,
                    p.seconds.total() * 1e3,
                    states / 1e9,
                    if states > HBM_BYTES {
                        " (over an H100's 80 GB)"
                    } else {
                        ""
                    }
                );
            }
        }
        println!();
    }
}
