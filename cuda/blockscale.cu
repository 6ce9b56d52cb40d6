/*
 * blockscale.cu: block-scaled formats. Quantize fp32 values to MXFP8 (e4m3 or
 * e5m2 elements), MXFP6 (e2m3, e3m2), MXFP4 (e2m1), each with one e8m0 scale
 * per block (OCP Microscaling Formats v1.0), or to NVFP4 (e2m1 elements, one
 * e4m3 scale per block of 16 and an fp32 per-tensor scale, NVIDIA's recipe);
 * and dequantize back to fp32.
 *
 * Every format and rule is declared once, in the tables below (bits, not
 * bytes), and exported by pl_minifloat_info / pl_block_format_info /
 * pl_scale_rule_info: Python builds its records from them.
 *
 * Scale rules for the MX formats. amax is the block's largest magnitude,
 * written amax = m * 2^E with m in [1, 2) exactly (fp32 subnormals included);
 * emax_elem is the exponent of the element format's largest normal and
 * max_elem its largest value. The scale is X = 2^e with
 *   FLOOR  e = E - emax_elem (OCP v1.0, section 6.3). amax / X = m * 2^emax_elem
 *          exceeds max_elem whenever m > max_elem / 2^emax_elem (1.5 for e2m1,
 *          1.75 for e4m3): the block's largest element then clips to max_elem.
 *   RCEIL  the smallest e with amax / 2^e <= max_elem, i.e.
 *          ceil(log2(amax / max_elem)) (cuBLAS's and TransformerEngine's MXFP8
 *          "round the decode scale amax / max_elem up to a power of two"). It
 *          is FLOOR's e plus one exactly when FLOOR clips, so it never clips.
 *          Computed exactly here; TransformerEngine forms amax * (1/max_elem)
 *          in fp32 first, which can differ by one step when that product
 *          rounds across a power of two.
 *   CEIL   e = ceil(log2 amax) - emax_elem: FLOOR plus one unless amax is a
 *          power of two. Never clips; spends a binade whenever m > 1.
 *   EVEN   FLOOR of amax with m first rounded to the element's mantissa bits,
 *          ties away from zero (torchao's EVEN: add half an element ulp to
 *          amax's fp32 bits, keep the exponent): e = E - emax_elem + 1 when
 *          m >= 2 - 2^-(mbits + 1). Clips when m lies in (max_elem/2^emax, that
 *          bound), e.g. (1.5, 1.75) for e2m1.
 * e is clamped to e8m0's [-127, 127]. An all-zero block gets e = -127 (code 0).
 * A block holding NaN or inf gets the NaN scale (code 255; e8m0 has no inf)
 * and zero element codes: it dequantizes to NaN throughout (OCP: a NaN scale
 * makes the whole block NaN).
 * Elements: P_i = V_i / X rounded to nearest, ties to even, in the element
 * format; finite values past max_elem saturate to +-max_elem (OCP: "clamped to
 * the max normal"). The sign of zero is kept. V_i / X is exact (X is a power of
 * two), so this is one rounding, done in integer arithmetic on V_i's bits.
 *
 * NVFP4 (rule PL_SCALE_NEAREST), every operation an fp32 one, rounded to
 * nearest even, in this order (NVIDIA's "Pretraining LLMs with NVFP4" recipe,
 * as TransformerEngine computes it up to the division below):
 *   g_enc = 2688 / tensor_amax (2688 = 6 * 448), capped at FLT_MAX; 1 when
 *           tensor_amax is 0, inf or NaN. g_dec = 1 / g_enc is the per-tensor
 *           scale stored.
 *   s_b   = e4m3(amax_b / 6 * g_enc), nearest even, saturating at 448: the
 *           block's stored scale. Rounding to nearest can round s_b down, so
 *           NVFP4 blocks can clip too (rarely: e4m3 has 3 mantissa bits).
 *   enc_b = g_enc / s_b (0 when s_b = 0), capped at FLT_MAX.
 *   P_i   = e2m1(V_i * enc_b), nearest even, saturating at 6.
 * A block holding NaN or inf gets the e4m3 NaN scale (0x7F) and zero codes.
 * Dequantize: y_i = (P_i * s_b) * g_dec (the first product is exact).
 *
 * Partial blocks: when n is not a multiple of the block size, the last block
 * holds n mod block elements and is scaled by those alone, exactly as if it
 * were padded with zeros. There are ceil(n / block) scales.
 * Storage: one code per byte (the low `bits` bits; dequantize ignores the
 * rest), one scale per byte.
 *
 * CPU reference: the per-block functions below, in a loop. The GPU versions
 * run the very same per-block code (__host__ __device__), so they must agree
 * to the bit; tests/test_blockscale.py checks both against an independent
 * emulation built on ml_dtypes' casts.
 * GPU versions (quantize):
 *   1  one thread per block: the simplest; a block's 32 loads are serial.
 *   2  one warp per block: lanes stride over the block, amax by a warp
 *      all-reduce; coalesced loads.
 * GPU versions (dequantize):
 *   1  one thread per element.
 */
#include <cfloat>

#include "common.cuh"

// The GPU variants, declared once (common.cuh, PL_DECLARE_VARIANTS).
// symbol, id, name, kind, devices, dtypes, order, batch-invariant, deterministic, default, sass, summary
#define BLOCKSCALE_QUANTIZE_VARIANTS(X)                                                                            \
    X(BSQ_THREAD_PER_BLOCK, 1, "thread_per_block", KERNEL, PL_ON_CUDA, PL_FMT_BIT(PL_FP32), AS_GIVEN, 1, 1, 0,     \
      NO_SASS, "one thread per scaling block: its loads are serial")                                               \
    X(BSQ_WARP_PER_BLOCK, 2, "warp_per_block", KERNEL, PL_ON_CUDA, PL_FMT_BIT(PL_FP32), AS_GIVEN, 1, 1, 1,         \
      NO_SASS, "one warp per scaling block, amax by a warp all-reduce; coalesced loads")
PL_DECLARE_VARIANTS(blockscale_quantize, BLOCKSCALE_QUANTIZE_VARIANTS);
#define BLOCKSCALE_DEQUANTIZE_VARIANTS(X)                                                                          \
    X(BSD_THREAD_PER_ELEMENT, 1, "thread_per_element", KERNEL, PL_ON_CUDA, PL_FMT_BIT(PL_FP32), AS_GIVEN, 1, 1, 1, \
      NO_SASS, "one thread per element")
PL_DECLARE_VARIANTS(blockscale_dequantize, BLOCKSCALE_DEQUANTIZE_VARIANTS);

namespace {

// ---------------------------------------------------------------------------
// the catalog

struct pl_mf {
    int bits, ebits, mbits, bias, emax;
    int max_r;    // largest value = max_r * 2^(emax - mbits) (max_r includes the implicit bit)
    int inf_nan;  // 0: neither; 1: e4m3fn (S.1111.111 is NaN, no inf); 2: IEEE (top exponent reserved)
};

// Element formats as the kernels use them (PL_HD: usable on the device).
PL_HD static inline pl_mf mf_of(int id) {
    switch (id) {
        case PL_MF_E2M1: return {4, 2, 1, 1, 2, 3, 0};
        case PL_MF_E2M3: return {6, 2, 3, 1, 2, 15, 0};
        case PL_MF_E3M2: return {6, 3, 2, 3, 4, 7, 0};
        case PL_MF_E4M3: return {8, 4, 3, 7, 8, 14, 1};
        case PL_MF_E5M2: return {8, 5, 2, 15, 15, 7, 2};
    }
    // not an element format (e8m0 is a scale; the entry points check their
    // codes first): a format of no bits, never another format's
    return {0, 0, 0, 0, 0, 0, 0};
}

const char* const MF_NAMES[PL_MINIFLOAT_COUNT_] = {"fp4_e2m1", "fp6_e2m3", "fp6_e3m2",
                                                   "fp8_e4m3", "fp8_e5m2", "e8m0"};

const pl_block_format_desc BLOCK_FORMATS[PL_BLOCK_FORMAT_COUNT_] = {
    {"mxfp8_e4m3", PL_MF_E4M3, 32, PL_MF_E8M0, 0},
    {"mxfp8_e5m2", PL_MF_E5M2, 32, PL_MF_E8M0, 0},
    {"mxfp6_e2m3", PL_MF_E2M3, 32, PL_MF_E8M0, 0},
    {"mxfp6_e3m2", PL_MF_E3M2, 32, PL_MF_E8M0, 0},
    {"mxfp4", PL_MF_E2M1, 32, PL_MF_E8M0, 0},
    {"nvfp4", PL_MF_E2M1, 16, PL_MF_E4M3, 32},
};

const char* const RULE_NAMES[PL_SCALE_RULE_COUNT_] = {"floor", "rceil", "ceil", "even", "nearest"};

constexpr int kMaxBlock = 1024;
constexpr uint8_t kE8M0Nan = 0xFF, kE4M3Nan = 0x7F;

// ---------------------------------------------------------------------------
// exact helpers, host and device alike

PL_HD static inline uint32_t fbits(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    return b;
}
PL_HD static inline float ffrom(uint32_t b) {
    float x;
    memcpy(&x, &b, 4);
    return x;
}
PL_HD static inline double pow2d(int q) {  // q in the normal double range
    const uint64_t b = (uint64_t)(q + 1023) << 52;
    double x;
    memcpy(&x, &b, 8);
    return x;
}
PL_HD static inline int bitlen(uint32_t v) {
    int l = 0;
    while (v) { ++l; v >>= 1; }
    return l;
}
PL_HD static inline float fabs_bits(float x) { return ffrom(fbits(x) & 0x7FFFFFFFu); }


PL_HD static inline uint8_t mf_max_code(const pl_mf f) {
    return (uint8_t)(((f.emax + f.bias) << f.mbits) | (f.max_r - (1 << f.mbits)));
}

// v * 2^-s rounded to nearest even in f, saturating at +-max; the sign of
// zero kept. Integer arithmetic on v's bits: v = sig * 2^ex exactly. NaN
// gives f's NaN (0 where f has none), inf gives f's inf or saturates.
PL_HD static inline uint8_t mf_encode(float v, int s, const pl_mf f) {
    const uint32_t b = fbits(v);
    const uint8_t sbit = (uint8_t)((b >> 31) << (f.bits - 1));
    const int ef = (int)((b >> 23) & 0xFF);
    const uint32_t man = b & 0x7FFFFFu;
    if (ef == 255) {
        if (man != 0) return f.inf_nan ? (uint8_t)(sbit | 0x7F) : sbit;  // 0x7F: a NaN of e4m3 and of e5m2
        return f.inf_nan == 2 ? (uint8_t)(sbit | (((1 << f.ebits) - 1) << f.mbits)) : (uint8_t)(sbit | mf_max_code(f));
    }
    const uint32_t sig = ef ? (man | 0x800000u) : man;
    if (sig == 0) return sbit;
    const int ex = (ef ? ef - 150 : -149) - s;  // |v| * 2^-s = sig * 2^ex
    const int lead = ex + bitlen(sig) - 1;      // exponent of the leading bit
    const int emin = 1 - f.bias;
    int q = (lead > emin ? lead : emin) - f.mbits;  // the quantum's exponent in f
    const int shift = q - ex;
    uint32_t r;
    if (shift <= 0) {
        r = sig << (-shift);  // exact (-shift <= mbits)
    } else if (shift >= 25) {
        r = 0;  // sig * 2^ex < 2^(ex + 24) <= half a quantum: rounds to zero, never a tie
    } else {
        const uint32_t half = 1u << (shift - 1), rem = sig & ((1u << shift) - 1);
        r = sig >> shift;
        if (rem > half || (rem == half && (r & 1u))) ++r;
    }
    if (r >> (f.mbits + 1)) { r >>= 1; ++q; }  // rounded up into the next binade
    const int qmax = f.emax - f.mbits;
    if (q > qmax || (q == qmax && r > (uint32_t)f.max_r)) return (uint8_t)(sbit | mf_max_code(f));
    if (r < (1u << f.mbits)) return (uint8_t)(sbit | r);  // subnormal or zero (q = emin - mbits)
    return (uint8_t)(sbit | ((q + f.mbits + f.bias) << f.mbits) | (r - (1u << f.mbits)));
}

// The value of a code (its low f.bits bits), exactly.
PL_HD static inline double mf_decode(uint32_t code, const pl_mf f) {
    code &= (1u << f.bits) - 1;
    const bool neg = (code >> (f.bits - 1)) & 1u;
    const int e = (int)((code >> f.mbits) & ((1u << f.ebits) - 1));
    const uint32_t m = code & ((1u << f.mbits) - 1);
    const int etop = (1 << f.ebits) - 1;
    double v;
    if ((f.inf_nan == 1 && e == etop && m == (1u << f.mbits) - 1) || (f.inf_nan == 2 && e == etop && m))
        v = NAN;
    else if (f.inf_nan == 2 && e == etop)
        v = INFINITY;
    else if (e == 0)
        v = (double)m * pow2d(1 - f.bias - f.mbits);
    else
        v = (double)((1u << f.mbits) + m) * pow2d(e - f.bias - f.mbits);
    return neg ? -v : v;
}

// The scale exponent a rule gives a block of finite amax > 0 (see the header).
PL_HD static inline int mx_scale_exp(float amax, const pl_mf f, int rule) {
    const uint32_t b = fbits(amax);
    const int ef = (int)((b >> 23) & 0xFF);
    const uint32_t man = b & 0x7FFFFFu;
    uint32_t sig;  // amax = sig * 2^(E - 23), sig in [2^23, 2^24)
    int E;
    if (ef) {
        sig = man | 0x800000u;
        E = ef - 127;
    } else {
        const int l = bitlen(man);
        sig = man << (24 - l);
        E = l - 1 - 149;
    }
    int bump = 0;
    switch (rule) {
        case PL_SCALE_RCEIL: bump = sig > ((uint32_t)f.max_r << (23 - f.mbits)); break;
        case PL_SCALE_CEIL: bump = sig != 0x800000u; break;
        case PL_SCALE_EVEN: bump = sig + (1u << (22 - f.mbits)) >= 0x1000000u; break;
        default: break;  // PL_SCALE_FLOOR
    }
    int e = E - f.emax + bump;
    return e < -127 ? -127 : e > 127 ? 127 : e;
}

// The NVFP4 per-tensor encode scale g_enc (its decode scale is 1 / g_enc).
static inline float nv_tensor_encode(float tensor_amax) {
    if (!(tensor_amax > 0.0f && tensor_amax <= FLT_MAX)) return 1.0f;
    const float g = 2688.0f / tensor_amax;
    return g > FLT_MAX ? FLT_MAX : g;
}

PL_HD static inline int element_of(int format) {
    switch (format) {
        case PL_MXFP8_E4M3: return PL_MF_E4M3;
        case PL_MXFP8_E5M2: return PL_MF_E5M2;
        case PL_MXFP6_E2M3: return PL_MF_E2M3;
        case PL_MXFP6_E3M2: return PL_MF_E3M2;
        case PL_MXFP4:
        case PL_NVFP4: return PL_MF_E2M1;
    }
    return -1;  // not a block format (the entry points check first): mf_of gives a format of no bits
}

// One block of len elements: its scale code and element codes.
PL_HD static inline void quantize_block(const float* x, int64_t len, int format, int rule, float g_enc,
                                        uint8_t* codes, uint8_t* scale) {
    float amax = 0.0f;
    for (int64_t i = 0; i < len; ++i) amax = pl_max_nan(amax, fabs_bits(x[i]));
    const bool nv = format == PL_NVFP4;
    const pl_mf f = mf_of(element_of(format));
    if (!(amax <= FLT_MAX)) {  // NaN or inf in the block
        *scale = nv ? kE4M3Nan : kE8M0Nan;
        for (int64_t i = 0; i < len; ++i) codes[i] = 0;
        return;
    }
    if (nv) {
        const pl_mf e4 = mf_of(PL_MF_E4M3);
        const uint8_t sc = mf_encode(pl_fmul_rn(pl_fdiv_rn(amax, 6.0f), g_enc), 0, e4);
        const float s = (float)mf_decode(sc, e4);
        float enc = s == 0.0f ? 0.0f : pl_fdiv_rn(g_enc, s);
        if (enc > FLT_MAX) enc = FLT_MAX;
        *scale = sc;
        for (int64_t i = 0; i < len; ++i) codes[i] = mf_encode(pl_fmul_rn(x[i], enc), 0, f);
        return;
    }
    const int e = amax == 0.0f ? -127 : mx_scale_exp(amax, f, rule);
    *scale = (uint8_t)(e + 127);
    for (int64_t i = 0; i < len; ++i) codes[i] = mf_encode(x[i], e, f);
}

// One element back to fp32.
PL_HD static inline float dequantize_one(uint8_t code, uint8_t scale, int format, float g_dec) {
    const pl_mf f = mf_of(element_of(format));
    const double p = mf_decode(code, f);
    if (format == PL_NVFP4) {
        const float s = (float)mf_decode(scale, mf_of(PL_MF_E4M3));
        return pl_fmul_rn(pl_fmul_rn((float)p, s), g_dec);
    }
    if (scale == kE8M0Nan) return NAN;
    return (float)(p * pow2d((int)scale - 127));  // exact, or inf past fp32's range
}

int check_args(int64_t n, int format, int block, int rule, const char* func) {
    if (n <= 0) return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "n must be > 0 (got %lld)", (long long)n);
    if ((uint64_t)n > SIZE_MAX / sizeof(float))
        return pl_fail(PL_ERR_SIZE_OVERFLOW, func, "n = %lld floats overflows size_t", (long long)n);
    if (format < 0 || format >= PL_BLOCK_FORMAT_COUNT_)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "unknown block format %d", format);
    if (block < 1 || block > kMaxBlock)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "block must be in [1, %d] (got %d)", kMaxBlock, block);
    if (rule < 0 || rule >= PL_SCALE_RULE_COUNT_)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "unknown scale rule %d", rule);
    return PL_OK;
}

int check_quantize_args(int64_t n, int format, int block, int rule, float tensor_amax, const float* tensor_scale,
                        const char* func) {
    if (int st = check_args(n, format, block, rule, func)) return st;
    const bool nv = format == PL_NVFP4;
    if (nv != (rule == PL_SCALE_NEAREST))
        return pl_fail(PL_ERR_UNSUPPORTED, func, "%s takes %s scales, not rule %s", BLOCK_FORMATS[format].name,
                       nv ? "the nearest" : "floor, rceil, ceil or even", RULE_NAMES[rule]);
    if (nv && !tensor_scale) return pl_fail(PL_ERR_NULL_POINTER, func, "tensor_scale is NULL (NVFP4 needs it)");
    if (nv && tensor_amax < 0.0f)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "tensor_amax must be >= 0 (got %g)", (double)tensor_amax);
    return PL_OK;
}

int64_t num_blocks(int64_t n, int block) { return n / block + (n % block != 0); }

}  // namespace

extern "C" int pl_minifloat_info(int id, pl_minifloat_desc* out) {
    PL_REQUIRE_PTR(out);
    PL_REQUIRE(id >= 0 && id < PL_MINIFLOAT_COUNT_, PL_ERR_INVALID_ARGUMENT, "unknown minifloat %d", id);
    if (id == PL_MF_E8M0) {
        *out = {MF_NAMES[id], 8, 8, 0, 127, -127, 127, pl_pow2(127), pl_pow2(-127), 0, 1};
        return PL_OK;
    }
    const pl_mf f = mf_of(id);
    *out = {MF_NAMES[id], f.bits, f.ebits, f.mbits, f.bias, 1 - f.bias, f.emax, mf_decode(mf_max_code(f), f),
            pl_pow2(1 - f.bias - f.mbits), f.inf_nan == 2, f.inf_nan != 0};
    return PL_OK;
}

extern "C" int pl_block_format_info(int id, pl_block_format_desc* out) {
    PL_REQUIRE_PTR(out);
    PL_REQUIRE(id >= 0 && id < PL_BLOCK_FORMAT_COUNT_, PL_ERR_INVALID_ARGUMENT, "unknown block format %d", id);
    *out = BLOCK_FORMATS[id];
    return PL_OK;
}

extern "C" int pl_scale_rule_info(int id, const char** name) {
    PL_REQUIRE_PTR(name);
    PL_REQUIRE(id >= 0 && id < PL_SCALE_RULE_COUNT_, PL_ERR_INVALID_ARGUMENT, "unknown scale rule %d", id);
    *name = RULE_NAMES[id];
    return PL_OK;
}

extern "C" int pl_blockscale_quantize_cpu(const float* x, int64_t n, int format, int block, int rule,
                                          float tensor_amax, uint8_t* codes, uint8_t* scales, float* tensor_scale) {
    PL_REQUIRE_PTR(x);
    PL_REQUIRE_PTR(codes);
    PL_REQUIRE_PTR(scales);
    if (int st = check_quantize_args(n, format, block, rule, tensor_amax, tensor_scale, __func__)) return st;
    const float g_enc = nv_tensor_encode(tensor_amax);
    if (format == PL_NVFP4) *tensor_scale = 1.0f / g_enc;
    for (int64_t b = 0, nb = num_blocks(n, block); b < nb; ++b) {
        const int64_t i0 = b * block, len = n - i0 < block ? n - i0 : block;
        quantize_block(x + i0, len, format, rule, g_enc, codes + i0, scales + b);
    }
    return PL_OK;
}

extern "C" int pl_blockscale_dequantize_cpu(const uint8_t* codes, const uint8_t* scales, float tensor_scale,
                                            int64_t n, int format, int block, float* y) {
    PL_REQUIRE_PTR(codes);
    PL_REQUIRE_PTR(scales);
    PL_REQUIRE_PTR(y);
    if (int st = check_args(n, format, block, 0, __func__)) return st;
    for (int64_t i = 0; i < n; ++i) y[i] = dequantize_one(codes[i], scales[i / block], format, tensor_scale);
    return PL_OK;
}

#ifdef __CUDACC__

namespace {

constexpr int kThreads = 256;

// Version 1: one thread per block.
__global__ void quantize_thread_per_block(const float* __restrict__ x, int64_t n, int format, int block, int rule,
                                          float g_enc, uint8_t* __restrict__ codes, uint8_t* __restrict__ scales,
                                          int64_t nblocks) {
    for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nblocks; b += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i0 = b * block, len = n - i0 < block ? n - i0 : block;
        quantize_block(x + i0, len, format, rule, g_enc, codes + i0, scales + b);
    }
}

// Version 2: one warp per block. Each lane takes elements lane, lane + 32, ...;
// every lane computes the same scale from the warp's all-reduced amax, then
// encodes its own elements with the per-block code of version 1.
__global__ void quantize_warp_per_block(const float* __restrict__ x, int64_t n, int format, int block, int rule,
                                        float g_enc, uint8_t* __restrict__ codes, uint8_t* __restrict__ scales,
                                        int64_t nblocks) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t b = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); b < nblocks; b += warps) {
        const int64_t i0 = b * block, len = n - i0 < block ? n - i0 : block;
        float amax = 0.0f;
        for (int64_t i = lane; i < len; i += 32) amax = pl_max_nan(amax, fabs_bits(x[i0 + i]));
        amax = pl_warp_allreduce(amax, pl_op_max());
        const bool nv = format == PL_NVFP4;
        const pl_mf f = mf_of(element_of(format));
        if (!(amax <= FLT_MAX)) {
            if (lane == 0) scales[b] = nv ? kE4M3Nan : kE8M0Nan;
            for (int64_t i = lane; i < len; i += 32) codes[i0 + i] = 0;
            continue;
        }
        int e = 0;
        float enc = 0.0f;
        uint8_t sc;
        if (nv) {
            const pl_mf e4 = mf_of(PL_MF_E4M3);
            sc = mf_encode(pl_fmul_rn(pl_fdiv_rn(amax, 6.0f), g_enc), 0, e4);
            const float s = (float)mf_decode(sc, e4);
            enc = s == 0.0f ? 0.0f : pl_fdiv_rn(g_enc, s);
            if (enc > FLT_MAX) enc = FLT_MAX;
        } else {
            e = amax == 0.0f ? -127 : mx_scale_exp(amax, f, rule);
            sc = (uint8_t)(e + 127);
        }
        if (lane == 0) scales[b] = sc;
        for (int64_t i = lane; i < len; i += 32)
            codes[i0 + i] = nv ? mf_encode(pl_fmul_rn(x[i0 + i], enc), 0, f) : mf_encode(x[i0 + i], e, f);
    }
}

__global__ void dequantize_thread_per_element(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                                              float g_dec, int64_t n, int format, int block, float* __restrict__ y) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = dequantize_one(codes[i], scales[i / block], format, g_dec);
}

unsigned grid_for(int64_t items, int per_block) {
    const int64_t g = (items + per_block - 1) / per_block;
    return (unsigned)(g < 65535 ? (g > 0 ? g : 1) : 65535);
}

}  // namespace

extern "C" int pl_blockscale_quantize_cuda(const float* x_dev, int64_t n, int format, int block, int rule,
                                           float tensor_amax, uint8_t* codes_dev, uint8_t* scales_dev,
                                           float* tensor_scale, int version) {
    PL_REQUIRE_PTR(x_dev);
    PL_REQUIRE_PTR(codes_dev);
    PL_REQUIRE_PTR(scales_dev);
    if (int st = check_quantize_args(n, format, block, rule, tensor_amax, tensor_scale, __func__)) return st;
    if (int st = pl_check_variant("blockscale_quantize", version, PL_ON_CUDA, __func__)) return st;
    if (int st = pl_require_device(x_dev, sizeof(float), "x_dev", __func__)) return st;
    if (int st = pl_require_device(codes_dev, 1, "codes_dev", __func__)) return st;
    if (int st = pl_require_device(scales_dev, 1, "scales_dev", __func__)) return st;
    const float g_enc = nv_tensor_encode(tensor_amax);
    if (format == PL_NVFP4) *tensor_scale = 1.0f / g_enc;
    const int64_t nb = num_blocks(n, block);
    if (version == BSQ_THREAD_PER_BLOCK)
        quantize_thread_per_block<<<grid_for(nb, kThreads), kThreads>>>(x_dev, n, format, block, rule, g_enc,
                                                                        codes_dev, scales_dev, nb);
    else
        quantize_warp_per_block<<<grid_for(nb, kThreads / 32), kThreads>>>(x_dev, n, format, block, rule, g_enc,
                                                                           codes_dev, scales_dev, nb);
    PL_CUDA_CHECK(cudaGetLastError());
    return PL_OK;
}

extern "C" int pl_blockscale_dequantize_cuda(const uint8_t* codes_dev, const uint8_t* scales_dev, float tensor_scale,
                                             int64_t n, int format, int block, float* y_dev, int version) {
    PL_REQUIRE_PTR(codes_dev);
    PL_REQUIRE_PTR(scales_dev);
    PL_REQUIRE_PTR(y_dev);
    if (int st = check_args(n, format, block, 0, __func__)) return st;
    if (int st = pl_check_variant("blockscale_dequantize", version, PL_ON_CUDA, __func__)) return st;
    if (int st = pl_require_device(codes_dev, 1, "codes_dev", __func__)) return st;
    if (int st = pl_require_device(scales_dev, 1, "scales_dev", __func__)) return st;
    if (int st = pl_require_device(y_dev, sizeof(float), "y_dev", __func__)) return st;
    dequantize_thread_per_element<<<grid_for(n, kThreads), kThreads>>>(codes_dev, scales_dev, tensor_scale, n, format,
                                                                       block, y_dev);
    PL_CUDA_CHECK(cudaGetLastError());
    return PL_OK;
}

#else

extern "C" int pl_blockscale_quantize_cuda(const float*, int64_t, int, int, int, float, uint8_t*, uint8_t*, float*,
                                           int) {
    return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA");
}
extern "C" int pl_blockscale_dequantize_cuda(const uint8_t*, const uint8_t*, float, int64_t, int, int, float*, int) {
    return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA");
}

#endif
