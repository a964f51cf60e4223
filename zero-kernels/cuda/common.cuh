// Shared by every zero kernel. Free of CUDA headers, so NVRTC and nvcc both compile it:
// 16-bit types are raw bits, converted with PTX `cvt` (round to nearest even, as the CPU
// kernels round). Compile with --fmad=false so a·b + c is never contracted, matching the
// CPU's bits, and with IEEE division and square root (NVRTC's default).

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ float bits_to_f32(u32 b) { float f; asm("mov.b32 %0, %1;" : "=f"(f) : "r"(b)); return f; }
__device__ __forceinline__ u32 f32_to_bits(float f) { u32 b; asm("mov.b32 %0, %1;" : "=r"(b) : "f"(f)); return b; }

// Element types: storage type, widening to f32, narrowing from f32 (RNE), finiteness.
struct F32 {
    typedef float T;
    static __device__ __forceinline__ float load(T x) { return x; }
    static __device__ __forceinline__ T store(float x) { return x; }
    static __device__ __forceinline__ bool finite(T x) { return (f32_to_bits(x) & 0x7f800000u) != 0x7f800000u; }
};
struct F16 {
    typedef u16 T;
    static __device__ __forceinline__ float load(T x) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x)); return f; }
    static __device__ __forceinline__ T store(float x) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x)); return h; }
    static __device__ __forceinline__ bool finite(T x) { return (x & 0x7c00u) != 0x7c00u; }
};
// f32 -> bf16, round to nearest even. sm_80 and newer have the instruction; below that
// (sm_75) the CPU's branch-free rounding (dtype.rs, bf16_from_f32_rne): NaN kept and
// made quiet, overflow to inf.
__device__ __forceinline__ u16 bf16_rne(float x) {
#if __CUDA_ARCH__ >= 800
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
#else
    const u32 b = f32_to_bits(x);
    const u16 rounded = (u16)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
    return ((b & 0x7fffffffu) > 0x7f800000u) ? (u16)((b >> 16) | 0x40u) : rounded;
#endif
}
struct BF16 {
    typedef u16 T;
    static __device__ __forceinline__ float load(T x) { return bits_to_f32(((u32)x) << 16); }
    static __device__ __forceinline__ T store(float x) { return bf16_rne(x); }
    static __device__ __forceinline__ bool finite(T x) { return (x & 0x7f80u) != 0x7f80u; }
};

__device__ __forceinline__ u64 global_thread() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 global_threads() { return (u64)gridDim.x * blockDim.x; }

// Four consecutive elements through one vector access (16 bytes of f32, 8 of 16-bit
// values; the pointer is aligned to that size), so a warp's lanes touch consecutive
// memory in one instruction: no 32-byte sector is fetched twice for a strided access.
__device__ __forceinline__ void load4(const float* p, float* v) {
    const float4 a = *(const float4*)p;
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
}
__device__ __forceinline__ void load4(const u16* p, u16* v) {
    const uint2 a = *(const uint2*)p;
    v[0] = (u16)a.x; v[1] = (u16)(a.x >> 16); v[2] = (u16)a.y; v[3] = (u16)(a.y >> 16);
}
// Stores are written as PTX: through a pointer read from memory (the flatten table's)
// NVRTC splits a vector store into four scalar ones, four times the 32-byte sectors per
// warp instruction (zero-gpusim's traffic table). Every pointer here is device memory.
__device__ __forceinline__ void store4(float* p, const float* v) {
    asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(__cvta_generic_to_global(p)),
                 "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]) : "memory");
}
__device__ __forceinline__ void store4(u16* p, const u16* v) {
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(__cvta_generic_to_global(p)),
                 "r"(v[0] | ((u32)v[1] << 16)), "r"(v[2] | ((u32)v[3] << 16)) : "memory");
}
// Whether `p` may be accessed four elements of `T` at a time.
template <typename T>
__device__ __forceinline__ bool aligned4(const T* p) { return (((u64)p) & (4 * sizeof(T) - 1)) == 0; }
