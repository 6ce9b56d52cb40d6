/*
 * exact_sum.cu: the exact sum of n doubles, for the references
 * (pl_exact_sum_terms: a superaccumulator of integer digits; math.fsum rounds
 * the few doubles it returns).
 */
#include <memory>

#include "common.cuh"

// Exact sums, for the references: the exact sum of n doubles as a few doubles
// with the same exact sum, which math.fsum then rounds once (so the reference
// is fsum's, bit for bit, at a nanosecond or two a value instead of fsum's
// tens). A superaccumulator of 32-bit digits: x = m 2^(e - 1075), m the
// 53-bit integer significand and e = max(biased exponent, 1), adds its signed
// m to digit e, an int64 that a block of 512 such additions cannot overflow
// (512 * 2^53 = 2^62); after each block the digits it touched carry into
// digit e + 32 what lies outside [-2^31, 2^31) (one unit there is 2^32 here;
// balanced digits, so a negative sum does not leave a trail of -1 carries up
// to the top). Integer additions only: the order of x and the FPU's modes do
// not matter. At the end each digit d_e 2^(e - 1075) is a double exactly
// (|d_e| <= 2^31, and a power of two no finer than the smallest subnormal).
namespace {
constexpr int kExactDigits = 2048 + 128;  // the top digits only take carries: n < 2^40 values fit
constexpr int kExactBlock = 512;

struct superacc {
    int64_t d[kExactDigits] = {};
    // Balances digits lo..hi and, upward, every digit their carries reach.
    void carry(int lo, int hi) {
        for (int e = lo; e <= hi && e + 32 < kExactDigits; ++e) {
            const int64_t c = (d[e] + (INT64_C(1) << 31)) >> 32;  // arithmetic shift: the floor
            if (c != 0) {
                d[e] -= c * (INT64_C(1) << 32);
                d[e + 32] += c;
                if (e + 32 > hi) hi = e + 32;
            }
        }
    }
};
}  // namespace

extern "C" int pl_exact_sum_terms(const double* x, int64_t n, int absolute, double* terms, int64_t capacity,
                                  int64_t* nterms, int* special) {
    PL_REQUIRE_PTR(x);
    PL_REQUIRE_PTR(terms);
    PL_REQUIRE_PTR(nterms);
    PL_REQUIRE_PTR(special);
    PL_REQUIRE(n >= 0 && n < (INT64_C(1) << 40), PL_ERR_INVALID_ARGUMENT, "n must be in [0, 2^40) (got %lld)",
               (long long)n);
    PL_REQUIRE(absolute == 0 || absolute == 1, PL_ERR_INVALID_ARGUMENT, "absolute must be 0 or 1 (got %d)", absolute);
    PL_REQUIRE(capacity >= PL_EXACT_SUM_TERMS, PL_ERR_INVALID_ARGUMENT, "capacity must be at least %d (got %lld)",
               PL_EXACT_SUM_TERMS, (long long)capacity);
    *nterms = 0;
    *special = 0;
    const auto owned = std::make_unique<superacc>();  // 17 KiB: on the heap, not a worker thread's stack
    superacc& acc = *owned;
    const uint64_t sign_mask = absolute ? 0 : ~0ull;
    uint64_t not_all_neg_zero = n == 0;
    for (int64_t i0 = 0; i0 < n; i0 += kExactBlock) {
        const int64_t end = i0 + kExactBlock < n ? i0 + kExactBlock : n;
        uint64_t lo = 2047, hi = 0, nonfinite = 0;
        for (int64_t i = i0; i < end; ++i) {
            const uint64_t b = pl_bits(x[i]);
            const uint64_t ex = (b >> 52) & 0x7FF;
            const uint64_t e = ex | (uint64_t)(ex == 0);
            const uint64_t m = (b & 0xFFFFFFFFFFFFFull) | ((uint64_t)(ex != 0) << 52);
            const uint64_t neg = (b >> 63) & sign_mask;       // 0 or 1
            acc.d[e] += (int64_t)((m ^ (0 - neg)) + neg);     // -m when negative
            nonfinite |= (uint64_t)(ex == 0x7FF);
            not_all_neg_zero |= b ^ pl_sign_bit;
            lo = e < lo ? e : lo;
            hi = e > hi ? e : hi;
        }
        if (nonfinite) {  // NaN or an infinity: the caller's IEEE rules, not a sum
            *special = 1;
            return PL_OK;
        }
        acc.carry((int)lo, (int)hi);
    }
    acc.carry(0, kExactDigits - 1);
    int64_t k = 0;
    for (int e = kExactDigits - 1; e >= 0; --e) {
        if (acc.d[e] == 0) continue;
        const double t = std::ldexp((double)acc.d[e], e - 1075);  // exact: at most 53 bits, no finer than 2^-1074
        if (!std::isfinite(t) || acc.d[e] > (INT64_C(1) << 53) || acc.d[e] < -(INT64_C(1) << 53)) {
            *special = 2;  // the sum is near or past the double range: the caller's wide path
            return PL_OK;
        }
        terms[k++] = t;
    }
    if (k == 0 && !not_all_neg_zero && !absolute) terms[k++] = -0.0;  // fsum's sign of a sum of -0.0s, whatever it is
    *nterms = k;
    return PL_OK;
}
