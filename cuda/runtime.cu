/*
 * runtime.cu: library-wide entry points: status strings, the thread-local last
 * error, build information, CUDA device discovery, and format rounding.
 */
#include <cstdarg>
#include <cstdio>

#include "common.cuh"

#ifndef PL_BUILD_FLAGS
#define PL_BUILD_FLAGS "unknown"
#endif
#define PL_STR2(...) #__VA_ARGS__  // variadic: __CUDA_ARCH_LIST__ holds commas (900,1000)
#define PL_STR(...) PL_STR2(__VA_ARGS__)

static thread_local char pl_last_error_buf[512] = "";

int pl_fail(int status, const char* func, const char* fmt, ...) {
    int k = std::snprintf(pl_last_error_buf, sizeof pl_last_error_buf, "%s: ", func);
    if (k < 0 || k >= (int)sizeof pl_last_error_buf) k = 0;
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(pl_last_error_buf + k, sizeof pl_last_error_buf - k, fmt, ap);
    va_end(ap);
    return status;
}

#ifdef __CUDACC__
int pl_cuda_fail(cudaError_t err, const char* func, const char* what) {
    (void)cudaGetLastError();  // clear a non-sticky error so later calls can proceed
    const int status = err == cudaErrorMemoryAllocation ? PL_ERR_OUT_OF_MEMORY
                       : (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver)
                           ? PL_ERR_NO_DEVICE
                           : PL_ERR_CUDA;
    return pl_fail(status, func, "%s failed: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
}
#endif

extern "C" {

int pl_abi_version(void) { return PL_ABI_VERSION; }

const char* pl_error_string(int status) {
    static const char* const text[PL_ERR_COUNT_] = {
        "ok",
        "invalid argument",
        "null pointer",
        "size overflows",
        "unsupported combination",
        "no CUDA device or driver",
        "library built without CUDA (nvcc was not found at build time)",
        "CUDA error",
        "out of memory",
    };
    if (status < 0 || status >= PL_ERR_COUNT_) return "unknown status";
    return text[status];
}

const char* pl_last_error(void) { return pl_last_error_buf; }

const char* pl_build_info(void) {
    return "compiler="
#ifdef __CUDACC__
           "nvcc " PL_STR(__CUDACC_VER_MAJOR__) "." PL_STR(__CUDACC_VER_MINOR__)
#else
           "c++ (host only)"
#endif
           "; flags=" PL_BUILD_FLAGS
#if defined(__CUDACC__) && defined(__CUDA_ARCH_LIST__)
           "; cuda_archs=" PL_STR(__CUDA_ARCH_LIST__)
#else
           "; cuda_archs=none"
#endif
        ;
}

int pl_round(const double* x, int64_t n, int format, double* y) {
    PL_REQUIRE_PTR(x);
    PL_REQUIRE_PTR(y);
    size_t bytes;
    if (int st = pl_checked_bytes(n, sizeof(double), &bytes, __func__)) return st;
    PL_REQUIRE(pl_valid_format(format), PL_ERR_INVALID_ARGUMENT, "unknown format %d", format);
    const pl_fmt& f = PL_FORMATS[format];
    for (int64_t i = 0; i < n; ++i) y[i] = pl_round_to(x[i], f);
    return PL_OK;
}

#ifdef __CUDACC__
int pl_cuda_device_count(int* count) {
    PL_REQUIRE_PTR(count);
    *count = 0;
    int c = 0;
    const cudaError_t err = cudaGetDeviceCount(&c);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return pl_fail(PL_ERR_NO_DEVICE, __func__, "no usable CUDA driver or device (%s: %s)", cudaGetErrorName(err),
                       cudaGetErrorString(err));
    }
    *count = c;
    if (c == 0) return pl_fail(PL_ERR_NO_DEVICE, __func__, "no CUDA device found");
    return PL_OK;
}

int pl_cuda_versions(int* runtime, int* driver) {
    PL_REQUIRE_PTR(runtime);
    PL_REQUIRE_PTR(driver);
    *runtime = 0;
    *driver = 0;
    PL_CUDA_CHECK(cudaRuntimeGetVersion(runtime));
    if (cudaDriverGetVersion(driver) != cudaSuccess) *driver = 0;
    return PL_OK;
}

int pl_cuda_device_info(int device, char* name, int name_len, int* sm_count, int* cc_major,
                        int* cc_minor, size_t* total_mem) {
    PL_REQUIRE_PTR(name);
    PL_REQUIRE_PTR(sm_count);
    PL_REQUIRE_PTR(cc_major);
    PL_REQUIRE_PTR(cc_minor);
    PL_REQUIRE_PTR(total_mem);
    PL_REQUIRE(name_len > 0, PL_ERR_INVALID_ARGUMENT, "name_len must be > 0");
    int count = 0;
    int st = pl_cuda_device_count(&count);
    if (st != PL_OK) return st;
    PL_REQUIRE(device >= 0 && device < count, PL_ERR_INVALID_ARGUMENT, "device %d out of range [0, %d)", device, count);
    cudaDeviceProp p;
    PL_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    std::snprintf(name, (size_t)name_len, "%s", p.name);
    *sm_count = p.multiProcessorCount;
    *cc_major = p.major;
    *cc_minor = p.minor;
    *total_mem = p.totalGlobalMem;
    return PL_OK;
}

int pl_device_alloc(size_t bytes, void** dev) {
    PL_REQUIRE_PTR(dev);
    *dev = nullptr;
    PL_REQUIRE(bytes > 0, PL_ERR_INVALID_ARGUMENT, "bytes must be > 0");
    int count = 0;
    if (int st = pl_cuda_device_count(&count)) return st;
    PL_CUDA_CHECK(cudaMalloc(dev, bytes));
    return PL_OK;
}

int pl_device_free(void* dev) {
    if (dev) PL_CUDA_CHECK(cudaFree(dev));
    return PL_OK;
}

static int copy_checked(void* dst, const void* src, const void* dev, size_t bytes, cudaMemcpyKind kind,
                        const char* func) {
    if (!dst || !src) return pl_fail(PL_ERR_NULL_POINTER, func, "%s is NULL", dst ? "src" : "dst");
    if (int st = pl_require_device(dev, 1, "dev", func)) return st;
    const cudaError_t err = cudaMemcpy(dst, src, bytes, kind);
    return err == cudaSuccess ? PL_OK : pl_cuda_fail(err, func, "cudaMemcpy");
}

int pl_copy_to_device(void* dev, const void* host, size_t bytes) {
    return copy_checked(dev, host, dev, bytes, cudaMemcpyHostToDevice, __func__);
}

int pl_copy_to_host(void* host, const void* dev, size_t bytes) {
    return copy_checked(host, dev, dev, bytes, cudaMemcpyDeviceToHost, __func__);
}
#else
int pl_cuda_device_count(int* count) {
    PL_REQUIRE_PTR(count);
    *count = 0;
    return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA (nvcc was not found at build time)");
}

int pl_cuda_versions(int* runtime, int* driver) {
    PL_REQUIRE_PTR(runtime);
    PL_REQUIRE_PTR(driver);
    *runtime = *driver = 0;
    return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA");
}

int pl_cuda_device_info(int, char*, int, int*, int*, int*, size_t*) {
    return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA");
}

int pl_device_alloc(size_t, void** dev) {
    if (dev) *dev = nullptr;
    return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA");
}
int pl_device_free(void*) { return PL_OK; }
int pl_copy_to_device(void*, const void*, size_t) { return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA"); }
int pl_copy_to_host(void*, const void*, size_t) { return pl_fail(PL_ERR_NO_CUDA, __func__, "library built without CUDA"); }
#endif

}  // extern "C"
