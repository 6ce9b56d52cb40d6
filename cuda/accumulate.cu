/*
 * accumulate.cu: summation of n stored values with a chosen accumulator
 * format, on the CPU (the sum's GPU versions are sum_cuda.cu's; the sorted
 * orders' sort is magnitude_sort.cu's; the exact references' sums are
 * exact_sum.cu's).
 *
 * CPU reference kernels (exact emulation of the accumulator format: each
 * operation's exact result rounded once, see common.cuh):
 *   sequential  left to right
 *   pairwise    adjacent pairs level by level, odd tail carried up; done as a
 *               streaming binary counter, so it needs O(log n) memory
 *   kahan       compensated summation in the accumulator's own precision
 *   neumaier    Kahan-Babuska-Neumaier, which also survives |x| > |sum|
 *   stochastic  sequential with stochastic rounding (seeded, counter-based)
 * Each comes twice: the exact path (pl_add: round to odd, then an integer
 * rounding), kept as the definition, and a fast path that gives the same bits
 * at hardware speed (see "CPU fast path" below; pl_accumulate_cpu_exact forces
 * the exact one, and the tests hold the two equal bit for bit).
 * pl_sum_cpu_threads: an fp32 sum cut into one chunk a thread, the chunk sums
 * added in order (its bits depend on the thread count).
 */
#include <thread>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common.cuh"

// The CPU variants of the sum, declared once (common.cuh, PL_DECLARE_VARIANTS);
// sum_cuda.cu declares the GPU ones. pl_accumulate_cpu takes these ids. The
// reordered rows run the sequential kernel on x as the caller arranged it
// (order column): the library sorts with pl_sort_by_magnitude
// (magnitude_sort.cu). dtypes: the accumulator formats (any).
// symbol, id, name, kind, devices, dtypes, order, batch-invariant, deterministic, default, sass, summary
#define SUM_CPU_VARIANTS(X)                                                                                        \
    X(PL_SEQUENTIAL, 0, "sequential", ALGORITHM, PL_ON_CPU, PL_ALL_FORMATS, AS_GIVEN, -1, 1, 1, NO_SASS,           \
      "left to right, one rounding per addition")                                                                  \
    X(PL_REVERSE_, 0, "reverse", ALGORITHM, PL_ON_CPU, PL_ALL_FORMATS, REVERSED, -1, 1, 1, NO_SASS,                \
      "sequential, right to left")                                                                                 \
    X(PL_SORTED_, 0, "sorted", ALGORITHM, PL_ON_CPU, PL_ALL_FORMATS, ASCENDING_ABS, -1, 1, 1, NO_SASS,             \
      "sequential by increasing |x|: best when the terms share a sign")                                            \
    X(PL_SORTED_DESC_, 0, "sorted_desc", ALGORITHM, PL_ON_CPU, PL_ALL_FORMATS, DESCENDING_ABS, -1, 1, 1,           \
      NO_SASS, "sequential by decreasing |x|: best under heavy cancellation")                                      \
    X(PL_PAIRWISE, 1, "pairwise", ALGORITHM, PL_ON_CPU, PL_ALL_FORMATS, AS_GIVEN, -1, 1, 1, NO_SASS,               \
      "adjacent pairs level by level, the odd tail carried up")                                                    \
    X(PL_KAHAN, 2, "kahan", ALGORITHM, PL_ON_CPU, PL_ALL_FORMATS, AS_GIVEN, -1, 1, 1, NO_SASS,                     \
      "compensated, in the accumulator's own precision")                                                           \
    X(PL_NEUMAIER, 3, "neumaier", ALGORITHM, PL_ON_CPU, PL_ALL_FORMATS, AS_GIVEN, -1, 1, 1, NO_SASS,               \
      "Kahan-Babuska-Neumaier: survives |x| > |sum|")                                                              \
    X(PL_STOCHASTIC, 4, "stochastic", ALGORITHM, PL_ON_CPU, PL_ALL_FORMATS, AS_GIVEN, -1, 1, 1, NO_SASS,           \
      "sequential with stochastic rounding (seeded, counter-based)")
PL_DECLARE_VARIANTS(sum, SUM_CPU_VARIANTS);

// ---------------------------------------------------------------------------
// CPU reference

namespace {

// The sequential sum's loop, whatever its arithmetic: add(s, i) is s + x[i]
// in the accumulator, get(s) the double s holds. The stall is the first step
// where a nonzero finite x leaves s as it was (watch_stall: a stochastic sum
// reports none).
template <typename S, typename Add, typename Get>
void sequential_loop(const double* x, int64_t n, S s, Add add, Get get, bool watch_stall, double* result,
                     int64_t* stall_step, double* stall_value, double* trace) {
    int64_t stall = -1;
    double stall_at = std::numeric_limits<double>::quiet_NaN();
    for (int64_t i = 0; i < n; ++i) {
        const S t = add(s, i);
        if (watch_stall && stall < 0 && get(t) == get(s) && x[i] != 0.0 && std::isfinite(x[i])) {
            stall = i;
            stall_at = get(s);
        }
        s = t;
        if (trace) trace[i] = get(s);
    }
    *result = get(s);
    if (stall_step) *stall_step = stall;
    if (stall_value) *stall_value = stall_at;
}

void cpu_sequential(const double* x, int64_t n, const pl_fmt& f, bool stochastic, uint64_t seed,
                    double* result, int64_t* stall_step, double* stall_value, double* trace) {
    // fp64 has no wider format to draw the rounding from: there it is plain RNE.
    const bool draw = stochastic && f.precision < 53;
    sequential_loop(
        x, n, 0.0,
        [&](double s, int64_t i) {
            return draw ? pl_round_stochastic(pl_add_round_odd(s, x[i]), f, pl_uniform(seed, (uint64_t)i))
                        : pl_add(s, x[i], f);
        },
        [](double s) { return s; }, !stochastic, result, stall_step, stall_value, trace);
}

// Level-by-level pairwise summation, streamed: a stack of partial sums tagged
// with their tree level; equal levels merge as soon as they meet, and what is
// left merges from the right at the end, exactly as the odd tails are carried
// up in the level-by-level description. op(a, b) is the accumulator's a + b.
template <typename T, typename Op>
struct pairwise_stack {
    Op op;
    T val[66] = {};
    int level[66] = {};
    int top = 0;
    explicit pairwise_stack(Op o) : op(o) {}
    void push(T v, int l) {
        while (top > 0 && level[top - 1] == l) {
            v = op(val[--top], v);
            ++l;
        }
        val[top] = v;
        level[top++] = l;
    }
    T finish() {
        while (top > 1) {
            const T r = val[--top];
            val[top - 1] = op(val[top - 1], r);
        }
        return val[0];
    }
};

double cpu_pairwise(const double* x, int64_t n, const pl_fmt& f) {
    const auto add = [&](double a, double b) { return pl_add(a, b, f); };
    pairwise_stack<double, decltype(add)> st(add);
    for (int64_t i = 0; i < n; ++i) st.push(x[i], 0);
    return pl_round_to(st.finish(), f);  // n == 1: the lone value still lands in the accumulator
}

double cpu_kahan(const double* x, int64_t n, const pl_fmt& f) {
    double s = 0.0, c = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double y = pl_sub(x[i], c, f);
        const double t = pl_add(s, y, f);
        c = pl_sub(pl_sub(t, s, f), y, f);
        s = t;
    }
    return s;
}

double cpu_neumaier(const double* x, int64_t n, const pl_fmt& f) {
    double s = 0.0, c = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double t = pl_add(s, x[i], f);
        const double lost = std::fabs(s) >= std::fabs(x[i]) ? pl_add(pl_sub(s, t, f), x[i], f)
                                                           : pl_add(pl_sub(x[i], t, f), s, f);
        c = pl_add(c, lost, f);
        s = t;
    }
    return pl_add(s, c, f);
}

}  // namespace

// ---------------------------------------------------------------------------
// CPU fast path: the same bits as the exact path, at hardware speed.
//
// Every accumulator operation is RN_p(a + b), the exact sum rounded once to the
// p-bit format. The fast path computes v = a + b in double (RN_53) and rounds v
// to p bits with two integer operations on its bits (add half a quantum to the
// magnitude, clear the dropped bits). That is RN_p(a + b) exactly, for any
// operands, narrower or wider than the accumulator, whenever
//   - v is in the format's normal range and rounds below the overflow
//     threshold (so the quantum is the one the bits say), and
//   - v is not a midpoint between two p-bit values.
// Why: every p-bit midpoint and the overflow threshold are doubles (p <= 51),
// and RN_53 is monotone, so a + b and v lie on the same side of each of them
// unless v *is* one; then both round alike (Figueroa's double-rounding argument
// without needing 53 >= 2p + 2: the midpoint case is simply sent to the exact
// path, which is the cheap round-to-odd step for wide operands, taken only
// there). Zeros, subnormals of the format, overflow, Inf and NaN fail the
// range test and take the exact path too. The test is a predicted branch off
// the dependency chain, so the chain costs one FP add and two integer ops.
// fp64 accumulators are native double arithmetic on both paths.

namespace {

#define PL_LIKELY(c) __builtin_expect(!!(c), 1)

constexpr uint64_t kSign = pl_sign_bit;

struct fast_fmt {
    uint64_t half;  // half a quantum of a normal value, in the double's bits
    uint64_t low;   // the bits a p-bit significand drops
    uint64_t keep;  // ~low
    uint64_t minb;  // bits of 2^emin
    uint64_t maxb;  // bits of the largest finite value
    uint64_t span;  // minb <= |bits| < minb + span: RN_p is normal and finite
    int p;
    const pl_fmt* f;
};

fast_fmt make_fast(const pl_fmt& f) {
    fast_fmt r;
    const int d = 53 - f.precision;
    r.half = 1ull << (d - 1);
    r.low = (1ull << d) - 1;
    r.keep = ~r.low;
    r.minb = (uint64_t)(f.emin + 1023) << 52;
    r.maxb = pl_bits(f.max);
    r.span = r.maxb + r.half - r.minb;
    r.p = f.precision;
    r.f = &f;
    return r;
}

// v's bits: may the two-op rounding stand for RN_p of the exact sum? A zero
// may: a sum that rounds to zero in double is exact, and the rounding keeps
// its sign, as the exact path does.
inline bool fast_ok(uint64_t vb, const fast_fmt& ff) {
    const uint64_t a = vb & ~kSign;
    // integer flags, not bools: short-circuit branches here would be taken at random
    const uint64_t in_range = (uint64_t)(a - ff.minb < ff.span) | (uint64_t)(a == 0);
    const uint64_t midpoint = (uint64_t)((a & ff.low) == ff.half);  // never 0
    return (in_range & ~midpoint) & 1;
}

// Off the fast path: v = RN_53(a + b) on a midpoint is a true tie when the
// double sum was exact (then ties go to even, on v's bits); every other case
// is the exact path's. (v - a == b and v - b == a hold both exactly when v is
// exact: the one with the larger operand is an exact subtraction, Dekker.)
inline double slow_add(double a, double b, double v, const fast_fmt& ff) {
    const uint64_t vb = pl_bits(v), a_ = vb & ~kSign;
    if ((a_ - ff.minb < ff.span) && (a_ & ff.low) == ff.half && v - a == b && v - b == a)
        return pl_from_bits((vb + ff.half - 1 + ((vb >> (53 - ff.p)) & 1)) & ff.keep);
    return pl_add(a, b, *ff.f);
}

// A double in an SSE register: the rounding's integer ops stay in the vector
// domain (a move to a general register and back costs more than the add).
#if defined(__SSE2__)
using reg = __m128d;
inline reg r_set(double x) { return _mm_set_sd(x); }
inline double r_get(reg r) { return _mm_cvtsd_f64(r); }
inline reg r_add(reg a, reg b) { return _mm_add_sd(a, b); }
inline reg r_sub(reg a, reg b) { return _mm_sub_sd(a, b); }
inline uint64_t r_bits(reg r) { return (uint64_t)_mm_cvtsi128_si64(_mm_castpd_si128(r)); }
struct r_consts {
    __m128i half, keep, half_1, one, drop;
    explicit r_consts(const fast_fmt& ff)
        : half(_mm_set1_epi64x((long long)ff.half)), keep(_mm_set1_epi64x((long long)ff.keep)),
          half_1(_mm_set1_epi64x((long long)ff.half - 1)), one(_mm_set1_epi64x(1)), drop(_mm_cvtsi32_si128(53 - ff.p)) {}
};
inline reg r_round(reg v, const r_consts& k) {
    return _mm_castsi128_pd(_mm_and_si128(_mm_add_epi64(_mm_castpd_si128(v), k.half), k.keep));
}
// Ties to even on the bits: two more integer ops than r_round.
inline reg r_round_even(reg v, const r_consts& k) {
    const __m128i b = _mm_castpd_si128(v);
    const __m128i lsb = _mm_and_si128(_mm_srl_epi64(b, k.drop), k.one);
    return _mm_castsi128_pd(_mm_and_si128(_mm_add_epi64(_mm_add_epi64(b, k.half_1), lsb), k.keep));
}
#else
using reg = double;
inline reg r_set(double x) { return x; }
inline double r_get(reg r) { return r; }
inline reg r_add(reg a, reg b) { return a + b; }
inline reg r_sub(reg a, reg b) { return a - b; }
inline uint64_t r_bits(reg r) { return pl_bits(r); }
struct r_consts {
    uint64_t half, keep;
    int drop;
    explicit r_consts(const fast_fmt& ff) : half(ff.half), keep(ff.keep), drop(53 - ff.p) {}
};
inline reg r_round(reg v, const r_consts& k) { return pl_from_bits((pl_bits(v) + k.half) & k.keep); }
inline reg r_round_even(reg v, const r_consts& k) {
    const uint64_t b = pl_bits(v);
    return pl_from_bits((b + k.half - 1 + ((b >> k.drop) & 1)) & k.keep);
}
#endif

// The accumulator's two operations on the fast path (formats below 53 bits).
struct fast_acc {
    fast_fmt ff;
    r_consts k;
    explicit fast_acc(const pl_fmt& f) : ff(make_fast(f)), k(ff) {}
    inline reg add(reg a, reg b) const {
        const reg v = r_add(a, b);
        const reg r = r_round(v, k);
        if (PL_LIKELY(fast_ok(r_bits(v), ff))) return r;
        return r_set(slow_add(r_get(a), r_get(b), r_get(v), ff));
    }
    inline reg sub(reg a, reg b) const {
        const reg v = r_sub(a, b);
        const reg r = r_round(v, k);
        if (PL_LIKELY(fast_ok(r_bits(v), ff))) return r;
        return r_set(slow_add(r_get(a), -r_get(b), r_get(v), ff));
    }
    // a + b where both are values of the format: then a double sum on a
    // midpoint is exact (53 >= 2p + 2, Figueroa), so ties go to even on the
    // bits and only the range is tested. Narrow operands meet exact ties often,
    // and a branch that fails that often costs more than the two integer ops.
    inline reg add_in(reg a, reg b) const {
        const reg v = r_add(a, b);
        const reg r = r_round_even(v, k);
        const uint64_t m = r_bits(v) & ~kSign;
        if (PL_LIKELY((uint64_t)(m - ff.minb < ff.span) | (uint64_t)(m == 0))) return r;
        return r_set(pl_add(r_get(a), r_get(b), *ff.f));
    }
    // a - b of two p-bit values (not necessarily in the format's range): a
    // double result on a midpoint is exact, so ties go to even on the bits,
    // behind a branch of their own (they are common, a range miss is not).
    inline reg sub_in(reg a, reg b) const {
        const reg v = r_sub(a, b);
        const uint64_t m = r_bits(v) & ~kSign;
        if (!PL_LIKELY((uint64_t)(m - ff.minb < ff.span) | (uint64_t)(m == 0)))
            return r_set(pl_sub(r_get(a), r_get(b), *ff.f));
        if (PL_LIKELY((m & ff.low) != ff.half)) return r_round(v, k);
        return r_round_even(v, k);
    }
    // Branch-free form for the pairwise tree, which has throughput to spare but
    // meets exact ties often (two values of one binade): ties to even on the
    // bits, and ok cleared only by a midpoint that was not exact, or by the range.
    inline double add_flag(double a, double b, bool& ok) const {
        const double v = a + b;
        const uint64_t vb = pl_bits(v), m = vb & ~kSign;
        const bool in_range = (m - ff.minb < ff.span) | (m == 0);
        const bool inexact_tie = ((m & ff.low) == ff.half) & ((v - a != b) | (v - b != a));
        ok &= in_range & !inexact_tie;
        return pl_from_bits((vb + ff.half - 1 + ((vb >> (53 - ff.p)) & 1)) & ff.keep);
    }
};

// The narrow loop where it runs, and from each x it stops at, the general loop
// over the next kWideRun values before the narrow one is tried again: wide
// data (fp32 values in a bf16 sum) pays one failed try per run, narrow data
// with a stray wide value (an fp16 subnormal in fp16 data: not a normal value
// of the format) loses only that run.
constexpr int64_t kWideRun = 256;

template <typename Narrow, typename Wide>
void narrow_or_wide(int64_t n, Narrow narrow, Wide wide) {
    for (int64_t i = 0; i < n;) {
        i = narrow(i);
        if (i < n) i = wide(i, i + kWideRun < n ? i + kWideRun : n);
    }
}

void fast_sequential(const double* x, int64_t n, const pl_fmt& f, double* result, int64_t* stall_step,
                     double* stall_value, double* trace) {
    const fast_acc acc(f);
    sequential_loop(
        x, n, r_set(0.0), [&](reg s, int64_t i) { return acc.add(s, r_set(x[i])); }, [](reg s) { return r_get(s); },
        true, result, stall_step, stall_value, trace);
}

// Stochastic rounding of v = RN_53(s + x): the exact path rounds the round-to-
// odd double w instead, which differs from v by at most one double ulp. With d
// the dropped bits of v and k the draw in the same units, "round up" is k < d,
// and w's draw differs only when k is d - 1 or d, or when d is 0 (w may sit
// in the grid point below): those, and everything outside the normal range,
// take the exact path. NARROW_X (x has at most p bits, as bf16 or fp8 values
// in an fp32 or fp16 sum): there d is 0 most of the time because v is exact
// and on the grid, and then w is v, which a stochastic rounding leaves as it
// is whatever the draw; the test (two subtractions) is kept off wide data,
// where it costs half a nanosecond and never holds.
template <bool NARROW_X>
int64_t stochastic_loop(const double* x, int64_t i, int64_t n, const fast_fmt& ff, uint64_t seed, double& s_io,
                        double* trace) {
    const uint64_t q = ff.low + 1;
    double s = s_io;
    for (; i < n; ++i) {
        if (NARROW_X) {
            const uint64_t xa = pl_bits(x[i]) & ~kSign;
            if (!PL_LIKELY((((xa & ff.low) == 0) & ((xa >> 52) - 1 < 0x7FE)) | (xa == 0))) break;
        }
        const uint64_t draw = pl_splitmix64(seed, (uint64_t)i) >> 11;  // pl_uniform's 53 bits
        const uint64_t kk = draw >> ff.p;
        const double v = s + x[i];
        const uint64_t vb = pl_bits(v);
        const uint64_t a = vb & ~kSign;
        const uint64_t d = a & ff.low;
        const uint64_t tb = (vb & ff.keep) + (kk < d ? q : 0);
        const bool on_grid = NARROW_X && (d == 0) & (v - s == x[i]) & (v - x[i] == s);
        if (PL_LIKELY((a - ff.minb < ff.maxb - ff.minb) & (((d != 0) & (kk - d + 1 > 1)) | on_grid)))
            s = pl_from_bits(tb);  // on the grid: tb is v
        else
            s = pl_round_stochastic(pl_add_round_odd(s, x[i]), *ff.f, pl_uniform(seed, (uint64_t)i));
        if (trace) trace[i] = s;
    }
    s_io = s;
    return i;
}

void fast_stochastic(const double* x, int64_t n, const pl_fmt& f, uint64_t seed, double* result,
                     double* trace) {
    const fast_fmt ff = make_fast(f);
    double s = 0.0;
    narrow_or_wide(n, [&](int64_t i) { return stochastic_loop<true>(x, i, n, ff, seed, s, trace); },
                   [&](int64_t i, int64_t end) { return stochastic_loop<false>(x, i, end, ff, seed, s, trace); });
    *result = s;
}

// Level-by-level pairwise in blocks of 2^kPairLog: at a block boundary the
// streaming counter holds only levels >= kPairLog, so a block's tree is one
// node of that level, computed level by level without branches; a block where
// any operation leaves the fast path is recomputed on the exact path.
constexpr int kPairLog = 6;
constexpr int kPairBlock = 1 << kPairLog;

// One block's tree, level by level: add(a, b) is the accumulator's a + b.
template <typename T, typename Add>
T block_tree(const double* b, Add add) {
    T tmp[kPairBlock / 2];
    for (int j = 0; j < kPairBlock / 2; ++j) tmp[j] = add((T)b[2 * j], (T)b[2 * j + 1]);
    for (int w = kPairBlock / 4; w >= 1; w /= 2)
        for (int j = 0; j < w; ++j) tmp[j] = add(tmp[2 * j], tmp[2 * j + 1]);
    return tmp[0];
}

// The whole blocks through block(first value), each pushed as one node of
// level kPairLog, the tail value by value.
template <typename T, typename Op, typename Block>
T pairwise_blocks(const double* x, int64_t n, Op op, Block block) {
    pairwise_stack<T, Op> st(op);
    int64_t i = 0;
    for (; i + kPairBlock <= n; i += kPairBlock) st.push(block(x + i), kPairLog);
    for (; i < n; ++i) st.push((T)x[i], 0);
    return st.finish();
}

double fast_pairwise(const double* x, int64_t n, const pl_fmt& f) {
    const fast_acc acc(f);
    const auto op = [&](double a, double b) { return r_get(acc.add(r_set(a), r_set(b))); };
    const auto block = [&](const double* b) {
        bool ok = true;
        const double t = block_tree<double>(b, [&](double u, double v) { return acc.add_flag(u, v, ok); });
        return ok ? t : block_tree<double>(b, [&](double u, double v) { return pl_add(u, v, f); });
    };
    return pl_round_to(pairwise_blocks<double>(x, n, op, block), f);
}

// Whether every x is 0 or a normal value of the format (decides the fp32
// hardware loops), a block at a time: values that are not (fp64 values in an
// fp32 sum) say so in the first block instead of costing a pass over memory.
bool all_in_format(const double* x, int64_t n, const fast_fmt& ff) {
    for (int64_t i0 = 0; i0 < n; i0 += 1024) {
        const int64_t end = i0 + 1024 < n ? i0 + 1024 : n;
        uint64_t bad = 0;
        for (int64_t i = i0; i < end; ++i) {
            const uint64_t a = pl_bits(x[i]) & ~kSign;
            bad |= (uint64_t)(((a - ff.minb > ff.maxb - ff.minb) | ((a & ff.low) != 0)) & (a != 0));
        }
        if (bad) return false;
    }
    return true;
}

// The compensated sums (Kahan, Neumaier) share one driver: a running sum s and
// a compensation c, both kept in registers across the loop, and a narrow loop
// that stops at the first x its step does not admit, from where
// narrow_or_wide goes on in the general loop: the same operations, exactly.
// A Step holds the two things that differ: admits(x's magnitude bits), the
// narrow loop's test (off the chains), and add<NARROW>(x, s, c), one term.
template <class Step, bool NARROW>
int64_t compensated_loop(const double* x, int64_t i, int64_t n, const fast_acc& acc, reg& s_io, reg& c_io) {
    reg s = s_io, c = c_io;
    for (; i < n; ++i) {
        if (NARROW && !PL_LIKELY(Step::admits(pl_bits(x[i]) & ~kSign, acc.ff))) break;
        Step::template add<NARROW>(x[i], acc, s, c);
    }
    s_io = s;
    c_io = c;
    return i;
}

template <class Step>
void compensated_sum(const double* x, int64_t n, const fast_acc& acc, reg& s, reg& c) {
    s = r_set(0.0);
    c = r_set(0.0);
    narrow_or_wide(n, [&](int64_t i) { return compensated_loop<Step, true>(x, i, n, acc, s, c); },
                   [&](int64_t i, int64_t end) { return compensated_loop<Step, false>(x, i, end, acc, s, c); });
}

// Kahan. The chain c -> y -> t -> c is the cost; its last two operations,
// c = (t - s) - y, are exact whenever |s| >= |y| (Fast2Sum: s and y are
// values of the format), and then equal t - v when v = s + y is exact in
// double too, which (v - s) == y tells (Dekker). One double subtraction then
// stands for two roundings. (add_in's ties to even would spare the branch on
// exact ties, but its two integer ops sit on this chain twice: slower.)
// NARROW: every x so far has at most p significant bits, as a narrow
// storage format's values do (bf16 in bf16, fp16 or fp8 in fp16). Then
// y = x - c adds two p-bit values, a double result on a midpoint is exact
// (Figueroa), and its ties go to even on the bits behind a branch of their
// own (sub_in): a fifth of the y's are ties with bf16 normal data, which
// sub's branch, taken for any midpoint into slow_add, guessed wrong at a
// higher price. (Ties to even without a branch cost more still: two integer
// ops on the chain.)
struct kahan_step {
    static bool admits(uint64_t a, const fast_fmt& ff) {
        return (((a & ff.low) == 0) & ((a >> 52) - 1 < 0x7FE)) | (a == 0);
    }
    template <bool NARROW>
    static void add(double x, const fast_acc& acc, reg& s, reg& c) {
        const pl_fmt& f = *acc.ff.f;
        const reg y = NARROW ? acc.sub_in(r_set(x), c) : acc.sub(r_set(x), c);
        const reg v = r_add(s, y);
        reg t = r_round(v, acc.k);
        const bool ok = fast_ok(r_bits(v), acc.ff);
        if (!PL_LIKELY(ok)) t = r_set(slow_add(r_get(s), r_get(y), r_get(v), acc.ff));
        const double sd = r_get(s), yd = r_get(y);
        if (PL_LIKELY(ok && std::fabs(sd) >= std::fabs(yd) && r_get(r_sub(v, s)) == yd))
            c = r_sub(t, v);
        else
            c = r_set(pl_sub(pl_sub(r_get(t), sd, f), yd, f));
        s = t;
    }
};

double fast_kahan(const double* x, int64_t n, const pl_fmt& f) {
    const fast_acc acc(f);
    reg s, c;
    compensated_sum<kahan_step>(x, n, acc, s, c);
    return r_get(s);
}

// Neumaier: the running sum and the compensation are two chains of one
// rounded addition each; the lost part is off both chains. In the usual case
// |s| >= |x| it needs fewer roundings: when x is a (normal) value of the
// format, lost = (s - t) + x is exact (Fast2Sum), so neither rounds; else, when
// |t| >= |s| / 2, s - t is exact in the format (Sterbenz), so only the second
// one rounds. c and lost are always values of the format (add_in). The
// NARROW loop (x in the format) stops at the first x that is not (a pass over
// x to decide first cost as much as the sum's own 0.9 ns a value).
struct neumaier_step {
    static bool admits(uint64_t a, const fast_fmt& ff) {  // 0 or a normal value of the format
        return ((a - ff.minb <= ff.maxb - ff.minb) & ((a & ff.low) == 0)) | (a == 0);
    }
    template <bool NARROW>
    static void add(double x, const fast_acc& acc, reg& s, reg& c) {
        const reg xi = r_set(x);
        const reg t = NARROW ? acc.add_in(s, xi) : acc.add(s, xi);
        const double as = std::fabs(r_get(s)), ax = std::fabs(x);
        reg lost;
        if (NARROW && PL_LIKELY(as >= ax)) {
            lost = r_add(r_sub(s, t), xi);
        } else if (PL_LIKELY(as >= ax && 2.0 * std::fabs(r_get(t)) >= as)) {
            lost = acc.add(r_sub(s, t), xi);
        } else {
            const bool big_s = as >= ax;
            const reg big = big_s ? s : xi, small = big_s ? xi : s;
            lost = acc.add(acc.sub(big, t), small);
        }
        c = acc.add_in(c, lost);
        s = t;
    }
};

double fast_neumaier(const double* x, int64_t n, const pl_fmt& f) {
    const fast_acc acc(f);
    reg s, c;
    compensated_sum<neumaier_step>(x, n, acc, s, c);
    return r_get(acc.add_in(s, c));
}

// Hardware arithmetic where it is the accumulator's: fp64 always, and fp32 when
// every x is an fp32 value (checked once per call). An IEEE float addition is
// the exact sum rounded once to nearest-even, with fp32's subnormals and
// overflow, which is the definition; nothing is left to emulate.
template <typename T>
void plain_sequential(const double* x, int64_t n, double* result, int64_t* stall_step, double* stall_value,
                      double* trace) {
    sequential_loop(
        x, n, (T)0, [&](T s, int64_t i) { return s + (T)x[i]; }, [](T s) { return (double)s; }, true, result,
        stall_step, stall_value, trace);
}

template <typename T>
double plain_pairwise(const double* x, int64_t n) {
    const auto add = [](T a, T b) { return a + b; };
    return pairwise_blocks<T>(x, n, add, [&](const double* b) { return block_tree<T>(b, add); });
}

template <typename T>
double plain_kahan(const double* x, int64_t n) {
    T s = 0, c = 0;
    for (int64_t i = 0; i < n; ++i) {
        const T y = (T)x[i] - c;
        const T t = s + y;
        c = (t - s) - y;
        s = t;
    }
    return s;
}

template <typename T>
double plain_neumaier(const double* x, int64_t n) {
    T s = 0, c = 0;
    for (int64_t i = 0; i < n; ++i) {
        const T xi = (T)x[i];
        const T t = s + xi;
        const bool big_s = std::fabs(s) >= std::fabs(xi);
        c = c + (big_s ? (s - t) + xi : (xi - t) + s);
        s = t;
    }
    return s + c;
}

bool fpu_is_ieee_default() {
#if defined(__SSE2__)
    return (_mm_getcsr() & 0xE040u) == 0;  // rounding control (bits 13-14), FTZ (15), DAZ (6)
#else
    return true;
#endif
}

int accumulate_cpu(const double* x, int64_t n, int accumulator, int method, uint64_t seed, double* result,
                   int64_t* stall_step, double* stall_value, double* trace, bool exact, const char* func) {
    if (int st = pl_check_ptrs(func, {{"x", x}, {"result", result}})) return st;
    size_t bytes = 0;
    if (int st = pl_checked_bytes(n, sizeof(double), &bytes, func)) return st;
    if (!pl_valid_format(accumulator))
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "unknown accumulator format %d", accumulator);
    if (int st = pl_check_variant("sum", method, PL_ON_CPU, func)) return st;
    const bool sequential_kind = method == PL_SEQUENTIAL || method == PL_STOCHASTIC;
    if (trace != nullptr && !sequential_kind)
        return pl_fail(PL_ERR_UNSUPPORTED, func, "a running-sum trace exists for sequential and stochastic only");
    const pl_fmt& f = PL_FORMATS[accumulator];
    if (stall_step) *stall_step = -1;
    if (stall_value) *stall_value = std::numeric_limits<double>::quiet_NaN();
    const bool native = f.precision == 53;
    // The fast path trusts the FPU's defaults: round to nearest even, no
    // flush-to-zero or denormals-are-zero (which a library built with
    // -ffast-math can switch on for the whole process). Otherwise: exact path.
    if (!fpu_is_ieee_default()) exact = true;
    if (exact) {
        switch (method) {
            case PL_SEQUENTIAL: cpu_sequential(x, n, f, false, seed, result, stall_step, stall_value, trace); break;
            case PL_STOCHASTIC: cpu_sequential(x, n, f, true, seed, result, stall_step, stall_value, trace); break;
            case PL_PAIRWISE: *result = cpu_pairwise(x, n, f); break;
            case PL_KAHAN: *result = cpu_kahan(x, n, f); break;
            case PL_NEUMAIER: *result = cpu_neumaier(x, n, f); break;
        }
        return PL_OK;
    }
    if (native || (accumulator == PL_FP32 && method != PL_STOCHASTIC && all_in_format(x, n, make_fast(f)))) {
        switch (method) {
            case PL_SEQUENTIAL:
                if (native) plain_sequential<double>(x, n, result, stall_step, stall_value, trace);
                else plain_sequential<float>(x, n, result, stall_step, stall_value, trace);
                break;
            // fp64 has no wider format to draw a stochastic rounding from: plain RNE
            case PL_STOCHASTIC: plain_sequential<double>(x, n, result, nullptr, nullptr, trace); break;
            case PL_PAIRWISE: *result = native ? plain_pairwise<double>(x, n) : plain_pairwise<float>(x, n); break;
            case PL_KAHAN: *result = native ? plain_kahan<double>(x, n) : plain_kahan<float>(x, n); break;
            case PL_NEUMAIER: *result = native ? plain_neumaier<double>(x, n) : plain_neumaier<float>(x, n); break;
        }
        return PL_OK;
    }
    switch (method) {
        case PL_SEQUENTIAL: fast_sequential(x, n, f, result, stall_step, stall_value, trace); break;
        case PL_STOCHASTIC: fast_stochastic(x, n, f, seed, result, trace); break;
        case PL_PAIRWISE: *result = fast_pairwise(x, n, f); break;
        case PL_KAHAN: *result = fast_kahan(x, n, f); break;
        case PL_NEUMAIER: *result = fast_neumaier(x, n, f); break;
    }
    return PL_OK;
}

}  // namespace

extern "C" int pl_accumulate_cpu(const double* x, int64_t n, int accumulator, int method, uint64_t seed,
                                 double* result, int64_t* stall_step, double* stall_value, double* trace) {
    return accumulate_cpu(x, n, accumulator, method, seed, result, stall_step, stall_value, trace, false, __func__);
}

extern "C" int pl_accumulate_cpu_exact(const double* x, int64_t n, int accumulator, int method, uint64_t seed,
                                       double* result, int64_t* stall_step, double* stall_value, double* trace) {
    return accumulate_cpu(x, n, accumulator, method, seed, result, stall_step, stall_value, trace, true, __func__);
}

extern "C" int pl_sum_cpu_threads(const double* x, int64_t n, int threads, double* result) {
    PL_REQUIRE_PTR(x);
    PL_REQUIRE_PTR(result);
    PL_REQUIRE_N(n);
    PL_REQUIRE(threads >= 1 && threads <= 256, PL_ERR_INVALID_ARGUMENT, "threads must be in [1, 256] (got %d)", threads);
    std::vector<float> part((size_t)threads, 0.0f);
    std::vector<std::thread> pool;
    const int64_t chunk = (n + threads - 1) / threads;
    for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
            float s = 0.0f;
            for (int64_t i = t * chunk; i < n && i < (t + 1) * chunk; ++i) s += (float)x[i];
            part[(size_t)t] = s;
        });
    }
    for (auto& th : pool) th.join();
    float s = 0.0f;
    for (int t = 0; t < threads; ++t) s += part[(size_t)t];
    *result = s;
    return PL_OK;
}
