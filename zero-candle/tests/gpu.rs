//! zero-candle with the engine on a GPU: candle computes forward and backward on its CPU
//! device, the engine keeps the parameters, gradients and optimizer state on the GPU
//! (`CudaDevice`, ranks as threads sharing the one GPU through `DeviceGroup`). Without
//! clipping the GPU engine gives the host engine's parameters bit for bit
//! (ARCHITECTURE.md, invariant 11), so the same GPT trained through the adapter on both
//! must agree to the bit, in every stage. Without a GPU it prints a visible skip.

use candle_core::{Device, Tensor};
use std::time::Duration;
use zero_candle::gpt::{self, Gpt, GptConfig};
use zero_candle::{Options, ZeroCandle};
use zero_comm::{Communicator, DeviceGroup, HostGroup};
use zero_kernels::testing::{canonical_bits, gpu_or_skip};
use zero_runtime::{CudaDevice, Device as EngineDevice, Engine, HostDevice, ZeroConfig};

const CFG: GptConfig = GptConfig {
    vocab: 8,
    context: 6,
    dim: 16,
    heads: 2,
    blocks: 2,
};
const WORLD: usize = 2;

fn config(stage: u8) -> ZeroConfig {
    let json = format!(
        r#"{{"train_micro_batch_size_per_gpu": 2, "bf16": {{"enabled": true}}, "gradient_clipping": 0.0,
            "optimizer": {{"type": "AdamW", "params": {{"lr": 0.01}}}},
            "zero_optimization": {{"stage": {stage}, "reduce_bucket_size": 700, "stage3_param_persistence_threshold": 16}}}}"#
    );
    ZeroConfig::from_json_str(&json, WORLD).unwrap()
}

/// Rank 0's parameters after 4 steps, as canonical bits.
fn train<C, D>(stage: u8, comms: Vec<C>, device: impl Fn() -> D + Sync) -> Vec<u32>
where
    C: Communicator + 'static,
    D: EngineDevice<Buffer = C::Buffer> + 'static,
    Engine<C, D>: Send,
{
    let mut out: Vec<Vec<u32>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let device = &device;
                s.spawn(move || {
                    let r = comm.rank() as u32;
                    let options = Options {
                        grouping: GptConfig::grouping(),
                        seed: 5,
                        ..Default::default()
                    };
                    let (zc, parts) =
                        ZeroCandle::new(config(stage), comm, device(), options, |vb| {
                            gpt::parts(&CFG, vb)
                        })
                        .unwrap();
                    let model = Gpt::wrapped(&zc, parts).unwrap();
                    for step in 0..4u32 {
                        let ids: Vec<u32> = (0..12).map(|i| (i * 5 + step * 3 + r) % 8).collect();
                        let x = Tensor::from_vec(ids.clone(), (2, 6), &Device::Cpu).unwrap();
                        let y = Tensor::from_vec(
                            ids.iter().map(|i| (i * 3 + 1) % 8).collect(),
                            (2, 6),
                            &Device::Cpu,
                        )
                        .unwrap();
                        zc.backward(&model.loss(&x, &y, 0).unwrap()).unwrap();
                        zc.step().unwrap();
                    }
                    let values: Vec<f32> = zc
                        .named_params()
                        .unwrap()
                        .into_iter()
                        .flat_map(|(_, t)| t.flatten_all().unwrap().to_vec1::<f32>().unwrap())
                        .collect();
                    canonical_bits(&values)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    out.swap_remove(0)
}

#[test]
fn the_engine_on_a_gpu_trains_a_candle_model_to_the_host_engines_bits() {
    let Some(_gpu) = gpu_or_skip("zero-candle with the engine on CudaDevice") else {
        return;
    };
    for stage in 0..=3 {
        let host = train(stage, HostGroup::new(WORLD).unwrap(), || HostDevice);
        let comms = DeviceGroup::with_timeout(WORLD, Duration::from_secs(60)).unwrap();
        let gpu = train(stage, comms, || CudaDevice::new().expect("device"));
        assert_eq!(
            gpu, host,
            "stage {stage}: the GPU engine differs from the host engine"
        );
        println!(
            "stage {stage}: GPU engine = host engine, {} values",
            host.len()
        );
    }
}
