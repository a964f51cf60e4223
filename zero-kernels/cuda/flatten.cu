// Multi-tensor flatten / unflatten in one launch. `table` (in device memory) holds one
// entry per copy: source, destination, length, and the first block that works on it.
// Block b finds its entry by binary search over first_block (one thread searches, the
// block shares the entry through shared memory), then copies its chunk of CHUNK elements:
// with the cast fused in, in groups of 4 elements moved with one vector access on each
// side (load4/store4: 16 bytes of f32, 8 of 16-bit values) when the pointers allow; between
// equal types, as raw 16-byte words (the bits unchanged). Every warp instruction touches
// consecutive memory. The host fills padding with entries whose source is a buffer of
// zeros (a branch for it here made ptxas spill).

#define FLATTEN_THREADS 256
#define CHUNK (FLATTEN_THREADS * 8 * 4)

struct CopyEntry {
    u64 src;
    u64 dst;
    u64 len;
    u64 first_block;
};

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
// Thread 0 searches the table; the others read its answer after the barrier (every thread
// of the block reaches it: no thread returns before).
__device__ __forceinline__ CopyEntry block_chunk(const CopyEntry* table, int entries, u64* start, u64* len) {
    __shared__ CopyEntry found;
    if (threadIdx.x == 0) found = find_entry(table, entries);
    __syncthreads();
    const CopyEntry e = found;
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
    const bool vec = aligned4(src) && aligned4(dst);
    const u64 groups = vec ? len / 4 : 0;
    for (u64 g = threadIdx.x; g < groups; g += FLATTEN_THREADS) {
        typename S::T in[4];
        typename D::T out[4];
        load4(src + 4 * g, in);
#pragma unroll
        for (int k = 0; k < 4; ++k) out[k] = D::store(S::load(in[k]));
        store4(dst + 4 * g, out);
    }
    for (u64 i = groups * 4 + threadIdx.x; i < len; i += FLATTEN_THREADS) dst[i] = D::store(S::load(src[i]));
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
