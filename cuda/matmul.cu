/*
 * matmul.cu: C = A @ B, row-major, A m x k, B k x n, in fp32, bf16 or fp16,
 * accumulated in fp32, C rounded to the input format.
 *
 * CPU reference: each C[i][j] sums its products in ascending k within blocks of
 * 128, and the block sums in order: an fp32 error growing like 128 + K/128
 * roundings rather than K (the sequential sum lost 2.4x torch's accuracy at
 * K = 1024). One rounding per product and per add: the host build does not
 * contract to FMA.
 *
 * GPU versions:
 *   1 naive           one thread per C element, ascending k, fp32 FMA.
 *   2 tiled           16 x 16 tiles of A and B staged in shared memory; the
 *                     same ascending-k FMA chain per element (the zero
 *                     padding past k adds fma(0, 0, s), which only turns a
 *                     -0 sum into +0), 1/16 of the global loads.
 *   3 splitk_atomic   K cut into `splits` slices, one block per (tile, slice);
 *                     slices land in an fp32 workspace by atomicAdd. The order
 *                     they land in varies, and so do the bits.
 *   4 splitk_ordered  the same slices, each written to its own workspace
 *                     plane, then summed in slice order by a second kernel:
 *                     the same bits every run, but not the unsplit bits.
 */
#include <algorithm>
#include <vector>

#include "common.cuh"

// The variants of pl_matmul_cuda, declared once (common.cuh, PL_DECLARE_VARIANTS).
// symbol, id, name, kind, devices, dtypes, order, batch-invariant, deterministic, default, sass, summary
#define MATMUL_VARIANTS(X)                                                                                         \
    X(PL_MATMUL_NAIVE, 1, "naive", KERNEL, PL_ON_CUDA, PL_ROW_FORMATS, AS_GIVEN, 1, 1, 0,                          \
      NO_SASS, "a thread per element, ascending k, fp32 FMA")                                                      \
    X(PL_MATMUL_TILED, 2, "tiled", KERNEL, PL_ON_CUDA, PL_ROW_FORMATS, AS_GIVEN, 1, 1, 1,                          \
      NO_SASS, "16 x 16 shared-memory tiles, the same ascending-k FMA chain")                                      \
    X(PL_MATMUL_SPLITK_ATOMIC, 3, "splitk_atomic", KERNEL, PL_ON_CUDA, PL_ROW_FORMATS, AS_GIVEN, 1, 0, 0,          \
      NO_SASS, "K slices combined by atomicAdd: the order, and the bits, vary")                                    \
    X(PL_MATMUL_SPLITK_ORDERED, 4, "splitk_ordered", KERNEL, PL_ON_CUDA, PL_ROW_FORMATS, AS_GIVEN, 1, 1, 0,        \
      NO_SASS, "K slices combined in slice order: fixed bits, not the unsplit ones")
PL_DECLARE_VARIANTS(matmul, MATMUL_VARIANTS);

namespace {

constexpr int64_t kBlockK = 128;

int check_matmul_args(const void* a, const void* b, const void* c, int64_t m, int64_t n, int64_t k, int dtype,
                      const char* func) {
    if (int st = pl_check_ptrs(func, {{"a", a}, {"b", b}, {"c", c}})) return st;
    if (m <= 0 || n <= 0 || k <= 0)
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "m, n, k must be > 0 (got %lld, %lld, %lld)", (long long)m,
                       (long long)n, (long long)k);
    if (int st = pl_check_row_dtype(dtype, "dtype", func)) return st;
    const int64_t lim = INT64_MAX / 8;
    if (m > lim / k || k > lim / n || m > lim / n) return pl_fail(PL_ERR_SIZE_OVERFLOW, func, "matrix sizes overflow");
    return PL_OK;
}

}  // namespace

extern "C" int pl_matmul_cpu(const void* a, const void* b, int64_t m, int64_t n, int64_t k, int dtype, void* c) {
    if (int st = check_matmul_args(a, b, c, m, n, k, dtype, __func__)) return st;
    std::vector<float> bf((size_t)(k * n)), acc((size_t)n), part((size_t)n);
    for (int64_t i = 0; i < k * n; ++i) bf[(size_t)i] = pl_load_host(b, i, dtype);
    for (int64_t i = 0; i < m; ++i) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t p0 = 0; p0 < k; p0 += kBlockK) {  // K in blocks, as BLAS does
            std::fill(part.begin(), part.end(), 0.0f);
            const int64_t p1 = p0 + kBlockK < k ? p0 + kBlockK : k;
            for (int64_t p = p0; p < p1; ++p) {
                const float aip = pl_load_host(a, i * k + p, dtype);
                const float* brow = bf.data() + p * n;
                for (int64_t j = 0; j < n; ++j) part[(size_t)j] += aip * brow[j];
            }
            for (int64_t j = 0; j < n; ++j) acc[(size_t)j] += part[(size_t)j];
        }
        for (int64_t j = 0; j < n; ++j) pl_store_host(c, i * n + j, dtype, acc[(size_t)j]);
    }
    return PL_OK;
}

#ifdef __CUDACC__

namespace {

constexpr int TILE = 16;

template <typename T>
__global__ void matmul_naive(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c, int64_t m, int64_t n,
                             int64_t k) {
    const int64_t i = (int64_t)blockIdx.y * blockDim.y + threadIdx.y;
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= m || j >= n) return;
    float s = 0.0f;
    for (int64_t p = 0; p < k; ++p) s = __fmaf_rn(pl_ld(a, i * k + p), pl_ld(b, p * n + j), s);
    pl_st(c, i * n + j, s);
}

// One (tile, K-slice) of C; MODE 0 writes C, 1 atomically adds into the fp32
// workspace, 2 writes the slice's own workspace plane.
template <typename T, int MODE>
__global__ void matmul_tiled(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c, float* work,
                             int64_t m, int64_t n, int64_t k, int64_t kslice) {
    __shared__ float as[TILE][TILE], bs[TILE][TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t i = (int64_t)blockIdx.y * TILE + ty, j = (int64_t)blockIdx.x * TILE + tx;
    const int64_t k0 = (int64_t)blockIdx.z * kslice;
    const int64_t k1 = k0 + kslice < k ? k0 + kslice : k;
    float s = 0.0f;
    for (int64_t t = k0; t < k1; t += TILE) {
        as[ty][tx] = (i < m && t + tx < k1) ? pl_ld(a, i * k + t + tx) : 0.0f;
        bs[ty][tx] = (j < n && t + ty < k1) ? pl_ld(b, (t + ty) * n + j) : 0.0f;
        __syncthreads();
#pragma unroll
        for (int p = 0; p < TILE; ++p) s = __fmaf_rn(as[ty][p], bs[p][tx], s);
        __syncthreads();
    }
    if (i >= m || j >= n) return;
    if constexpr (MODE == 0) pl_st(c, i * n + j, s);
    else if constexpr (MODE == 1) atomicAdd(work + i * n + j, s);
    else work[(int64_t)blockIdx.z * m * n + i * n + j] = s;
}

template <typename T>
__global__ void sum_planes(const float* __restrict__ work, T* __restrict__ c, int64_t mn, int planes) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < mn; e += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int z = 0; z < planes; ++z) s += work[z * mn + e];  // slice order: fixed
        pl_st(c, e, s);
    }
}

template <typename T>
int launch(const void* av, const void* bv, void* cv, int64_t m, int64_t n, int64_t k, int version, int splits,
           float* work) {
    const T* a = static_cast<const T*>(av);
    const T* b = static_cast<const T*>(bv);
    T* c = static_cast<T*>(cv);
    const dim3 block(TILE, TILE);
    if (splits < 1) splits = 1;  // unsplit versions ignore it, and may be passed 0
    const int64_t kslice = ((k + splits - 1) / splits + TILE - 1) / TILE * TILE;
    const int planes = (int)((k + kslice - 1) / kslice);
    const dim3 grid((unsigned)((n + TILE - 1) / TILE), (unsigned)((m + TILE - 1) / TILE), 1);
    const unsigned sum_blocks = (unsigned)((m * n + 255) / 256 < 65535 ? (m * n + 255) / 256 : 65535);
    switch (version) {
        case PL_MATMUL_NAIVE: matmul_naive<T><<<grid, block>>>(a, b, c, m, n, k); break;
        case PL_MATMUL_TILED: matmul_tiled<T, 0><<<grid, block>>>(a, b, c, nullptr, m, n, k, k); break;
        case PL_MATMUL_SPLITK_ATOMIC:
            PL_CUDA_CHECK(cudaMemsetAsync(work, 0, sizeof(float) * (size_t)(m * n)));
            matmul_tiled<T, 1><<<dim3(grid.x, grid.y, planes), block>>>(a, b, c, work, m, n, k, kslice);
            PL_CUDA_CHECK(cudaGetLastError());
            sum_planes<T><<<sum_blocks, 256>>>(work, c, m * n, 1);
            break;
        case PL_MATMUL_SPLITK_ORDERED:
            matmul_tiled<T, 2><<<dim3(grid.x, grid.y, planes), block>>>(a, b, c, work, m, n, k, kslice);
            PL_CUDA_CHECK(cudaGetLastError());
            sum_planes<T><<<sum_blocks, 256>>>(work, c, m * n, planes);
            break;
    }
    PL_CUDA_CHECK(cudaGetLastError());
    return PL_OK;
}

}  // namespace

extern "C" int pl_matmul_workspace_bytes(int64_t m, int64_t n, int version, int splits, size_t* bytes) {
    PL_REQUIRE_PTR(bytes);
    PL_REQUIRE(m > 0 && n > 0, PL_ERR_INVALID_ARGUMENT, "m and n must be > 0");
    if (int st = pl_check_variant("matmul", version, PL_ON_CUDA, __func__)) return st;
    const bool split = version == PL_MATMUL_SPLITK_ATOMIC || version == PL_MATMUL_SPLITK_ORDERED;
    PL_REQUIRE(!split || (splits >= 1 && splits <= 1024), PL_ERR_INVALID_ARGUMENT,
               "splits must be in [1, 1024] (got %d)", splits);
    const int64_t planes = version == PL_MATMUL_SPLITK_ORDERED ? splits : version == PL_MATMUL_SPLITK_ATOMIC ? 1 : 0;
    PL_REQUIRE(m <= INT64_MAX / 4 / n / (planes ? planes : 1), PL_ERR_SIZE_OVERFLOW, "workspace size overflows");
    *bytes = (size_t)(planes * m * n) * sizeof(float);
    return PL_OK;
}

extern "C" int pl_matmul_cuda(const void* a_dev, const void* b_dev, int64_t m, int64_t n, int64_t k, int dtype,
                              int version, int splits, void* work_dev, size_t work_bytes, void* c_dev) {
    if (int st = check_matmul_args(a_dev, b_dev, c_dev, m, n, k, dtype, __func__)) return st;
    if (int st = pl_check_variant("matmul", version, PL_ON_CUDA, __func__)) return st;
    size_t need = 0;
    if (int st = pl_matmul_workspace_bytes(m, n, version, splits, &need)) return st;
    PL_REQUIRE(need == 0 || (work_dev && work_bytes >= need), PL_ERR_INVALID_ARGUMENT,
               "workspace of %zu bytes is below the %zu needed", work_bytes, need);
    PL_REQUIRE(m < 65535LL * TILE, PL_ERR_UNSUPPORTED, "m must be below %d", 65535 * TILE);
    PL_REQUIRE(n < 2147483647LL, PL_ERR_UNSUPPORTED, "n must be below 2^31 - 1");
    const size_t elem = PL_FORMATS[dtype].bytes;
    if (int st = pl_require_device(a_dev, elem, "a_dev", __func__)) return st;
    if (int st = pl_require_device(b_dev, elem, "b_dev", __func__)) return st;
    if (int st = pl_require_device(c_dev, elem, "c_dev", __func__)) return st;
    if (need)
        if (int st = pl_require_device(work_dev, sizeof(float), "work_dev", __func__)) return st;
    float* work = static_cast<float*>(work_dev);
    return pl_with_row_type(dtype, __func__, [&](auto t) {
        return launch<typename decltype(t)::type>(a_dev, b_dev, c_dev, m, n, k, version, splits, work);
    });
}

#else

extern "C" int pl_matmul_workspace_bytes(int64_t, int64_t, int, int, size_t*) {
    return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA");
}
extern "C" int pl_matmul_cuda(const void*, const void*, int64_t, int64_t, int64_t, int, int, int, void*, size_t, void*) {
    return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA");
}

#endif
