// Multi-tensor flatten / unflatten in one launch. `table` (in device memory) holds one
// entry per copy: source, destination, length, and the first block that works on it.
// Block b finds its entry by binary search over first_block, then copies its chunk of
// CHUNK elements: with the cast fused in, in groups of 8 elements moved as 16-byte vectors
// (one uint4 of 16-bit values, two float4 of f32) when the pointers allow; between equal
// types, as raw 16-byte words (the bits unchanged). The host fills padding with entries
// whose source is a buffer of zeros (a branch for it here made ptxas spill).

#define FLATTEN_THREADS 256
#define CHUNK (FLATTEN_THREADS * 8 * 4)

struct CopyEntry {
    u64 src;
    u64 dst;
    u64 len;
    u64 first_block;
};

// Eight elements through 16-byte accesses (the pointer is 16-byte aligned), unpacked into
// registers with shifts rather than through a local array.
__device__ __forceinline__ void load8(const float* p, float* v) {
    const float4 a = ((const float4*)p)[0], b = ((const float4*)p)[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ __forceinline__ void load8(const u16* p, u16* v) {
    const uint4 a = ((const uint4*)p)[0];
    v[0] = (u16)a.x; v[1] = (u16)(a.x >> 16); v[2] = (u16)a.y; v[3] = (u16)(a.y >> 16);
    v[4] = (u16)a.z; v[5] = (u16)(a.z >> 16); v[6] = (u16)a.w; v[7] = (u16)(a.w >> 16);
}
__device__ __forceinline__ void store8(float* p, const float* v) {
    ((float4*)p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    ((float4*)p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void store8(u16* p, const u16* v) {
    ((uint4*)p)[0] = make_uint4(v[0] | ((u32)v[1] << 16), v[2] | ((u32)v[3] << 16),
                                v[4] | ((u32)v[5] << 16), v[6] | ((u32)v[7] << 16));
}

// The table entry of this block.
__device__ __forceinline__ CopyEntry find_entry(const CopyEntry* table, int entries) {
    int lo = 0, hi = entries - 1;
    while (lo < hi) {  // the last entry whose first_block <= blockIdx.x
        const int mid = (lo + hi + 1) / 2;
        if (table[mid].first_block <= blockIdx.x) lo = mid; else hi = mid - 1;
    }
    return table[lo];
}

// This block's part of its entry: the first element and the count (0: nothing to do).
__device__ __forceinline__ CopyEntry block_chunk(const CopyEntry* table, int entries, u64* start, u64* len) {
    const CopyEntry e = find_entry(table, entries);
    *start = (blockIdx.x - e.first_block) * (u64)CHUNK;
    *len = *start >= e.len ? 0 : ((e.len - *start < (u64)CHUNK) ? e.len - *start : (u64)CHUNK);
    return e;
}

// Between equal types: the chunk's bytes, 16 at a time where both pointers allow.
template <typename E>
__device__ void copy_same_impl(const CopyEntry* table, int entries) {
    u64 start, len;
    const CopyEntry e = block_chunk(table, entries, &start, &len);
    if (len == 0) return;
    const typename E::T* src = (const typename E::T*)e.src + start;
    typename E::T* dst = (typename E::T*)e.dst + start;
    const u64 per_word = 16 / sizeof(typename E::T);
    const bool vec = ((((u64)src) | ((u64)dst)) & 15) == 0;
    const u64 words = vec ? len / per_word : 0;
    for (u64 w = threadIdx.x; w < words; w += FLATTEN_THREADS) ((uint4*)dst)[w] = ((const uint4*)src)[w];
    for (u64 i = words * per_word + threadIdx.x; i < len; i += FLATTEN_THREADS) dst[i] = src[i];
}

template <typename S, typename D>
__device__ void copy_impl(const CopyEntry* table, int entries) {
    u64 start, len;
    const CopyEntry e = block_chunk(table, entries, &start, &len);
    if (len == 0) return;
    const typename S::T* src = (const typename S::T*)e.src + start;
    typename D::T* dst = (typename D::T*)e.dst + start;
    const bool vec = ((((u64)src) | ((u64)dst)) & 15) == 0;
    const u64 groups = vec ? len / 8 : 0;
    for (u64 g = threadIdx.x; g < groups; g += FLATTEN_THREADS) {
        typename S::T in[8];
        typename D::T out[8];
        load8(src + 8 * g, in);
#pragma unroll
        for (int k = 0; k < 8; ++k) out[k] = D::store(S::load(in[k]));
        store8(dst + 8 * g, out);
    }
    for (u64 i = groups * 8 + threadIdx.x; i < len; i += FLATTEN_THREADS) dst[i] = D::store(S::load(src[i]));
}

#define COPY_SAME(NAME, E) \
    extern "C" __global__ void __launch_bounds__(FLATTEN_THREADS) NAME(const CopyEntry* table, int entries) { copy_same_impl<E>(table, entries); }
#define COPY(NAME, S, D) \
    extern "C" __global__ void __launch_bounds__(FLATTEN_THREADS) NAME(const CopyEntry* table, int entries) { copy_impl<S, D>(table, entries); }
COPY_SAME(copy_f32_f32, F32)
COPY_SAME(copy_f16_f16, F16)
COPY_SAME(copy_bf16_bf16, BF16)
COPY(copy_f32_f16, F32, F16)
COPY(copy_f32_bf16, F32, BF16)
COPY(copy_f16_f32, F16, F32)
COPY(copy_bf16_f32, BF16, F32)
