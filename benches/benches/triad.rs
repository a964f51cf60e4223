//! STREAM-style triad `a[i] = b[i] + s·c[i]` on all threads: the memory-bandwidth roofline
//! every CPU kernel is measured against. Counted as 3 arrays × 4 bytes per element.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rayon::prelude::*;
use zero_benches::{config, fill, label, SIZES};
use zero_kernels::PAR_CHUNK;

fn triad(c: &mut Criterion) {
    let mut g = c.benchmark_group("triad");
    for &n in &SIZES {
        let mut a = vec![0f32; n];
        let mut b = vec![0f32; n];
        let mut cc = vec![0f32; n];
        fill(&mut b, 1);
        fill(&mut cc, 2);
        let s = 3.0f32;
        g.throughput(Throughput::Bytes((3 * 4 * n) as u64));
        g.bench_function(label(n), |bench| {
            bench.iter(|| {
                a.par_chunks_mut(PAR_CHUNK)
                    .zip(b.par_chunks(PAR_CHUNK).zip(cc.par_chunks(PAR_CHUNK)))
                    .for_each(|(a, (b, c))| {
                        for ((a, b), c) in a.iter_mut().zip(b).zip(c) {
                            *a = *b + s * *c;
                        }
                    });
                std::hint::black_box(&a);
            })
        });
    }
    g.finish();
}

criterion_group! { name = benches; config = config(); targets = triad }
criterion_main!(benches);
