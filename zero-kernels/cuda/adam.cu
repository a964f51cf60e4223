// Fused mixed-precision Adam/AdamW over one contiguous range: the update of
// zero-kernels/src/adam.rs, element for element, in f32 without FMA.
// The gradient scale is either a value the host passes (grad_scale null) or one in device
// memory; found_inf (optional) lives in device memory: an overflow found on the device
// skips the update on the device, with no host sync. mode: 0 no weight decay, 1 L2 (Adam),
// 2 decoupled (AdamW). Scalars are separate arguments; `params` may be null (no copy).

struct AdamScalars {
    float beta1, one_minus_beta1, beta2, one_minus_beta2;
    float wd, lr_wd, step_size, bc2_sqrt, eps;
    int mode;
};

#define ADAM_SCALAR_PARAMS float beta1, float one_minus_beta1, float beta2, float one_minus_beta2, \
    float wd, float lr_wd, float step_size, float bc2_sqrt, float eps, int mode

__device__ __forceinline__ float adam_update(const AdamScalars& s, float w, float& m, float& v, float g) {
    if (s.mode == 1) g = __fadd_rn(g, __fmul_rn(s.wd, w));
    if (s.mode == 2) w = __fsub_rn(w, __fmul_rn(s.lr_wd, w));
    const float m1 = __fadd_rn(__fmul_rn(s.beta1, m), __fmul_rn(s.one_minus_beta1, g));
    const float v1 = __fadd_rn(__fmul_rn(s.beta2, v), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
    m = m1;
    v = v1;
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v1), s.bc2_sqrt), s.eps);
    return __fsub_rn(w, __fdiv_rn(__fmul_rn(s.step_size, m1), denom));
}

template <typename G, typename P>
__device__ void adam_impl(float* w, float* m, float* v, const typename G::T* grads, typename P::T* params,
                          u64 n, AdamScalars s, float grad_scale_value, const float* grad_scale,
                          const int* found_inf) {
    if (found_inf != 0 && *found_inf != 0) return;
    const float scale = grad_scale != 0 ? *grad_scale : grad_scale_value;
    const u64 groups = n / 4;
    // Each of the five streams is read and written four elements at a time with one
    // vector access where its pointer allows (every warp instruction coalesced).
    const bool vec = ((((u64)w) | ((u64)m) | ((u64)v)) & 15) == 0;
    const bool gvec = aligned4(grads);
    const bool pvec = params != 0 && aligned4(params);
    for (u64 q = global_thread(); q < groups; q += global_threads()) {
        float4 wq, mq, vq;
        if (vec) {
            wq = ((float4*)w)[q]; mq = ((float4*)m)[q]; vq = ((float4*)v)[q];
        } else {
            wq = make_float4(w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3]);
            mq = make_float4(m[4 * q], m[4 * q + 1], m[4 * q + 2], m[4 * q + 3]);
            vq = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
        }
        typename G::T gq[4];
        if (gvec) {
            load4(grads + 4 * q, gq);
        } else {
            for (int k = 0; k < 4; ++k) gq[k] = grads[4 * q + k];
        }
        float* wv = &wq.x; float* mv = &mq.x; float* vv = &vq.x;
        typename P::T pq[4];
        for (int k = 0; k < 4; ++k) {
            const float g = __fmul_rn(G::load(gq[k]), scale);
            wv[k] = adam_update(s, wv[k], mv[k], vv[k], g);
            pq[k] = P::store(wv[k]);
        }
        if (pvec) {
            store4(params + 4 * q, pq);
        } else if (params != 0) {
            for (int k = 0; k < 4; ++k) params[4 * q + k] = pq[k];
        }
        if (vec) {
            ((float4*)w)[q] = wq; ((float4*)m)[q] = mq; ((float4*)v)[q] = vq;
        } else {
            for (int k = 0; k < 4; ++k) { w[4 * q + k] = wv[k]; m[4 * q + k] = mv[k]; v[4 * q + k] = vv[k]; }
        }
    }
    for (u64 i = groups * 4 + global_thread(); i < n; i += global_threads()) {
        const float g = __fmul_rn(G::load(grads[i]), scale);
        w[i] = adam_update(s, w[i], m[i], v[i], g);
        if (params != 0) params[i] = P::store(w[i]);
    }
}

#define ADAM(NAME, G, P)                                                                              \
    extern "C" __global__ void NAME(float* w, float* m, float* v, const G::T* grads, P::T* params,     \
                                    u64 n, ADAM_SCALAR_PARAMS, float grad_scale_value,                \
                                    const float* grad_scale, const int* found_inf) {                  \
        const AdamScalars s = {beta1, one_minus_beta1, beta2, one_minus_beta2, wd, lr_wd, step_size, bc2_sqrt, eps, mode}; \
        adam_impl<G, P>(w, m, v, grads, params, n, s, grad_scale_value, grad_scale, found_inf);         \
    }
ADAM(adam_f32_f32, F32, F32)
ADAM(adam_f32_f16, F32, F16)
ADAM(adam_f32_bf16, F32, BF16)
ADAM(adam_f16_f32, F16, F32)
ADAM(adam_f16_f16, F16, F16)
ADAM(adam_f16_bf16, F16, BF16)
ADAM(adam_bf16_f32, BF16, F32)
ADAM(adam_bf16_f16, BF16, F16)
ADAM(adam_bf16_bf16, BF16, BF16)
