// pl_emu.h: the CUDA execution model on the CPU, for running this project's
// kernels where there is no GPU. Force-included (g++ -include) into copies of
// cuda/*.cu that translate.py has rewritten: launches become pl_emu::launch,
// __CUDACC__ becomes PL_EMU.
//
// What it models: a grid of blocks run one cluster at a time (a block alone
// is a cluster of one) in a seeded random order (so atomics land in a
// different order from launch to launch, as on a GPU); the threads of every
// block of the cluster as fibers on one OS thread (ucontext to start them,
// _setjmp/_longjmp to switch), switched only at __syncthreads, cluster.sync()
// and warp shuffles, so every barrier and shuffle is a real rendezvous and the
// blocks of a cluster run together (each sweep starts at a random block); a
// barrier that not every live thread reaches is reported as a deadlock
// instead of hanging. Each block has its own __shared__ variables
// (translate.py makes each declaration a reference to the running block's
// copy, filled with 0xFF: NaN), which cooperative_groups::this_cluster()'s
// map_shared_rank reaches from the cluster's other blocks (distributed shared
// memory); a block's shared memory is poisoned (0xFF) when it exits, so a
// peer reading it too late reads NaN. Launches with a cluster dimension come
// through cudaLaunchKernelEx (cudaLaunchAttributeClusterDimension); past 8
// blocks a cluster needs cudaFuncAttributeNonPortableClusterSizeAllowed, and
// 16 is the most, as on an H100/H200.
// What it does not: memory races between threads (fibers do not preempt each
// other), timing, CUDA's own expf/logf (the host libm's are used: a few ulps
// apart), and anything about real hardware. It checks kernel logic, not a GPU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <utility>

#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __forceinline__ inline
#define __launch_bounds__(...)

namespace pl_emu {
extern uint3 g_tid, g_bid;
extern dim3 g_bdim, g_gdim;
// cluster: blocks a cluster (1 x 1 x 1: none); kernel: the function, for its
// attributes (the non-portable cluster size)
void launch(dim3 grid, dim3 block, const std::function<void()>& body, size_t dynamic_shared_bytes = 0,
            dim3 cluster = dim3(1, 1, 1), const void* kernel = nullptr);
// The launch's dynamic shared memory (extern __shared__), the running block's,
// filled with 0xFF (NaN) before each block, as a GPU leaves it undefined.
void* dynamic_shared();
// The running block's copy of the __shared__ variable declared at `tag` (a
// static of the declaring function, so one per template instance), `bytes`
// long, filled with 0xFF when the block starts using it.
void* shared_slot(const void* tag, size_t bytes);
template <typename U>
U& shared_var(const void* tag) {
    return *static_cast<U*>(shared_slot(tag, sizeof(U)));
}
// The address p (in the running block's shared memory) in the shared memory
// of the block of cluster rank `rank`.
void* map_shared(const void* p, unsigned rank);
unsigned cluster_rank();
unsigned cluster_blocks();
dim3 cluster_dims();
void cluster_sync();
void syncthreads();
cudaError_t take_last_error();
void allow_nonportable_cluster(const void* kernel, bool allow);
// cudaFuncAttributeMaxDynamicSharedMemorySize: false past an sm_90's 227 KiB
bool allow_dynamic_shared(const void* kernel, int bytes);

// cudaLaunchKernelEx (translate.py renames the calls): the grid, block,
// dynamic shared bytes and a cluster dimension, if one is given.
template <typename... P, typename... A>
cudaError_t launch_ex(const cudaLaunchConfig_t* cfg, void (*kernel)(P...), A&&... args) {
    dim3 cl(1, 1, 1);
    for (unsigned i = 0; i < cfg->numAttrs; ++i)
        if (cfg->attrs[i].id == cudaLaunchAttributeClusterDimension)
            cl = dim3(cfg->attrs[i].val.clusterDim.x, cfg->attrs[i].val.clusterDim.y, cfg->attrs[i].val.clusterDim.z);
    launch(cfg->gridDim, cfg->blockDim, [&] { kernel(args...); }, cfg->dynamicSmemBytes, cl,
           reinterpret_cast<const void*>(kernel));
    return take_last_error();
}
// cudaFuncSetAttribute / cudaFuncGetAttributes (renamed by translate.py)
template <typename F>
cudaError_t func_set_attribute(F* kernel, cudaFuncAttribute attr, int value) {
    if (attr == cudaFuncAttributeNonPortableClusterSizeAllowed)
        allow_nonportable_cluster(reinterpret_cast<const void*>(kernel), value != 0);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize &&
        !allow_dynamic_shared(reinterpret_cast<const void*>(kernel), value))
        return cudaErrorInvalidValue;
    return cudaSuccess;
}
template <typename F>
cudaError_t func_get_attributes(cudaFuncAttributes* a, F*) {
    std::memset(a, 0, sizeof(*a));
    a->maxThreadsPerBlock = 1024;
    a->ptxVersion = a->binaryVersion = 90;  // the emulated device is an sm_90
    return cudaSuccess;
}
// cudaOccupancyMaxActiveClusters (renamed by translate.py): the emulated
// sm_90 schedules any cluster a launch would accept (8 blocks, 16 with the
// non-portable attribute), one at a time; PL_EMU_MAX_CLUSTER=8 in the
// environment plays a device that cannot schedule 16 (the fallback's test).
bool cluster_size_allowed(const void* kernel, unsigned blocks);
template <typename F>
cudaError_t occupancy_max_active_clusters(int* n, F* kernel, const cudaLaunchConfig_t* cfg) {
    unsigned blocks = 1;
    for (unsigned i = 0; i < cfg->numAttrs; ++i)
        if (cfg->attrs[i].id == cudaLaunchAttributeClusterDimension)
            blocks = cfg->attrs[i].val.clusterDim.x * cfg->attrs[i].val.clusterDim.y * cfg->attrs[i].val.clusterDim.z;
    const char* most = std::getenv("PL_EMU_MAX_CLUSTER");
    const bool schedulable = !most || blocks <= (unsigned)std::atoi(most);
    *n = schedulable && cluster_size_allowed(reinterpret_cast<const void*>(kernel), blocks) ? 1 : 0;
    return cudaSuccess;
}
// Exchange 8 bytes within the current warp: every lane offers `mine` and
// receives lane `src`'s offer (its own where src is out of range).
uint64_t warp_exchange(uint64_t mine, int src);
int lane();
}  // namespace pl_emu

#define threadIdx (pl_emu::g_tid)
#define blockIdx (pl_emu::g_bid)
#define blockDim (pl_emu::g_bdim)
#define gridDim (pl_emu::g_gdim)

inline void __syncthreads() { pl_emu::syncthreads(); }

// cooperative_groups' cluster, what the kernels use of it (translate.py drops
// the #include <cooperative_groups.h>).
namespace cooperative_groups {
struct cluster_group {
    unsigned block_rank() const { return pl_emu::cluster_rank(); }
    unsigned num_blocks() const { return pl_emu::cluster_blocks(); }
    dim3 dim_blocks() const { return pl_emu::cluster_dims(); }
    void sync() const { pl_emu::cluster_sync(); }
    template <typename T>
    T* map_shared_rank(T* addr, unsigned rank) const {
        return static_cast<T*>(pl_emu::map_shared(addr, rank));
    }
};
inline cluster_group this_cluster() { return {}; }
}  // namespace cooperative_groups

template <typename T>
inline T pl_emu_shfl(T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    bits = pl_emu::warp_exchange(bits, src);
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}
template <typename T>
inline T __shfl_sync(unsigned, T v, int src_lane) { return pl_emu_shfl(v, src_lane & 31); }
template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int lane_mask) { return pl_emu_shfl(v, pl_emu::lane() ^ lane_mask); }
template <typename T>
inline T __shfl_down_sync(unsigned, T v, unsigned delta) {
    const int src = pl_emu::lane() + (int)delta;
    return pl_emu_shfl(v, src < 32 ? src : pl_emu::lane());
}

// Round-to-nearest arithmetic: the host's, with contraction off.
inline float __fadd_rn(float a, float b) { return a + b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }

template <typename T> inline T __ldg(const T* p) { return *p; }
template <typename T> inline T __ldcs(const T* p) { return *p; }
template <typename T> inline void __stcs(T* p, T v) { *p = v; }

// One fiber runs at a time, so a read-modify-write is atomic here.
inline float atomicAdd(float* p, float v) { const float o = *p; *p = o + v; return o; }
inline int atomicAdd(int* p, int v) { const int o = *p; *p = o + v; return o; }
inline double atomicAdd(double* p, double v) { const double o = *p; *p = o + v; return o; }
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* p, __nv_bfloat16 v) {
    const __nv_bfloat16 o = *p;
    *p = __float2bfloat16_rn(__bfloat162float(o) + __bfloat162float(v));
    return o;
}
