/*
 * softmax.cu: row softmax and log-sum-exp over a rows x cols matrix of fp32,
 * bf16 or fp16, with fp32 arithmetic (one method keeps the sum in the input
 * format, to show why not).
 *
 * Variants (the catalog rows below), on the CPU and the GPU alike (the CPU sums its
 * exponentials pairwise, and its online method runs 64-wide leaves combined
 * pairwise, so its error grows like the GPU tree's, with log2(cols)):
 *   naive            exp(x) / sum exp(x): no shift, overflows past x ~ 88
 *   stable           three passes: max, sum of exp(x - max), normalise
 *   online           one pass carrying a running max and rescaling the running
 *                    sum (Milakov & Gimelshein 2018), then the normalise pass
 *   bug_zero_identity  stable, but the max reduction's idle slots (threads
 *                    past the row's end, and the unused warp slots of the
 *                    block tree's second stage) feed 0, not -inf: wrong for
 *                    rows of very negative logits shorter than 1024 columns
 *   bug_zero_start   stable, but the max starts at 0 instead of x[0]
 *   bug_no_rescale   exponentials taken against the max seen so far and never
 *                    rescaled: [1, 2, 3] gives 1/3 each
 *   lowp_accum       stable, with exp and the running sum rounded to the input
 *                    format: 512 equal bf16 logits give 1/256, not 1/512
 *
 * GPU versions (one block per row unless said):
 *   version 1  naive / stable / online / bug variants: a simple strided loop
 *              per thread, block reductions between passes, re-reading x.
 *   version 2  single_pass: the row held in registers as raw 16-byte vectors,
 *              read once, written once; every load issued first, exp once per
 *              element, one (max, sum) block all-reduce (make sass-check).
 *              A thread holds 16 elements (32 registers: 2048 threads, four
 *              or more rows, an SM), or 32 where 512 threads of 16 cannot
 *              hold the row; a CTA at most 16384 elements in at most 512
 *              threads: at <= 64 registers a thread (make sass-check) two
 *              CTAs share an SM's register file, so two rows or more are in
 *              flight on each SM, one loading while another reduces and
 *              stores. Longer rows go to version 5 on
 *              sm_90+; elsewhere up to 32768 columns take one CTA of up to
 *              1024 threads (one row an SM), longer ones version 3.
 *   stable_adaptive  version 1's stable kernel launched with threads chosen
 *              from the batch size too (pl_adaptive_lanes): a row's bits then
 *              depend on the batch it came in. Shown by nondeterminism.
 *   version 3  online_vec: 16-byte loads, a per-thread online (max, sum) pair,
 *              one block combine, then the write pass: two reads, one write.
 *   version 4  single_pass on short rows (up to 1024 columns): a warp per row,
 *              four rows a block, the pair reduced in shuffles alone.
 *   version 5  cluster: a row split over a thread-block cluster of C CTAs
 *              (sm_90+, QuACK's layout), each holding its piece in registers
 *              as version 2 does; the CTAs' (max, sum) pairs meet through
 *              distributed shared memory, combined in rank order. Still one
 *              read and one write, and a 64 x 262144 batch is 1024 CTAs, not
 *              64. C (2, 4, 8, 16) is the smallest whose pieces fit version
 *              2's 512-thread tiers (two CTAs an SM), from cols alone
 *              (batch-invariant): 2 for 32768 columns, 16 (past the portable
 *              8, where the device schedules it; else 8 at the 1024-thread
 *              tiers) for 151936 and 262144. single_pass takes it past 16384
 *              columns; rows past 16 pieces of 32768 columns fall back to
 *              version 3, ragged rows to online.
 *
 * Masked rows (every logit -inf): the textbook formula gives NaN (-inf minus
 * -inf), and so does the shifted methods' log-sum-exp (naive's is log 0 =
 * -inf). PL_MASKED_ZERO writes zeros and a
 * log-sum-exp of -inf instead, for every method. A NaN logit makes its row
 * NaN whatever the policy (the max keeps NaN: pl_max_nan), and so does a +inf
 * logit in the shifted methods (inf - inf), as in the float64 reference.
 * Partly masked rows are ordinary rows: exp(-inf - m) = 0.
 */
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common.cuh"

#ifdef __CUDACC__
#include <cooperative_groups.h>
#endif

// The variants, declared once (common.cuh, PL_DECLARE_VARIANTS): the catalog
// rows the CLI, --help, bench, info and the tests iterate.
// symbol, id, name, kind, devices, dtypes, order, batch-invariant, deterministic, default, sass, summary
// The sass column's shorthands: the 16-bit row formats, and the checks of the
// kernels that hold a row (or piece) in registers in CTAs of <= 512 threads.
#define SOFTMAX_16BIT (PL_FMT_BIT(PL_BF16) | PL_FMT_BIT(PL_FP16))
#define SOFTMAX_RESIDENT (PL_SASS_SINGLE_PASS | PL_SASS_TWO_AN_SM)
#define SOFTMAX_VARIANTS(X)                                                                                        \
    X(PL_SOFTMAX_NAIVE, 0, "naive", ALGORITHM, PL_ON_CPU | PL_ON_CUDA, PL_ROW_FORMATS, AS_GIVEN, 1, 1, 1,          \
      NO_SASS, "exp(x) / sum exp(x), no shift: overflows past x ~ 88")                                             \
    X(PL_SOFTMAX_STABLE, 1, "stable", ALGORITHM, PL_ON_CPU | PL_ON_CUDA, PL_ROW_FORMATS, AS_GIVEN, 1, 1, 1,        \
      NO_SASS, "max, sum of exp(x - max), normalise: three passes")                                                \
    X(PL_SOFTMAX_ONLINE, 2, "online", ALGORITHM, PL_ON_CPU | PL_ON_CUDA, PL_ROW_FORMATS, AS_GIVEN, 1, 1, 1,        \
      NO_SASS, "running max and rescaled sum in one pass, then normalise")                                         \
    X(PL_SOFTMAX_BUG_ZERO_IDENTITY, 3, "bug_zero_identity", BUG, PL_ON_CPU | PL_ON_CUDA, PL_ROW_FORMATS, AS_GIVEN, 1, 1, 0, \
      NO_SASS, "the max reduction's idle slots feed 0, not -inf")                                                  \
    X(PL_SOFTMAX_BUG_ZERO_START, 4, "bug_zero_start", BUG, PL_ON_CPU | PL_ON_CUDA, PL_ROW_FORMATS, AS_GIVEN, 1, 1, 0, \
      NO_SASS, "the max starts at 0 instead of x[0]")                                                              \
    X(PL_SOFTMAX_BUG_NO_RESCALE, 5, "bug_no_rescale", BUG, PL_ON_CPU | PL_ON_CUDA, PL_ROW_FORMATS, AS_GIVEN, 1, 1, 0, \
      NO_SASS, "exps against the running max, never rescaled")                                                     \
    X(PL_SOFTMAX_LOWP_ACCUM, 6, "lowp_accum", BUG, PL_ON_CPU | PL_ON_CUDA, PL_ROW_FORMATS, AS_GIVEN, 1, 1, 0,      \
      NO_SASS, "exps and their sum rounded to the input format")                                                   \
    X(PL_SOFTMAX_SINGLE_PASS, 7, "single_pass", KERNEL, PL_ON_CUDA, PL_ROW_FORMATS, AS_GIVEN, 1, 1, 1,             \
      SASS(PL_SASS_KERNEL("softmax_single_pass", SOFTMAX_RESIDENT, PL_FMT_BIT(PL_FP32), 20.0),                     \
           PL_SASS_KERNEL("softmax_single_pass", SOFTMAX_RESIDENT, SOFTMAX_16BIT, 18.0),                           \
           PL_SASS_KERNEL("softmax_warp_rows", PL_SASS_SINGLE_PASS, PL_FMT_BIT(PL_FP32), 19.0),                    \
           PL_SASS_KERNEL("softmax_warp_rows", PL_SASS_SINGLE_PASS, SOFTMAX_16BIT, 18.0)),                         \
      "row in registers: one read, one write, one (max, sum) reduction")                                           \
    X(PL_SOFTMAX_ONLINE_VEC, 8, "online_vec", KERNEL, PL_ON_CUDA, PL_ROW_FORMATS, AS_GIVEN, 1, 1, 1,               \
      SASS(PL_SASS_KERNEL("softmax_online_vec", PL_SASS_STREAMING, PL_ROW_FORMATS, 26.0)),                         \
      "16-byte loads, per-thread online (max, sum): two reads, one write")                                         \
    X(PL_SOFTMAX_STABLE_ADAPTIVE, 9, "stable_adaptive", KERNEL, PL_ON_CUDA, PL_ROW_FORMATS, AS_GIVEN, 0, 1, 0,     \
      NO_SASS, "stable, threads chosen from the batch size too: not batch-invariant")                              \
    X(PL_SOFTMAX_CLUSTER, 10, "cluster", KERNEL, PL_ON_CUDA, PL_ROW_FORMATS, AS_GIVEN, 1, 1, 0,                    \
      SASS(PL_SASS_KERNEL("softmax_cluster", SOFTMAX_RESIDENT, PL_FMT_BIT(PL_FP32), 21.0),                         \
           PL_SASS_KERNEL("softmax_cluster", SOFTMAX_RESIDENT, SOFTMAX_16BIT, 19.0)),                              \
      "row split over a thread-block cluster, (max, sum) through DSMEM: one read")
PL_DECLARE_VARIANTS(softmax, SOFTMAX_VARIANTS);

namespace {

int check_softmax_args(int64_t rows, int64_t cols, int dtype, int method, int masked, const char* func) {
    if (int st = pl_check_rows_cols(rows, cols, func)) return st;
    if (int st = pl_check_row_dtype(dtype, "softmax dtype", func)) return st;
    if (!pl_catalog_find("softmax", method))
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "unknown softmax variant %d", method);
    if (masked != PL_MASKED_NAN && masked != PL_MASKED_ZERO)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "unknown masked-row policy %d", masked);
    return pl_check_elements(rows, cols, "rows * cols", func);
}

constexpr float kNegInf = pl_neg_inf;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();


struct cpu_pair {
    float m, s;
};
// The same rules as the GPU's combine() and loop, so the two agree on every
// non-finite case: -inf logits are skipped (they add exp(-inf) = 0, and
// -inf - -inf must not become NaN), NaN and +inf poison the sum.
cpu_pair cpu_combine(cpu_pair a, cpu_pair b) {
    const float m = pl_max_nan(a.m, b.m);
    if (m == kNegInf) return {m, a.s + b.s};  // both empty so far
    return {m, a.s * std::exp(a.m - m) + b.s * std::exp(b.m - m)};
}
cpu_pair cpu_online_step(cpu_pair p, float v) {
    // v - v + 1 is 1, or NaN for v = +inf, as the shifted exp(v - v) would be
    if (v > p.m || v != v) return {v, p.s * std::exp(p.m - v) + (v - v + 1.0f)};
    if (v != kNegInf) p.s += std::exp(v - p.m);
    return p;
}
// Online (max, sum) over [lo, hi): 64-wide leaves run the one-pass recurrence,
// and leaves combine pairwise, as a GPU's lanes and tree would.
template <typename F>
cpu_pair online_range(F X, int64_t lo, int64_t hi) {
    if (hi - lo <= 64) {
        cpu_pair p{kNegInf, 0.0f};
        for (int64_t j = lo; j < hi; ++j) p = cpu_online_step(p, X(j));
        return p;
    }
    const int64_t mid = lo + (hi - lo) / 2;
    return cpu_combine(online_range(X, lo, mid), online_range(X, mid, hi));
}

// One row on the CPU. Writes y (storage format) and returns the log-sum-exp.
float cpu_row(const void* x, void* y, int64_t off, int64_t cols, int dtype, int method, int masked) {
    auto X = [&](int64_t j) { return pl_load_host(x, off + j, dtype); };
    const pl_fmt& f = PL_FORMATS[dtype];
    // A masked row: every logit -inf. NaN logits make the row NaN whatever the policy.
    bool all_masked = true;
    for (int64_t j = 0; j < cols && all_masked; ++j) all_masked = X(j) == kNegInf;
    if (all_masked && masked == PL_MASKED_ZERO) {
        for (int64_t j = 0; j < cols; ++j) pl_store_host(y, off + j, dtype, 0.0f);
        return kNegInf;
    }
    float m = 0.0f, s = 0.0f;
    std::vector<float> e((size_t)cols);
    switch (method) {
        case PL_SOFTMAX_NAIVE:
            for (int64_t j = 0; j < cols; ++j) e[(size_t)j] = std::exp(X(j));
            s = pl_pairwise_sum(e.data(), cols);
            for (int64_t j = 0; j < cols; ++j) pl_store_host(y, off + j, dtype, e[(size_t)j] / s);
            return std::log(s);
        case PL_SOFTMAX_ONLINE: {
            cpu_pair p = online_range(X, 0, cols);
            if (p.m == kNegInf) p.s = kNaN;  // masked: the textbook NaN
            for (int64_t j = 0; j < cols; ++j) pl_store_host(y, off + j, dtype, std::exp(X(j) - p.m) / p.s);
            return p.m + std::log(p.s);
        }
        case PL_SOFTMAX_BUG_NO_RESCALE: {
            m = kNegInf;
            for (int64_t j = 0; j < cols; ++j) {
                const float v = X(j);
                m = pl_max_nan(m, v);
                // against the max so far, never rescaled (a masked -inf adds 0: not the bug shown)
                e[(size_t)j] = v == kNegInf ? 0.0f : std::exp(v - m);
                s += e[(size_t)j];
            }
            for (int64_t j = 0; j < cols; ++j) pl_store_host(y, off + j, dtype, e[(size_t)j] / s);
            return m + std::log(s);
        }
        default: break;
    }
    // the stable family: max, sum, normalise
    if (method == PL_SOFTMAX_BUG_ZERO_START) {
        m = 0.0f;
        for (int64_t j = 0; j < cols; ++j) m = pl_max_nan(m, X(j));
    } else if (method == PL_SOFTMAX_BUG_ZERO_IDENTITY) {
        // The GPU's block, emulated: L threads, thread l takes columns l,
        // l + L, ...; a thread with no column feeds 0 where -inf belongs, and
        // so does each of the second stage's 32 slots that no warp fills.
        const int64_t L = pl_lanes_for(cols);
        m = L / 32 < 32 ? 0.0f : kNegInf;
        for (int64_t l = 0; l < L; ++l) {
            float lm = l < cols ? kNegInf : 0.0f;
            for (int64_t j = l; j < cols; j += L) lm = pl_max_nan(lm, X(j));
            m = pl_max_nan(m, lm);
        }
    } else {
        m = kNegInf;
        for (int64_t j = 0; j < cols; ++j) m = pl_max_nan(m, X(j));
    }
    if (method == PL_SOFTMAX_LOWP_ACCUM) {
        double sd = 0.0;  // a value of the storage format at every step
        for (int64_t j = 0; j < cols; ++j) sd = pl_add(sd, pl_round_to(std::exp(X(j) - m), f), f);
        for (int64_t j = 0; j < cols; ++j)
            pl_store_host(y, off + j, dtype, (float)(pl_round_to(std::exp(X(j) - m), f) / sd));
        return m + std::log((float)sd);
    }
    for (int64_t j = 0; j < cols; ++j) e[(size_t)j] = std::exp(X(j) - m);
    s = pl_pairwise_sum(e.data(), cols);
    for (int64_t j = 0; j < cols; ++j) pl_store_host(y, off + j, dtype, e[(size_t)j] / s);
    return m + std::log(s);
}

}  // namespace

extern "C" int pl_softmax_lanes(int64_t cols) { return pl_lanes_for(cols); }

// The stable softmax with its sum taken in the order of a GPU block of `lanes`
// threads: lets the CPU show what a batch-dependent launch does to the bits.
extern "C" int pl_softmax_cpu_lanes(const void* x, int64_t rows, int64_t cols, int dtype, void* y, int lanes) {
    PL_REQUIRE_PTR(x);
    PL_REQUIRE_PTR(y);
    if (int st = check_softmax_args(rows, cols, dtype, PL_SOFTMAX_STABLE, PL_MASKED_NAN, __func__)) return st;
    PL_REQUIRE(lanes >= 1 && lanes <= 1024, PL_ERR_INVALID_ARGUMENT, "lanes must be in [1, 1024] (got %d)", lanes);
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t off = r * cols;
        float m = pl_neg_inf;
        for (int64_t j = 0; j < cols; ++j) m = pl_max_nan(m, pl_load_host(x, off + j, dtype));
        const float s = pl_lane_sum([&](int64_t j) { return std::exp(pl_load_host(x, off + j, dtype) - m); }, cols, lanes);
        for (int64_t j = 0; j < cols; ++j) pl_store_host(y, off + j, dtype, std::exp(pl_load_host(x, off + j, dtype) - m) / s);
    }
    return PL_OK;
}

extern "C" int pl_softmax_cpu(const void* x, int64_t rows, int64_t cols, int dtype, int method, int masked, void* y,
                              double* lse) {
    PL_REQUIRE_PTR(x);
    PL_REQUIRE_PTR(y);
    if (int st = check_softmax_args(rows, cols, dtype, method, masked, __func__)) return st;
    if (int st = pl_check_variant("softmax", method, PL_ON_CPU, __func__)) return st;
    for (int64_t r = 0; r < rows; ++r) {
        const float l = cpu_row(x, y, r * cols, cols, dtype, method, masked);
        if (lse) lse[r] = (double)l;
    }
    return PL_OK;
}

// ---------------------------------------------------------------------------
// The GPU launch plan: which kernel version, vectors a thread, threads, rows a
// block and cluster size a call gets. Decided here only, so the launcher and
// pl_softmax_cuda_plan (what bench records beside each figure) cannot
// disagree. vec_ok: cols a multiple of the 16-byte vector and both pointers
// 16-byte aligned; sms: the device's SM count (used by stable_adaptive only).
namespace {
constexpr int kWarpRows = 4;  // rows a block in version 4 (a warp each)

// Version 2's and 5's register tiers: the fewest vectors a thread, from
// `smallest` up to 8 for fp32 or 4 for 16-bit types (which would spill at 8,
// make sass-check), that hold nvec vectors in at most max_threads threads; 0
// when none does.
constexpr int top_vpt(int elem_bytes) { return elem_bytes == 4 ? 8 : 4; }
int vpt_tier(int64_t nvec, int elem_bytes, int max_threads, int smallest = 1) {
    for (int v = smallest; v <= top_vpt(elem_bytes); v *= 2)
        if (nvec <= (int64_t)v * max_threads) return v;
    return 0;
}
// Residency, measured in registers (make sass-check prints each kernel's):
// 16 elements a thread cost 31-32 registers (fp32 at 4 vectors, 16-bit at 2),
// so 2048 threads, the SM's most, fit its 65536 registers with 32768 elements
// in flight (Little's law wants about 25 KiB an SM at 4.8 TB/s). Fewer
// elements a thread leave registers idle (at 1 vector, 4 fp32 elements take
// 23 registers, 8 bf16 29: 2048 threads hold a quarter or half as many);
// more use up the file with fewer threads. So rows start at 16 elements a thread (first_vpt),
// several rows an SM, and grow past it only when 512 threads cannot hold
// the row. A CTA of versions 2 and 5 has at most kPairThreads threads: with
// at most 64 registers a thread (__launch_bounds__(1024), make sass-check)
// two such CTAs fill an SM, so at least two rows (or row pieces) are in
// flight on each SM, one's loads overlapping the other's reduction and
// stores. A CTA then holds at most 16384 elements, in fp32 (8 x 4 x 512) and
// 16-bit types (4 x 8 x 512) alike. Past that a CTA takes up to 1024
// threads (one an SM, as before Hopper's clusters).
constexpr int kPairThreads = 512;
constexpr int first_vpt(int elem_bytes) { return elem_bytes == 4 ? 4 : 2; }  // 16 elements a thread
int single_pass_vpt(int64_t nvec, int elem_bytes) {
    return vpt_tier(nvec, elem_bytes, kPairThreads, first_vpt(elem_bytes));
}
int32_t threads_for(int64_t nvec, int vpt) {
    const int64_t t = ((nvec + vpt - 1) / vpt + 31) / 32 * 32;
    return (int32_t)(t < 32 ? 32 : t);
}
// Version 5's split, from cols alone (batch-invariant) and the device's
// largest cluster (max_cluster: 16, or 8 where 16 cannot be scheduled): the
// smallest C in 2, 4, ..., max_cluster whose pieces, ceil(nvec / C) vectors a
// CTA, fit kPairThreads threads; failing that (rows past max_cluster x 16384
// columns) the smallest whose pieces fit 1024 threads. The smallest C keeps
// the most columns a thread (every load in flight before the first reduction)
// and the fewest CTAs to meet. {0, 0} when no C does (rows past max_cluster x
// 32768 columns).
struct cluster_split {
    int c, max_threads;
};
cluster_split cluster_for(int64_t nvec, int elem_bytes, int max_cluster) {
    for (int max_threads : {kPairThreads, 1024})
        for (int c = 2; c <= max_cluster; c *= 2)
            if (vpt_tier((nvec + c - 1) / c, elem_bytes, max_threads, first_vpt(elem_bytes))) return {c, max_threads};
    return {0, 0};
}

// max_cluster: the largest thread-block cluster the device schedules for
// version 5 (16 or 8), 0 where it runs no clusters or the library has no
// sm_90 code for it (softmax_max_cluster).
pl_softmax_plan plan_softmax(int64_t rows, int64_t cols, int elem_bytes, int method, bool vec_ok, int sms,
                             int max_cluster) {
    const int64_t nvec = cols / (16 / elem_bytes);
    pl_softmax_plan p{method, 1, 0, pl_lanes_for(cols), 1, 1};
    const bool vectorised = method == PL_SOFTMAX_SINGLE_PASS || method == PL_SOFTMAX_ONLINE_VEC ||
                            method == PL_SOFTMAX_CLUSTER;
    if (vectorised && !vec_ok) {
        p.variant = PL_SOFTMAX_ONLINE;  // ragged rows: the scalar online kernel is the honest fallback
        return p;
    }
    if (method == PL_SOFTMAX_STABLE_ADAPTIVE) p.threads = pl_adaptive_lanes_for(rows, cols, sms);
    if (method == PL_SOFTMAX_CLUSTER || (method == PL_SOFTMAX_SINGLE_PASS && !single_pass_vpt(nvec, elem_bytes))) {
        // version 5: the row split over a cluster of C CTAs (a grid of rows x C
        // CTAs, kept under 2^31: a limit no row count that fits in memory reaches)
        const cluster_split split = max_cluster ? cluster_for(nvec, elem_bytes, max_cluster) : cluster_split{0, 0};
        if (split.c && rows <= 0x7FFFFFFF / split.c) {
            const int64_t piece = (nvec + split.c - 1) / split.c;
            const int vpt = vpt_tier(piece, elem_bytes, split.max_threads, first_vpt(elem_bytes));
            return {PL_SOFTMAX_CLUSTER, 5, vpt, threads_for(piece, vpt), 1, split.c};
        }
        // no clusters here (or a row past 16 pieces): `cluster` runs what
        // single_pass would; single_pass keeps a row of up to 32768 columns in
        // one CTA of up to 1024 threads (one row an SM), longer rows take two reads
        if (method == PL_SOFTMAX_CLUSTER && single_pass_vpt(nvec, elem_bytes))
            return plan_softmax(rows, cols, elem_bytes, PL_SOFTMAX_SINGLE_PASS, vec_ok, sms, 0);
        const int vpt = vpt_tier(nvec, elem_bytes, 1024, first_vpt(elem_bytes));
        if (vpt) return {PL_SOFTMAX_SINGLE_PASS, 2, vpt, threads_for(nvec, vpt), 1, 1};
        return {PL_SOFTMAX_ONLINE_VEC, 3, 0, 1024, 1, 1};
    }
    if (method == PL_SOFTMAX_SINGLE_PASS && nvec <= 32 * top_vpt(elem_bytes)) {
        // short rows: a warp per row, kWarpRows rows a block (version 4); the
        // same register tiers as version 2, at 32 lanes
        return {method, 4, vpt_tier(nvec, elem_bytes, 32), 32 * kWarpRows, kWarpRows, 1};
    }
    if (method == PL_SOFTMAX_SINGLE_PASS) {
        const int vpt = single_pass_vpt(nvec, elem_bytes);  // > 0: longer rows went to version 5 above
        return {method, 2, vpt, threads_for(nvec, vpt), 1, 1};
    }
    if (method == PL_SOFTMAX_ONLINE_VEC) return {method, 3, 0, pl_lanes_for(nvec < 1024 ? nvec : 1024), 1, 1};
    return p;
}

// The largest cluster version 5 may use on the current device (16, 8, or 0:
// none): defined with the kernels (a host-only build plans for an H100/H200).
int softmax_max_cluster();
}  // namespace

extern "C" int pl_softmax_cuda_plan(int64_t rows, int64_t cols, int dtype, int method, int sm_count,
                                    pl_softmax_plan* plan) {
    PL_REQUIRE_PTR(plan);
    if (int st = check_softmax_args(rows, cols, dtype, method, PL_MASKED_NAN, __func__)) return st;
    PL_REQUIRE(sm_count > 0, PL_ERR_INVALID_ARGUMENT, "sm_count must be > 0 (got %d)", sm_count);
    const int elem = (int)PL_FORMATS[dtype].bytes;
    *plan = plan_softmax(rows, cols, elem, method, cols % (16 / elem) == 0, sm_count, softmax_max_cluster());
    return PL_OK;
}

// ---------------------------------------------------------------------------
// GPU
#ifdef __CUDACC__

namespace {

template <typename T> struct op_add_rounded {
    __device__ __forceinline__ float operator()(float a, float b) const { return pl_round_storage<T>(__fadd_rn(a, b)); }
};

__device__ __forceinline__ bool masked_row(float m, int masked) { return m == kNegInf && masked == PL_MASKED_ZERO; }

// (max, sum) pairs of the online softmax: combine two partial rows.
struct online_pair {
    float m, s;
};
// The rules (the CPU's cpu_combine keeps the same): a side that has seen only
// -inf has s = 0 and drops out through exp(-inf - m) = 0; when both have, the
// sums add (exp(-inf - -inf) would be NaN). NaN in m or s poisons the result.
__device__ __forceinline__ online_pair combine(online_pair a, online_pair b) {
    const float m = pl_max_nan(a.m, b.m);
    if (m == kNegInf) return {m, a.s + b.s};
    return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

// Under PL_MASKED_ZERO, a row whose every logit is -inf is written as zeros
// with a log-sum-exp of -inf. The methods whose max is not the row's true max
// (naive has none, the bugs have wrong ones) look for such rows first.
template <typename T>
__device__ bool zeroed_masked_row(const T* xr, T* yr, int64_t cols, float* lse, int masked) {
    if (masked != PL_MASKED_ZERO) return false;
    float tm = kNegInf;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) tm = pl_max_nan(tm, pl_ld(xr, j));
    if (pl_block_allreduce(tm, pl_op_max(), kNegInf) != kNegInf) return false;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) pl_st(yr, j, 0.0f);
    if (threadIdx.x == 0 && lse) lse[blockIdx.x] = kNegInf;
    return true;
}
__device__ __forceinline__ online_pair pl_shfl_xor(online_pair p, int d) {
    return {::pl_shfl_xor(p.m, d), ::pl_shfl_xor(p.s, d)};
}
struct op_combine {
    __device__ __forceinline__ online_pair operator()(online_pair a, online_pair b) const { return combine(a, b); }
};
__device__ online_pair block_combine(online_pair p) {
    return pl_block_allreduce(p, op_combine(), online_pair{kNegInf, 0.0f});
}

// Version 1: every method, a plain strided loop per thread.
template <typename T, int METHOD>
__global__ void __launch_bounds__(1024) softmax_v1(const T* __restrict__ x, T* __restrict__ y, int64_t cols, float* lse, int masked) {
    const T* xr = x + (int64_t)blockIdx.x * cols;
    T* yr = y + (int64_t)blockIdx.x * cols;
    const int tid = threadIdx.x, nt = blockDim.x;
    float m = 0.0f, s = 0.0f;
    if constexpr (METHOD == PL_SOFTMAX_NAIVE || METHOD == PL_SOFTMAX_BUG_NO_RESCALE ||
                  METHOD == PL_SOFTMAX_BUG_ZERO_START || METHOD == PL_SOFTMAX_BUG_ZERO_IDENTITY) {
        if (zeroed_masked_row(xr, yr, cols, lse, masked)) return;
    }
    if constexpr (METHOD == PL_SOFTMAX_NAIVE) {
        for (int64_t j = tid; j < cols; j += nt) s += expf(pl_ld(xr, j));
        s = pl_block_allreduce(s, pl_op_add(), 0.0f);
        for (int64_t j = tid; j < cols; j += nt) pl_st(yr, j, expf(pl_ld(xr, j)) / s);
        if (tid == 0 && lse) lse[blockIdx.x] = logf(s);
        return;
    } else if constexpr (METHOD == PL_SOFTMAX_ONLINE) {
        online_pair p{kNegInf, 0.0f};
        for (int64_t j = tid; j < cols; j += nt) {
            const float v = pl_ld(xr, j);
            // v - v + 1 is 1, or NaN for v = +inf, as the shifted exp(v - v) would be;
            // -inf is skipped: it adds 0, and -inf - -inf would be NaN
            if (v > p.m || v != v) { p.s = p.s * expf(p.m - v) + (v - v + 1.0f); p.m = v; }
            else if (v != kNegInf) p.s += expf(v - p.m);
        }
        p = block_combine(p);
        m = p.m;
        s = p.s;
    } else if constexpr (METHOD == PL_SOFTMAX_BUG_NO_RESCALE) {
        // Each thread's exponentials against its own running max, summed
        // without rescaling, then normalised with no correction either. The
        // normalise pass replays the running max, so each exponential is
        // rounded once, in fp32, as on the CPU.
        float tm = kNegInf;
        for (int64_t j = tid; j < cols; j += nt) {
            const float v = pl_ld(xr, j);
            tm = pl_max_nan(tm, v);
            s += v == kNegInf ? 0.0f : expf(v - tm);  // a masked -inf adds 0, as on the CPU
        }
        s = pl_block_allreduce(s, pl_op_add(), 0.0f);
        const float mm = pl_block_allreduce(tm, pl_op_max(), kNegInf);
        tm = kNegInf;
        for (int64_t j = tid; j < cols; j += nt) {
            const float v = pl_ld(xr, j);
            tm = pl_max_nan(tm, v);
            pl_st(yr, j, (v == kNegInf ? 0.0f : expf(v - tm)) / s);
        }
        if (tid == 0 && lse) lse[blockIdx.x] = mm + logf(s);
        return;
    } else {
        // the stable family
        float tm;
        if constexpr (METHOD == PL_SOFTMAX_BUG_ZERO_START) tm = 0.0f;
        else if constexpr (METHOD == PL_SOFTMAX_BUG_ZERO_IDENTITY) tm = tid < cols ? kNegInf : 0.0f;
        else tm = kNegInf;
        for (int64_t j = tid; j < cols; j += nt) tm = pl_max_nan(tm, pl_ld(xr, j));
        m = pl_block_allreduce(tm, pl_op_max(), METHOD == PL_SOFTMAX_BUG_ZERO_IDENTITY ? 0.0f : kNegInf);
        if (masked_row(m, masked)) {
            for (int64_t j = tid; j < cols; j += nt) pl_st(yr, j, 0.0f);
            if (tid == 0 && lse) lse[blockIdx.x] = kNegInf;
            return;
        }
        if constexpr (METHOD == PL_SOFTMAX_LOWP_ACCUM) {
            // Every addition rounded to the storage format, in the thread's
            // serial chain and in the tree. Short chains and a tree are kinder
            // than the CPU's one long chain: equal logits stay exact here.
            for (int64_t j = tid; j < cols; j += nt)
                s = pl_round_storage<T>(s + pl_round_storage<T>(expf(pl_ld(xr, j) - m)));
            s = pl_block_allreduce(s, op_add_rounded<T>(), 0.0f);
            for (int64_t j = tid; j < cols; j += nt)
                pl_st(yr, j, pl_round_storage<T>(expf(pl_ld(xr, j) - m)) / s);
            if (tid == 0 && lse) lse[blockIdx.x] = m + logf(s);
            return;
        } else {
            for (int64_t j = tid; j < cols; j += nt) s += expf(pl_ld(xr, j) - m);
            s = pl_block_allreduce(s, pl_op_add(), 0.0f);
        }
    }
    if (m == kNegInf) {  // every logit -inf (a NaN would have made m NaN)
        if (masked_row(m, masked)) {
            for (int64_t j = tid; j < cols; j += nt) pl_st(yr, j, 0.0f);
            if (tid == 0 && lse) lse[blockIdx.x] = kNegInf;
            return;
        }
        s = kNaN;  // the textbook formula's NaN, which online's skipped -inf avoided
    }
    for (int64_t j = tid; j < cols; j += nt) pl_st(yr, j, expf(pl_ld(xr, j) - m) / s);
    if (tid == 0 && lse) lse[blockIdx.x] = m + logf(s);
}

// 16-byte vectors of T, widened to float on use.
template <typename T> struct vec16 {
    static constexpr int N = 16 / sizeof(T);
    int4 raw;
    __device__ __forceinline__ float get(int k) const { return pl_widen(reinterpret_cast<const T*>(&raw)[k]); }
    __device__ __forceinline__ void set(int k, float v);
};
template <> __device__ __forceinline__ void vec16<float>::set(int k, float v) { reinterpret_cast<float*>(&raw)[k] = v; }
template <> __device__ __forceinline__ void vec16<__nv_bfloat16>::set(int k, float v) {
    reinterpret_cast<__nv_bfloat16*>(&raw)[k] = __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ void vec16<__half>::set(int k, float v) {
    reinterpret_cast<__half*>(&raw)[k] = __float2half_rn(v);
}

// NaN-propagating max in one instruction on sm_80+ (max.NaN.f32); the
// emulator and the host pass use pl_max_nan, which returns the same value for
// every non-NaN pair and a NaN whenever either side is NaN.
__device__ __forceinline__ float max_nan1(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
#else
    return pl_max_nan(a, b);
#endif
}

// Version 2: the row in registers, VPT 16-byte vectors a thread; requires cols
// to be a multiple of the vector width and 16-byte aligned rows (checked by
// the launcher). Built so that the hardware does one thing per element at a
// time, and little of it:
//  - every load is issued before any arithmetic: out-of-row vectors are
//    predicated off and padded with -inf, so no load waits behind a branch or
//    the previous vector's max chain (make sass-check holds this);
//  - exp is taken once per element, against the thread's own max, and kept in
//    registers; the thread's (max, sum) pair goes through ONE block all-reduce
//    (the online combine), and the output is e * (exp(m_thread - M) / S);
//  - the max is one max.NaN instruction.
// A thread whose logits are all -inf (padding, or a masked stretch) has pair
// (-inf, 0) and exponentials 0, so partly masked rows stay ordinary rows.
template <typename T> __device__ __forceinline__ int4 neg_inf_vec16();
template <> __device__ __forceinline__ int4 neg_inf_vec16<float>() {
    const int b = (int)0xff800000u;
    return make_int4(b, b, b, b);
}
template <> __device__ __forceinline__ int4 neg_inf_vec16<__nv_bfloat16>() {
    const int b = (int)0xff80ff80u;
    return make_int4(b, b, b, b);
}
template <> __device__ __forceinline__ int4 neg_inf_vec16<__half>() {
    const int b = (int)0xfc00fc00u;
    return make_int4(b, b, b, b);
}

// The register-resident row, shared by versions 2, 4 and 5 (indices of type I:
// int in versions 2 and 5, whose plans give a CTA at most 8192 vectors of a
// row, which saves 1.5-2.3 instructions an element; version 4 keeps int64_t,
// which takes fewer registers there): a thread's VPT
// vectors at first, first + stride, ... are all loaded before any arithmetic
// (out-of-row ones predicated off and padded with -inf), then the thread's max
// (one max.NaN each) and exp once against it, kept in ex[]. Returns the
// thread's (max, sum) pair. A thread with nothing but -inf shifts by 0 (-inf -
// -inf would be NaN) and gets exp(-inf) = 0 everywhere.
template <typename T, int VPT, typename I>
__device__ __forceinline__ online_pair exp_in_registers(const int4* __restrict__ xr, I first, I stride, I nvec,
                                                        float (&ex)[VPT * vec16<T>::N]) {
    constexpr int N = vec16<T>::N;
    vec16<T> v[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {  // loads only: all of them in flight together
        const I i = first + (I)k * stride;
        v[k].raw = i < nvec ? __ldcs(xr + i) : neg_inf_vec16<T>();  // streamed: read once
    }
    float tm = kNegInf;
#pragma unroll
    for (int k = 0; k < VPT; ++k)
#pragma unroll
        for (int e = 0; e < N; ++e) tm = max_nan1(tm, v[k].get(e));
    const float shift = tm == kNegInf ? 0.0f : tm;
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < VPT; ++k)
#pragma unroll
        for (int e = 0; e < N; ++e) {
            ex[k * N + e] = expf(v[k].get(e) - shift);
            s += ex[k * N + e];
        }
    return {tm, s};
}

// Writes ex[] * c back to the thread's vectors of the row.
template <typename T, int VPT, typename I>
__device__ __forceinline__ void store_scaled(int4* __restrict__ yr, I first, I stride, I nvec,
                                             const float (&ex)[VPT * vec16<T>::N], float c) {
    constexpr int N = vec16<T>::N;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const I i = first + (I)k * stride;
        if (i < nvec) {
            vec16<T> o;
#pragma unroll
            for (int e = 0; e < N; ++e) o.set(e, ex[k * N + e] * c);
            __stcs(yr + i, o.raw);
        }
    }
}

// The thread's rescale once the row's pair p is known: exp(m_thread - M) / S,
// 0 under the masked-zero policy; a masked row under the nan policy gets the
// textbook NaN. Returns c, and whether the row is written as zeros.
__device__ __forceinline__ float row_rescale(online_pair& p, float tm, int masked, bool& zero) {
    zero = masked_row(p.m, masked);
    if (p.m == kNegInf && !zero) p.s = kNaN;
    return zero ? 0.0f : expf(tm - p.m) / p.s;  // exp(-inf - M) = 0 for an all -inf thread
}

template <typename T, int VPT>
__global__ void __launch_bounds__(1024) softmax_single_pass(const T* __restrict__ x, T* __restrict__ y, int64_t cols,
                                                            float* lse, int masked) {
    constexpr int N = vec16<T>::N;
    const int nvec = (int)(cols / N);  // at most 8192: the plan sends longer rows to version 5 or 3
    const int4* xr = reinterpret_cast<const int4*>(x + (int64_t)blockIdx.x * cols);
    int4* yr = reinterpret_cast<int4*>(y + (int64_t)blockIdx.x * cols);
    float ex[VPT * N];
    const online_pair mine = exp_in_registers<T, VPT>(xr, (int)threadIdx.x, (int)blockDim.x, nvec, ex);
    online_pair p = block_combine(mine);
    bool zero;
    const float c = row_rescale(p, mine.m, masked, zero);
    store_scaled<T, VPT>(yr, (int)threadIdx.x, (int)blockDim.x, nvec, ex, c);
    if (threadIdx.x == 0 && lse) lse[blockIdx.x] = zero ? kNegInf : p.m + logf(p.s);
}

// Version 4: short rows, a warp per row and WARP_ROWS rows a block (OneFlow's
// layout): the same register-resident scheme as version 2, but the (max, sum)
// pair meets in five shuffles with no barrier and no shared memory, and a
// block holds several rows, so short rows still fill the SMs with work.
template <typename T, int VPT>
__global__ void __launch_bounds__(32 * kWarpRows) softmax_warp_rows(const T* __restrict__ x, T* __restrict__ y,
                                                                  int64_t rows, int64_t cols, float* lse, int masked) {
    constexpr int N = vec16<T>::N;
    const int64_t row = (int64_t)blockIdx.x * kWarpRows + threadIdx.y;
    if (row >= rows) return;  // a whole warp leaves together: no barrier below
    const int64_t nvec = cols / N;
    const int4* xr = reinterpret_cast<const int4*>(x + row * cols);
    int4* yr = reinterpret_cast<int4*>(y + row * cols);
    float ex[VPT * N];
    const online_pair mine = exp_in_registers<T, VPT>(xr, (int64_t)threadIdx.x, (int64_t)32, nvec, ex);
    online_pair p = pl_warp_allreduce(mine, op_combine());
    bool zero;
    const float c = row_rescale(p, mine.m, masked, zero);
    store_scaled<T, VPT>(yr, (int64_t)threadIdx.x, (int64_t)32, nvec, ex, c);
    if (threadIdx.x == 0 && lse) lse[row] = zero ? kNegInf : p.m + logf(p.s);
}

// Version 3: online (max, sum) over 16-byte vectors, then the write pass.
template <typename T>
__global__ void __launch_bounds__(1024) softmax_online_vec(const T* __restrict__ x, T* __restrict__ y, int64_t cols,
                                                           float* lse, int masked) {
    constexpr int N = vec16<T>::N;
    const int64_t nvec = cols / N;
    const int4* xr = reinterpret_cast<const int4*>(x + (int64_t)blockIdx.x * cols);
    int4* yr = reinterpret_cast<int4*>(y + (int64_t)blockIdx.x * cols);
    online_pair p{kNegInf, 0.0f};
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
        vec16<T> v;
        v.raw = __ldg(xr + i);
        float vm = p.m;
#pragma unroll
        for (int e = 0; e < N; ++e) vm = pl_max_nan(vm, v.get(e));
        float vs = 0.0f;
        if (vm != kNegInf) {  // an all -inf vector adds nothing (-inf - -inf would be NaN)
#pragma unroll
            for (int e = 0; e < N; ++e) vs += expf(v.get(e) - vm);
        }
        p = combine(p, online_pair{vm, vs});
    }
    p = block_combine(p);
    const bool zero = masked_row(p.m, masked);
    if (p.m == kNegInf && !zero) p.s = kNaN;  // masked: the textbook NaN
    const float inv = 1.0f / p.s;
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
        vec16<T> v, o;
        v.raw = __ldcs(xr + i);
#pragma unroll
        for (int e = 0; e < N; ++e) o.set(e, zero ? 0.0f : expf(v.get(e) - p.m) * inv);
        __stcs(yr + i, o.raw);
    }
    if (threadIdx.x == 0 && lse) lse[blockIdx.x] = zero ? kNegInf : p.m + logf(p.s);
}

// Version 5: rows too long for one CTA's registers, split over a thread-block
// cluster of C CTAs (sm_90+; QuACK's layout). CTA `rank` of the row's cluster
// holds vectors [rank * piece, (rank + 1) * piece) of it in registers, as
// version 2 holds a whole row (every load first, exp once per element, one
// block all-reduce of the (max, sum) pair), so the row is still read once and
// written once. The CTAs' pairs meet through distributed shared memory: each
// publishes its pair, cluster.sync(), then warp 0 reads every peer's pair (lane
// r reads rank r's) and combines them in rank order 0, 1, ..., C - 1, the
// same order whatever the timing; a second cluster.sync() keeps every CTA's
// shared memory alive until its peers have read it. The last piece may be
// short, or empty (predicated off like version 2's padding). Compiled for
// sm_90+ only: an older arch's build has an empty body, and the launcher asks
// the device (softmax_max_cluster) before it plans this version.
template <typename T, int VPT>
__global__ void __launch_bounds__(1024) softmax_cluster(const T* __restrict__ x, T* __restrict__ y, int64_t cols,
                                                        int64_t piece, float* lse, int masked) {
#if defined(PL_EMU) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    const unsigned rank = cluster.block_rank(), nblocks = cluster.num_blocks();
    constexpr int N = vec16<T>::N;
    const int64_t row = blockIdx.x / nblocks, lo = (int64_t)rank * piece;
    const int64_t left = cols / N - lo;
    const int mine_n = (int)(left < piece ? left : piece);  // <= 0: an empty last piece; at most 8192
    const int4* xr = reinterpret_cast<const int4*>(x + row * cols) + lo;
    int4* yr = reinterpret_cast<int4*>(y + row * cols) + lo;
    float ex[VPT * N];
    const online_pair mine = exp_in_registers<T, VPT>(xr, (int)threadIdx.x, (int)blockDim.x, mine_n, ex);
    const online_pair cta = block_combine(mine);
    __shared__ online_pair published, row_pair;
    if (threadIdx.x == 0) published = cta;
    cluster.sync();  // every CTA's pair published
    if (threadIdx.x < 32) {
        const online_pair peer = threadIdx.x < nblocks ? *cluster.map_shared_rank(&published, threadIdx.x)
                                                       : online_pair{kNegInf, 0.0f};
        online_pair p{__shfl_sync(0xffffffffu, peer.m, 0), __shfl_sync(0xffffffffu, peer.s, 0)};
        for (unsigned r = 1; r < nblocks; ++r)
            p = combine(p, online_pair{__shfl_sync(0xffffffffu, peer.m, r), __shfl_sync(0xffffffffu, peer.s, r)});
        if (threadIdx.x == 0) row_pair = p;
    }
    cluster.sync();  // every peer read (its shared memory may go now), row_pair visible to the CTA
    online_pair p = row_pair;
    bool zero;
    const float c = row_rescale(p, mine.m, masked, zero);
    store_scaled<T, VPT>(yr, (int)threadIdx.x, (int)blockDim.x, mine_n, ex, c);
    if (rank == 0 && threadIdx.x == 0 && lse) lse[row] = zero ? kNegInf : p.m + logf(p.s);
#endif
}

// Clusters need an sm_90+ device that launches them (cudaDevAttrClusterLaunch)
// and version 5's sm_90 code for it: a library built for older archs only (or
// PTX of one, JIT-compiled) has the empty body, so it must not launch it. A
// cluster of 16 (past the portable 8) is used only where the device can
// schedule one of the heaviest instantiation's 512-thread CTAs
// (cudaOccupancyMaxActiveClusters > 0); else 8. Asked once a device (each
// launch of a long row would pay for the queries).
int softmax_max_cluster() {
    static std::atomic<int> known[64];  // 0: not asked yet, else the answer + 1
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError();  // an answer, not an error for the next launch to report
        return 0;
    }
    if (dev >= 0 && dev < 64 && known[dev].load() != 0) return known[dev].load() - 1;
    int major = 0, launch = 0, answer = 0;
    cudaFuncAttributes a;
    bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&launch, cudaDevAttrClusterLaunch, dev) == cudaSuccess;
    if (ok && major >= 9 && launch) {
        ok = cudaFuncGetAttributes(&a, softmax_cluster<float, 4>) == cudaSuccess;
        if (ok && a.ptxVersion >= 90 && a.binaryVersion >= 90) {
            answer = 8;
            void (*heaviest)(const __nv_bfloat16*, __nv_bfloat16*, int64_t, int64_t, float*, int) =
                softmax_cluster<__nv_bfloat16, 4>;  // the most registers a thread (make sass-check)
            cudaLaunchAttribute attr[1];
            attr[0].id = cudaLaunchAttributeClusterDimension;
            attr[0].val.clusterDim.x = 16;
            attr[0].val.clusterDim.y = 1;
            attr[0].val.clusterDim.z = 1;
            const cudaLaunchConfig_t cfg = {dim3(16), dim3(kPairThreads), 0, 0, attr, 1};
            int clusters = 0;
            if (cudaFuncSetAttribute(heaviest, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess &&
                cudaOccupancyMaxActiveClusters(&clusters, heaviest, &cfg) == cudaSuccess && clusters > 0)
                answer = 16;
        }
    }
    cudaGetLastError();  // a failed query is an answer, not an error for the next launch to report
    if (dev >= 0 && dev < 64) known[dev].store(answer + 1);
    return answer;
}

template <typename T, int VPT>
int launch_cluster(const T* x, T* y, int64_t rows, int64_t cols, const pl_softmax_plan& p, float* lse, int masked) {
    void (*kernel)(const T*, T*, int64_t, int64_t, float*, int) = softmax_cluster<T, VPT>;
    if (p.cluster > 8)  // 16: past the portable 8, allowed on sm_90
        PL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)p.cluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    // grid, block, dynamic shared bytes, stream, attributes (positional: the
    // emulator's gridDim and blockDim are macros)
    const cudaLaunchConfig_t cfg = {dim3((unsigned)(rows * p.cluster)), dim3((unsigned)p.threads), 0, 0, attr, 1};
    const int64_t nvec = cols / vec16<T>::N, piece = (nvec + p.cluster - 1) / p.cluster;
    PL_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, x, y, cols, piece, lse, masked));
    return PL_OK;
}

template <typename T, int METHOD>
void launch_v1(const T* x, T* y, int64_t rows, int64_t cols, float* lse, int masked, int threads) {
    softmax_v1<T, METHOD><<<(unsigned)rows, (unsigned)threads>>>(x, y, cols, lse, masked);
}

template <typename T>
int launch(const void* xv, void* yv, int64_t rows, int64_t cols, int method, int masked, float* lse) {
    const T* x = static_cast<const T*>(xv);
    T* y = static_cast<T*>(yv);
    constexpr int N = vec16<T>::N;
    constexpr int kFirst = first_vpt(sizeof(T)), kTop = top_vpt(sizeof(T));  // versions 2 and 5's tiers
    const bool vec_ok = cols % N == 0 && reinterpret_cast<uintptr_t>(xv) % 16 == 0 &&
                        reinterpret_cast<uintptr_t>(yv) % 16 == 0;
    int sms = 1;
    if (method == PL_SOFTMAX_STABLE_ADAPTIVE)
        if (int st = pl_sm_count(&sms, "pl_softmax_cuda")) return st;
    // asked only where version 5 may be planned: rows past one CTA's tiers, or the cluster variant
    const int max_cluster = (method == PL_SOFTMAX_CLUSTER ||
                             (method == PL_SOFTMAX_SINGLE_PASS && !single_pass_vpt(cols / N, (int)sizeof(T))))
                                ? softmax_max_cluster()
                                : 0;
    const pl_softmax_plan p = plan_softmax(rows, cols, (int)sizeof(T), method, vec_ok, sms, max_cluster);
    const unsigned grid = (unsigned)rows, t = (unsigned)p.threads;
    switch (p.variant) {
        case PL_SOFTMAX_NAIVE: launch_v1<T, PL_SOFTMAX_NAIVE>(x, y, rows, cols, lse, masked, t); break;
        case PL_SOFTMAX_STABLE:
        case PL_SOFTMAX_STABLE_ADAPTIVE: launch_v1<T, PL_SOFTMAX_STABLE>(x, y, rows, cols, lse, masked, t); break;
        case PL_SOFTMAX_ONLINE: launch_v1<T, PL_SOFTMAX_ONLINE>(x, y, rows, cols, lse, masked, t); break;
        case PL_SOFTMAX_BUG_ZERO_IDENTITY: launch_v1<T, PL_SOFTMAX_BUG_ZERO_IDENTITY>(x, y, rows, cols, lse, masked, t); break;
        case PL_SOFTMAX_BUG_ZERO_START: launch_v1<T, PL_SOFTMAX_BUG_ZERO_START>(x, y, rows, cols, lse, masked, t); break;
        case PL_SOFTMAX_BUG_NO_RESCALE: launch_v1<T, PL_SOFTMAX_BUG_NO_RESCALE>(x, y, rows, cols, lse, masked, t); break;
        case PL_SOFTMAX_LOWP_ACCUM: launch_v1<T, PL_SOFTMAX_LOWP_ACCUM>(x, y, rows, cols, lse, masked, t); break;
        case PL_SOFTMAX_SINGLE_PASS:
            if (p.kernel == 4) {
                const dim3 wgrid((unsigned)((rows + kWarpRows - 1) / kWarpRows)), wblock(32, kWarpRows);
                switch (p.vpt) {
                    case 1: softmax_warp_rows<T, 1><<<wgrid, wblock>>>(x, y, rows, cols, lse, masked); break;
                    case 2: softmax_warp_rows<T, 2><<<wgrid, wblock>>>(x, y, rows, cols, lse, masked); break;
                    case 4: softmax_warp_rows<T, 4><<<wgrid, wblock>>>(x, y, rows, cols, lse, masked); break;
                    default: softmax_warp_rows<T, kTop><<<wgrid, wblock>>>(x, y, rows, cols, lse, masked);
                }
                break;
            }
            // the two tiers plan_softmax gives (vpt_tier from first_vpt): 16 elements a thread, or the most
            if (p.vpt == kFirst) softmax_single_pass<T, kFirst><<<grid, t>>>(x, y, cols, lse, masked);
            else softmax_single_pass<T, kTop><<<grid, t>>>(x, y, cols, lse, masked);
            break;
        case PL_SOFTMAX_ONLINE_VEC: softmax_online_vec<T><<<grid, t>>>(x, y, cols, lse, masked); break;
        case PL_SOFTMAX_CLUSTER: {
            const int st = p.vpt == kFirst ? launch_cluster<T, kFirst>(x, y, rows, cols, p, lse, masked)
                                           : launch_cluster<T, kTop>(x, y, rows, cols, p, lse, masked);
            if (st) return st;
            break;
        }
    }
    PL_CUDA_CHECK(cudaGetLastError());
    return PL_OK;
}

int dispatch(const void* x, void* y, int64_t rows, int64_t cols, int dtype, int method, int masked, float* lse) {
    return pl_with_row_type(dtype, "pl_softmax_cuda", [&](auto t) {
        return launch<typename decltype(t)::type>(x, y, rows, cols, method, masked, lse);
    });
}

}  // namespace

extern "C" int pl_softmax_cuda_device(const void* x_dev, int64_t rows, int64_t cols, int dtype, int method, int masked,
                                      void* y_dev, float* lse_dev) {
    PL_REQUIRE_PTR(x_dev);
    PL_REQUIRE_PTR(y_dev);
    if (int st = check_softmax_args(rows, cols, dtype, method, masked, __func__)) return st;
    PL_REQUIRE(rows <= 0x7FFFFFFF, PL_ERR_UNSUPPORTED, "at most 2^31 - 1 rows (one block per row)");
    const size_t elem = PL_FORMATS[dtype].bytes;
    if (int st = pl_require_device(x_dev, elem, "x_dev", __func__)) return st;
    if (int st = pl_require_device(y_dev, elem, "y_dev", __func__)) return st;
    if (lse_dev)
        if (int st = pl_require_device(lse_dev, sizeof(float), "lse_dev", __func__)) return st;
    return dispatch(x_dev, y_dev, rows, cols, dtype, method, masked, lse_dev);
}

extern "C" int pl_softmax_cuda(const void* x, int64_t rows, int64_t cols, int dtype, int method, int masked, void* y,
                               double* lse) {
    PL_REQUIRE_PTR(x);
    PL_REQUIRE_PTR(y);
    if (int st = check_softmax_args(rows, cols, dtype, method, masked, __func__)) return st;
    PL_REQUIRE(rows <= 0x7FFFFFFF, PL_ERR_UNSUPPORTED, "at most 2^31 - 1 rows (one block per row)");
    int count = 0;
    if (int st = pl_cuda_device_count(&count)) return st;
    const size_t bytes = (size_t)(rows * cols) * PL_FORMATS[dtype].bytes;
    void *xd = nullptr, *yd = nullptr;
    float* ld = nullptr;
    int st = PL_OK;
    cudaError_t err = cudaMalloc(&xd, bytes);
    if (err == cudaSuccess) err = cudaMalloc(&yd, bytes);
    if (err == cudaSuccess) err = cudaMalloc(reinterpret_cast<void**>(&ld), sizeof(float) * (size_t)rows);
    if (err == cudaSuccess) err = cudaMemcpy(xd, x, bytes, cudaMemcpyHostToDevice);
    if (err != cudaSuccess) st = pl_cuda_fail(err, __func__, "allocation or upload");
    if (st == PL_OK) st = dispatch(xd, yd, rows, cols, dtype, method, masked, ld);
    if (st == PL_OK) {
        err = cudaMemcpy(y, yd, bytes, cudaMemcpyDeviceToHost);
        if (err != cudaSuccess) st = pl_cuda_fail(err, __func__, "kernel or download");
    }
    if (st == PL_OK && lse) {
        std::vector<float> tmp((size_t)rows);
        err = cudaMemcpy(tmp.data(), ld, sizeof(float) * (size_t)rows, cudaMemcpyDeviceToHost);
        if (err != cudaSuccess) st = pl_cuda_fail(err, __func__, "download");
        for (int64_t r = 0; r < rows && st == PL_OK; ++r) lse[r] = tmp[(size_t)r];
    }
    cudaFree(xd);
    cudaFree(yd);
    cudaFree(ld);
    return st;
}

#else

namespace {
int softmax_max_cluster() { return 16; }  // no device here: the plan is an H100's or H200's
}  // namespace

extern "C" int pl_softmax_cuda_device(const void*, int64_t, int64_t, int, int, int, void*, float*) {
    return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA");
}
extern "C" int pl_softmax_cuda(const void*, int64_t, int64_t, int, int, int, void*, double*) {
    return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA");
}

#endif
