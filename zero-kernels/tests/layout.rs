mod common;

use common::*;
use rand::Rng;
use zero_kernels::{DType, FlatLayout};

#[test]
fn every_element_is_owned_by_exactly_one_rank_and_partitions_are_aligned() {
    let mut rng = seeded("layout");
    for _ in 0..200 {
        let count = rng.gen_range(0..12);
        let sizes: Vec<usize> = (0..count)
            .map(|_| match rng.gen_range(0..4) {
                0 => 0,
                1 => rng.gen_range(1..4),
                2 => rng.gen_range(1..200),
                _ => rng.gen_range(1..5000),
            })
            .collect();
        let align = [1, 2, 8, 64][rng.gen_range(0..4)];
        let world = rng.gen_range(1..9);
        let l = FlatLayout::new(&sizes, DType::BF16, align, world).unwrap();
        let ctx = format!("sizes={sizes:?} align={align} world={world}");
        assert_eq!(l.total_len() % (world * align), 0, "{ctx}");
        assert_eq!(l.partition_len() % align, 0, "{ctx}");
        assert_eq!(l.numel() + l.padding(), l.total_len(), "{ctx}");
        let mut owner = vec![usize::MAX; l.total_len()];
        for rank in 0..world {
            let part = l.partition_range(rank).unwrap();
            for s in l.shards(rank).unwrap() {
                assert!(
                    part.start <= s.flat_range.start && s.flat_range.end <= part.end,
                    "{ctx}"
                );
                let t = l.tensor_range(s.tensor);
                assert_eq!(s.flat_range.start - t.start, s.tensor_range.start, "{ctx}");
                assert_eq!(s.flat_range.len(), s.tensor_range.len(), "{ctx}");
                for e in s.flat_range.clone() {
                    assert_eq!(owner[e], usize::MAX, "{ctx}: element {e} owned twice");
                    owner[e] = rank;
                }
            }
        }
        let mut prev_end = 0;
        for (i, &size) in sizes.iter().enumerate() {
            let t = l.tensor_range(i);
            assert_eq!(t.start % align, 0, "{ctx}");
            assert!(t.start >= prev_end, "{ctx}: tensors overlap");
            prev_end = t.end;
            assert_eq!(t.len(), size, "{ctx}");
            assert!(
                t.clone().all(|e| owner[e] != usize::MAX),
                "{ctx}: tensor {i} not fully owned"
            );
            // tensor_shards agrees with shards, in rank order.
            let ts = l.tensor_shards(i).unwrap();
            assert_eq!(
                ts.iter().map(|s| s.tensor_range.len()).sum::<usize>(),
                size,
                "{ctx}"
            );
            assert!(ts.windows(2).all(|w| w[0].rank < w[1].rank), "{ctx}");
            for s in ts {
                assert!(l.shards(s.rank).unwrap().contains(&s), "{ctx}");
            }
        }
    }
}
