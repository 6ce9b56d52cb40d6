// pl_emu.h: the CUDA execution model on the CPU, for running this project's
// kernels where there is no GPU. Force-included (g++ -include) into copies of
// cuda/*.cu that translate.py has rewritten: launches become pl_emu::launch,
// __CUDACC__ becomes PL_EMU.
//
// What it models: a grid of blocks run one at a time in a seeded random order
// (so atomics land in a different order from launch to launch, as on a GPU);
// each block's threads as fibers on one OS thread (ucontext to start them,
// _setjmp/_longjmp to switch), switched only at __syncthreads and warp shuffles, so every barrier and shuffle is a real
// rendezvous; a barrier that not every live thread reaches is reported as a
// deadlock instead of hanging. Static __shared__ variables are shared by the
// block running at the time.
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
#include <cstring>
#include <functional>

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
void launch(dim3 grid, dim3 block, const std::function<void()>& body, size_t dynamic_shared_bytes = 0);
// The launch's dynamic shared memory (extern __shared__), filled with 0xFF
// (NaN) before each block, as a GPU leaves it undefined.
void* dynamic_shared();
void syncthreads();
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
inline double atomicAdd(double* p, double v) { const double o = *p; *p = o + v; return o; }
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* p, __nv_bfloat16 v) {
    const __nv_bfloat16 o = *p;
    *p = __float2bfloat16_rn(__bfloat162float(o) + __bfloat162float(v));
    return o;
}
