/*
 * attention.cu: scaled dot-product attention with a causal mask and key
 * padding, the softmax in fp32 as inference engines keep it.
 *
 * q: bh x tq x d, k: bh x tk x d, v: bh x tk x dv, y: bh x tq x dv, all in
 * the storage format (fp32, bf16, fp16). Query i of head-batch b sees key j
 * when j >= kv_start[b] (left padding; kv_start may be NULL: none) and, if
 * causal, j <= i + (tk - tq) (the queries are the last tq positions). Then
 *
 *   s_j = scale * (q_i . k_j),  p_j = exp(s_j - max s),  y_i = sum_j p_j v_j / sum_j p_j
 *
 * with every sum in fp32 and y rounded once to the storage format. A query
 * that sees no key at all (a fully masked row: padding before the first
 * real token) gets zeros, as engines write; the textbook formula would give
 * 0/0 = NaN.
 *
 * CPU: the reference, pairwise fp32 sums. GPU:
 *   version 1  one block a query row: threads over keys for the scores (kept
 *              in shared memory, tk <= 8192), block max and sum, then threads
 *              over output columns, each summing p_j v_jc over j in order.
 */
#include <cmath>
#include <vector>

#include "common.cuh"

namespace {

constexpr int64_t kMaxKeysGpu = 8192;  // 32 KiB of fp32 scores in shared memory

int check_attention_args(const void* q, const void* k, const void* v, const void* y, int64_t bh, int64_t tq, int64_t tk,
                         int64_t d, int64_t dv, int dtype, float scale, const char* func) {
    if (int st = pl_check_ptrs(func, {{"q", q}, {"k", k}, {"v", v}, {"y", y}})) return st;
    if (bh <= 0 || tq <= 0 || tk <= 0 || d <= 0 || dv <= 0)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "bh, tq, tk, d and dv must be > 0");
    if (tq > tk) return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "tq (%lld) must be <= tk (%lld)", (long long)tq, (long long)tk);
    if (int st = pl_check_row_dtype(dtype, "dtype", func)) return st;
    if (!std::isfinite(scale)) return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "scale must be finite");
    const int64_t biggest = (tq > tk ? tq : tk) * (d > dv ? d : dv);
    if ((uint64_t)bh > (uint64_t)INT64_MAX / (uint64_t)biggest) return pl_fail(PL_ERR_SIZE_OVERFLOW, func, "sizes overflow");
    size_t bytes;
    return pl_checked_bytes(bh * biggest, sizeof(float), &bytes, func);
}

PL_HD inline bool visible(int64_t i, int64_t j, int64_t tq, int64_t tk, int causal, int64_t start) {
    return j >= start && (!causal || j <= i + (tk - tq));
}

}  // namespace

extern "C" int pl_attention_cpu(const void* q, const void* k, const void* v, int64_t bh, int64_t tq, int64_t tk,
                                int64_t d, int64_t dv, int dtype, int causal, const int32_t* kv_start, float scale,
                                void* y) {
    if (int st = check_attention_args(q, k, v, y, bh, tq, tk, d, dv, dtype, scale, __func__)) return st;
    std::vector<float> prod((size_t)(d > tk ? d : tk)), p((size_t)tk), col((size_t)tk);
    for (int64_t b = 0; b < bh; ++b) {
        const int64_t start = kv_start ? kv_start[b] : 0;
        for (int64_t i = 0; i < tq; ++i) {
            const int64_t qo = (b * tq + i) * d, yo = (b * tq + i) * dv;
            float m = pl_neg_inf;
            for (int64_t j = 0; j < tk; ++j) {
                if (!visible(i, j, tq, tk, causal, start)) {
                    p[(size_t)j] = pl_neg_inf;
                    continue;
                }
                const int64_t ko = (b * tk + j) * d;
                for (int64_t c = 0; c < d; ++c) prod[(size_t)c] = pl_load_host(q, qo + c, dtype) * pl_load_host(k, ko + c, dtype);
                p[(size_t)j] = scale * pl_pairwise_sum(prod.data(), d);
                m = pl_max_nan(m, p[(size_t)j]);
            }
            if (m == pl_neg_inf) {  // sees no key: zeros, as engines write
                for (int64_t c = 0; c < dv; ++c) pl_store_host(y, yo + c, dtype, 0.0f);
                continue;
            }
            for (int64_t j = 0; j < tk; ++j) p[(size_t)j] = p[(size_t)j] == pl_neg_inf ? 0.0f : std::exp(p[(size_t)j] - m);
            const float l = pl_pairwise_sum(p.data(), tk);
            for (int64_t c = 0; c < dv; ++c) {
                for (int64_t j = 0; j < tk; ++j) col[(size_t)j] = p[(size_t)j] * pl_load_host(v, (b * tk + j) * dv + c, dtype);
                pl_store_host(y, yo + c, dtype, pl_pairwise_sum(col.data(), tk) / l);
            }
        }
    }
    return PL_OK;
}

#ifdef __CUDACC__

namespace {

template <typename T>
__global__ void __launch_bounds__(256) attention_v1(const T* __restrict__ q, const T* __restrict__ k,
                                                    const T* __restrict__ v, T* __restrict__ y, int64_t tq, int64_t tk,
                                                    int64_t d, int64_t dv, int causal, const int32_t* kv_start,
                                                    float scale) {
    extern __shared__ float p[];  // tk scores, then probabilities
    const int64_t b = blockIdx.x / tq, i = blockIdx.x % tq;
    const int64_t start = kv_start ? kv_start[b] : 0;
    const T* qr = q + (b * tq + i) * d;
    T* yr = y + (b * tq + i) * dv;
    float tm = pl_neg_inf;
    for (int64_t j = threadIdx.x; j < tk; j += blockDim.x) {
        float s = pl_neg_inf;
        if (visible(i, j, tq, tk, causal, start)) {
            const T* kr = k + (b * tk + j) * d;
            float acc = 0.0f;
            for (int64_t c = 0; c < d; ++c) acc = __fmaf_rn(pl_ld(qr, c), pl_ld(kr, c), acc);
            s = scale * acc;
        }
        p[j] = s;
        tm = pl_max_nan(tm, s);
    }
    const float m = pl_block_allreduce(tm, pl_op_max(), pl_neg_inf);
    if (m == pl_neg_inf) {  // sees no key: zeros, as engines write
        for (int64_t c = threadIdx.x; c < dv; c += blockDim.x) pl_st(yr, c, 0.0f);
        return;
    }
    float ts = 0.0f;
    for (int64_t j = threadIdx.x; j < tk; j += blockDim.x) {
        const float e = p[j] == pl_neg_inf ? 0.0f : expf(p[j] - m);
        p[j] = e;
        ts += e;
    }
    const float l = pl_block_allreduce(ts, pl_op_add(), 0.0f);  // its barriers also publish p[]
    for (int64_t c = threadIdx.x; c < dv; c += blockDim.x) {
        float acc = 0.0f;
        for (int64_t j = 0; j < tk; ++j) acc = __fmaf_rn(p[j], pl_ld(v, (b * tk + j) * dv + c), acc);
        pl_st(yr, c, acc / l);
    }
}

template <typename T>
int launch_attention(const void* q, const void* k, const void* v, void* y, int64_t bh, int64_t tq, int64_t tk,
                     int64_t d, int64_t dv, int causal, const int32_t* kv_start, float scale) {
    const int threads = pl_lanes_for(tk < 256 ? tk : 256);
    attention_v1<T><<<(unsigned)(bh * tq), threads, (size_t)tk * sizeof(float)>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(y), tq, tk, d, dv,
        causal, kv_start, scale);
    PL_CUDA_CHECK(cudaGetLastError());
    return PL_OK;
}

}  // namespace

extern "C" int pl_attention_cuda(const void* q_dev, const void* k_dev, const void* v_dev, int64_t bh, int64_t tq,
                                 int64_t tk, int64_t d, int64_t dv, int dtype, int causal, const int32_t* kv_start_dev,
                                 float scale, void* y_dev) {
    if (int st = check_attention_args(q_dev, k_dev, v_dev, y_dev, bh, tq, tk, d, dv, dtype, scale, __func__)) return st;
    PL_REQUIRE(tk <= kMaxKeysGpu, PL_ERR_UNSUPPORTED, "version 1 keeps the scores in shared memory: tk <= %lld (got %lld)",
               (long long)kMaxKeysGpu, (long long)tk);
    PL_REQUIRE(bh * tq <= 0x7FFFFFFF, PL_ERR_UNSUPPORTED, "at most 2^31 - 1 query rows (one block each)");
    const size_t elem = PL_FORMATS[dtype].bytes;
    if (int st = pl_require_device(q_dev, elem, "q_dev", __func__)) return st;
    if (int st = pl_require_device(k_dev, elem, "k_dev", __func__)) return st;
    if (int st = pl_require_device(v_dev, elem, "v_dev", __func__)) return st;
    if (int st = pl_require_device(y_dev, elem, "y_dev", __func__)) return st;
    if (kv_start_dev)
        if (int st = pl_require_device(kv_start_dev, sizeof(int32_t), "kv_start_dev", __func__)) return st;
    return pl_with_row_type(dtype, __func__, [&](auto t) {
        return launch_attention<typename decltype(t)::type>(q_dev, k_dev, v_dev, y_dev, bh, tq, tk, d, dv, causal,
                                                            kv_start_dev, scale);
    });
}

#else

extern "C" int pl_attention_cuda(const void*, const void*, const void*, int64_t, int64_t, int64_t, int64_t, int64_t, int,
                                 int, const int32_t*, float, void*) {
    return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA");
}

#endif
