/*
 * flash_attention.cu: FlashAttention's forward pass, one head, tiled online
 * softmax, bit for bit as precisionlab/numerics/flash_attention.py's
 * docstring defines it for the knobs this kernel offers:
 *   inputs fp32 (Q rows x d, K keys x d, V keys x dv, row-major), block_r
 *   (Br) and block_c (Bc) tiles, causal (bottom-right aligned), max_offset,
 *   the lazy-rescale threshold, the P format (fp32, bf16, fp16, fp8 e4m3 /
 *   e5m2: nearest even, FP8 saturating) with an optional p_scale, fp32
 *   accumulation of Q.K^T and P.V (the emulator's `fp32` accumulator model:
 *   c = fp32(c + fp32(a_k b_k)), k in order, no fused multiply-add), one split,
 *   fp32 arithmetic (every operation rounded to fp32, exp2 of float64 then
 *   rounded and flushed below 2^-126, log of float64 then rounded).
 * Out: the normalised output (rows x dv, fp32) and the log-sum-exp (rows,
 * natural log units; may be NULL).
 *
 * The order of operations is the emulator's steps 1-9, per row, tile after
 * tile; the per-row and per-element steps are the __host__ __device__
 * functions below, which the CPU reference and the kernel both call, so the
 * two agree by construction and tests/test_flash_attention*.py hold them to
 * the numpy emulator.
 *
 * CPU reference: each row alone, tile after tile. GPU versions:
 *   1 tiled  one thread block of 128 threads a block of Br query rows: Q
 *            block, K and V tiles, the scores / P tile and the O block in
 *            shared memory; per tile the threads load K, V (coalesced), take
 *            the Br x Bc scores (a thread an entry, its dot product serial),
 *            the Br rows' softmax step (a thread a row), then the Br x dv
 *            outputs' P.V chains (a thread an entry). A numerics lab's
 *            kernel (the emulator's order, no tensor cores), not a fast one.
 */
#include <cmath>
#include <vector>

#include "common.cuh"

// The variants, declared once (common.cuh, PL_DECLARE_VARIANTS).
// symbol, id, name, kind, devices, dtypes, order, batch-invariant, deterministic, default, sass, summary
#define FLASH_FORMATS PL_FMT_BIT(PL_FP32)
#define FLASH_VARIANTS(X)                                                                                          \
    X(FLASH_REFERENCE, 0, "reference", ALGORITHM, PL_ON_CPU, FLASH_FORMATS, AS_GIVEN, 1, 1, 1, NO_SASS,            \
      "the host reference: each row's tiled online softmax in the emulator's order")                              \
    X(FLASH_TILED, 1, "tiled", KERNEL, PL_ON_CUDA, FLASH_FORMATS, AS_GIVEN, 1, 1, 1,                              \
      SASS(PL_SASS_KERNEL("flash_tiled", PL_SASS_SHARED_LOOPS, FLASH_FORMATS, 3.0)),                                 \
      "a block of Br rows, K/V tiles in shared memory, the emulator's order of operations")
PL_DECLARE_VARIANTS(flash_attention, FLASH_VARIANTS);

namespace {

constexpr int kFlashThreads = 128;
constexpr int64_t kMaxTile = 1024;              // Br, Bc at most
constexpr size_t kMaxSharedBytes = 227 * 1024;  // an H100 / H200 block's opt-in shared memory
constexpr double kLog2e = 1.4426950408889634;   // numerics/flash_attention.py's LOG2E
constexpr double kLn2 = 0.6931471805599453;     // math.log(2.0)

// The P format's rounding: significand bits, the smallest normal's exponent,
// the largest value and whether past it saturates (FP8's satfinite) or gives inf.
struct p_format {
    int precision, emin;
    double max;
    bool saturate;
};

// The per-launch constants, all fp32 values computed once on the host.
struct flash_params {
    float c;            // R(softmax_scale log2(e)): the scale in log2 units
    float c_ln2;        // R(c ln 2)
    float max_offset;   // log2 units
    float threshold;    // the lazy-rescale threshold, 0: eager
    float p_scale;      // multiplies P before its cast (1: no multiply)
    float inv_p_scale;  // R(1 / p_scale)
    double offset_pow;  // 2^-max_offset (float64, as the emulator's 2.0 ** -max_offset)
    p_format pf;
    int64_t rows, keys, d, dv, br, bc;
    int causal;
};

PL_HD inline uint64_t dbits(double x) {
    uint64_t b;
    memcpy(&b, &x, 8);
    return b;
}
PL_HD inline double from_dbits(uint64_t b) {
    double x;
    memcpy(&x, &b, 8);
    return x;
}


constexpr float kInf = __builtin_huge_valf();

// 2^x rounded to fp32, flushed to +0 below 2^-126 (the emulator's exp2 under fp32 arithmetic).
PL_HD inline float exp2_ftz(float x) {
    const float y = pl_to_float_rn(exp2((double)x));
    return y < 1.1754943508222875e-38f ? 0.0f : y;
}

// x (>= 0, an fp32 value) to the P format, nearest even, exactly: integer
// arithmetic on the double's significand (x is normal as a double).
PL_HD inline float round_p(float x, const p_format& f) {
    if (f.precision >= 24 || !(x > 0.0f) || x == kInf) return x;
    const uint64_t b = dbits((double)x);
    const int e = (int)(b >> 52) - 1023;
    const uint64_t m = (b & 0x000FFFFFFFFFFFFFull) | 0x0010000000000000ull;  // x = m 2^(e - 52)
    const int q = (e > f.emin ? e : f.emin) - (f.precision - 1);              // the quantum's exponent
    const int s = q - (e - 52);                                               // bits dropped, >= 29
    uint64_t r = 0;
    if (s < 54) {
        const uint64_t half = 1ull << (s - 1), rem = m & ((1ull << s) - 1);
        r = m >> s;
        if (rem > half || (rem == half && (r & 1))) ++r;
    }
    double y = (double)r * from_dbits((uint64_t)(q + 1023) << 52);  // exact; q >= -149 - 23 > -1022
    if (y > f.max) y = f.saturate ? f.max : (double)kInf;
    return (float)y;  // exact: y is a value of the format
}

// Step 1: a score, the fp32 accumulator model's chain over d from +0 (common.cuh's step).
PL_HD inline float qk_dot(const float* q, const float* k, int64_t d) {
    float s = 0.0f;
    for (int64_t i = 0; i < d; ++i) s = pl_fp32_acc_step(s, q[i], k[i]);
    return s;
}

// Steps 2-7 of one row on one tile: s[0..n) its scores (masked: -inf), which
// become the stored P in place; m, l the row's running max and sum. Returns
// alpha, the factor the row's O takes before this tile's P.V.
PL_HD inline float row_tile(float& m, float& l, float* s, int64_t n, bool first, const flash_params& fp) {
    float mt = -kInf;
    for (int64_t j = 0; j < n; ++j) mt = s[j] > mt ? s[j] : mt;
    float m_new = m > mt ? m : mt;
    float m_safe = m_new == -kInf ? 0.0f : m_new;
    const float a = pl_fmul_rn(pl_fsub_rn(m, m_safe), fp.c);  // -inf while the row has no max yet
    const bool keep = !first && fp.threshold > 0.0f && a >= -fp.threshold && m != -kInf;
    if (keep) m_new = m_safe = m;  // within the threshold: not rescaled
    const float alpha = keep ? 1.0f : exp2_ftz(m == -kInf ? -kInf : a);
    m = m_new;
    const float ms = m_new == -kInf ? 0.0f : pl_ffma_rn(m_safe, fp.c, -fp.max_offset);
    l = pl_fmul_rn(l, alpha);
    for (int64_t j = 0; j < n; ++j) {
        const float p = s[j] == -kInf ? 0.0f : exp2_ftz(pl_ffma_rn(s[j], fp.c, -ms));
        l = pl_fadd_rn(l, p);  // the sum takes the fp32 P, before the cast
        s[j] = round_p(fp.p_scale != 1.0f ? pl_fmul_rn(p, fp.p_scale) : p, fp.pf);
    }
    return alpha;
}

// Step 8 of one output entry: O = R(O alpha), then the fp32 chain over the tile's keys.
PL_HD inline float pv_step(float o, float alpha, const float* p, const float* v, int64_t stride, int64_t n) {
    o = pl_fmul_rn(o, alpha);
    for (int64_t j = 0; j < n; ++j) o = pl_fp32_acc_step(o, p[j], v[j * stride]);
    return o;
}

// The end of a row: the factor its O is multiplied by, and its lse.
PL_HD inline float row_factor(float l, const flash_params& fp) {
    const float inv = l > 0.0f ? pl_fdiv_rn(1.0f, l) : 0.0f;
    return pl_fmul_rn(inv, fp.inv_p_scale);
}
PL_HD inline float row_lse(float m, float l, const flash_params& fp) {
    if (!(l > 0.0f)) return -kInf;
    const float lg = pl_to_float_rn(log((double)pl_to_float_rn((double)l * fp.offset_pow)));
    return pl_ffma_rn(m == -kInf ? 0.0f : m, fp.c_ln2, lg);
}

// Key j is visible to row i (the queries are the last `rows` positions).
PL_HD inline bool visible(int64_t i, int64_t j, const flash_params& fp) {
    return !fp.causal || j <= i + fp.keys - fp.rows;
}

// The key tiles the block of rows [r0, r0 + Br) visits (FA's n_block_max).
PL_HD inline int64_t tiles_for_block(int64_t r0, const flash_params& fp) {
    int64_t end = fp.keys;
    if (fp.causal) {
        const int64_t last = (r0 + fp.br < fp.rows ? r0 + fp.br : fp.rows) + fp.keys - fp.rows;
        end = last < fp.keys ? last : fp.keys;
    }
    return (end + fp.bc - 1) / fp.bc;
}

// ---------------------------------------------------------------------------
// argument checks and the constants

size_t shared_floats(const pl_flash_config& cfg, int64_t d, int64_t dv) {
    const size_t br = (size_t)cfg.block_r, bc = (size_t)cfg.block_c;
    return br * (size_t)d + bc * (size_t)(d + dv) + br * bc + br * (size_t)dv + 3 * br;
}

int check_args(const float* q, const float* k, const float* v, const float* out, int64_t rows, int64_t keys,
               int64_t d, int64_t dv, const pl_flash_config* cfg, const char* func) {
    if (int st = pl_check_ptrs(func, {{"q", q}, {"k", k}, {"v", v}, {"cfg", cfg}, {"out", out}})) return st;
    if (rows <= 0 || keys <= 0 || d <= 0 || dv <= 0)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "rows, keys, d and dv must be > 0 (got %lld, %lld, %lld, %lld)",
                       (long long)rows, (long long)keys, (long long)d, (long long)dv);
    const int64_t lim = INT64_MAX / 8;
    const int64_t width = d > dv ? d : dv, longest = rows > keys ? rows : keys;
    if (longest > lim / width) return pl_fail(PL_ERR_SIZE_OVERFLOW, func, "S * d overflows");
    if (cfg->block_r < 1 || cfg->block_r > kMaxTile || cfg->block_c < 1 || cfg->block_c > kMaxTile)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "block_r and block_c must be in [1, %lld] (got %d, %d)",
                       (long long)kMaxTile, cfg->block_r, cfg->block_c);
    const int pf = cfg->p_format;
    if (!pl_valid_format(pf)) return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "unknown p_format %d", pf);
    if (pf != PL_FP32 && pf != PL_BF16 && pf != PL_FP16 && pf != PL_FP8_E4M3 && pf != PL_FP8_E5M2)
        return pl_fail(PL_ERR_UNSUPPORTED, func, "p_format %s: P is stored as fp32, bf16, fp16, fp8_e4m3 or fp8_e5m2",
                       PL_FORMATS[pf].name);
    if (!(cfg->max_offset >= 0.0f && cfg->max_offset <= 64.0f))
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "max_offset must be in [0, 64] (got %g)", (double)cfg->max_offset);
    if (!(cfg->rescale_threshold >= 0.0f && cfg->rescale_threshold <= 64.0f))
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "rescale_threshold must be in [0, 64] (got %g)",
                       (double)cfg->rescale_threshold);
    if (!(cfg->p_scale > 0.0f && std::isfinite(cfg->p_scale)))
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "p_scale must be a positive number (got %g)", (double)cfg->p_scale);
    if (!(cfg->softmax_scale >= 0.0 && std::isfinite(cfg->softmax_scale)))
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "softmax_scale must be > 0, or 0 for 1 / sqrt(d) (got %g)",
                       cfg->softmax_scale);
    if (cfg->causal != 0 && cfg->causal != 1)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "causal must be 0 or 1 (got %d)", cfg->causal);
    if (cfg->causal && rows > keys)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "causal needs rows <= keys (bottom-right alignment; got %lld > "
                       "%lld)", (long long)rows, (long long)keys);
    return PL_OK;
}

flash_params params_of(const pl_flash_config& cfg, int64_t rows, int64_t keys, int64_t d, int64_t dv) {
    const double scale = cfg.softmax_scale > 0.0 ? cfg.softmax_scale : 1.0 / std::sqrt((double)d);
    flash_params fp;
    fp.c = (float)(scale * kLog2e);
    fp.c_ln2 = (float)((double)fp.c * kLn2);
    fp.max_offset = cfg.max_offset;
    fp.threshold = cfg.rescale_threshold;
    fp.p_scale = cfg.p_scale;
    fp.inv_p_scale = 1.0f / cfg.p_scale;
    fp.offset_pow = std::pow(2.0, -(double)cfg.max_offset);
    const pl_fmt& f = PL_FORMATS[cfg.p_format];
    fp.pf = {f.precision, f.emin, f.max, cfg.p_format == PL_FP8_E4M3 || cfg.p_format == PL_FP8_E5M2};  // satfinite
    fp.rows = rows, fp.keys = keys, fp.d = d, fp.dv = dv, fp.br = cfg.block_r, fp.bc = cfg.block_c;
    fp.causal = cfg.causal;
    return fp;
}

}  // namespace

extern "C" int pl_flash_attention_cpu(const float* q, const float* k, const float* v, int64_t rows, int64_t keys,
                                      int64_t d, int64_t dv, const pl_flash_config* cfg, float* out, float* lse) {
    if (int st = check_args(q, k, v, out, rows, keys, d, dv, cfg, __func__)) return st;
    const flash_params fp = params_of(*cfg, rows, keys, d, dv);
    std::vector<float> s((size_t)fp.bc), o((size_t)dv);
    for (int64_t i = 0; i < rows; ++i) {
        const int64_t tiles = tiles_for_block(i / fp.br * fp.br, fp);
        float m = -kInf, l = 0.0f;
        for (int64_t c = 0; c < dv; ++c) o[(size_t)c] = 0.0f;
        for (int64_t t = 0; t < tiles; ++t) {
            const int64_t lo = t * fp.bc, n = (keys - lo < fp.bc ? keys - lo : fp.bc);
            for (int64_t j = 0; j < n; ++j)
                s[(size_t)j] = visible(i, lo + j, fp) ? qk_dot(q + i * d, k + (lo + j) * d, d) : -kInf;
            const float alpha = row_tile(m, l, s.data(), n, t == 0, fp);
            for (int64_t c = 0; c < dv; ++c)
                o[(size_t)c] = pv_step(o[(size_t)c], alpha, s.data(), v + lo * dv + c, dv, n);
        }
        const float f = row_factor(l, fp);
        for (int64_t c = 0; c < dv; ++c) out[i * dv + c] = pl_fmul_rn(o[(size_t)c], f);
        if (lse) lse[i] = row_lse(m, l, fp);
    }
    return PL_OK;
}

extern "C" int pl_flash_attention_shared_bytes(int64_t d, int64_t dv, const pl_flash_config* cfg, size_t* bytes) {
    PL_REQUIRE_PTR(cfg);
    PL_REQUIRE_PTR(bytes);
    PL_REQUIRE(d > 0 && dv > 0 && d <= INT64_MAX / 8 / kMaxTile && dv <= INT64_MAX / 8 / kMaxTile,
               PL_ERR_INVALID_ARGUMENT, "d and dv must be > 0 and not overflow (got %lld, %lld)", (long long)d,
               (long long)dv);
    PL_REQUIRE(cfg->block_r >= 1 && cfg->block_r <= kMaxTile && cfg->block_c >= 1 && cfg->block_c <= kMaxTile,
               PL_ERR_INVALID_ARGUMENT, "block_r and block_c must be in [1, %lld]", (long long)kMaxTile);
    *bytes = shared_floats(*cfg, d, dv) * sizeof(float);
    return PL_OK;
}

#ifdef __CUDACC__

namespace {

// Version 1. Shared memory: Q block (Br x d), K tile (Bc x d), V tile (Bc x
// dv), scores / P (Br x Bc), O block (Br x dv), then per row m, l, alpha.
template <typename T>
__global__ void __launch_bounds__(kFlashThreads) flash_tiled(const T* __restrict__ q, const T* __restrict__ k,
                                                             const T* __restrict__ v, T* __restrict__ out,
                                                             float* __restrict__ lse, flash_params fp) {
    extern __shared__ float smem[];
    const int64_t d = fp.d, dv = fp.dv, br = fp.br, bc = fp.bc;
    float* qs = smem;
    float* ks = qs + br * d;
    float* vs = ks + bc * d;
    float* ps = vs + bc * dv;
    float* os = ps + br * bc;
    float* rm = os + br * dv;
    float* rl = rm + br;
    float* ra = rl + br;
    const int64_t r0 = (int64_t)blockIdx.x * br;
    const int64_t nr = fp.rows - r0 < br ? fp.rows - r0 : br;
    const int64_t tid = threadIdx.x, nt = blockDim.x;
    for (int64_t e = tid; e < nr * d; e += nt) qs[e] = q[r0 * d + e];
    for (int64_t e = tid; e < nr * dv; e += nt) os[e] = 0.0f;
    for (int64_t r = tid; r < nr; r += nt) rm[r] = -kInf, rl[r] = 0.0f;
    const int64_t tiles = tiles_for_block(r0, fp);
    for (int64_t t = 0; t < tiles; ++t) {
        const int64_t lo = t * bc, n = fp.keys - lo < bc ? fp.keys - lo : bc;
        __syncthreads();  // the previous tile's P.V is done with ks, vs, ps
        for (int64_t e = tid; e < n * d; e += nt) ks[e] = k[lo * d + e];
        for (int64_t e = tid; e < n * dv; e += nt) vs[e] = v[lo * dv + e];
        __syncthreads();
        for (int64_t e = tid; e < nr * n; e += nt) {
            const int64_t r = e / n, j = e % n;
            ps[r * bc + j] = visible(r0 + r, lo + j, fp) ? qk_dot(qs + r * d, ks + j * d, d) : -kInf;
        }
        __syncthreads();
        for (int64_t r = tid; r < nr; r += nt) ra[r] = row_tile(rm[r], rl[r], ps + r * bc, n, t == 0, fp);
        __syncthreads();
        for (int64_t e = tid; e < nr * dv; e += nt) {
            const int64_t r = e / dv, c = e % dv;
            os[e] = pv_step(os[e], ra[r], ps + r * bc, vs + c, dv, n);
        }
    }
    __syncthreads();
    for (int64_t r = tid; r < nr; r += nt) {
        ra[r] = row_factor(rl[r], fp);
        if (lse) lse[r0 + r] = row_lse(rm[r], rl[r], fp);
    }
    __syncthreads();
    for (int64_t e = tid; e < nr * dv; e += nt) out[r0 * dv + e] = pl_fmul_rn(os[e], ra[e / dv]);
}

}  // namespace

extern "C" int pl_flash_attention_cuda(const float* q_dev, const float* k_dev, const float* v_dev, int64_t rows,
                                       int64_t keys, int64_t d, int64_t dv, const pl_flash_config* cfg,
                                       float* out_dev, float* lse_dev, int variant) {
    if (int st = check_args(q_dev, k_dev, v_dev, out_dev, rows, keys, d, dv, cfg, __func__)) return st;
    if (int st = pl_check_variant("flash_attention", variant, PL_ON_CUDA, __func__)) return st;
    const size_t bytes = shared_floats(*cfg, d, dv) * sizeof(float);
    PL_REQUIRE(bytes <= kMaxSharedBytes, PL_ERR_UNSUPPORTED, "block_r %d, block_c %d at d %lld, dv %lld need %zu "
               "bytes of shared memory, past a block's %zu: smaller tiles", cfg->block_r, cfg->block_c, (long long)d,
               (long long)dv, bytes, kMaxSharedBytes);
    const int64_t blocks = (rows + cfg->block_r - 1) / cfg->block_r;
    PL_REQUIRE(blocks <= 0x7FFFFFFF, PL_ERR_UNSUPPORTED, "at most 2^31 - 1 blocks of rows");
    if (int st = pl_require_device(q_dev, sizeof(float), "q_dev", __func__)) return st;
    if (int st = pl_require_device(k_dev, sizeof(float), "k_dev", __func__)) return st;
    if (int st = pl_require_device(v_dev, sizeof(float), "v_dev", __func__)) return st;
    if (int st = pl_require_device(out_dev, sizeof(float), "out_dev", __func__)) return st;
    if (lse_dev)
        if (int st = pl_require_device(lse_dev, sizeof(float), "lse_dev", __func__)) return st;
    const flash_params fp = params_of(*cfg, rows, keys, d, dv);
    // past 48 KiB the kernel must opt in; cudaLaunchKernelEx names the kernel, so the CPU emulator checks it too
    PL_CUDA_CHECK(cudaFuncSetAttribute(flash_tiled<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    const cudaLaunchConfig_t launch = {dim3((unsigned)blocks), dim3(kFlashThreads), bytes, 0, nullptr, 0};
    PL_CUDA_CHECK(cudaLaunchKernelEx(&launch, flash_tiled<float>, q_dev, k_dev, v_dev, out_dev, lse_dev, fp));
    return PL_OK;
}

#else

extern "C" int pl_flash_attention_cuda(const float* q_dev, const float* k_dev, const float* v_dev, int64_t rows,
                                       int64_t keys, int64_t d, int64_t dv, const pl_flash_config* cfg,
                                       float* out_dev, float* lse_dev, int variant) {
    (void)lse_dev;
    // the arguments first, as with nvcc, so a bad call says what is wrong before "no CUDA"
    if (int st = check_args(q_dev, k_dev, v_dev, out_dev, rows, keys, d, dv, cfg, __func__)) return st;
    if (int st = pl_check_variant("flash_attention", variant, PL_ON_CUDA, __func__)) return st;
    return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA");
}

#endif
