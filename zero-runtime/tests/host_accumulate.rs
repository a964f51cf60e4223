//! The host device's gradient accumulation against an f64 reference: an f32 accumulator
//! takes any dtype; a 16-bit one (`data_types.grad_accum_dtype` the training dtype) takes
//! its own, each element the exact sum rounded to f32 and then to 16 bits (what torch's
//! `add_` on 16-bit tensors and the GPU's reduction kernel give), at an offset, with
//! non-finite values carried; a 16-bit accumulator refuses another dtype by name.

use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use zero_kernels::testing::fresh_seed;
use zero_kernels::DType;
use zero_runtime::{Device, HostDevice};

const LENGTHS: [usize; 6] = [0, 1, 3, 31, 257, 4099];
const OFFSET: usize = 5;

/// `n` seeded values in [-10, 10), with an inf, a -inf and a NaN planted where they fit.
fn values(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..n).map(|_| rng.gen_range(-10.0..10.0)).collect();
    for (i, x) in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN]
        .into_iter()
        .enumerate()
    {
        if n > 8 {
            let at = rng.gen_range(0..n);
            v[at] = x;
        } else if i < n && n > 2 {
            v[i] = x;
        }
    }
    v
}

/// A buffer of `dtype` holding `vals` rounded to it.
fn buffer(dtype: DType, vals: &[f32]) -> zero_comm::HostBuffer {
    let mut b = HostDevice.zeros(dtype, vals.len()).expect("buffer");
    HostDevice.upload_f32(&mut b, 0, vals).expect("fill");
    b
}

fn read(b: &zero_comm::HostBuffer) -> Vec<f32> {
    let n = HostDevice.len(b);
    // Poisoned: every element must be written.
    let mut out = vec![f32::from_bits(0x7fc0_dead); n];
    HostDevice
        .download_f32_into(b, 0..n, &mut out)
        .expect("download");
    out
}

/// Rounds an exact sum as the accumulator's dtype keeps it.
type Round = fn(f64) -> f32;

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn accumulators_sum_as_the_f64_reference_rounds() {
    let seed = fresh_seed("host accumulate");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let round16: [(DType, Round); 2] = [
        (DType::BF16, |x| bf16::from_f32(x as f32).to_f32()),
        (DType::F16, |x| f16::from_f32(x as f32).to_f32()),
    ];
    for n in LENGTHS {
        for (dtype, round) in round16 {
            let acc0 = values(&mut rng, n + OFFSET);
            let x0 = values(&mut rng, n);
            let mut acc = buffer(dtype, &acc0);
            let x = buffer(dtype, &x0);
            let (a_in, x_in) = (read(&acc), read(&x));
            HostDevice
                .accumulate(&mut acc, OFFSET, &x, 0..n)
                .expect("accumulate");
            let got = read(&acc);
            for i in 0..n + OFFSET {
                let want = if i < OFFSET {
                    a_in[i]
                } else {
                    round(f64::from(a_in[i]) + f64::from(x_in[i - OFFSET]))
                };
                assert!(
                    same(got[i], want),
                    "{dtype} n={n} [{i}]: {} + {} gave {}, want {want}",
                    a_in[i],
                    if i < OFFSET { 0.0 } else { x_in[i - OFFSET] },
                    got[i]
                );
            }
            // Another dtype into a 16-bit accumulator is refused, naming both.
            let wrong = buffer(DType::F32, &x0);
            let e = HostDevice
                .accumulate(&mut acc, OFFSET, &wrong, 0..n)
                .expect_err("a 16-bit accumulator took f32")
                .to_string();
            assert!(e.contains("f32") && e.contains(&dtype.to_string()), "{e}");
            // An f32 accumulator takes the 16-bit values exactly widened.
            let mut acc32 = buffer(DType::F32, &acc0);
            HostDevice
                .accumulate(&mut acc32, OFFSET, &x, 0..n)
                .expect("accumulate into f32");
            let got = read(&acc32);
            for i in OFFSET..n + OFFSET {
                let want = (f64::from(acc0[i]) + f64::from(x_in[i - OFFSET])) as f32;
                assert!(same(got[i], want), "f32 += {dtype} n={n} [{i}]");
            }
        }
    }
}
