// pl_emu.cpp: the fiber scheduler behind pl_emu.h, and the few CUDA runtime
// calls the library makes, served from host memory. See pl_emu.h for what is
// and is not modelled.
#include "pl_emu.h"

#include <setjmp.h>
#include <ucontext.h>

#if defined(_FORTIFY_SOURCE) && _FORTIFY_SOURCE > 0
#error "pl_emu jumps between fiber stacks with _longjmp, which _FORTIFY_SOURCE's check aborts: build with -U_FORTIFY_SOURCE"
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

namespace pl_emu {

uint3 g_tid, g_bid;
dim3 g_bdim, g_gdim;

namespace {

constexpr size_t kStack = 64 * 1024;

// A fiber starts once on its own stack through ucontext (setcontext), and
// from then on switches with _setjmp/_longjmp, which leave the signal mask
// alone: no system call per switch, unlike swapcontext.
struct Fiber {
    ucontext_t ctx;
    jmp_buf jb;
    bool has_ctx = false, started = false;
    uint3 tid;
    int warp = 0, lane = 0;
    bool done = false;
    bool waiting = false;
};

struct Barrier {  // a generation-counting rendezvous of the live members
    int arrived = 0;
    unsigned gen = 0;
};

std::vector<Fiber> fibers;
std::vector<char> stacks;
jmp_buf sched;
ucontext_t launch_env;  // the caller's signal mask and floating-point state, taken at each launch
int cur = 0;
const std::function<void()>* body = nullptr;
Barrier block_bar;
std::vector<Barrier> warp_bars;
std::vector<int> warp_live;
std::vector<uint64_t> warp_slots;
int live = 0;
bool progress = false;
cudaError_t last_error = cudaSuccess;
std::mutex launch_mutex;
std::mt19937_64 order_rng(12345);

void yield() {
    if (!_setjmp(fibers[cur].jb)) _longjmp(sched, 1);
}

// Wait at b until `members` live fibers have arrived.
void rendezvous(Barrier& b, const int& members) {
    const unsigned g = b.gen;
    if (++b.arrived >= members) {
        b.arrived = 0;
        ++b.gen;
        progress = true;
        return;
    }
    fibers[cur].waiting = true;
    while (b.gen == g) yield();
    fibers[cur].waiting = false;
}

// A fiber that exits counts as arrived at every later barrier, as on a GPU:
// release any barrier that was waiting only for it.
void release_if_complete(Barrier& b, int members) {
    if (b.arrived > 0 && b.arrived >= members) {
        b.arrived = 0;
        ++b.gen;
    }
}

void entry() {
    (*body)();
    Fiber& f = fibers[cur];
    f.done = true;
    --live;
    --warp_live[f.warp];
    release_if_complete(block_bar, live);
    release_if_complete(warp_bars[f.warp], warp_live[f.warp]);
    progress = true;
    _longjmp(sched, 1);  // never returns: this stack is reused by the next block
}

// Run fiber i until it waits or ends. Its own frame, so no local of the
// caller lives across the _setjmp.
__attribute__((noinline)) void switch_to(int i) {
    cur = i;
    g_tid = fibers[i].tid;
    if (!_setjmp(sched)) {
        if (!fibers[i].started) {
            fibers[i].started = true;
            setcontext(&fibers[i].ctx);
            std::fprintf(stderr, "pl_emu: setcontext failed\n");
            std::abort();
        }
        _longjmp(fibers[i].jb, 1);
    }
}

void run_block(int nthreads) {
    live = nthreads;
    block_bar = Barrier{};
    const int nwarps = (nthreads + 31) / 32;
    warp_bars.assign(nwarps, Barrier{});
    warp_live.assign(nwarps, 0);
    warp_slots.assign((size_t)nwarps * 32, 0);
    for (int i = 0; i < nthreads; ++i) {
        Fiber& f = fibers[i];
        f.done = f.waiting = f.started = false;
        f.tid = uint3{(unsigned)(i % g_bdim.x), (unsigned)(i / g_bdim.x % g_bdim.y), (unsigned)(i / (g_bdim.x * g_bdim.y))};
        f.warp = i / 32;
        f.lane = i % 32;
        ++warp_live[f.warp];
        if (!f.has_ctx) {
            getcontext(&f.ctx);
            f.has_ctx = true;
        }
        // setcontext restores these: they must be the caller's now (rounding
        // mode, flush-to-zero, signal mask), not those of the first launch
        f.ctx.uc_sigmask = launch_env.uc_sigmask;
        *f.ctx.uc_mcontext.fpregs = *launch_env.uc_mcontext.fpregs;
        f.ctx.uc_stack.ss_sp = stacks.data() + (size_t)i * kStack;
        f.ctx.uc_stack.ss_size = kStack;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, entry, 0);
    }
    while (live > 0) {
        progress = false;
        bool all_waiting = true;
        for (int i = 0; i < nthreads; ++i) {
            if (fibers[i].done) continue;
            switch_to(i);
            if (!fibers[i].done && !fibers[i].waiting) all_waiting = false;
        }
        if (live > 0 && all_waiting && !progress) {
            // Every live thread waits at a barrier no one else will reach: on
            // a GPU, a hang or undefined behaviour. Report it.
            std::fprintf(stderr, "pl_emu: deadlock in block (%u,%u,%u): a barrier or shuffle not reached by every thread\n",
                         g_bid.x, g_bid.y, g_bid.z);
            std::abort();
        }
    }
}

}  // namespace

int lane() { return fibers[cur].lane; }

void syncthreads() { rendezvous(block_bar, live); }

uint64_t warp_exchange(uint64_t mine, int src) {
    const Fiber& f = fibers[cur];
    uint64_t* slots = warp_slots.data() + (size_t)f.warp * 32;
    slots[f.lane] = mine;
    rendezvous(warp_bars[f.warp], warp_live[f.warp]);  // every lane has offered
    const uint64_t got = src >= 0 && src < 32 ? slots[src] : mine;
    rendezvous(warp_bars[f.warp], warp_live[f.warp]);  // every lane has read before the next offer
    return got;
}

namespace {
std::vector<unsigned char> dyn_shared;
}

void* dynamic_shared() { return dyn_shared.data(); }

void launch(dim3 grid, dim3 block, const std::function<void()>& fn, size_t smem) {
    std::lock_guard<std::mutex> lock(launch_mutex);
    const long long nthreads = (long long)block.x * block.y * block.z;
    if (nthreads < 1 || nthreads > 1024 || grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.y > 65535 || grid.z > 65535 ||
        smem > 48 * 1024) {  // past 48 KiB a GPU needs an opt-in attribute the kernels do not set
        last_error = cudaErrorInvalidConfiguration;
        return;
    }
    dyn_shared.assign(smem ? smem : 1, 0xFF);
    if (fibers.empty()) {  // once, at the most a block can have: a ucontext must never move
        fibers.resize(1024);
        stacks.resize(1024 * kStack);
    }
    g_bdim = block;
    g_gdim = grid;
    body = &fn;
    getcontext(&launch_env);
    std::vector<uint64_t> order((size_t)grid.x * grid.y * grid.z);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), order_rng);  // blocks arrive in no fixed order
    for (uint64_t b : order) {
        g_bid = uint3{(unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y), (unsigned)(b / ((uint64_t)grid.x * grid.y))};
        std::fill(dyn_shared.begin(), dyn_shared.end(), (unsigned char)0xFF);
        run_block((int)nthreads);
    }
}

}  // namespace pl_emu

// ---------------------------------------------------------------------------
// The runtime calls the library makes, on host memory.

namespace {
std::map<uintptr_t, size_t>& allocations() {
    static std::map<uintptr_t, size_t> m;
    return m;
}
bool is_device(const void* p) {
    auto& m = allocations();
    auto it = m.upper_bound((uintptr_t)p);
    if (it == m.begin()) return false;
    --it;
    return (uintptr_t)p < it->first + it->second;
}
}  // namespace

extern "C" {

cudaError_t cudaMalloc(void** p, size_t bytes) {
    if (bytes > ((size_t)16 << 30)) return cudaErrorMemoryAllocation;  // a 16 GiB "device"
    *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
    if (!*p) return cudaErrorMemoryAllocation;
    allocations()[(uintptr_t)*p] = bytes ? bytes : 1;
    return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
    if (p) {
        allocations().erase((uintptr_t)p);
        std::free(p);
    }
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
    std::memcpy(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t bytes, cudaStream_t) {
    std::memset(p, v, bytes);
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int* n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr attr, int) {
    if (attr != cudaDevAttrMultiProcessorCount) return cudaErrorInvalidValue;
    *v = 132;  // an H200's, so grids and launch heuristics are the ones it would get
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
    std::memset(p, 0, sizeof(*p));
    std::snprintf(p->name, sizeof(p->name), "pl_emu (CUDA on the CPU)");
    p->multiProcessorCount = 132;
    p->major = 9;
    p->minor = 0;
    p->totalGlobalMem = (size_t)16 << 30;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaGetLastError() {
    const cudaError_t e = pl_emu::last_error;
    pl_emu::last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError() { return pl_emu::last_error; }
const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated CUDA error"; }
const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
        default: return "cudaErrorUnknown";
    }
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
    std::memset(a, 0, sizeof(*a));
    a->type = is_device(p) ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
    return cudaSuccess;
}

}  // extern "C"
