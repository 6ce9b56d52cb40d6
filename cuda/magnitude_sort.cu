/*
 * magnitude_sort.cu: stable sorts by |x|, for the sum's sorted orders
 * (sorted, sorted_desc: accumulate.cu's rows, whose caller arranges x).
 *   pl_sort_by_magnitude          LSD radix sort on |x|'s bits, O(n), one work array
 *   pl_reverse_magnitude_order    the decreasing order from the increasing one, one pass
 *   pl_sort_float32_by_magnitude  float32 values: 32-bit keys, no work array
 * NaN goes last in both directions, in its input order, as numpy's stable
 * argsort of |x| and of -|x| puts it.
 */
#include <algorithm>
#include <vector>

#include "common.cuh"

// Stable sort by magnitude, for the sorted summation orders: LSD radix sort
// on |x|'s bits (a byte per pass; a byte that is the same in every value, as
// the low bytes of narrow stored formats are, costs no pass). O(n) time, and
// exactly two arrays: out and one work array of n doubles. NaN goes last in
// both directions, in its input order, as numpy's stable argsort of |x| and of
// -|x| puts it.
namespace {
inline uint64_t magnitude_key(double v, bool descending) {
    if (std::isnan(v)) return ~0ull;
    const uint64_t a = pl_bits(v) & ~pl_sign_bit;
    return descending ? 0x7FF0000000000000ull - a : a;  // 0 for inf, never above NaN's key
}
}  // namespace

// The 8-bit digits a radix pass must sort by: a digit whose 256 counts put all
// n keys in one bucket would move nothing, so its pass is skipped.
static int radix_passes(const std::vector<int64_t>& count, int digits, int64_t n, int* passes) {
    int found = 0;
    for (int d = 0; d < digits; ++d) {
        bool trivial = false;
        for (int b = 0; b < 256; ++b) trivial |= count[(size_t)(d * 256 + b)] == n;
        if (!trivial) passes[found++] = d;
    }
    return found;
}

// Where each of digit d's 256 buckets starts in the pass's output: the counts
// of the smaller buckets, summed.
static void bucket_starts(const std::vector<int64_t>& count, int d, int64_t pos[256]) {
    int64_t acc = 0;
    for (int b = 0; b < 256; ++b) {
        pos[b] = acc;
        acc += count[(size_t)(d * 256 + b)];
    }
}

// The checks both sorts make, in order: the pointers by name, n (and its
// bytes as doubles), and descending as 0 or 1.
static int check_sort_args(const char* func, std::initializer_list<pl_named_ptr> ptrs, int64_t n, int descending,
                           size_t* bytes) {
    if (int st = pl_check_ptrs(func, ptrs)) return st;
    if (int st = pl_checked_bytes(n, sizeof(double), bytes, func)) return st;
    if (descending != 0 && descending != 1)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "descending must be 0 or 1 (got %d)", descending);
    return PL_OK;
}

extern "C" int pl_sort_by_magnitude(const double* x, int64_t n, int descending, double* out, double* work) {
    size_t bytes = 0;
    if (int st = check_sort_args(__func__, {{"x", x}, {"out", out}, {"work", work}}, n, descending, &bytes)) return st;
    const bool desc = descending == 1;
    std::vector<int64_t> count(8 * 256, 0);
    for (int64_t i = 0; i < n; ++i) {
        const uint64_t k = magnitude_key(x[i], desc);
        for (int d = 0; d < 8; ++d) ++count[(size_t)(d * 256 + ((k >> (8 * d)) & 255))];
    }
    int passes[8];
    const int np_ = radix_passes(count, 8, n, passes);
    if (np_ == 0) {
        std::memcpy(out, x, bytes);
        return PL_OK;
    }
    const double* src = x;
    double* dst = (np_ % 2 == 1) ? out : work;  // the last pass lands in out
    for (int p = 0; p < np_; ++p) {
        const int d = passes[p];
        int64_t pos[256];
        bucket_starts(count, d, pos);
        for (int64_t i = 0; i < n; ++i) dst[pos[(magnitude_key(src[i], desc) >> (8 * d)) & 255]++] = src[i];
        src = dst;
        dst = (dst == out) ? work : out;
    }
    return PL_OK;
}

// The decreasing order from the increasing one, in one pass: x sorted by
// increasing |x| (stably, NaN last) holds the runs of equal |x| each in input
// order, as the stable decreasing sort does; that sort only puts the runs the
// other way round, NaN still last. A copy (or, in place, a reversal and a
// reversal of each run back) instead of a second radix sort.
extern "C" int pl_reverse_magnitude_order(const double* sorted, int64_t n, double* out) {
    PL_REQUIRE_PTR(sorted);
    PL_REQUIRE_PTR(out);
    size_t bytes = 0;
    if (int st = pl_checked_bytes(n, sizeof(double), &bytes, __func__)) return st;
    int64_t m = n;  // [m, n): the NaN tail, which stays
    while (m > 0 && std::isnan(sorted[m - 1])) --m;
    const auto key = [](double v) { return pl_bits(v) & ~pl_sign_bit; };
    if (out == sorted) {
        std::reverse(out, out + m);
        for (int64_t i = 0; i < m;) {
            int64_t j = i + 1;
            while (j < m && key(out[j]) == key(out[i])) ++j;
            std::reverse(out + i, out + j);
            i = j;
        }
        return PL_OK;
    }
    std::memcpy(out + m, sorted + m, (size_t)(n - m) * sizeof(double));
    int64_t pos = 0;
    for (int64_t j = m; j > 0;) {
        int64_t i = j - 1;
        while (i > 0 && key(sorted[i - 1]) == key(sorted[j - 1])) --i;
        std::memcpy(out + pos, sorted + i, (size_t)(j - i) * sizeof(double));
        pos += j - i;
        j = i;
    }
    return PL_OK;
}

// pl_sort_by_magnitude for float32 values held as doubles (every stored format
// but fp64), with no work array: the radix passes move 32-bit values between
// the two halves of out's 8n bytes, and the sorted floats are then widened in
// place (from the first half backwards, from the second forwards: each double
// written covers only floats already read). Half the bytes a pass moves, and
// 8n bytes less than the general sort. Byte access through memcpy: out is
// raw storage, first floats, then doubles.
namespace {
inline uint32_t magnitude_key32(uint32_t b, bool descending) {
    const uint32_t a = b & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return ~0u;  // NaN
    return descending ? 0x7F800000u - a : a;
}
inline uint32_t f32_bits_at(const unsigned char* base, int64_t i) {
    uint32_t b;
    std::memcpy(&b, base + 4 * i, 4);
    return b;
}
}  // namespace

extern "C" int pl_sort_float32_by_magnitude(const double* x, int64_t n, int descending, double* out) {
    size_t bytes = 0;
    if (int st = check_sort_args(__func__, {{"x", x}, {"out", out}}, n, descending, &bytes)) return st;
    PL_REQUIRE(x != out, PL_ERR_INVALID_ARGUMENT, "out must not be x itself");
    const bool desc = descending == 1;
    unsigned char* const base = reinterpret_cast<unsigned char*>(out);
    unsigned char* const half[2] = {base, base + 4 * n};
    std::vector<int64_t> count(4 * 256, 0);
    for (int64_t i = 0; i < n; ++i) {
        const float f = (float)x[i];
        uint32_t b;
        std::memcpy(&b, &f, 4);
        if (pl_bits((double)f) != pl_bits(x[i]))
            return pl_fail(PL_ERR_INVALID_ARGUMENT, __func__, "x[%lld] = %.17g is not a float32 value", (long long)i,
                           x[i]);
        const uint32_t k = magnitude_key32(b, desc);
        for (int d = 0; d < 4; ++d) ++count[(size_t)(d * 256 + ((k >> (8 * d)) & 255))];
    }
    int passes[4];
    const int np_ = radix_passes(count, 4, n, passes);
    int at = 0;  // the half the floats are in
    if (np_ == 0) {
        for (int64_t i = 0; i < n; ++i) {
            const float f = (float)x[i];
            std::memcpy(half[0] + 4 * i, &f, 4);
        }
    }
    for (int p = 0; p < np_; ++p) {
        const int d = passes[p];
        int64_t pos[256];
        bucket_starts(count, d, pos);
        unsigned char* const dst = half[p == 0 ? 0 : 1 - at];
        for (int64_t i = 0; i < n; ++i) {
            uint32_t b;
            if (p == 0) {  // the first pass reads x
                const float f = (float)x[i];
                std::memcpy(&b, &f, 4);
            } else {
                b = f32_bits_at(half[at], i);
            }
            std::memcpy(dst + 4 * pos[(magnitude_key32(b, desc) >> (8 * d)) & 255]++, &b, 4);
        }
        at = p == 0 ? 0 : 1 - at;
    }
    const auto widen = [&](int64_t i) {
        const uint32_t b = f32_bits_at(half[at], i);
        float f;
        std::memcpy(&f, &b, 4);
        const double v = (double)f;
        std::memcpy(base + 8 * i, &v, 8);
    };
    if (at == 0)
        for (int64_t i = n - 1; i >= 0; --i) widen(i);
    else
        for (int64_t i = 0; i < n; ++i) widen(i);
    return PL_OK;
}
