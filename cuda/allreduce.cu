/*
 * allreduce.cu: the order in which an all-reduce sums the ranks' partials,
 * replayed on the host with every addition rounded exactly.
 *
 * CPU reference kernels (no GPU version: the point is to reproduce, bit for
 * bit, what a communication library did, not to be one):
 *   ring  the reduce-scatter of a ring all-reduce. The reduced buffer is cut
 *         into one chunk per rank; chunk c travels the ring and is finished
 *         by rank c, so its sum starts at rank c + step and goes on by step:
 *           acc = x[c+step]; acc += x[c+2*step]; ...; acc += x[c]  (mod ranks)
 *         step = -1 is gloo's ring (each rank sends to rank - 1). Which chunk
 *         an element lands in depends on where it sits in the message and on
 *         the message's length: the same data in another buffer changes order.
 *   tree  adjacent pairs level by level, odd tail carried up:
 *         ((x0 + x1) + (x2 + x3)) + ..., the order of a recursive-halving or
 *         binary-tree all-reduce; the same for every element.
 * Each addition's exact result is rounded once to the format (round-to-odd in
 * double, then to nearest-even: see common.cuh). For bf16 that is what gloo's
 * and NCCL's bf16 sums do too: bf16 + bf16 in fp32 then rounded to bf16 is the
 * correctly rounded sum, because fp32 carries at least 2 * 8 + 2 bits
 * (double rounding is innocuous there).
 */
#include <cmath>

#include "common.cuh"

// The orders, declared once (common.cuh, PL_DECLARE_VARIANTS).
// symbol, id, name, kind, devices, dtypes, order, batch-invariant, deterministic, default, sass, summary
#define ALLREDUCE_VARIANTS(X)                                                                                      \
    X(PL_ALLREDUCE_RING, 0, "ring", ALGORITHM, PL_ON_CPU, PL_ALL_FORMATS, AS_GIVEN, -1, 1, 1,                      \
      NO_SASS, "reduce-scatter around a ring: each chunk summed from a different starting rank")                   \
    X(PL_ALLREDUCE_TREE, 1, "tree", ALGORITHM, PL_ON_CPU, PL_ALL_FORMATS, AS_GIVEN, -1, 1, 1,                      \
      NO_SASS, "adjacent ranks paired level by level")
PL_DECLARE_VARIANTS(allreduce, ALLREDUCE_VARIANTS);

namespace {

double ring_sum(const double* partials, int ranks, int64_t n, int64_t i, int64_t chunk_index, int step,
                const pl_fmt& f) {
    const int c = (int)chunk_index;
    int r = ((c + step) % ranks + ranks) % ranks;
    double acc = partials[(int64_t)r * n + i];
    for (int j = 2; j <= ranks; ++j) {
        r = ((c + j * step) % ranks + ranks) % ranks;
        acc = pl_add(acc, partials[(int64_t)r * n + i], f);
    }
    return acc;
}

double tree_sum(const double* partials, int ranks, int64_t n, int64_t i, const pl_fmt& f) {
    double level[256];
    for (int r = 0; r < ranks; ++r) level[r] = partials[(int64_t)r * n + i];
    for (int width = ranks; width > 1; width = (width + 1) / 2) {
        for (int j = 0; j < width / 2; ++j) level[j] = pl_add(level[2 * j], level[2 * j + 1], f);
        if (width % 2) level[width / 2] = level[width - 1];  // the odd tail, carried up unchanged
    }
    return level[0];
}

}  // namespace

extern "C" int pl_allreduce_cpu(const double* partials, int ranks, int64_t n, int format, int order, int64_t offset,
                                int64_t chunk, int step, double* out) {
    PL_REQUIRE_PTR(partials);
    PL_REQUIRE_PTR(out);
    PL_REQUIRE_N(n);
    PL_REQUIRE(ranks >= 1 && ranks <= 256, PL_ERR_INVALID_ARGUMENT, "ranks must be in [1, 256] (got %d)", ranks);
    PL_REQUIRE(pl_valid_format(format), PL_ERR_INVALID_ARGUMENT, "unknown format %d", format);
    if (int st = pl_check_variant("allreduce", order, PL_ON_CPU, __func__)) return st;
    size_t bytes;
    if (int s = pl_checked_bytes(n, sizeof(double), &bytes, __func__)) return s;
    PL_REQUIRE((uint64_t)n <= (uint64_t)INT64_MAX / (uint64_t)ranks, PL_ERR_SIZE_OVERFLOW,
               "ranks * n overflows (ranks %d, n %lld)", ranks, (long long)n);
    if (order == PL_ALLREDUCE_RING) {
        PL_REQUIRE(step == 1 || step == -1, PL_ERR_INVALID_ARGUMENT, "step must be 1 or -1 (got %d)", step);
        PL_REQUIRE(offset >= 0, PL_ERR_INVALID_ARGUMENT, "offset must be >= 0 (got %lld)", (long long)offset);
        PL_REQUIRE(chunk >= 1, PL_ERR_INVALID_ARGUMENT, "chunk must be >= 1 (got %lld)", (long long)chunk);
        PL_REQUIRE(offset <= INT64_MAX - n, PL_ERR_SIZE_OVERFLOW, "offset + n overflows");
        // every element must fall in one of the ranks' chunks
        PL_REQUIRE((offset + n - 1) / chunk < ranks, PL_ERR_INVALID_ARGUMENT,
                   "offset %lld + n %lld exceeds ranks %d * chunk %lld", (long long)offset, (long long)n, ranks,
                   (long long)chunk);
    }
    const pl_fmt& f = PL_FORMATS[format];
    const int64_t total = (int64_t)ranks * n;
    for (int64_t j = 0; j < total; ++j) {
        const double v = partials[j];
        PL_REQUIRE(std::isnan(v) || pl_round_to(v, f) == v, PL_ERR_INVALID_ARGUMENT,
                   "partials[%lld] = %.17g is not a %s value", (long long)j, v, f.name);
    }
    for (int64_t i = 0; i < n; ++i)
        out[i] = order == PL_ALLREDUCE_RING ? ring_sum(partials, ranks, n, i, (offset + i) / chunk, step, f)
                                            : tree_sum(partials, ranks, n, i, f);
    return PL_OK;
}
