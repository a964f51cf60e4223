// Non-finite check and sum of squares in one pass. Pass 1: each block writes the sum (f64)
// and the non-finite flag of its grid-stride share; pass 2 (one block) adds the block
// partials in the same fixed tree order. For a fixed launch shape the result is
// deterministic.

#define STATS_THREADS 256

// Combines every thread's (sum, flag) in a fixed tree order; thread 0 writes the result.
__device__ void block_reduce(double acc, int bad, double* sum_out, int* flag_out) {
    __shared__ double ssum[STATS_THREADS];
    __shared__ int sbad[STATS_THREADS];
    ssum[threadIdx.x] = acc;
    sbad[threadIdx.x] = bad;
    __syncthreads();
    for (int half = STATS_THREADS / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) {
            ssum[threadIdx.x] += ssum[threadIdx.x + half];
            sbad[threadIdx.x] |= sbad[threadIdx.x + half];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        *sum_out = ssum[0];
        *flag_out = sbad[0];
    }
}

template <typename T>
__device__ void stats_impl(const typename T::T* x, u64 n, double* sums, int* flags) {
    double acc = 0.0;
    int bad = 0;
    for (u64 i = global_thread(); i < n; i += global_threads()) {
        const float f = T::load(x[i]);
        acc += (double)f * (double)f;
        bad |= T::finite(x[i]) ? 0 : 1;
    }
    block_reduce(acc, bad, &sums[blockIdx.x], &flags[blockIdx.x]);
}

#define STATS(NAME, E) \
    extern "C" __global__ void __launch_bounds__(STATS_THREADS) NAME(const E::T* x, u64 n, double* sums, int* flags) { stats_impl<E>(x, n, sums, flags); }
STATS(stats_f32, F32)
STATS(stats_f16, F16)
STATS(stats_bf16, BF16)

// One block of STATS_THREADS threads: adds `count` partials (and ORs their flags).
extern "C" __global__ void __launch_bounds__(STATS_THREADS) stats_finish(const double* sums, const int* flags, int count, double* sum_out, int* flag_out) {
    double acc = 0.0;
    int bad = 0;
    for (int i = threadIdx.x; i < count; i += STATS_THREADS) {
        acc += sums[i];
        bad |= flags[i];
    }
    block_reduce(acc, bad, sum_out, flag_out);
}
