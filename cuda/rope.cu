/*
 * rope.cu: rotary position embedding, rotate-half layout (Llama, NeoX, Qwen):
 * for a row x of even length dim at position p, h = dim / 2 and i < h,
 *
 *   inv_freq[i] = base^(-2i / dim)         (float64, rounded once to fp32)
 *   angle       = p * inv_freq[i]          (the fp32 product)
 *   y[i]        = x[i] cos(angle) - x[i + h] sin(angle)
 *   y[i + h]    = x[i + h] cos(angle) + x[i] sin(angle)
 *
 * arithmetic in fp32, y rounded once to the storage format (fp32, bf16, fp16).
 *
 * phase: the format the phases live in. PL_FP32 is the above. PL_BF16 and
 * PL_FP16 reproduce the classic pitfall of a model cast wholesale to a low
 * dtype: inv_freq, the angle and cos/sin are each rounded to that format. At
 * position 32768 a bf16 angle is a multiple of 256 radians: the rotation is
 * arbitrary, while the fp32 angle is off by at most 2^-9 radians there.
 *
 * CPU: the reference loop (libm cosf/sinf). GPU:
 *   version 1  one thread a (row, i) pair, cosf/sinf (never __cosf/__sinf).
 */
#include <cmath>

#include "common.cuh"

namespace {

int check_rope_args(const void* x, const int64_t* pos, const void* y, int64_t rows, int64_t dim, int dtype, float base,
                    int phase, const char* func) {
    if (int st = pl_check_ptrs(func, {{"x", x}, {"pos", pos}, {"y", y}})) return st;
    if (rows <= 0 || dim <= 0 || dim % 2)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "rows must be > 0 and dim even and > 0 (got %lld x %lld)",
                       (long long)rows, (long long)dim);
    if (int st = pl_check_row_dtype(dtype, "dtype", func)) return st;
    if (!pl_row_dtype(phase))
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "phase must be fp32, bf16 or fp16 (got %d)", phase);
    if (!(base > 1.0f) || !std::isfinite(base))
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "base must be finite and > 1");
    return pl_check_elements(rows, dim, "rows * dim", func);
}

// base^(-2i/dim) in float64, rounded once to fp32: the same on host and device
// up to double pow's last-bit error, far below fp32's.
PL_HD inline float inv_freq(int64_t i, int64_t dim, float base) {
    return (float)pow((double)base, -2.0 * (double)i / (double)dim);
}

float round_host(float v, int phase) { return (float)pl_round_to((double)v, PL_FORMATS[phase]); }

}  // namespace

extern "C" int pl_rope_cpu(const void* x, int64_t rows, int64_t dim, int dtype, const int64_t* pos, float base,
                           int phase, void* y) {
    if (int st = check_rope_args(x, pos, y, rows, dim, dtype, base, phase, __func__)) return st;
    const int64_t h = dim / 2;
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t off = r * dim;
        for (int64_t i = 0; i < h; ++i) {
            const float a = round_host(round_host((float)pos[r], phase) * round_host(inv_freq(i, dim, base), phase), phase);
            const float c = round_host(std::cos(a), phase), s = round_host(std::sin(a), phase);
            const float x0 = pl_load_host(x, off + i, dtype), x1 = pl_load_host(x, off + i + h, dtype);
            pl_store_host(y, off + i, dtype, x0 * c - x1 * s);
            pl_store_host(y, off + i + h, dtype, x1 * c + x0 * s);
        }
    }
    return PL_OK;
}

#ifdef __CUDACC__

namespace {

__device__ __forceinline__ float round_phase(float v, int phase) {
    if (phase == PL_BF16) return __bfloat162float(__float2bfloat16_rn(v));
    if (phase == PL_FP16) return __half2float(__float2half_rn(v));
    return v;
}

template <typename T>
__global__ void rope_v1(const T* __restrict__ x, const int64_t* __restrict__ pos, T* __restrict__ y, int64_t rows,
                        int64_t dim, float base, int phase) {
    const int64_t h = dim / 2, total = rows * h;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = t / h, i = t % h, off = r * dim;
        // plain arithmetic: --fmad=false keeps every product and sum rounded
        // on its own, as the host's -ffp-contract=off does
        const float a = round_phase(round_phase((float)pos[r], phase) * round_phase(inv_freq(i, dim, base), phase), phase);
        const float c = round_phase(cosf(a), phase), s = round_phase(sinf(a), phase);
        const float x0 = pl_ld(x, off + i), x1 = pl_ld(x, off + i + h);
        pl_st(y, off + i, x0 * c - x1 * s);
        pl_st(y, off + i + h, x1 * c + x0 * s);
    }
}

template <typename T>
int launch_rope(const void* x, const int64_t* pos, void* y, int64_t rows, int64_t dim, float base, int phase) {
    int sms = 0;
    if (int st = pl_sm_count(&sms, "pl_rope_cuda")) return st;
    const int64_t want = (rows * (dim / 2) + 255) / 256, cap = (int64_t)sms * 8;
    rope_v1<T><<<(unsigned)(want < cap ? want : cap), 256>>>(static_cast<const T*>(x), pos, static_cast<T*>(y), rows,
                                                             dim, base, phase);
    PL_CUDA_CHECK(cudaGetLastError());
    return PL_OK;
}

}  // namespace

extern "C" int pl_rope_cuda(const void* x_dev, int64_t rows, int64_t dim, int dtype, const int64_t* pos_dev, float base,
                            int phase, void* y_dev) {
    if (int st = check_rope_args(x_dev, pos_dev, y_dev, rows, dim, dtype, base, phase, __func__)) return st;
    const size_t elem = PL_FORMATS[dtype].bytes;
    if (int st = pl_require_device(x_dev, elem, "x_dev", __func__)) return st;
    if (int st = pl_require_device(pos_dev, sizeof(int64_t), "pos_dev", __func__)) return st;
    if (int st = pl_require_device(y_dev, elem, "y_dev", __func__)) return st;
    return pl_with_row_type(dtype, __func__, [&](auto t) {
        return launch_rope<typename decltype(t)::type>(x_dev, pos_dev, y_dev, rows, dim, base, phase);
    });
}

#else

extern "C" int pl_rope_cuda(const void*, int64_t, int64_t, int, const int64_t*, float, int, void*) {
    return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA");
}

#endif
