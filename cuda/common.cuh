/*
 * common.cuh: what every operation file shares.
 *  - status and error plumbing (pl_fail, PL_CUDA_CHECK);
 *  - argument checks;
 *  - the format table and host rounding (round to nearest even, exact);
 *  - a counter-based RNG for stochastic rounding;
 *  - warp and block reductions (CUDA only).
 *
 * The host half compiles with g++ too (-x c++), so the library can be built
 * without nvcc; everything CUDA sits under __CUDACC__.
 */
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <vector>

#include "precisionlab.h"

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#define PL_HD __host__ __device__
#else
#define PL_HD
#endif

// ---------------------------------------------------------------------------
// errors: the status is the return value, the message is thread-local.

// Records "func: message" as the last error and returns status.
int pl_fail(int status, const char* func, const char* fmt, ...);

#define PL_REQUIRE(cond, status, ...)                      \
    do {                                                   \
        if (!(cond)) return pl_fail((status), __func__, __VA_ARGS__); \
    } while (0)

#define PL_REQUIRE_PTR(p) PL_REQUIRE((p) != nullptr, PL_ERR_NULL_POINTER, "%s is NULL", #p)
#define PL_REQUIRE_N(n) PL_REQUIRE((n) > 0, PL_ERR_INVALID_ARGUMENT, "n must be > 0 (got %lld)", (long long)(n))

// n * elem bytes without overflow, or a status.
static inline int pl_checked_bytes(int64_t n, size_t elem, size_t* bytes, const char* func) {
    if (n <= 0) return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "n must be > 0 (got %lld)", (long long)n);
    if ((uint64_t)n > SIZE_MAX / elem)
        return pl_fail(PL_ERR_SIZE_OVERFLOW, func, "n = %lld elements of %zu bytes overflows size_t",
                       (long long)n, elem);
    *bytes = (size_t)n * elem;
    return PL_OK;
}

// The pointers an entry point needs, by name, checked in order: the first
// NULL one is the error ("x is NULL").
struct pl_named_ptr {
    const char* name;
    const void* p;
};
static inline int pl_check_ptrs(const char* func, std::initializer_list<pl_named_ptr> ptrs) {
    for (const pl_named_ptr& q : ptrs)
        if (q.p == nullptr) return pl_fail(PL_ERR_NULL_POINTER, func, "%s is NULL", q.name);
    return PL_OK;
}

// rows x cols, both > 0, as the row ops take them.
static inline int pl_check_rows_cols(int64_t rows, int64_t cols, const char* func) {
    if (rows <= 0 || cols <= 0)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "rows and cols must be > 0 (got %lld x %lld)", (long long)rows,
                       (long long)cols);
    return PL_OK;
}

// rows * cols fp32 values without overflow (in elements and in bytes); `what`
// names the product in the message ("rows * cols").
static inline int pl_check_elements(int64_t rows, int64_t cols, const char* what, const char* func) {
    if ((uint64_t)rows > (uint64_t)INT64_MAX / (uint64_t)cols) return pl_fail(PL_ERR_SIZE_OVERFLOW, func, "%s overflows", what);
    size_t bytes;
    return pl_checked_bytes(rows * cols, sizeof(float), &bytes, func);
}

#ifdef __CUDACC__
int pl_cuda_fail(cudaError_t err, const char* func, const char* what);
// Any CUDA failure becomes a status carrying cudaGetErrorString.
#define PL_CUDA_CHECK(call)                                          \
    do {                                                             \
        cudaError_t pl_err_ = (call);                                \
        if (pl_err_ != cudaSuccess) return pl_cuda_fail(pl_err_, __func__, #call); \
    } while (0)
#endif

// ---------------------------------------------------------------------------
// formats

struct pl_fmt {
    const char* name;
    int bits;        // bits of a value (tf32: the 19 that carry information)
    int precision;   // significand bits, the implicit bit included
    int emin;        // exponent of the smallest normal
    double max;      // largest finite value
    bool has_inf;    // false: overflow gives NaN (OCP e4m3fn)
    size_t bytes;    // bytes a value takes in the library's buffers
};

// The arithmetic formats, declared once: pl_fmt exports this table.
static const pl_fmt PL_FORMATS[PL_FORMAT_COUNT_] = {
    {"fp64", 64, 53, -1022, 1.7976931348623157e308, true, 8},
    {"fp32", 32, 24, -126, 3.4028234663852886e38, true, 4},
    {"fp16", 16, 11, -14, 65504.0, true, 2},
    {"bf16", 16, 8, -126, 3.3895313892515355e38, true, 2},
    {"fp8_e4m3", 8, 4, -6, 448.0, false, 1},
    {"fp8_e5m2", 8, 3, -14, 57344.0, true, 1},
    {"tf32", 19, 11, -126, 3.4011621342146535e38, true, 4},  // stored in 32 bits; max = (2 - 2^-10) 2^127
};

static inline bool pl_valid_format(int f) { return f >= 0 && f < PL_FORMAT_COUNT_; }

// A format's bit in a set of formats (pl_variant_desc.dtypes); the row ops' three.
#define PL_FMT_BIT(f) (1u << (f))
#define PL_ROW_FORMATS (PL_FMT_BIT(PL_FP32) | PL_FMT_BIT(PL_BF16) | PL_FMT_BIT(PL_FP16))
#define PL_ALL_FORMATS ((1u << PL_FORMAT_COUNT_) - 1u)
#define PL_STORAGE_FORMATS (PL_ALL_FORMATS & ~PL_FMT_BIT(PL_TF32))  // tf32 is a compute format only

constexpr uint64_t pl_sign_bit = 0x8000000000000000ull;  // of a double's bits

static inline uint64_t pl_bits(double x) { uint64_t b; std::memcpy(&b, &x, 8); return b; }
static inline double pl_from_bits(uint64_t b) { double x; std::memcpy(&x, &b, 8); return x; }

// 2^q for q in the normal double range.
static inline double pl_pow2(int q) { return pl_from_bits((uint64_t)(q + 1023) << 52); }

// Round x (a double) to format f, to nearest with ties to even, exactly:
// integer arithmetic on the significand, no intermediate format.
static inline double pl_round_to(double x, const pl_fmt& f) {
    if (f.precision == 53 || std::isnan(x)) return x;
    if (std::isinf(x)) return f.has_inf ? x : std::numeric_limits<double>::quiet_NaN();  // e4m3fn: no Inf
    const uint64_t b = pl_bits(x);
    const uint64_t sign = b & 0x8000000000000000ull;
    const uint64_t a = b & ~0x8000000000000000ull;
    const int biased = (int)(a >> 52);
    if (biased == 0) return pl_from_bits(sign);  // 0 or a double subnormal: far below every target
    const int e = biased - 1023;
    const uint64_t m = (a & 0x000FFFFFFFFFFFFFull) | 0x0010000000000000ull;  // x = m * 2^(e-52)
    const int q = (e > f.emin ? e : f.emin) - (f.precision - 1);              // quantum exponent
    const int s = q - (e - 52);                                               // bits to drop (>= 29)
    uint64_t r;
    if (s >= 54) {
        r = 0;  // m < 2^53 <= half a quantum: rounds to zero, never a tie
    } else {
        const uint64_t half = 1ull << (s - 1);
        const uint64_t rem = m & ((1ull << s) - 1);
        r = m >> s;
        if (rem > half || (rem == half && (r & 1))) r += 1;
    }
    double y = (double)r * pl_pow2(q);
    if (y > f.max) y = f.has_inf ? std::numeric_limits<double>::infinity()
                                 : std::numeric_limits<double>::quiet_NaN();
    return sign ? -y : y;
}

// a + b rounded to odd in double: the exact sum's sticky bit survives, so a
// second rounding to any format of <= 51 bits is the correctly rounded sum
// (Boldo & Melquiond, "Emulation of FMA and correctly rounded sums", 2008).
static inline double pl_add_round_odd(double a, double b) {
    const double s = a + b;
    if (!std::isfinite(s)) return s;
    const double bb = s - a;                       // TwoSum (Knuth): s + e == a + b exactly
    const double e = (a - (s - bb)) + (b - bb);
    // Inexact with an even last bit: step one ulp toward the lost part. s != 0
    // here (a sum that rounds to zero is exact), so moving away from zero is
    // +1 on the magnitude's bits and toward zero is -1.
    if (e != 0.0 && (pl_bits(s) & 1) == 0) return pl_from_bits(pl_bits(s) + (((e > 0) == (s > 0)) ? 1 : -1));
    return s;
}

// One accumulator operation: a + b, exact result rounded once to f.
static inline double pl_add(double a, double b, const pl_fmt& f) {
    if (f.precision == 53) return a + b;
    return pl_round_to(pl_add_round_odd(a, b), f);
}
static inline double pl_sub(double a, double b, const pl_fmt& f) { return pl_add(a, -b, f); }

// The row ops' storage formats (fp32, bf16, fp16).
static inline bool pl_row_dtype(int dtype) { return dtype == PL_FP32 || dtype == PL_BF16 || dtype == PL_FP16; }

// PL_OK for a row dtype; else UNSUPPORTED for another format, INVALID_ARGUMENT
// for a code that is none. `what` names the argument ("dtype").
static inline int pl_check_row_dtype(int dtype, const char* what, const char* func) {
    if (pl_row_dtype(dtype)) return PL_OK;
    return pl_fail(pl_valid_format(dtype) ? PL_ERR_UNSUPPORTED : PL_ERR_INVALID_ARGUMENT, func,
                   "%s must be fp32, bf16 or fp16 (got %d)", what, dtype);
}

// ---------------------------------------------------------------------------
// host access to fp32 / bf16 / fp16 tensors (bf16, fp16 as raw 16-bit patterns)

static inline float pl_load_host(const void* p, int64_t i, int dtype) {
    switch (dtype) {
        case PL_FP32: return static_cast<const float*>(p)[i];
        case PL_BF16: {
            const uint32_t b = (uint32_t) static_cast<const uint16_t*>(p)[i] << 16;
            float f;
            std::memcpy(&f, &b, 4);
            return f;
        }
        case PL_FP16: {
            const uint16_t h = static_cast<const uint16_t*>(p)[i];
            const int e = (h >> 10) & 31, m = h & 1023;
            double v = e == 0 ? std::ldexp((double)m, -24)
                       : e == 31 ? (m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity())
                                 : std::ldexp((double)(1024 + m), e - 25);
            return (float)((h & 0x8000) ? -v : v);
        }
    }
    // Unreachable through the entry points (each checks its dtype first,
    // pl_check_row_dtype); never a guess at the format.
    pl_fail(PL_ERR_INVALID_ARGUMENT, "pl_load_host", "unknown format %d", dtype);
    return std::numeric_limits<float>::quiet_NaN();
}

// Round to the storage format (nearest even) and store.
static inline void pl_store_host(void* p, int64_t i, int dtype, float v) {
    if (!pl_row_dtype(dtype)) {  // as pl_load_host: unreachable, never a guess
        pl_fail(PL_ERR_INVALID_ARGUMENT, "pl_store_host", "unknown format %d", dtype);
        return;
    }
    const double r = pl_round_to((double)v, PL_FORMATS[dtype]);
    switch (dtype) {
        case PL_FP32: static_cast<float*>(p)[i] = (float)r; return;
        case PL_BF16: {
            const float f = (float)r;  // exact: r is a bf16 value
            uint32_t b;
            std::memcpy(&b, &f, 4);
            static_cast<uint16_t*>(p)[i] = std::isnan(f) ? 0x7FC0 : (uint16_t)(b >> 16);
            return;
        }
        case PL_FP16: {
            uint16_t h;
            const double a = std::fabs(r);
            const uint16_t sign = std::signbit(r) ? 0x8000 : 0;
            if (std::isnan(r)) h = 0x7E00;
            else if (std::isinf(r)) h = sign | 0x7C00;
            else if (a < std::ldexp(1.0, -14)) h = sign | (uint16_t)(a * std::ldexp(1.0, 24));
            else {
                int e;
                const double f = std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
                h = sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)((f * 2.0 - 1.0) * 1024.0);
            }
            static_cast<uint16_t*>(p)[i] = h;
            return;
        }
    }
}

// fp32 pairwise sum: the error grows with log2(n), not n. A sequential fp32
// sum over a 151936-wide row drifts by ~2e-4 relative (measured), far past
// what fp32 softmax should cost; the GPU's tree has the same property.
static inline float pl_pairwise_sum(const float* e, int64_t n) {
    if (n <= 8) {
        float s = 0.0f;
        for (int64_t j = 0; j < n; ++j) s += e[j];
        return s;
    }
    const int64_t h = n / 2;
    return pl_pairwise_sum(e, h) + pl_pairwise_sum(e + h, n - h);
}

// Threads per row of the simple GPU row kernels: cols rounded up to a warp,
// between 32 and 1024. The CPU emulates these lanes where a bug depends on them.
static inline int pl_lanes_for(int64_t work) {
    const int64_t t = (work + 31) / 32 * 32;
    return (int)(t < 32 ? 32 : t > 1024 ? 1024 : t);
}

// The launch heuristic of the "adaptive" GPU row kernels: a whole block per
// row while the batch cannot fill the SMs, one warp per row once it can. It
// makes a row's reduction order, and so its bits, depend on the batch size.
static inline int pl_adaptive_lanes_for(int64_t rows, int64_t cols, int sm_count) {
    const int t = rows < sm_count ? 1024 : 32;
    const int c = pl_lanes_for(cols);
    return t < c ? t : c;
}

// sum f(j), j in [0, n), in a GPU block's order: lane l adds j = l, l + lanes,
// ... in turn, then the lane sums combine pairwise (a stand-in for the shuffle
// tree). The CPU uses it to emulate a given launch.
template <typename F>
static inline float pl_lane_sum(F f, int64_t n, int lanes) {
    std::vector<float> part((size_t)lanes, 0.0f);
    for (int64_t j = 0; j < n; ++j) part[(size_t)(j % lanes)] += f(j);
    return pl_pairwise_sum(part.data(), lanes);
}

constexpr float pl_neg_inf = -std::numeric_limits<float>::infinity();

// IEEE fp32 operations rounded once to nearest even, the same on the host and
// the device (the host build does not contract, -ffp-contract=off; the device
// says _rn), for the kernels whose bits a host reference reproduces.
#if defined(__CUDA_ARCH__)
#define PL_RN_(device, host) return device
#else
#define PL_RN_(device, host) return host
#endif
PL_HD static inline float pl_fmul_rn(float a, float b) { PL_RN_(__fmul_rn(a, b), a * b); }
PL_HD static inline float pl_fadd_rn(float a, float b) { PL_RN_(__fadd_rn(a, b), a + b); }
PL_HD static inline float pl_fsub_rn(float a, float b) { PL_RN_(__fsub_rn(a, b), a - b); }
PL_HD static inline float pl_fdiv_rn(float a, float b) { PL_RN_(__fdiv_rn(a, b), a / b); }
PL_HD static inline float pl_ffma_rn(float a, float b, float c) { PL_RN_(__fmaf_rn(a, b, c), std::fma(a, b, c)); }
PL_HD static inline float pl_to_float_rn(double v) { PL_RN_(__double2float_rn(v), (float)v); }
#undef PL_RN_

// One step of the `fp32` accumulator model (precisionlab/numerics/accumulators.py):
// c = fp32(c + fp32(x y)), two roundings, no fused multiply-add. Declared once:
// matmul_accumulator.cu's fp32 model and flash_attention.cu's Q.K^T and P.V
// chains both take it, so the kernel's accumulation is the model's.
PL_HD static inline float pl_fp32_acc_step(float c, float x, float y) { return pl_fadd_rn(c, pl_fmul_rn(x, y)); }

// max that keeps NaN from either side. fmax drops a NaN operand, so a row
// holding NaN and -inf would look fully masked (max -inf) and be zeroed under
// the masked=zero policy; with this max a NaN anywhere makes the row NaN, as
// the float64 reference's np.max does.
PL_HD static inline float pl_max_nan(float a, float b) { return (a > b || a != a) ? a : b; }


// ---------------------------------------------------------------------------
// RNG for stochastic rounding: counter-based, so a step's draw depends only on
// (seed, step) and Python can reproduce it. splitmix64's finaliser.
PL_HD static inline uint64_t pl_splitmix64(uint64_t seed, uint64_t counter) {
    uint64_t z = seed + (counter + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Uniform in [0, 1), 53 bits.
PL_HD static inline double pl_uniform(uint64_t seed, uint64_t counter) {
    return (double)(pl_splitmix64(seed, counter) >> 11) * (1.0 / 9007199254740992.0);
}

// Stochastic rounding of v to f: with lo <= |v| < lo + q the neighbours of |v|
// in f (q the quantum of |v|'s binade), round up with probability
// (|v| - lo) / q. v is the round-to-odd double of the exact result; scaling by
// q and the subtraction are exact, so the probability is exactly as stated.
static inline double pl_round_stochastic(double v, const pl_fmt& f, double u) {
    if (f.precision == 53 || v == 0.0) return v;
    if (!std::isfinite(v)) return pl_round_to(v, f);
    const double a = std::fabs(v);
    int e = (int)((pl_bits(a) >> 52) & 0x7FF) - 1023;
    if (e < f.emin) e = f.emin;
    const int qe = e - (f.precision - 1);
    const double lo = std::floor(a * pl_pow2(-qe)) * pl_pow2(qe);
    const double frac = (a - lo) * pl_pow2(-qe);
    double r = u < frac ? lo + pl_pow2(qe) : lo;
    if (r > f.max) r = f.has_inf ? std::numeric_limits<double>::infinity()
                                 : std::numeric_limits<double>::quiet_NaN();
    return v < 0 ? -r : r;
}

// ---------------------------------------------------------------------------
// CUDA: storage types, warp and block reductions.
#ifdef __CUDACC__

template <typename T> struct pl_storage;
template <> struct pl_storage<double> { static constexpr int code = PL_FP64; };
template <> struct pl_storage<float> { static constexpr int code = PL_FP32; };
template <> struct pl_storage<__half> { static constexpr int code = PL_FP16; };
template <> struct pl_storage<__nv_bfloat16> { static constexpr int code = PL_BF16; };
template <> struct pl_storage<__nv_fp8_e4m3> { static constexpr int code = PL_FP8_E4M3; };
template <> struct pl_storage<__nv_fp8_e5m2> { static constexpr int code = PL_FP8_E5M2; };

// Widen a stored value exactly.
__device__ __forceinline__ float pl_widen(float x) { return x; }
__device__ __forceinline__ double pl_widen(double x) { return x; }
__device__ __forceinline__ float pl_widen(__half x) { return __half2float(x); }
__device__ __forceinline__ float pl_widen(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float pl_widen(__nv_fp8_e4m3 x) { return (float)x; }
__device__ __forceinline__ float pl_widen(__nv_fp8_e5m2 x) { return (float)x; }

// Accumulator arithmetic. acc_t is the register type; bf16 sums live in a float
// register that always holds a bf16 value, rounded after every addition.
template <int ACC> struct pl_acc;
template <> struct pl_acc<PL_FP32> {
    using reg = float;
    __device__ static __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
};
template <> struct pl_acc<PL_FP64> {
    using reg = double;
    __device__ static __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
};
template <> struct pl_acc<PL_BF16> {
    using reg = float;
    // fp32 add then bf16 rounding. For bf16 + bf16 this double rounding is
    // innocuous (24 >= 2*8 + 2); with wider stored values it is what hardware
    // bf16 accumulation does too.
    __device__ static __forceinline__ float add(float a, float b) {
        return __bfloat162float(__float2bfloat16_rn(__fadd_rn(a, b)));
    }
};

template <typename R>
__device__ __forceinline__ R pl_shfl_down(R v, int delta) { return __shfl_down_sync(0xffffffffu, v, delta); }

// Fixed-shape warp tree: lane 0 ends with the sum. Deterministic.
template <int ACC, typename R>
__device__ __forceinline__ R pl_warp_sum(R v) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) v = pl_acc<ACC>::add(v, pl_shfl_down(v, d));
    return v;
}

// Block tree: warp sums, then warp 0 sums the warp results. Thread 0 ends with
// the block's sum. blockDim.x must be a multiple of 32, at most 1024.
template <int ACC, typename R>
__device__ R pl_block_sum(R v) {
    __shared__ R warp_sums[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    v = pl_warp_sum<ACC>(v);
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    R r = (R)0;
    if (warp == 0) {
        r = lane < nwarps ? warp_sums[lane] : (R)0;  // 0 is the identity of +
        r = pl_warp_sum<ACC>(r);
    }
    __syncthreads();  // warp_sums may be reused by the caller's next call
    return r;
}

// All-reduce over a block for an associative op: every thread gets the result.
// `identity` is what a thread holding nothing contributes; passing the wrong
// one (0 for a max) is the classic bug softmax shows as a named variant.
struct pl_op_max {
    __device__ __forceinline__ float operator()(float a, float b) const { return pl_max_nan(a, b); }
};
struct pl_op_add {
    __device__ __forceinline__ float operator()(float a, float b) const { return __fadd_rn(a, b); }
};

// A warp shuffle of a float; a struct of floats reduced by pl_block_allreduce
// brings its own pl_shfl_xor overload beside it (found by argument lookup).
__device__ __forceinline__ float pl_shfl_xor(float v, int d) { return __shfl_xor_sync(0xffffffffu, v, d); }

template <typename T, typename Op>
__device__ __forceinline__ T pl_warp_allreduce(T v, Op op) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) v = op(v, pl_shfl_xor(v, d));
    return v;
}

template <typename T, typename Op>
__device__ T pl_block_allreduce(T v, Op op, T identity) {
    __shared__ T partial[32];
    __shared__ T result;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = pl_warp_allreduce(v, op);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T r = lane < nwarps ? partial[lane] : identity;
        r = pl_warp_allreduce(r, op);
        if (lane == 0) result = r;
    }
    __syncthreads();
    const T out = result;
    __syncthreads();  // partial/result may be reused by the next call
    return out;
}

// Loads and stores of row tensors in their storage type, fp32 in registers.
template <typename T> __device__ __forceinline__ float pl_ld(const T* p, int64_t i) { return pl_widen(p[i]); }
template <typename T> __device__ __forceinline__ void pl_st(T* p, int64_t i, float v);
template <> __device__ __forceinline__ void pl_st<float>(float* p, int64_t i, float v) { p[i] = v; }
template <> __device__ __forceinline__ void pl_st<__nv_bfloat16>(__nv_bfloat16* p, int64_t i, float v) {
    p[i] = __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ void pl_st<__half>(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }

template <typename T> __device__ __forceinline__ float pl_round_storage(float v) { return v; }
template <> __device__ __forceinline__ float pl_round_storage<__nv_bfloat16>(float v) {
    return __bfloat162float(__float2bfloat16_rn(v));
}
template <> __device__ __forceinline__ float pl_round_storage<__half>(float v) { return __half2float(__float2half_rn(v)); }


// A device pointer the kernels may dereference: on the device (or managed) and
// aligned to the element it holds. A misaligned access is a sticky error that
// ends the CUDA context for the whole process (torch's too), so it is refused
// here, not discovered there.
static inline int pl_require_device(const void* p, size_t align, const char* name, const char* func) {
    cudaPointerAttributes a;
    const cudaError_t err = cudaPointerGetAttributes(&a, p);
    if (err != cudaSuccess) return pl_cuda_fail(err, func, "cudaPointerGetAttributes");
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "%s is not a device pointer", name);
    if (reinterpret_cast<uintptr_t>(p) % align != 0)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "%s must be %zu-byte aligned", name, align);
    return PL_OK;
}

// The current device's SM count, for launch heuristics.
static inline int pl_sm_count(int* sms, const char* func) {
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev);
    return err == cudaSuccess ? PL_OK : pl_cuda_fail(err, func, "SM count");
}

// The GPU launchers' one dtype switch: f(pl_type<T>{}) with T the storage type
// of a row dtype (float, __nv_bfloat16, __half); any other code is an error.
template <typename T> struct pl_type { using type = T; };
template <typename F>
static inline int pl_with_row_type(int dtype, const char* func, F&& f) {
    switch (dtype) {
        case PL_FP32: return f(pl_type<float>{});
        case PL_BF16: return f(pl_type<__nv_bfloat16>{});
        case PL_FP16: return f(pl_type<__half>{});
    }
    return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "unknown row dtype %d", dtype);
}

#endif  // __CUDACC__

// ---------------------------------------------------------------------------
// the catalog (precisionlab.h, pl_variant_desc): each cuda/<op>.cu declares
// its variants once, as an X-macro list beside their code,
//
//   #define SOFTMAX_VARIANTS(X)
//       X(PL_SOFTMAX_NAIVE, 0, "naive", ALGORITHM, PL_ON_CPU | PL_ON_CUDA, PL_ROW_FORMATS, AS_GIVEN, 1, 1, 1,
//         NO_SASS, "summary")
//   PL_DECLARE_VARIANTS(softmax, SOFTMAX_VARIANTS);
//
// which makes the enum the code switches on and the table rows, and registers
// the rows when the library loads. Columns: symbol, id, name, kind, devices,
// dtypes (PL_FMT_BIT set of the formats it takes), input order,
// batch-invariant (1/0/-1), deterministic, default, the instruction ceilings
// make sass-check holds its kernels to, summary. The ceilings column is
// NO_SASS or SASS(PL_SASS_KERNEL(kernel, checks, dtypes, ceiling), ...): one
// entry per kernel and ceiling (a kernel whose ceiling differs by dtype takes
// one entry per ceiling).
struct pl_variant_row {
    int32_t id;
    const char* name;
    int32_t kind, devices;
    uint32_t dtypes;
    int32_t order, batch_invariant, deterministic, is_default;
    const pl_sass_rule* sass;
    int32_t nsass;
    const char* summary;
};
// Registers op's rows (called once per list, at load; an op may have one list
// per file); returns 0.
int pl_catalog_register(const char* op, const pl_variant_row* rows, int count);
// The row of op with this id, or NULL.
const pl_variant_row* pl_catalog_find(const char* op, int id);
// PL_OK when op has a variant `id` that runs on `device` (PL_ON_CPU / PL_ON_CUDA), else a status naming it.
int pl_check_variant(const char* op, int id, int device, const char* func);

#define PL_SASS_KERNEL(kernel, checks, dtypes, ceiling) {kernel, checks, dtypes, ceiling}
#define PL_SASS_LIST_SASS(...) __VA_ARGS__,
#define PL_SASS_LIST_NO_SASS
// Each row's ceilings, ended by an empty entry (an array is never empty).
// (Two steps: the column is expanded first, so it may be a macro naming a shared SASS(...).)
#define PL_VARIANT_SASS_(sym, id, name, kind, devices, dtypes, order, binv, det, dflt, sass, summary) \
    PL_SASS_ARRAY_(sym, sass)
#define PL_SASS_ARRAY_(sym, sass) static const pl_sass_rule pl_sass_##sym[] = {PL_SASS_LIST_##sass{nullptr, 0, 0, 0.0}};
#define PL_VARIANT_ENUM_(sym, id, ...) sym = id,
#define PL_VARIANT_ROW_(sym, id, name, kind, devices, dtypes, order, binv, det, dflt, sass, summary)       \
    {id,   name, PL_KIND_##kind, devices, dtypes, PL_ORDER_##order, binv, det, dflt, pl_sass_##sym,          \
     (int32_t)(sizeof pl_sass_##sym / sizeof pl_sass_##sym[0]) - 1, summary},
// Identifiers from the list's name, so one op may declare a list in each of several files.
#define PL_DECLARE_VARIANTS(op, LIST)                                                      \
    enum LIST##_ids { LIST(PL_VARIANT_ENUM_) };                                            \
    LIST(PL_VARIANT_SASS_)                                                                 \
    static const pl_variant_row pl_rows_##LIST[] = {LIST(PL_VARIANT_ROW_)};                \
    static const int pl_registered_##LIST =                                                \
        pl_catalog_register(#op, pl_rows_##LIST, (int)(sizeof pl_rows_##LIST / sizeof pl_rows_##LIST[0]))
