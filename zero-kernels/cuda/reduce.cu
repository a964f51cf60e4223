// Element-wise reductions over several buffers, for the one-device multi-rank collectives,
// and gradient accumulation. Sources are read in table order (rank 0, 1, …, N−1) and
// combined in f32, rounded once to the element type: the host collectives' exact order,
// so both give the same bits. The buffer addresses come as kernel parameters (tables of
// at most MAX_REDUCE_BUFFERS), not through device memory, so no host table has to outlive
// an asynchronous copy.

#define MAX_REDUCE_BUFFERS 64
struct BufferTable {
    u64 at[MAX_REDUCE_BUFFERS];
};

#define REDUCE_SUM 0
#define REDUCE_AVG 1
#define REDUCE_MAX 2

// Maximum in which NaN wins (a non-finite flag is never reduced away).
__device__ __forceinline__ float nan_max(float a, float b) {
    if (a != a || b != b) return bits_to_f32(0x7fc00000u);
    return a > b ? a : b;
}

// dsts[d][i] = op(srcs[0][i], …, srcs[nsrc-1][i]) for every d. A destination may also be
// a source: each element is read from every source before it is written.
template <typename E>
__device__ void reduce_impl(const BufferTable& srcs, int nsrc, const BufferTable& dsts, int ndst, u64 n, int op, float world) {
    for (u64 i = global_thread(); i < n; i += global_threads()) {
        float acc = E::load(((const typename E::T*)srcs.at[0])[i]);
        for (int r = 1; r < nsrc; ++r) {
            const float x = E::load(((const typename E::T*)srcs.at[r])[i]);
            acc = (op == REDUCE_MAX) ? nan_max(acc, x) : acc + x;
        }
        if (op == REDUCE_AVG) acc = acc / world;
        const typename E::T out = E::store(acc);
        for (int d = 0; d < ndst; ++d) ((typename E::T*)dsts.at[d])[i] = out;
    }
}

// acc[i] += src[i] in f32.
template <typename E>
__device__ void accumulate_impl(float* acc, const typename E::T* src, u64 n) {
    for (u64 i = global_thread(); i < n; i += global_threads()) acc[i] = acc[i] + E::load(src[i]);
}

#define REDUCE(NAME, E) \
    extern "C" __global__ void NAME(const BufferTable srcs, int nsrc, const BufferTable dsts, int ndst, u64 n, int op, float world) { \
        reduce_impl<E>(srcs, nsrc, dsts, ndst, n, op, world); }
REDUCE(reduce_f32, F32)
REDUCE(reduce_f16, F16)
REDUCE(reduce_bf16, BF16)

#define ACCUMULATE(NAME, E) \
    extern "C" __global__ void NAME(float* acc, const E::T* src, u64 n) { accumulate_impl<E>(acc, src, n); }
ACCUMULATE(accumulate_f32, F32)
ACCUMULATE(accumulate_f16, F16)
ACCUMULATE(accumulate_bf16, BF16)
