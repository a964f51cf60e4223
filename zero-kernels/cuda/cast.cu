// dst[i] = round(src[i]) for every i < n: widening exact, narrowing round-to-nearest-even.
// Four elements per thread per iteration, read and written with one vector access each
// (load4/store4) when both pointers allow, so every warp instruction is coalesced.

template <typename S, typename D>
__device__ void cast_impl(const typename S::T* src, typename D::T* dst, u64 n) {
    const u64 groups = n / 4;
    const bool vec = aligned4(src) && aligned4(dst);
    for (u64 g = global_thread(); g < groups; g += global_threads()) {
        typename S::T in[4];
        typename D::T out[4];
        if (vec) {
            load4(src + 4 * g, in);
        } else {
            for (int k = 0; k < 4; ++k) in[k] = src[4 * g + k];
        }
        for (int k = 0; k < 4; ++k) out[k] = D::store(S::load(in[k]));
        if (vec) {
            store4(dst + 4 * g, out);
        } else {
            for (int k = 0; k < 4; ++k) dst[4 * g + k] = out[k];
        }
    }
    for (u64 i = groups * 4 + global_thread(); i < n; i += global_threads()) dst[i] = D::store(S::load(src[i]));
}

#define CAST(NAME, S, D) \
    extern "C" __global__ void NAME(const S::T* src, D::T* dst, u64 n) { cast_impl<S, D>(src, dst, n); }
CAST(cast_f32_f16, F32, F16)
CAST(cast_f32_bf16, F32, BF16)
CAST(cast_f16_f32, F16, F32)
CAST(cast_bf16_f32, BF16, F32)
CAST(cast_f16_bf16, F16, BF16)
CAST(cast_bf16_f16, BF16, F16)
