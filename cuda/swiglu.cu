/*
 * swiglu.cu: the gated MLP activation of Llama-family models,
 *
 *   y = silu(gate) * up,   silu(g) = g / (1 + exp(-g)),
 *
 * elementwise over n values in fp32, bf16 or fp16, arithmetic in fp32 and the
 * result rounded once to the storage format. exp is expf, never __expf; for g
 * below about -88, exp(-g) overflows to inf and silu(g) = g / inf = -0, the
 * limit it should have. A NaN in either input gives NaN.
 *
 * CPU: the reference loop. GPU:
 *   version 1  a grid-stride loop, one element a thread a step.
 */
#include "common.cuh"

namespace {

int check_swiglu_args(const void* gate, const void* up, const void* y, int64_t n, int dtype, const char* func) {
    if (int st = pl_check_ptrs(func, {{"gate", gate}, {"up", up}, {"y", y}})) return st;
    if (n <= 0) return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "n must be > 0 (got %lld)", (long long)n);
    if (int st = pl_check_row_dtype(dtype, "dtype", func)) return st;
    size_t bytes;
    return pl_checked_bytes(n, sizeof(float), &bytes, func);
}

}  // namespace

extern "C" int pl_swiglu_cpu(const void* gate, const void* up, int64_t n, int dtype, void* y) {
    if (int st = check_swiglu_args(gate, up, y, n, dtype, __func__)) return st;
    for (int64_t i = 0; i < n; ++i) {
        const float g = pl_load_host(gate, i, dtype), u = pl_load_host(up, i, dtype);
        const float silu = g / (1.0f + std::exp(-g));
        pl_store_host(y, i, dtype, silu * u);
    }
    return PL_OK;
}

#ifdef __CUDACC__

namespace {

template <typename T>
__global__ void swiglu_v1(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ y, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float g = pl_ld(gate, i), u = pl_ld(up, i);
        const float silu = g / (1.0f + expf(-g));
        pl_st(y, i, silu * u);
    }
}

template <typename T>
int launch_swiglu(const void* gate, const void* up, void* y, int64_t n) {
    int sms = 0;
    if (int st = pl_sm_count(&sms, "pl_swiglu_cuda")) return st;
    const int64_t want = (n + 255) / 256, cap = (int64_t)sms * 8;
    swiglu_v1<T><<<(unsigned)(want < cap ? want : cap), 256>>>(static_cast<const T*>(gate), static_cast<const T*>(up),
                                                               static_cast<T*>(y), n);
    PL_CUDA_CHECK(cudaGetLastError());
    return PL_OK;
}

}  // namespace

extern "C" int pl_swiglu_cuda(const void* gate_dev, const void* up_dev, int64_t n, int dtype, void* y_dev) {
    if (int st = check_swiglu_args(gate_dev, up_dev, y_dev, n, dtype, __func__)) return st;
    const size_t elem = PL_FORMATS[dtype].bytes;
    if (int st = pl_require_device(gate_dev, elem, "gate_dev", __func__)) return st;
    if (int st = pl_require_device(up_dev, elem, "up_dev", __func__)) return st;
    if (int st = pl_require_device(y_dev, elem, "y_dev", __func__)) return st;
    return pl_with_row_type(dtype, __func__, [&](auto t) {
        return launch_swiglu<typename decltype(t)::type>(gate_dev, up_dev, y_dev, n);
    });
}

#else

extern "C" int pl_swiglu_cuda(const void*, const void*, int64_t, int, void*) {
    return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA");
}

#endif
