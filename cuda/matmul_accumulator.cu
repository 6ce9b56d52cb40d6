/*
 * matmul_accumulator.cu: C = A @ B under an accumulator model (pl_accumulator),
 * every output bit for bit as precisionlab/numerics/accumulators.py's
 * docstring defines the model. A (m x k) and B (k x n) are row-major fp32
 * arrays whose values are values of `format` (fp32, tf32, bf16, fp16, fp8
 * e4m3/e5m2): every such format's values are fp32 values, so one element type
 * serves them all, and the callers (numpy, torch) already hold them so.
 *
 * The models, one output c = sum_k a_k b_k at a time (k in the model's order):
 *   exact          the exact sum rounded once to fp32: products as exact
 *                  integers (24 x 24 significand bits) added into a 640-bit
 *                  fixed-point accumulator (bit 0 = 2^-298, the smallest
 *                  product's last bit), rounded once, nearest even.
 *   fp32           c = fp32(c + fp32(a_k b_k)), IEEE, no contraction.
 *   fp32-pairwise  adjacent pairs level by level, an odd last element passing
 *                  up: computed with a binary counter (a stack of <= 64 partial
 *                  sums, merged as blocks of 2^L complete, the last blocks
 *                  folded from the right), the same tree in O(log K) memory.
 *   hopper-fp8     a tensor core's fused dot-add, MMA-Sim's Hopper model: per
 *                  group of `group` k, the terms {c} U {a_k b_k}, each with
 *                  its alignment exponent (c: its own, at least -126; a
 *                  product: its factors' exponents summed, each at least its
 *                  format's emin; a zero c or product: -133, MMA-Sim 2.1.1's
 *                  e_zero; or with align = value a product's exact value's,
 *                  a zero product none, and e at least -126), e the largest,
 *                  each term cut to a multiple of
 *                  2^(e - bits + 1) (trunc, rne or floor) in integer arithmetic on
 *                  its significand, the cut terms summed exactly in int64
 *                  (below (group + 1) 2^(bits + 1) < 2^53), the sum cut to
 *                  out_bits significant bits the same way (an fp32 value).
 *   promote        chunks of `interval` k, each by hopper-fp8 from +0, added
 *                  in fp32.
 * An exact zero result is +0 in every model but fp32-pairwise at K = 1 (the
 * product itself), as the numpy models give. Inputs outside the models' domain
 * (NaN, inf, which the Python side refuses) give NaN in exact, hopper-fp8 and
 * promote, IEEE's result in fp32 and fp32-pairwise: defined, so the host and
 * the device agree on them too.
 *
 * CPU reference: the per-output function below in a loop. The GPU version
 * runs the very same per-output code (__host__ __device__), so they agree to
 * the bit; tests/test_accumulators.py holds the host to the numpy models and
 * the fractions emulation, tests/test_accumulators_gpu.py the GPU to the host.
 * GPU versions:
 *   1 thread_per_output  one thread per C element, its dot product serial: a
 *                        numerics lab's kernel, not a fast one.
 */
#include <climits>
#include <type_traits>

#include "common.cuh"

// The variants, declared once (common.cuh, PL_DECLARE_VARIANTS).
// symbol, id, name, kind, devices, dtypes, order, batch-invariant, deterministic, default, sass, summary
#define MATMUL_ACC_FORMATS                                                                                         \
    (PL_FMT_BIT(PL_FP32) | PL_FMT_BIT(PL_TF32) | PL_FMT_BIT(PL_BF16) | PL_FMT_BIT(PL_FP16) |                       \
     PL_FMT_BIT(PL_FP8_E4M3) | PL_FMT_BIT(PL_FP8_E5M2))
#define MATMUL_ACC_VARIANTS(X)                                                                                     \
    X(MACC_REFERENCE, 0, "reference", ALGORITHM, PL_ON_CPU, MATMUL_ACC_FORMATS, AS_GIVEN, 1, 1, 1, NO_SASS,        \
      "the host reference: each output's model step by step in integer arithmetic")                                \
    X(MACC_THREAD_PER_OUTPUT, 1, "thread_per_output", KERNEL, PL_ON_CUDA, MATMUL_ACC_FORMATS, AS_GIVEN, 1, 1, 1,   \
      NO_SASS, "one thread per output running the host reference's per-output code")
PL_DECLARE_VARIANTS(matmul_acc, MATMUL_ACC_VARIANTS);

namespace {

const char* const KIND_NAMES[PL_ACC_KIND_COUNT_] = {"exact", "fp32", "fp32-pairwise", "hopper-fp8", "promote"};
const char* const ROUNDING_NAMES[PL_ACC_ROUNDING_COUNT_] = {"trunc", "rne", "floor"};
const char* const ALIGN_NAMES[PL_ACC_ALIGN_COUNT_] = {"product", "value"};

constexpr int kMaxBits = 40;    // numerics/accumulators.py's MAX_BITS: the cut sum stays below 2^53
constexpr int kMaxOut = 24;     // MAX_OUT: a step's result is an fp32 value
constexpr int kF32Emin = -126;  // F32_EMIN: where a subnormal c aligns; align = value never aligns below it
// ZERO_EXP: a zero term's alignment exponent with align = product (c = 0, or a product with a zero factor):
// MMA-Sim 2.1.1's e_zero for an fp32 result on Hopper and Blackwell, below every non-zero fp32 c, so a zero
// never sets the group's exponent.
constexpr int kZeroExp = -133;
constexpr int kProductLsb = -298;  // the last bit of the smallest product, 2^-149 squared
constexpr int kLimbs = 20;      // 32-bit digits: 640 bits hold K < 2^63 products below 2^256

// ---------------------------------------------------------------------------
// exact helpers, host and device alike

PL_HD inline uint32_t fbits(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    return b;
}
PL_HD inline double pow2d(int q) {  // q in the normal double range
    const uint64_t b = (uint64_t)(q + 1023) << 52;
    double x;
    memcpy(&x, &b, 8);
    return x;
}
PL_HD inline int bitlen64(uint64_t v) {  // bits up to the leading one; 0 for 0
#if defined(__CUDA_ARCH__)
    return 64 - __clzll((long long)v);
#else
    return v ? 64 - __builtin_clzll(v) : 0;
#endif
}
PL_HD inline bool finite(float x) { return (fbits(x) & 0x7F800000u) != 0x7F800000u; }


// A finite value or product as (-1)^neg sig 2^ex exactly; sig == 0 for zero.
struct term {
    uint64_t sig;
    int ex;
    bool neg;
};
PL_HD inline term term_of(float x) {
    const uint32_t b = fbits(x);
    const uint32_t ef = (b >> 23) & 0xFF, man = b & 0x7FFFFFu;
    return {ef ? (uint64_t)(man | 0x800000u) : (uint64_t)man, ef ? (int)ef - 150 : -149, (b >> 31) != 0};
}
PL_HD inline term product(float x, float y) {  // exact: 48 bits at most
    const term a = term_of(x), b = term_of(y);
    return {a.sig * b.sig, a.ex + b.ex, a.neg != b.neg};
}
PL_HD inline int top_exp(const term& t) { return t.ex + bitlen64(t.sig) - 1; }  // floor(log2 |t|), t != 0
// A non-zero factor's alignment exponent (align = product): floor(log2 |x|), at least its format's emin
// (a product with a zero factor takes part at kZeroExp instead, see fused_group).
PL_HD inline int factor_exp(float x, int emin) {
    const int e = top_exp(term_of(x));
    return e > emin ? e : emin;
}

// t / 2^ul cut to an integer (pl_accumulator_rounding: toward zero, to nearest
// even, or toward -inf), signed. Below the group's alignment exponent e (a
// product's significands may multiply to just under 4),
// |t| / 2^ul < 2^(bits + 1) <= 2^41, so the cut lies in [-2^(bits+1), 2^(bits+1)].
PL_HD inline int64_t cut(const term& t, int ul, int rounding) {
    if (t.sig == 0) return 0;
    const int s = ul - t.ex;
    uint64_t q;
    bool inexact;
    if (s <= 0) {
        q = t.sig << (-s);  // exact: the term's last bit is at or above 2^ul
        inexact = false;
    } else if (s >= 64) {
        q = 0;  // sig < 2^48 < half of 2^s: zero toward zero and to nearest
        inexact = true;
    } else {
        q = t.sig >> s;
        const uint64_t rem = t.sig & ((1ull << s) - 1), half = 1ull << (s - 1);
        inexact = rem != 0;
        if (rounding == PL_ACC_RNE && (rem > half || (rem == half && (q & 1)))) ++q;
    }
    if (rounding == PL_ACC_FLOOR && t.neg && inexact) ++q;  // a negative magnitude cut up: toward -inf
    return t.neg ? -(int64_t)q : (int64_t)q;
}

// The inputs of one output: x[idx * sx], y[idx * sy], idx the step's k in the model's order.
struct dot_args {
    const float* x;
    int64_t sx;
    const float* y;
    int64_t sy;
    int64_t k;
    bool reverse;
    int emin_x, emin_y;  // the formats' smallest normal exponents (align = product)
    PL_HD float xv(int64_t s) const { return x[(reverse ? k - 1 - s : s) * sx]; }
    PL_HD float yv(int64_t s) const { return y[(reverse ? k - 1 - s : s) * sy]; }
};

PL_HD inline float fp32_sequential(const dot_args& d) {
    float c = 0.0f;
    for (int64_t s = 0; s < d.k; ++s) c = pl_fp32_acc_step(c, d.xv(s), d.yv(s));
    return c;
}

// Level-by-level pairs as a binary counter: after step s the stack holds the
// complete aligned blocks; s's trailing one bits say how many merge.
PL_HD inline float fp32_pairwise(const dot_args& d) {
    float stack[64];
    int depth = 0;
    for (int64_t s = 0; s < d.k; ++s) {
        float v = pl_fmul_rn(d.xv(s), d.yv(s));
        for (uint64_t t = (uint64_t)s; t & 1; t >>= 1) v = pl_fadd_rn(stack[--depth], v);
        stack[depth++] = v;
    }
    float v = stack[depth - 1];  // the partial blocks, smallest last: the tree folds them from the right
    for (int i = depth - 2; i >= 0; --i) v = pl_fadd_rn(stack[i], v);
    return v;
}

// One MMA step: c plus the products of steps [s0, s1), aligned to their
// largest alignment exponent (c included, at least -126), cut to `bits` bits,
// summed exactly, the sum cut to out_bits significant bits.
PL_HD inline float fused_group(float c, const dot_args& d, int64_t s0, int64_t s1, const pl_accumulator& a) {
    if (!finite(c)) return c;  // an overflowed accumulator stays as it is (the numpy model's inf)
    const bool by_product = a.align == PL_ACC_ALIGN_PRODUCT;
    // The floor: a zero term's exponent (align = product; c = 0 and zero products take part there, never
    // above a non-zero term), or fp32's emin (align = value: a zero product has no exponent).
    int e = by_product ? kZeroExp : kF32Emin;
    const term tc = term_of(c);
    if (tc.sig) {
        const int ec = top_exp(tc) > kF32Emin ? top_exp(tc) : kF32Emin;  // a subnormal c aligns at -126
        if (ec > e) e = ec;
    }
    for (int64_t s = s0; s < s1; ++s) {
        const float x = d.xv(s), y = d.yv(s);
        if (!finite(x) || !finite(y)) return NAN;
        const term t = product(x, y);
        if (t.sig) {  // a zero product sits at the floor
            const int te = by_product ? factor_exp(x, d.emin_x) + factor_exp(y, d.emin_y) : top_exp(t);
            if (te > e) e = te;
        }
    }
    const int ul = e - a.bits + 1;
    int64_t total = cut(tc, ul, a.rounding);
    for (int64_t s = s0; s < s1; ++s) total += cut(product(d.xv(s), d.yv(s)), ul, a.rounding);
    if (total == 0) return 0.0f;  // a zero sum is +0
    // Normalise: the sum's exponent (at least -126) and the quantum of out_bits significant bits there.
    const uint64_t mag = total < 0 ? (uint64_t)(-total) : (uint64_t)total;
    int es = bitlen64(mag) - 1 + ul;
    if (es < kF32Emin) es = kF32Emin;
    const int q = es - a.out_bits + 1;
    // q <= ul: the sum already has at most out_bits bits from its leading one down
    const int64_t r = q > ul ? cut(term{mag, ul, total < 0}, q, a.rounding) : total;
    if (r == 0) return 0.0f;  // cut to zero: +0
    // at most out_bits (+1 when rne carries) significant bits, the last at or above 2^-149: the double is
    // exact, and so is the float unless it overflows (inf)
    const double v = (double)r * pow2d(q > ul ? q : ul);
    const double big = 3.4028234663852886e38;
    return v > big ? INFINITY : v < -big ? -INFINITY : (float)v;
}

PL_HD inline float limited(float c, const dot_args& d, int64_t s0, int64_t s1, const pl_accumulator& a) {
    for (int64_t g0 = s0; g0 < s1; g0 += a.group) {
        const int64_t g1 = s1 - g0 > a.group ? g0 + a.group : s1;
        c = fused_group(c, d, g0, g1, a);
    }
    return c;
}

PL_HD inline float promote(const dot_args& d, const pl_accumulator& a) {
    float c = 0.0f;
    for (int64_t q0 = 0; q0 < d.k; q0 += a.interval) {
        const int64_t q1 = d.k - q0 > a.interval ? q0 + a.interval : d.k;
        c = pl_fadd_rn(c, limited(0.0f, d, q0, q1, a));  // the CUDA-core fp32 addition
    }
    return c;
}

// The exact sum: 32-bit digits in int64 limbs (carry-save: each product adds
// less than 2^32 to at most three limbs), carried every 2^30 products.
struct superacc {
    int64_t limb[kLimbs];

    PL_HD void carry() {
        for (int i = 0; i < kLimbs - 1; ++i) {
            const int64_t c = limb[i] >> 32;  // arithmetic: floor division by 2^32
            limb[i] -= c * 4294967296LL;
            limb[i + 1] += c;
        }
    }
    PL_HD void add(const term& t) {
        if (t.sig == 0) return;
        const int o = t.ex - kProductLsb, li = o >> 5, sh = o & 31;
        const uint64_t lo = (t.sig << sh) & 0xFFFFFFFFull, rest = t.sig >> (32 - sh);
        const int64_t sg = t.neg ? -1 : 1;
        limb[li] += sg * (int64_t)lo;
        limb[li + 1] += sg * (int64_t)(rest & 0xFFFFFFFFull);
        limb[li + 2] += sg * (int64_t)(rest >> 32);
    }
    PL_HD int bit(int i) const { return i < 0 ? 0 : (int)((limb[i >> 5] >> (i & 31)) & 1); }
    PL_HD bool any_below(int i) const {  // a set bit under index i
        for (int l = 0; l < kLimbs && 32 * l < i; ++l) {
            const int n = i - 32 * l;
            const uint64_t mask = n >= 32 ? 0xFFFFFFFFull : ((1ull << n) - 1);
            if ((uint64_t)limb[l] & mask) return true;
        }
        return false;
    }
    // The held value rounded once to fp32, nearest even; an exact zero is +0.
    PL_HD float round_fp32() {
        carry();
        const bool neg = limb[kLimbs - 1] < 0;
        if (neg) {
            for (int i = 0; i < kLimbs; ++i) limb[i] = -limb[i];
            carry();
        }
        int h = kLimbs - 1;
        while (h >= 0 && limb[h] == 0) --h;
        if (h < 0) return 0.0f;
        const int top = 32 * h + bitlen64((uint64_t)limb[h]) - 1;  // the leading bit's index
        const int exp = top + kProductLsb;
        const int q = (exp > -126 ? exp : -126) - 23;  // fp32's quantum there
        const int d = q - kProductLsb;                  // its bit index (> 0: exp >= -126 > -275)
        uint64_t r = 0;
        for (int i = top; i >= d; --i) r = (r << 1) | (uint64_t)bit(i);
        if (bit(d - 1) && ((r & 1) || any_below(d - 1))) ++r;
        if (r == 0) return 0.0f;
        const double v = (double)r * pow2d(q);  // exact: r <= 2^24
        const float f = v > 3.4028234663852886e38 ? INFINITY : (float)v;
        return neg ? -f : f;
    }
};

PL_HD inline float exact(const dot_args& d) {
    superacc acc;
    for (int i = 0; i < kLimbs; ++i) acc.limb[i] = 0;
    for (int64_t s = 0; s < d.k; ++s) {
        const float x = d.xv(s), y = d.yv(s);
        if (!finite(x) || !finite(y)) return NAN;
        acc.add(product(x, y));
        if ((s & ((1LL << 30) - 1)) == (1LL << 30) - 1) acc.carry();
    }
    return acc.round_fp32();
}

// One output under the model of kind KIND (its fields checked by check_args).
// A template, so a kernel instance holds only its kind's per-thread arrays.
template <int KIND>
PL_HD inline float output(const float* a, const float* b, int64_t i, int64_t j, int64_t n, int64_t k,
                          const pl_accumulator& acc, int emin) {
    const dot_args d{a + i * k, 1, b + j, n, k, acc.order == PL_ORDER_REVERSED, emin, emin};
    if constexpr (KIND == PL_ACC_EXACT) return exact(d);
    else if constexpr (KIND == PL_ACC_FP32) return fp32_sequential(d);
    else if constexpr (KIND == PL_ACC_FP32_PAIRWISE) return fp32_pairwise(d);
    else if constexpr (KIND == PL_ACC_HOPPER_FP8) return limited(0.0f, d, 0, d.k, acc);
    else return promote(d, acc);
}

// f(kind constant) for the model's kind (checked first: the last case is PL_ACC_PROMOTE).
template <typename F>
inline auto with_kind(int kind, F&& f) {
    switch (kind) {
        case PL_ACC_EXACT: return f(std::integral_constant<int, PL_ACC_EXACT>{});
        case PL_ACC_FP32: return f(std::integral_constant<int, PL_ACC_FP32>{});
        case PL_ACC_FP32_PAIRWISE: return f(std::integral_constant<int, PL_ACC_FP32_PAIRWISE>{});
        case PL_ACC_HOPPER_FP8: return f(std::integral_constant<int, PL_ACC_HOPPER_FP8>{});
    }
    return f(std::integral_constant<int, PL_ACC_PROMOTE>{});
}

// ---------------------------------------------------------------------------
// argument checks

bool acc_format(int f) { return f >= 0 && f < PL_FORMAT_COUNT_ && (MATMUL_ACC_FORMATS & PL_FMT_BIT(f)); }

int check_accumulator(const pl_accumulator* a, const char* func) {
    if (a->kind < 0 || a->kind >= PL_ACC_KIND_COUNT_)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "unknown accumulator kind %d", a->kind);
    if (a->order != PL_ORDER_AS_GIVEN && a->order != PL_ORDER_REVERSED)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "acc->order must be PL_ORDER_AS_GIVEN or PL_ORDER_REVERSED "
                       "(got %d)", a->order);
    if (a->kind != PL_ACC_HOPPER_FP8 && a->kind != PL_ACC_PROMOTE) return PL_OK;  // bits, group, ... unused
    if (a->bits < 1 || a->bits > kMaxBits)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "acc->bits must be in [1, %d] (got %d)", kMaxBits, a->bits);
    if (a->group < 1) return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "acc->group must be >= 1 (got %d)", a->group);
    if ((int64_t)a->group + 1 >= (1LL << (52 - a->bits)))
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "acc->bits = %d with acc->group = %d: (group + 1) "
                       "2^(bits + 1) must be below 2^53, or the cut terms would not sum exactly", a->bits, a->group);
    if (a->rounding < 0 || a->rounding >= PL_ACC_ROUNDING_COUNT_)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "unknown acc->rounding %d", a->rounding);
    if (a->align < 0 || a->align >= PL_ACC_ALIGN_COUNT_)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "unknown acc->align %d", a->align);
    if (a->out_bits < 1 || a->out_bits > kMaxOut)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "acc->out_bits must be in [1, %d] (got %d)", kMaxOut,
                       a->out_bits);
    if (a->kind == PL_ACC_PROMOTE && a->interval < 1)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "acc->interval must be >= 1 for promote (got %lld)",
                       (long long)a->interval);
    return PL_OK;
}

int check_args(const float* a, const float* b, const float* c, int64_t m, int64_t n, int64_t k, int format,
               const pl_accumulator* acc, const char* func) {
    if (int st = pl_check_ptrs(func, {{"a", a}, {"b", b}, {"acc", acc}, {"c", c}})) return st;
    if (m <= 0 || n <= 0 || k <= 0)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "m, n, k must be > 0 (got %lld, %lld, %lld)", (long long)m,
                       (long long)n, (long long)k);
    const int64_t lim = INT64_MAX / 8;
    if (m > lim / k || k > lim / n || m > lim / n) return pl_fail(PL_ERR_SIZE_OVERFLOW, func, "matrix sizes overflow");
    if (!pl_valid_format(format)) return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "unknown format %d", format);
    if (!acc_format(format))
        return pl_fail(PL_ERR_UNSUPPORTED, func, "format %s: the inputs are fp32 arrays of fp32, tf32, bf16, fp16 "
                       "or fp8 values", PL_FORMATS[format].name);
    return check_accumulator(acc, func);
}

// Every value of x is a value of the format (NaN is in every one), or the error naming the first that is not.
int check_values(const float* x, int64_t count, int format, const char* name, const char* func) {
    const pl_fmt& f = PL_FORMATS[format];
    for (int64_t i = 0; i < count; ++i) {
        const double v = x[i];
        if (v == v && pl_round_to(v, f) != v)
            return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "%s[%lld] = %.9g is not a %s value", name, (long long)i, v,
                           f.name);
    }
    return PL_OK;
}

}  // namespace

extern "C" int pl_accumulator_kind_info(int id, const char** name) {
    PL_REQUIRE_PTR(name);
    PL_REQUIRE(id >= 0 && id < PL_ACC_KIND_COUNT_, PL_ERR_INVALID_ARGUMENT, "unknown accumulator kind %d", id);
    *name = KIND_NAMES[id];
    return PL_OK;
}

extern "C" int pl_accumulator_rounding_info(int id, const char** name) {
    PL_REQUIRE_PTR(name);
    PL_REQUIRE(id >= 0 && id < PL_ACC_ROUNDING_COUNT_, PL_ERR_INVALID_ARGUMENT, "unknown accumulator rounding %d",
               id);
    *name = ROUNDING_NAMES[id];
    return PL_OK;
}

extern "C" int pl_accumulator_align_info(int id, const char** name) {
    PL_REQUIRE_PTR(name);
    PL_REQUIRE(id >= 0 && id < PL_ACC_ALIGN_COUNT_, PL_ERR_INVALID_ARGUMENT, "unknown accumulator alignment %d", id);
    *name = ALIGN_NAMES[id];
    return PL_OK;
}

extern "C" int pl_matmul_acc_cpu(const float* a, const float* b, int64_t m, int64_t n, int64_t k, int format,
                                 const pl_accumulator* acc, float* c) {
    if (int st = check_args(a, b, c, m, n, k, format, acc, __func__)) return st;
    if (int st = check_values(a, m * k, format, "a", __func__)) return st;
    if (int st = check_values(b, k * n, format, "b", __func__)) return st;
    const pl_accumulator model = *acc;
    const int emin = PL_FORMATS[format].emin;
    with_kind(model.kind, [&](auto kind) {
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) c[i * n + j] = output<decltype(kind)::value>(a, b, i, j, n, k, model, emin);
        return 0;
    });
    return PL_OK;
}

#ifdef __CUDACC__

namespace {

constexpr int kThreads = 128;

// Version 1: one thread per output, grid-stride.
template <int KIND>
__global__ void matmul_acc_thread(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                                  int64_t m, int64_t n, int64_t k, pl_accumulator acc, int emin) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < m * n; e += (int64_t)gridDim.x * blockDim.x)
        c[e] = output<KIND>(a, b, e / n, e % n, n, k, acc, emin);
}

}  // namespace

extern "C" int pl_matmul_acc_cuda(const float* a_dev, const float* b_dev, int64_t m, int64_t n, int64_t k, int format,
                                  const pl_accumulator* acc, float* c_dev, int variant) {
    if (int st = check_args(a_dev, b_dev, c_dev, m, n, k, format, acc, __func__)) return st;
    if (int st = pl_check_variant("matmul_acc", variant, PL_ON_CUDA, __func__)) return st;
    if (int st = pl_require_device(a_dev, sizeof(float), "a_dev", __func__)) return st;
    if (int st = pl_require_device(b_dev, sizeof(float), "b_dev", __func__)) return st;
    if (int st = pl_require_device(c_dev, sizeof(float), "c_dev", __func__)) return st;
    const int64_t blocks = (m * n + kThreads - 1) / kThreads;
    const unsigned grid = (unsigned)(blocks < 65535 ? blocks : 65535);
    const pl_accumulator model = *acc;
    with_kind(model.kind, [&](auto kind) {
        matmul_acc_thread<decltype(kind)::value><<<grid, kThreads>>>(a_dev, b_dev, c_dev, m, n, k, model,
                                                                     PL_FORMATS[format].emin);
        return 0;
    });
    PL_CUDA_CHECK(cudaGetLastError());
    return PL_OK;
}

#else

extern "C" int pl_matmul_acc_cuda(const float* a_dev, const float* b_dev, int64_t m, int64_t n, int64_t k, int format,
                                  const pl_accumulator* acc, float* c_dev, int variant) {
    // the arguments first, as with nvcc, so a bad call says what is wrong before "no CUDA"
    if (int st = check_args(a_dev, b_dev, c_dev, m, n, k, format, acc, __func__)) return st;
    if (int st = pl_check_variant("matmul_acc", variant, PL_ON_CUDA, __func__)) return st;
    return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA");
}

#endif
