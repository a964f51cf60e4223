// Multi-tensor flatten / unflatten in one launch. `table` (in device memory) holds one
// entry per copy: source, destination, length, and the first block that works on it.
// Block b finds its entry by binary search over first_block, then copies its chunk of
// CHUNK elements with the cast fused in; groups of 8 elements move as 16-byte vectors
// (one uint4 of 16-bit values, two float4 of f32) when the pointers allow.

#define FLATTEN_THREADS 256
#define CHUNK (FLATTEN_THREADS * 8 * 4)

struct CopyEntry {
    u64 src;
    u64 dst;
    u64 len;
    u64 first_block;
};

template <typename S, typename D>
__device__ void copy_impl(const CopyEntry* table, int entries) {
    int lo = 0, hi = entries - 1;
    while (lo < hi) {  // the last entry whose first_block <= blockIdx.x
        const int mid = (lo + hi + 1) / 2;
        if (table[mid].first_block <= blockIdx.x) lo = mid; else hi = mid - 1;
    }
    const CopyEntry e = table[lo];
    const u64 start = (blockIdx.x - e.first_block) * (u64)CHUNK;
    if (start >= e.len) return;
    const u64 len = (e.len - start < (u64)CHUNK) ? e.len - start : (u64)CHUNK;
    const typename S::T* src = (const typename S::T*)e.src + start;
    typename D::T* dst = (typename D::T*)e.dst + start;
    const bool vec = ((((u64)src) | ((u64)dst)) & 15) == 0;
    const u64 groups = vec ? len / 8 : 0;
    for (u64 g = threadIdx.x; g < groups; g += FLATTEN_THREADS) {
        typename S::T in[8];
        typename D::T out[8];
        if (sizeof(typename S::T) == 4) {
            ((uint4*)in)[0] = ((const uint4*)(src + 8 * g))[0];
            ((uint4*)in)[1] = ((const uint4*)(src + 8 * g))[1];
        } else {
            ((uint4*)in)[0] = ((const uint4*)(src + 8 * g))[0];
        }
        for (int k = 0; k < 8; ++k) out[k] = D::store(S::load(in[k]));
        if (sizeof(typename D::T) == 4) {
            ((uint4*)(dst + 8 * g))[0] = ((uint4*)out)[0];
            ((uint4*)(dst + 8 * g))[1] = ((uint4*)out)[1];
        } else {
            ((uint4*)(dst + 8 * g))[0] = ((uint4*)out)[0];
        }
    }
    for (u64 i = groups * 8 + threadIdx.x; i < len; i += FLATTEN_THREADS) dst[i] = D::store(S::load(src[i]));
}

#define COPY(NAME, S, D) \
    extern "C" __global__ void __launch_bounds__(FLATTEN_THREADS) NAME(const CopyEntry* table, int entries) { copy_impl<S, D>(table, entries); }
COPY(copy_f32_f32, F32, F32)
COPY(copy_f16_f16, F16, F16)
COPY(copy_bf16_bf16, BF16, BF16)
COPY(copy_f32_f16, F32, F16)
COPY(copy_f32_bf16, F32, BF16)
COPY(copy_f16_f32, F16, F32)
COPY(copy_bf16_f32, BF16, F32)
