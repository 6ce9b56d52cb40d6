/*
 * sum_cuda.cu: the sum's GPU versions (the CPU reference is accumulate.cu's).
 *
 * GPU kernels:
 *   version 1, tree        each thread sums a grid-strided slice (16-byte loads,
 *                          four in flight), then warp shuffle + block tree;
 *                          a second one-block pass sums the block partials.
 *                          Fixed shape, so the same bits on every run.
 *   version 2, tree_kahan  version 1 with each thread's serial part
 *                          compensated: the long serial chain is where the
 *                          error grows, the tree is only log2(threads) deep.
 *   version 3, atomic      version 1's block sums land in one accumulator by
 *                          atomicAdd: one pass, but the order blocks arrive in
 *                          varies, and so do the bits.
 * The GPU kernels do what real kernels do, not what the CPU reference does:
 * each stored value is first converted to the accumulator's register (fp32
 * for fp32 and bf16 accumulators, fp64 for fp64), and a bf16 sum is rounded
 * to fp32, then to bf16. Where the stored format is wider than the
 * accumulator, that is one more rounding per step than the CPU's exact
 * result rounded once; the experiment's GPU bound allows for it.
 * "Same bits every run" holds for one GPU model and one alignment of x: the
 * grid follows the SM count, and a 16-byte-aligned x is read in vectors.
 */
#include <cstdlib>

#include "common.cuh"

// The GPU variants of the sum, declared once (common.cuh, PL_DECLARE_VARIANTS);
// accumulate.cu declares the CPU ones. pl_sum_cuda* take these ids.
// dtypes: the accumulator formats; sass: version 1-3's first pass, any storage format.
// symbol, id, name, kind, devices, dtypes, order, batch-invariant, deterministic, default, sass, summary
#define SUM_GPU_ACCUMULATORS (PL_FMT_BIT(PL_FP64) | PL_FMT_BIT(PL_FP32) | PL_FMT_BIT(PL_BF16))
#define SUM_GPU_SASS SASS(PL_SASS_KERNEL("sum_blocks_kernel", PL_SASS_STREAMING, PL_STORAGE_FORMATS, 18.0))
#define SUM_GPU_VARIANTS(X)                                                                                        \
    X(PL_GPU_TREE, 5, "tree", KERNEL, PL_ON_CUDA, SUM_GPU_ACCUMULATORS, AS_GIVEN, -1, 1, 1, SUM_GPU_SASS,          \
      "warp shuffle + block tree, two passes: the same bits every run")                                            \
    X(PL_GPU_TREE_KAHAN, 6, "tree_kahan", KERNEL, PL_ON_CUDA, SUM_GPU_ACCUMULATORS, AS_GIVEN, -1, 1, 1,            \
      SUM_GPU_SASS, "tree with each thread's serial part compensated")                                             \
    X(PL_GPU_ATOMIC, 7, "atomic", KERNEL, PL_ON_CUDA, SUM_GPU_ACCUMULATORS, AS_GIVEN, -1, 0, 1,                    \
      SUM_GPU_SASS, "block tree + one atomicAdd a block: the order, and the bits, vary")
PL_DECLARE_VARIANTS(sum, SUM_GPU_VARIANTS);

// ---------------------------------------------------------------------------
// GPU
#ifdef __CUDACC__

namespace {

constexpr int kThreads = 512;
constexpr int kBlocksPerSM = 4;  // 2048 threads per SM: full occupancy on sm_80/sm_90
constexpr int kMaxBlocks = 4096;
constexpr int kUnroll = 4;       // 16-byte loads in flight per thread
constexpr size_t kSlotOffset = kMaxBlocks * sizeof(double);
constexpr size_t kWorkspaceBytes = kSlotOffset + 64;

template <int ACC> struct slot_type { using type = typename pl_acc<ACC>::reg; };
template <> struct slot_type<PL_BF16> { using type = __nv_bfloat16; };

template <int ACC, bool KAHAN>
struct thread_acc {
    using R = typename pl_acc<ACC>::reg;
    R s = (R)0, c = (R)0;
    __device__ __forceinline__ void add(R x) {
        if constexpr (KAHAN) {
            const R y = pl_acc<ACC>::add(x, -c);
            const R t = pl_acc<ACC>::add(s, y);
            c = pl_acc<ACC>::add(pl_acc<ACC>::add(t, -s), -y);
            s = t;
        } else {
            s = pl_acc<ACC>::add(s, x);
        }
    }
    __device__ __forceinline__ R value() const { return KAHAN ? pl_acc<ACC>::add(s, -c) : s; }
};

// Versions 1-3, first pass. Each block reduces its slice; MODE 0 stores the
// block sum in partials[blockIdx.x], MODE 1 atomically adds it to *slot.
template <typename TS, int ACC, bool KAHAN, int MODE>
__global__ void __launch_bounds__(kThreads)
sum_blocks_kernel(const TS* __restrict__ x, int64_t n, bool aligned, typename pl_acc<ACC>::reg* partials,
                  typename slot_type<ACC>::type* slot) {
    using R = typename pl_acc<ACC>::reg;
    constexpr int V = 16 / sizeof(TS);
    thread_acc<ACC, KAHAN> acc;
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t npacks = aligned ? n / V : 0;
    const int4* packs = reinterpret_cast<const int4*>(x);
    int64_t p = tid;
    for (; p + (kUnroll - 1) * stride < npacks; p += kUnroll * stride) {
        int4 raw[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) raw[u] = __ldg(packs + p + u * stride);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const TS* v = reinterpret_cast<const TS*>(&raw[u]);
#pragma unroll
            for (int k = 0; k < V; ++k) acc.add((R)pl_widen(v[k]));
        }
    }
    for (; p < npacks; p += stride) {
        const int4 raw = __ldg(packs + p);
        const TS* v = reinterpret_cast<const TS*>(&raw);
#pragma unroll
        for (int k = 0; k < V; ++k) acc.add((R)pl_widen(v[k]));
    }
    for (int64_t i = npacks * V + tid; i < n; i += stride) acc.add((R)pl_widen(x[i]));
    const R b = pl_block_sum<ACC>(acc.value());
    if (threadIdx.x == 0) {
        if constexpr (MODE == 0) {
            partials[blockIdx.x] = b;
        } else if constexpr (ACC == PL_BF16) {
            atomicAdd(slot, __float2bfloat16_rn(b));
        } else {
            atomicAdd(slot, b);
        }
    }
}

// Second pass of versions 1-2: one block, fixed order.
template <int ACC>
__global__ void __launch_bounds__(1024) sum_partials_kernel(const typename pl_acc<ACC>::reg* partials, int nblocks,
                                                            double* out) {
    using R = typename pl_acc<ACC>::reg;
    R s = (R)0;
    for (int i = threadIdx.x; i < nblocks; i += blockDim.x) s = pl_acc<ACC>::add(s, partials[i]);
    s = pl_block_sum<ACC>(s);
    if (threadIdx.x == 0) *out = (double)s;
}

template <typename S>
__global__ void slot_to_double_kernel(const S* slot, double* out) {
    if constexpr (sizeof(S) == 2) *out = (double)__bfloat162float(*slot);
    else *out = (double)*slot;
}

int grid_for(int64_t n, size_t elem, int* blocks) {
    int sms = 0;
    if (int st = pl_sm_count(&sms, "pl_sum_cuda")) return st;
    const int64_t per_block = (int64_t)kThreads * (16 / (int64_t)elem) * kUnroll;
    int64_t b = (n + per_block - 1) / per_block;
    const int64_t cap = (int64_t)sms * kBlocksPerSM < kMaxBlocks ? (int64_t)sms * kBlocksPerSM : kMaxBlocks;
    if (b > cap) b = cap;
    if (b < 1) b = 1;
    *blocks = (int)b;
    return PL_OK;
}

template <typename TS, int ACC>
int launch_sum(const void* x_dev, int64_t n, int method, void* work_dev, double* out_dev) {
    using R = typename pl_acc<ACC>::reg;
    using S = typename slot_type<ACC>::type;
    const TS* x = static_cast<const TS*>(x_dev);
    R* partials = static_cast<R*>(work_dev);
    S* slot = reinterpret_cast<S*>(static_cast<char*>(work_dev) + kSlotOffset);
    const bool aligned = (reinterpret_cast<uintptr_t>(x_dev) % 16) == 0;
    int blocks = 0;
    if (int st = grid_for(n, sizeof(TS), &blocks)) return st;
    switch (method) {
        case PL_GPU_TREE:
            sum_blocks_kernel<TS, ACC, false, 0><<<blocks, kThreads>>>(x, n, aligned, partials, slot);
            PL_CUDA_CHECK(cudaGetLastError());
            sum_partials_kernel<ACC><<<1, 1024>>>(partials, blocks, out_dev);
            break;
        case PL_GPU_TREE_KAHAN:
            sum_blocks_kernel<TS, ACC, true, 0><<<blocks, kThreads>>>(x, n, aligned, partials, slot);
            PL_CUDA_CHECK(cudaGetLastError());
            sum_partials_kernel<ACC><<<1, 1024>>>(partials, blocks, out_dev);
            break;
        case PL_GPU_ATOMIC:
            PL_CUDA_CHECK(cudaMemsetAsync(slot, 0, sizeof(S)));
            sum_blocks_kernel<TS, ACC, false, 1><<<blocks, kThreads>>>(x, n, aligned, partials, slot);
            PL_CUDA_CHECK(cudaGetLastError());
            slot_to_double_kernel<S><<<1, 1>>>(slot, out_dev);
            break;
    }
    PL_CUDA_CHECK(cudaGetLastError());
    return PL_OK;
}

template <typename TS>
int dispatch_acc(const void* x_dev, int64_t n, int accumulator, int method, void* work, double* out) {
    switch (accumulator) {
        case PL_FP32: return launch_sum<TS, PL_FP32>(x_dev, n, method, work, out);
        case PL_FP64: return launch_sum<TS, PL_FP64>(x_dev, n, method, work, out);
        case PL_BF16: return launch_sum<TS, PL_BF16>(x_dev, n, method, work, out);
    }
    return pl_fail(PL_ERR_UNSUPPORTED, "pl_sum_cuda_device", "GPU accumulator must be fp32, fp64 or bf16 (got %s)",
                   PL_FORMATS[accumulator].name);
}

int dispatch(const void* x_dev, int64_t n, int storage, int accumulator, int method, void* work, double* out) {
    switch (storage) {
        case PL_FP64: return dispatch_acc<double>(x_dev, n, accumulator, method, work, out);
        case PL_FP32: return dispatch_acc<float>(x_dev, n, accumulator, method, work, out);
        case PL_FP16: return dispatch_acc<__half>(x_dev, n, accumulator, method, work, out);
        case PL_BF16: return dispatch_acc<__nv_bfloat16>(x_dev, n, accumulator, method, work, out);
        case PL_FP8_E4M3: return dispatch_acc<__nv_fp8_e4m3>(x_dev, n, accumulator, method, work, out);
        case PL_FP8_E5M2: return dispatch_acc<__nv_fp8_e5m2>(x_dev, n, accumulator, method, work, out);
    }
    return pl_fail(PL_ERR_INVALID_ARGUMENT, "pl_sum_cuda_device", "unknown storage format %d", storage);
}

// Host doubles (already values of the format) to the device's storage bytes.
void encode(const double* x, int64_t n, int storage, void* out) {
    const pl_fmt& f = PL_FORMATS[storage];
    for (int64_t i = 0; i < n; ++i) {
        const double v = pl_round_to(x[i], f);  // exact when x[i] is already a value of the format
        switch (storage) {
            case PL_FP64: static_cast<double*>(out)[i] = v; break;
            case PL_FP32: static_cast<float*>(out)[i] = (float)v; break;
            case PL_FP16: static_cast<__half*>(out)[i] = __float2half_rn((float)v); break;
            case PL_BF16: static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn((float)v); break;
            // not the saturating constructors: they would turn e5m2's inf into 57344
            case PL_FP8_E4M3: static_cast<__nv_fp8_storage_t*>(out)[i] = __nv_cvt_float_to_fp8((float)v, __NV_NOSAT, __NV_E4M3); break;
            case PL_FP8_E5M2: static_cast<__nv_fp8_storage_t*>(out)[i] = __nv_cvt_float_to_fp8((float)v, __NV_NOSAT, __NV_E5M2); break;
        }
    }
}

int check_sum_args(int64_t n, int storage, int accumulator, int method, const char* func) {
    if (n <= 0) return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "n must be > 0 (got %lld)", (long long)n);
    if (!pl_valid_format(storage)) return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "unknown storage format %d", storage);
    if (storage == PL_TF32) return pl_fail(PL_ERR_UNSUPPORTED, func, "tf32 is a compute format, not a storage one");
    if (!pl_valid_format(accumulator))
        return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "unknown accumulator format %d", accumulator);
    if (int st = pl_check_variant("sum", method, PL_ON_CUDA, func)) return st;
    if (accumulator != PL_FP32 && accumulator != PL_FP64 && accumulator != PL_BF16)
        return pl_fail(PL_ERR_UNSUPPORTED, func, "GPU accumulator must be fp32, fp64 or bf16 (got %s)",
                       PL_FORMATS[accumulator].name);
    size_t bytes;
    return pl_checked_bytes(n, PL_FORMATS[storage].bytes, &bytes, func);
}

}  // namespace

extern "C" int pl_sum_workspace_bytes(int64_t n, int storage, int method, size_t* bytes) {
    PL_REQUIRE_PTR(bytes);
    if (int st = check_sum_args(n, storage, PL_FP32, method, __func__)) return st;
    *bytes = kWorkspaceBytes;
    return PL_OK;
}

extern "C" int pl_sum_cuda_device(const void* x_dev, int64_t n, int storage, int accumulator, int method,
                                  void* work_dev, size_t work_bytes, double* out_dev) {
    PL_REQUIRE_PTR(x_dev);
    PL_REQUIRE_PTR(work_dev);
    PL_REQUIRE_PTR(out_dev);
    if (int st = check_sum_args(n, storage, accumulator, method, __func__)) return st;
    PL_REQUIRE(work_bytes >= kWorkspaceBytes, PL_ERR_INVALID_ARGUMENT, "workspace of %zu bytes is below the %zu needed",
               work_bytes, kWorkspaceBytes);
    if (int st = pl_require_device(x_dev, PL_FORMATS[storage].bytes, "x_dev", __func__)) return st;
    if (int st = pl_require_device(work_dev, sizeof(double), "work_dev", __func__)) return st;
    if (int st = pl_require_device(out_dev, sizeof(double), "out_dev", __func__)) return st;
    return dispatch(x_dev, n, storage, accumulator, method, work_dev, out_dev);
}

extern "C" int pl_sum_cuda(const double* x, int64_t n, int storage, int accumulator, int method, int runs,
                           double* results) {
    PL_REQUIRE_PTR(x);
    PL_REQUIRE_PTR(results);
    if (int st = check_sum_args(n, storage, accumulator, method, __func__)) return st;
    PL_REQUIRE(runs > 0, PL_ERR_INVALID_ARGUMENT, "runs must be > 0 (got %d)", runs);
    int count = 0;
    if (int st = pl_cuda_device_count(&count)) return st;
    size_t bytes = 0;
    if (int st = pl_checked_bytes(n, PL_FORMATS[storage].bytes, &bytes, __func__)) return st;
    // Device memory first: a size the GPU cannot hold fails before x is read.
    void *x_dev = nullptr, *work = nullptr, *host = nullptr;
    double* out = nullptr;
    int st = PL_OK;
    cudaError_t err = cudaMalloc(&x_dev, bytes);
    if (err == cudaSuccess) err = cudaMalloc(&work, kWorkspaceBytes);
    if (err == cudaSuccess) err = cudaMalloc(reinterpret_cast<void**>(&out), sizeof(double) * (size_t)runs);
    if (err != cudaSuccess) st = pl_cuda_fail(err, __func__, "cudaMalloc");
    if (st == PL_OK && (host = std::malloc(bytes)) == nullptr)
        st = pl_fail(PL_ERR_OUT_OF_MEMORY, __func__, "cannot allocate %zu host bytes", bytes);
    if (st == PL_OK) {
        encode(x, n, storage, host);
        err = cudaMemcpy(x_dev, host, bytes, cudaMemcpyHostToDevice);
        if (err != cudaSuccess) st = pl_cuda_fail(err, __func__, "upload");
    }
    for (int r = 0; st == PL_OK && r < runs; ++r) st = dispatch(x_dev, n, storage, accumulator, method, work, out + r);
    if (st == PL_OK) {
        err = cudaMemcpy(results, out, sizeof(double) * (size_t)runs, cudaMemcpyDeviceToHost);
        if (err != cudaSuccess) st = pl_cuda_fail(err, __func__, "kernel or download");
    }
    std::free(host);
    cudaFree(x_dev);
    cudaFree(work);
    cudaFree(out);
    return st;
}

#else  // built without nvcc

extern "C" int pl_sum_workspace_bytes(int64_t, int, int, size_t*) {
    return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA");
}
extern "C" int pl_sum_cuda_device(const void*, int64_t, int, int, int, void*, size_t, double*) {
    return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA");
}
extern "C" int pl_sum_cuda(const double*, int64_t, int, int, int, int, double*) {
    return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA");
}

#endif
