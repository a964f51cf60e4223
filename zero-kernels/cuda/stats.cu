// Non-finite check and sum of squares in one pass. Pass 1: each block writes the sum (f64)
// and the non-finite flag of its grid-stride share; pass 2 (one block) adds the block
// partials in a fixed tree order. For a fixed launch shape the result is deterministic.

#define STATS_THREADS 256

template <typename T>
__device__ void stats_impl(const typename T::T* x, u64 n, double* sums, int* flags) {
    __shared__ double ssum[STATS_THREADS];
    __shared__ int sbad[STATS_THREADS];
    double acc = 0.0;
    int bad = 0;
    for (u64 i = global_thread(); i < n; i += global_threads()) {
        const float f = T::load(x[i]);
        acc += (double)f * (double)f;
        bad |= T::finite(x[i]) ? 0 : 1;
    }
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
        sums[blockIdx.x] = ssum[0];
        flags[blockIdx.x] = sbad[0];
    }
}

#define STATS(NAME, E) \
    extern "C" __global__ void __launch_bounds__(STATS_THREADS) NAME(const E::T* x, u64 n, double* sums, int* flags) { stats_impl<E>(x, n, sums, flags); }
STATS(stats_f32, F32)
STATS(stats_f16, F16)
STATS(stats_bf16, BF16)

// One block of STATS_THREADS threads: adds `count` partials (and ORs their flags).
extern "C" __global__ void __launch_bounds__(STATS_THREADS) stats_finish(const double* sums, const int* flags, int count, double* sum_out, int* flag_out) {
    __shared__ double ssum[STATS_THREADS];
    __shared__ int sbad[STATS_THREADS];
    double acc = 0.0;
    int bad = 0;
    for (int i = threadIdx.x; i < count; i += STATS_THREADS) {
        acc += sums[i];
        bad |= flags[i];
    }
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
