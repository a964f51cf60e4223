//! Cross-crate: a ZeRO-style sharded step built from the kernels and the host collectives
//! (flatten → reduce-scatter of gradients → Adam on the owned partition → all-gather of the
//! 16-bit parameters → unflatten) gives the same bits as one process doing Adam on the
//! whole model with the rank-order averaged gradients.

use half::bf16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use zero_comm::{Communicator, Completion, HostBuffer, HostGroup, ReduceOp};
use zero_kernels::{adam_step, flatten, unflatten, AdamConfig, DType, Element, FlatLayout};

fn seeded() -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(zero_kernels::testing::fresh_seed("sharded_adam"))
}

#[test]
fn sharded_step_equals_whole_model_step_bit_for_bit() {
    let mut rng = seeded();
    for world in [1, 2, 3, 5] {
        // Sizes include one smaller than the world and one no rank boundary respects.
        let sizes = [1, 7, 1023, 300, 2];
        let layout = FlatLayout::new(&sizes, DType::BF16, 8, world).unwrap();
        let n = layout.total_len();
        let params: Vec<Vec<f32>> = sizes
            .iter()
            .map(|&s| (0..s).map(|_| rng.gen_range(-1.0..1.0)).collect())
            .collect();
        let grads: Vec<Vec<Vec<f32>>> = (0..world)
            .map(|_| {
                sizes
                    .iter()
                    .map(|&s| (0..s).map(|_| rng.gen_range(-1.0..1.0)).collect())
                    .collect()
            })
            .collect();
        let cfg = AdamConfig::adamw(1e-2);
        let flat_of = |ts: &[Vec<f32>]| {
            let srcs: Vec<&[f32]> = ts.iter().map(|t| &t[..]).collect();
            let mut f = vec![bf16::ZERO; n];
            flatten(&layout, &srcs, &mut f).unwrap();
            f
        };
        let mut master0 = vec![0f32; n];
        {
            let srcs: Vec<&[f32]> = params.iter().map(|t| &t[..]).collect();
            flatten(&layout, &srcs, &mut master0).unwrap();
        }

        // Reference: one process, gradients averaged in rank order in f32, rounded to bf16.
        let flat_grads: Vec<Vec<bf16>> = grads.iter().map(|g| flat_of(g)).collect();
        let avg: Vec<bf16> = (0..n)
            .map(|i| {
                let mut a = flat_grads[0][i].to_f32();
                for g in &flat_grads[1..] {
                    a += g[i].to_f32();
                }
                <bf16 as Element>::from_f32(a / world as f32)
            })
            .collect();
        let (mut w, mut m, mut v) = (master0.clone(), vec![0f32; n], vec![0f32; n]);
        let mut want = vec![bf16::ZERO; n];
        adam_step(&cfg, 1, 1.0, &mut w, &mut m, &mut v, &avg, Some(&mut want)).unwrap();

        // Sharded: each rank owns one partition of master, m and v.
        let results: Vec<Vec<bf16>> = std::thread::scope(|s| {
            let hs: Vec<_> = HostGroup::new(world)
                .unwrap()
                .into_iter()
                .map(|comm| {
                    let (layout, master0, flat_grads) = (&layout, &master0, &flat_grads);
                    s.spawn(move || {
                        let r = comm.rank();
                        let part = layout.partition_range(r).unwrap();
                        let grads = HostBuffer::from(flat_grads[r].clone());
                        let shard = HostBuffer::zeros(DType::BF16, part.len());
                        let (_, shard) = comm
                            .reduce_scatter(grads, shard, ReduceOp::Avg)
                            .unwrap()
                            .wait()
                            .unwrap();
                        let shard = shard.into_bf16().unwrap();
                        let mut w = master0[part.clone()].to_vec();
                        let (mut m, mut v) = (vec![0f32; part.len()], vec![0f32; part.len()]);
                        let mut p16 = vec![bf16::ZERO; part.len()];
                        adam_step(&cfg, 1, 1.0, &mut w, &mut m, &mut v, &shard, Some(&mut p16))
                            .unwrap();
                        let out = HostBuffer::zeros(DType::BF16, layout.total_len());
                        let (_, full) = comm
                            .all_gather(HostBuffer::from(p16), out)
                            .unwrap()
                            .wait()
                            .unwrap();
                        full.into_bf16().unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, got) in results.iter().enumerate() {
            // Compare tensor by tensor through unflatten (padding is not a parameter).
            let unflat = |flat: &[bf16]| {
                let mut outs: Vec<Vec<f32>> = sizes.iter().map(|&s| vec![f32::NAN; s]).collect();
                let mut dsts: Vec<&mut [f32]> = outs.iter_mut().map(|t| &mut t[..]).collect();
                unflatten(&layout, flat, &mut dsts).unwrap();
                outs
            };
            let (g, w) = (unflat(got), unflat(&want));
            for (t, (a, b)) in g.iter().zip(&w).enumerate() {
                let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same,
                    "world {world} rank {r}: tensor {t} differs from the whole-model step"
                );
            }
        }
    }
}
