// pl_emu.cpp: the fiber scheduler behind pl_emu.h, and the few CUDA runtime
// calls the library makes, served from host memory. See pl_emu.h for what is
// and is not modelled.
#include "pl_emu.h"

#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>

#if defined(_FORTIFY_SOURCE) && _FORTIFY_SOURCE > 0
#error "pl_emu jumps between fiber stacks with _longjmp, which _FORTIFY_SOURCE's check aborts: build with -U_FORTIFY_SOURCE"
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
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
constexpr int kSlab = 1024;  // fibers whose stacks one mapping holds: a block's most

// A fiber starts once on its own stack through ucontext (setcontext), and
// from then on switches with _setjmp/_longjmp, which leave the signal mask
// alone: no system call per switch, unlike swapcontext.
struct Fiber {
    ucontext_t ctx;
    jmp_buf jb;
    bool has_ctx = false, started = false;
    uint3 tid;
    int block = 0;  // its block's cluster rank
    int warp = 0, lane = 0;
    bool done = false;
    bool waiting = false;
    char* stack = nullptr;
};

struct Barrier {  // a generation-counting rendezvous of the live members
    int arrived = 0;
    unsigned gen = 0;
};

// A block of the cluster running now: its barrier, live threads and shared memory.
struct Block {
    uint3 bid;
    Barrier bar;
    int live = 0;
    std::map<const void*, std::vector<unsigned char>> shared;  // by declaration (shared_slot's tag)
    std::vector<unsigned char> dyn;                            // extern __shared__
};

// Fibers never move once made (a ucontext must not): each lives on the heap,
// its stack in a lazily committed mapping of kSlab stacks.
std::vector<std::unique_ptr<Fiber>> fibers;
std::vector<char*> slabs;
jmp_buf sched;
ucontext_t launch_env;  // the caller's signal mask and floating-point state, taken at each launch
int cur = 0;
const std::function<void()>* body = nullptr;
std::vector<Block> blocks;
Barrier cluster_bar;
int cluster_live = 0;
dim3 g_cdim(1, 1, 1);
std::map<const void*, size_t> slot_bytes;  // every __shared__ declaration seen: its size
std::set<const void*> nonportable;         // kernels allowed clusters of more than 8 blocks
std::map<const void*, size_t> smem_optin;  // kernels allowed more than 48 KiB of dynamic shared memory: how much
std::vector<Barrier> warp_bars;
std::vector<int> warp_live;
std::vector<uint64_t> warp_slots;
size_t dyn_bytes = 1;
bool progress = false;
cudaError_t last_error = cudaSuccess;
std::mutex launch_mutex;
std::mt19937_64 order_rng(12345);

Fiber& F(int i) { return *fibers[(size_t)i]; }

void ensure_fibers(size_t n) {
    while (fibers.size() < n) {
        const size_t i = fibers.size();
        if (i % kSlab == 0) {
            void* m = mmap(nullptr, kSlab * kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                           -1, 0);
            if (m == MAP_FAILED) {
                std::fprintf(stderr, "pl_emu: no memory for fiber stacks\n");
                std::abort();
            }
            slabs.push_back(static_cast<char*>(m));
        }
        fibers.push_back(std::make_unique<Fiber>());
        fibers.back()->stack = slabs[i / kSlab] + (i % kSlab) * kStack;
    }
}

void yield() {
    if (!_setjmp(F(cur).jb)) _longjmp(sched, 1);
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
    F(cur).waiting = true;
    while (b.gen == g) yield();
    F(cur).waiting = false;
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
    Fiber& f = F(cur);
    Block& b = blocks[(size_t)f.block];
    f.done = true;
    --b.live;
    --cluster_live;
    --warp_live[f.warp];
    release_if_complete(b.bar, b.live);
    release_if_complete(cluster_bar, cluster_live);
    release_if_complete(warp_bars[f.warp], warp_live[f.warp]);
    if (b.live == 0) {  // the block is gone: a peer still reading its shared memory reads NaN
        for (auto& kv : b.shared) std::fill(kv.second.begin(), kv.second.end(), (unsigned char)0xFF);
        std::fill(b.dyn.begin(), b.dyn.end(), (unsigned char)0xFF);
    }
    progress = true;
    _longjmp(sched, 1);  // never returns: this stack is reused by the next block
}

// Run fiber i until it waits or ends. Its own frame, so no local of the
// caller lives across the _setjmp.
__attribute__((noinline)) void switch_to(int i) {
    cur = i;
    g_tid = F(i).tid;
    g_bid = blocks[(size_t)F(i).block].bid;
    if (!_setjmp(sched)) {
        if (!F(i).started) {
            F(i).started = true;
            setcontext(&F(i).ctx);
            std::fprintf(stderr, "pl_emu: setcontext failed\n");
            std::abort();
        }
        _longjmp(F(i).jb, 1);
    }
}

// The blocks in `blocks` (one cluster), their threads all as fibers together.
void run_cluster(int nthreads) {
    const int nblocks = (int)blocks.size(), total = nblocks * nthreads;
    ensure_fibers((size_t)total);
    const int nwarps = (nthreads + 31) / 32;  // a block's
    warp_bars.assign((size_t)nblocks * nwarps, Barrier{});
    warp_live.assign((size_t)nblocks * nwarps, 0);
    warp_slots.assign((size_t)nblocks * nwarps * 32, 0);
    cluster_bar = Barrier{};
    cluster_live = total;
    for (Block& b : blocks) {
        b.bar = Barrier{};
        b.live = nthreads;
        b.shared.clear();
        b.dyn.assign(dyn_bytes, 0xFF);
    }
    for (int i = 0; i < total; ++i) {
        Fiber& f = F(i);
        const int li = i % nthreads;
        f.done = f.waiting = f.started = false;
        f.tid = uint3{(unsigned)(li % g_bdim.x), (unsigned)(li / g_bdim.x % g_bdim.y), (unsigned)(li / (g_bdim.x * g_bdim.y))};
        f.block = i / nthreads;
        f.warp = f.block * nwarps + li / 32;
        f.lane = li % 32;
        ++warp_live[f.warp];
        if (!f.has_ctx) {
            getcontext(&f.ctx);
            f.has_ctx = true;
        }
        // setcontext restores these: they must be the caller's now (rounding
        // mode, flush-to-zero, signal mask), not those of the first launch
        f.ctx.uc_sigmask = launch_env.uc_sigmask;
        *f.ctx.uc_mcontext.fpregs = *launch_env.uc_mcontext.fpregs;
        f.ctx.uc_stack.ss_sp = f.stack;
        f.ctx.uc_stack.ss_size = kStack;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, entry, 0);
    }
    while (cluster_live > 0) {
        progress = false;
        bool all_waiting = true;
        // each sweep starts at a random block of the cluster: no block is always first
        const int first = nblocks > 1 ? (int)(order_rng() % (uint64_t)nblocks) : 0;
        for (int k = 0; k < nblocks; ++k) {
            const int b = (first + k) % nblocks;
            for (int i = b * nthreads; i < (b + 1) * nthreads; ++i) {
                if (F(i).done) continue;
                switch_to(i);
                if (!F(i).done && !F(i).waiting) all_waiting = false;
            }
        }
        if (cluster_live > 0 && all_waiting && !progress) {
            // Every live thread waits at a barrier no one else will reach: on
            // a GPU, a hang or undefined behaviour. Report it.
            std::fprintf(stderr, "pl_emu: deadlock in block (%u,%u,%u)%s: a barrier or shuffle not reached by every thread\n",
                         blocks[0].bid.x, blocks[0].bid.y, blocks[0].bid.z, nblocks > 1 ? "'s cluster" : "");
            std::abort();
        }
    }
}

}  // namespace

int lane() { return F(cur).lane; }

void syncthreads() {
    Block& b = blocks[(size_t)F(cur).block];
    rendezvous(b.bar, b.live);
}

void cluster_sync() { rendezvous(cluster_bar, cluster_live); }
unsigned cluster_rank() { return (unsigned)F(cur).block; }
unsigned cluster_blocks() { return (unsigned)blocks.size(); }
dim3 cluster_dims() { return g_cdim; }

uint64_t warp_exchange(uint64_t mine, int src) {
    const Fiber& f = F(cur);
    uint64_t* slots = warp_slots.data() + (size_t)f.warp * 32;
    slots[f.lane] = mine;
    rendezvous(warp_bars[f.warp], warp_live[f.warp]);  // every lane has offered
    const uint64_t got = src >= 0 && src < 32 ? slots[src] : mine;
    rendezvous(warp_bars[f.warp], warp_live[f.warp]);  // every lane has read before the next offer
    return got;
}

void* dynamic_shared() { return blocks[(size_t)F(cur).block].dyn.data(); }

namespace {
std::vector<unsigned char>& slot_of(Block& b, const void* tag, size_t bytes) {
    std::vector<unsigned char>& v = b.shared[tag];
    if (v.empty()) v.assign(bytes, 0xFF);  // undefined on a GPU: NaN here
    return v;
}
}  // namespace

void* shared_slot(const void* tag, size_t bytes) {
    slot_bytes[tag] = bytes;
    return slot_of(blocks[(size_t)F(cur).block], tag, bytes).data();
}

void* map_shared(const void* p, unsigned rank) {
    if (rank >= blocks.size()) {
        std::fprintf(stderr, "pl_emu: map_shared_rank(%u) in a cluster of %zu blocks\n", rank, blocks.size());
        std::abort();
    }
    Block& mine = blocks[(size_t)F(cur).block];
    Block& peer = blocks[rank];
    const auto* c = static_cast<const unsigned char*>(p);
    for (auto& kv : mine.shared)
        if (c >= kv.second.data() && c < kv.second.data() + kv.second.size())
            return slot_of(peer, kv.first, slot_bytes[kv.first]).data() + (c - kv.second.data());
    if (c >= mine.dyn.data() && c < mine.dyn.data() + mine.dyn.size()) return peer.dyn.data() + (c - mine.dyn.data());
    std::fprintf(stderr, "pl_emu: map_shared_rank of an address outside the block's shared memory\n");
    std::abort();
}

cudaError_t take_last_error() {
    const cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

void allow_nonportable_cluster(const void* kernel, bool allow) {
    if (allow) nonportable.insert(kernel);
    else nonportable.erase(kernel);
}

bool allow_dynamic_shared(const void* kernel, int bytes) {
    if (bytes < 0 || bytes > 227 * 1024) return false;  // an sm_90 block's opt-in most
    smem_optin[kernel] = (size_t)bytes;
    return true;
}

bool cluster_size_allowed(const void* kernel, unsigned blocks) {
    return blocks <= 8 || (blocks <= 16 && nonportable.count(kernel));  // 8 portable, 16 with the attribute (sm_90)
}

void launch(dim3 grid, dim3 block, const std::function<void()>& fn, size_t smem, dim3 cluster, const void* kernel) {
    std::lock_guard<std::mutex> lock(launch_mutex);
    const long long nthreads = (long long)block.x * block.y * block.z;
    if (nthreads < 1 || nthreads > 1024 || grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.y > 65535 || grid.z > 65535 ||
        smem > std::max<size_t>(48 * 1024, kernel && smem_optin.count(kernel) ? smem_optin[kernel] : 0)) {
        // past 48 KiB a GPU needs the kernel's opt-in (cudaFuncAttributeMaxDynamicSharedMemorySize), which
        // only a launch that names its kernel (cudaLaunchKernelEx) can be checked against here
        last_error = cudaErrorInvalidConfiguration;
        return;
    }
    const long long csize = (long long)cluster.x * cluster.y * cluster.z;
    if (csize < 1 || grid.x % cluster.x || grid.y % cluster.y || grid.z % cluster.z) {
        last_error = cudaErrorInvalidConfiguration;  // the grid must be whole clusters
        return;
    }
    if (csize > 16 || !cluster_size_allowed(kernel, (unsigned)csize)) {
        last_error = cudaErrorInvalidClusterSize;
        return;
    }
    dyn_bytes = smem ? smem : 1;
    g_bdim = block;
    g_gdim = grid;
    g_cdim = cluster;
    body = &fn;
    getcontext(&launch_env);
    const dim3 nc(grid.x / cluster.x, grid.y / cluster.y, grid.z / cluster.z);  // clusters a dimension
    std::vector<uint64_t> order((size_t)nc.x * nc.y * nc.z);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), order_rng);  // blocks (clusters) arrive in no fixed order
    blocks.assign((size_t)csize, Block{});
    for (uint64_t c : order) {
        const uint3 c0{(unsigned)(c % nc.x) * cluster.x, (unsigned)(c / nc.x % nc.y) * cluster.y,
                       (unsigned)(c / ((uint64_t)nc.x * nc.y)) * cluster.z};
        for (long long r = 0; r < csize; ++r)  // rank r: x fastest, as block_rank() counts
            blocks[(size_t)r].bid = uint3{c0.x + (unsigned)(r % cluster.x), c0.y + (unsigned)(r / cluster.x % cluster.y),
                                         c0.z + (unsigned)(r / ((long long)cluster.x * cluster.y))};
        run_cluster((int)nthreads);
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
    switch (attr) {  // an H200's, so grids and launch heuristics are the ones it would get
        case cudaDevAttrMultiProcessorCount: *v = 132; return cudaSuccess;
        case cudaDevAttrComputeCapabilityMajor: *v = 9; return cudaSuccess;
        case cudaDevAttrComputeCapabilityMinor: *v = 0; return cudaSuccess;
        case cudaDevAttrClusterLaunch: *v = 1; return cudaSuccess;
        default: return cudaErrorInvalidValue;
    }
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
        case cudaErrorInvalidClusterSize: return "cudaErrorInvalidClusterSize";
        default: return "cudaErrorUnknown";
    }
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
    std::memset(a, 0, sizeof(*a));
    a->type = is_device(p) ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
    return cudaSuccess;
}

}  // extern "C"
