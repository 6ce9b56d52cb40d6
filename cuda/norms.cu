/*
 * norms.cu: RMSNorm and LayerNorm over the last dimension of a rows x cols
 * tensor (fp32, bf16 or fp16), each a reduction plus a broadcast, with the
 * statistic in fp32 whatever the storage format.
 *
 *   rmsnorm    y = x / sqrt(mean(x^2) + eps) * w
 *   layernorm  y = (x - mean) / sqrt(var + eps) * w + b, var = mean((x - mean)^2)
 *              (two passes: the one-pass E[x^2] - E[x]^2 cancels catastrophically)
 *
 * CPU: pairwise fp32 sums. GPU (one block per row):
 *   version 1, block     threads = cols rounded up to a warp (at most 1024): the
 *                        reduction order depends on cols alone, so a row's
 *                        bits do not depend on how many rows come with it.
 *   version 2, adaptive  threads chosen from the batch too (1024 for a small
 *                        batch to use the SMs, a warp for a large one), as launch
 *                        heuristics do: the same row gives different bits at
 *                        different batch sizes. Kept to show exactly that.
 * 1/sqrt is IEEE sqrtf and division, not rsqrtf (an approximation).
 */
#include <vector>

#include "common.cuh"

// The variants of pl_rmsnorm_cuda, declared once (common.cuh, PL_DECLARE_VARIANTS).
// symbol, id, name, kind, devices, dtypes, order, batch-invariant, deterministic, default, sass, summary
#define RMSNORM_VARIANTS(X)                                                                                        \
    X(PL_NORM_BLOCK, 1, "block", KERNEL, PL_ON_CUDA, PL_ROW_FORMATS, AS_GIVEN, 1, 1, 1,                            \
      NO_SASS, "threads from cols alone: a row's bits never depend on the batch")                                  \
    X(PL_NORM_ADAPTIVE, 2, "adaptive", KERNEL, PL_ON_CUDA, PL_ROW_FORMATS, AS_GIVEN, 0, 1, 0,                      \
      NO_SASS, "threads chosen from the batch size too: not batch-invariant")
PL_DECLARE_VARIANTS(rmsnorm, RMSNORM_VARIANTS);

namespace {

int check_norm_args(const void* x, const void* y, int64_t rows, int64_t cols, int dtype, float eps, const char* func) {
    if (int st = pl_check_ptrs(func, {{"x", x}, {"y", y}})) return st;
    if (int st = pl_check_rows_cols(rows, cols, func)) return st;
    if (int st = pl_check_row_dtype(dtype, "dtype", func)) return st;
    if (!(eps >= 0.0f) || !std::isfinite(eps)) return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "eps must be finite and >= 0");
    return pl_check_elements(rows, cols, "rows * cols", func);
}

}  // namespace

extern "C" int pl_rmsnorm_cpu(const void* x, int64_t rows, int64_t cols, int dtype, const void* w, float eps, void* y) {
    if (int st = check_norm_args(x, y, rows, cols, dtype, eps, __func__)) return st;
    std::vector<float> sq((size_t)cols);
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t off = r * cols;
        for (int64_t j = 0; j < cols; ++j) {
            const float v = pl_load_host(x, off + j, dtype);
            sq[(size_t)j] = v * v;
        }
        const float inv = 1.0f / std::sqrt(pl_pairwise_sum(sq.data(), cols) / (float)cols + eps);
        for (int64_t j = 0; j < cols; ++j) {
            const float v = pl_load_host(x, off + j, dtype) * inv;
            pl_store_host(y, off + j, dtype, w ? v * pl_load_host(w, j, dtype) : v);
        }
    }
    return PL_OK;
}

extern "C" int pl_rmsnorm_cpu_lanes(const void* x, int64_t rows, int64_t cols, int dtype, const void* w, float eps,
                                    void* y, int lanes) {
    if (int st = check_norm_args(x, y, rows, cols, dtype, eps, __func__)) return st;
    PL_REQUIRE(lanes >= 1 && lanes <= 1024, PL_ERR_INVALID_ARGUMENT, "lanes must be in [1, 1024] (got %d)", lanes);
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t off = r * cols;
        const float s = pl_lane_sum([&](int64_t j) { const float v = pl_load_host(x, off + j, dtype); return v * v; },
                                    cols, lanes);
        const float inv = 1.0f / std::sqrt(s / (float)cols + eps);
        for (int64_t j = 0; j < cols; ++j) {
            const float v = pl_load_host(x, off + j, dtype) * inv;
            pl_store_host(y, off + j, dtype, w ? v * pl_load_host(w, j, dtype) : v);
        }
    }
    return PL_OK;
}

extern "C" int pl_adaptive_lanes(int64_t rows, int64_t cols, int sm_count) {
    return pl_adaptive_lanes_for(rows, cols, sm_count);
}

extern "C" int pl_layernorm_cpu(const void* x, int64_t rows, int64_t cols, int dtype, const void* w, const void* b,
                                float eps, void* y) {
    if (int st = check_norm_args(x, y, rows, cols, dtype, eps, __func__)) return st;
    std::vector<float> t((size_t)cols);
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t off = r * cols;
        for (int64_t j = 0; j < cols; ++j) t[(size_t)j] = pl_load_host(x, off + j, dtype);
        const float mean = pl_pairwise_sum(t.data(), cols) / (float)cols;
        for (int64_t j = 0; j < cols; ++j) {
            const float d = pl_load_host(x, off + j, dtype) - mean;
            t[(size_t)j] = d * d;
        }
        const float inv = 1.0f / std::sqrt(pl_pairwise_sum(t.data(), cols) / (float)cols + eps);
        for (int64_t j = 0; j < cols; ++j) {
            float v = (pl_load_host(x, off + j, dtype) - mean) * inv;
            if (w) v = v * pl_load_host(w, j, dtype);
            if (b) v = v + pl_load_host(b, j, dtype);
            pl_store_host(y, off + j, dtype, v);
        }
    }
    return PL_OK;
}

#ifdef __CUDACC__

namespace {

template <typename T>
__global__ void __launch_bounds__(1024) rmsnorm_kernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int64_t cols,
                               float eps) {
    const T* xr = x + (int64_t)blockIdx.x * cols;
    T* yr = y + (int64_t)blockIdx.x * cols;
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        const float v = pl_ld(xr, j);
        s = __fmaf_rn(v, v, s);
    }
    s = pl_block_allreduce(s, pl_op_add(), 0.0f);
    const float inv = 1.0f / sqrtf(s / (float)cols + eps);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        const float v = pl_ld(xr, j) * inv;
        pl_st(yr, j, w ? v * pl_ld(w, j) : v);
    }
}

template <typename T>
__global__ void __launch_bounds__(1024) layernorm_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                 T* __restrict__ y, int64_t cols, float eps) {
    const T* xr = x + (int64_t)blockIdx.x * cols;
    T* yr = y + (int64_t)blockIdx.x * cols;
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += pl_ld(xr, j);
    const float mean = pl_block_allreduce(s, pl_op_add(), 0.0f) / (float)cols;
    float q = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        const float d = pl_ld(xr, j) - mean;
        q = __fmaf_rn(d, d, q);
    }
    const float inv = 1.0f / sqrtf(pl_block_allreduce(q, pl_op_add(), 0.0f) / (float)cols + eps);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        float v = (pl_ld(xr, j) - mean) * inv;
        if (w) v = v * pl_ld(w, j);
        if (b) v = v + pl_ld(b, j);
        pl_st(yr, j, v);
    }
}

template <typename T>
int launch_rms(const void* x, const void* w, void* y, int64_t rows, int64_t cols, float eps, int version) {
    int threads = pl_lanes_for(cols);
    if (version == PL_NORM_ADAPTIVE) {
        int sms = 0;
        if (int st = pl_sm_count(&sms, "pl_rmsnorm_cuda")) return st;
        threads = pl_adaptive_lanes_for(rows, cols, sms);
    }
    rmsnorm_kernel<T><<<(unsigned)rows, threads>>>(static_cast<const T*>(x), static_cast<const T*>(w),
                                                    static_cast<T*>(y), cols, eps);
    PL_CUDA_CHECK(cudaGetLastError());
    return PL_OK;
}

template <typename T>
int launch_ln(const void* x, const void* w, const void* b, void* y, int64_t rows, int64_t cols, float eps) {
    layernorm_kernel<T><<<(unsigned)rows, pl_lanes_for(cols)>>>(static_cast<const T*>(x), static_cast<const T*>(w),
                                                                 static_cast<const T*>(b), static_cast<T*>(y), cols, eps);
    PL_CUDA_CHECK(cudaGetLastError());
    return PL_OK;
}

int check_devptrs(const void* x, const void* w, const void* b, const void* y, int dtype, const char* func) {
    const size_t elem = PL_FORMATS[dtype].bytes;
    if (int st = pl_require_device(x, elem, "x_dev", func)) return st;
    if (int st = pl_require_device(y, elem, "y_dev", func)) return st;
    if (w)
        if (int st = pl_require_device(w, elem, "w_dev", func)) return st;
    if (b)
        if (int st = pl_require_device(b, elem, "b_dev", func)) return st;
    return PL_OK;
}

}  // namespace

extern "C" int pl_rmsnorm_cuda(const void* x_dev, int64_t rows, int64_t cols, int dtype, const void* w_dev, float eps,
                               void* y_dev, int version) {
    if (int st = check_norm_args(x_dev, y_dev, rows, cols, dtype, eps, __func__)) return st;
    if (int st = pl_check_variant("rmsnorm", version, PL_ON_CUDA, __func__)) return st;
    PL_REQUIRE(rows <= 0x7FFFFFFF, PL_ERR_UNSUPPORTED, "at most 2^31 - 1 rows (one block per row)");
    if (int st = check_devptrs(x_dev, w_dev, nullptr, y_dev, dtype, __func__)) return st;
    return pl_with_row_type(dtype, __func__, [&](auto t) {
        return launch_rms<typename decltype(t)::type>(x_dev, w_dev, y_dev, rows, cols, eps, version);
    });
}

extern "C" int pl_layernorm_cuda(const void* x_dev, int64_t rows, int64_t cols, int dtype, const void* w_dev,
                                 const void* b_dev, float eps, void* y_dev) {
    if (int st = check_norm_args(x_dev, y_dev, rows, cols, dtype, eps, __func__)) return st;
    PL_REQUIRE(rows <= 0x7FFFFFFF, PL_ERR_UNSUPPORTED, "at most 2^31 - 1 rows (one block per row)");
    if (int st = check_devptrs(x_dev, w_dev, b_dev, y_dev, dtype, __func__)) return st;
    return pl_with_row_type(dtype, __func__, [&](auto t) {
        return launch_ln<typename decltype(t)::type>(x_dev, w_dev, b_dev, y_dev, rows, cols, eps);
    });
}

#else

extern "C" int pl_rmsnorm_cuda(const void*, int64_t, int64_t, int, const void*, float, void*, int) {
    return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA");
}
extern "C" int pl_layernorm_cuda(const void*, int64_t, int64_t, int, const void*, const void*, float, void*) {
    return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA");
}

#endif
