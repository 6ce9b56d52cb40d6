// selftest.cu: the emulator's own checks of the cluster features the kernels
// use (tests/test_cuda_emu.py translates and builds it against pl_emu).
// Plain CUDA: nvcc builds it too (nvcc -arch=sm_90 selftest.cu), so the same
// answers can be checked on a GPU.
#include <cstdio>
#include <cuda_runtime.h>
#ifdef __CUDACC__
#include <cooperative_groups.h>
#endif

namespace cg = cooperative_groups;

// Each block publishes rank * 1000 + its thread sum in shared memory; after
// cluster.sync() thread 0 sums every peer's value through DSMEM, rank order.
__global__ void exchange(int* out) {
    cg::cluster_group cluster = cg::this_cluster();
    __shared__ int mine, partial[32];
    if (threadIdx.x < 32) partial[threadIdx.x] = 0;
    __syncthreads();
    atomicAdd(&partial[threadIdx.x % 32], (int)threadIdx.x);
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0;
        for (int i = 0; i < 32; ++i) s += partial[i];
        mine = (int)cluster.block_rank() * 1000 + s;
    }
    cluster.sync();
    if (threadIdx.x == 0) {
        int total = 0;
        for (unsigned r = 0; r < cluster.num_blocks(); ++r) total += *cluster.map_shared_rank(&mine, r);
        out[blockIdx.x] = total;
    }
    cluster.sync();  // peers' shared memory stays alive until every read is done
}

// Each block's own copy of a static __shared__ variable, while the cluster's
// blocks run together: write, sync with the whole cluster, read back.
__global__ void own_shared(int* out) {
    cg::cluster_group cluster = cg::this_cluster();
    __shared__ int v;
    if (threadIdx.x == 0) v = (int)blockIdx.x;
    cluster.sync();
    if (threadIdx.x == 0) out[blockIdx.x] = v;
}

static cudaError_t launch(void (*k)(int*), int grid, int threads, int cluster, int* out) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)cluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    const cudaLaunchConfig_t cfg = {dim3((unsigned)grid), dim3((unsigned)threads), 0, 0, attr, 1};
    const cudaError_t e = cudaLaunchKernelEx(&cfg, k, out);
    return e != cudaSuccess ? e : cudaDeviceSynchronize();
}

int main() {
    int fails = 0;
    int* d = nullptr;
    int h[64];
    cudaMalloc(reinterpret_cast<void**>(&d), sizeof h);
    for (int c : {1, 2, 4, 8}) {
        if (launch(exchange, 8 * c, 96, c, d) != cudaSuccess) {
            std::printf("FAIL exchange: cluster %d refused\n", c);
            ++fails;
            continue;
        }
        cudaMemcpy(h, d, sizeof(int) * 8 * c, cudaMemcpyDeviceToHost);
        const int want = 1000 * c * (c - 1) / 2 + c * (95 * 96 / 2);
        for (int b = 0; b < 8 * c; ++b)
            if (h[b] != want) {
                std::printf("FAIL exchange: cluster %d block %d got %d, want %d\n", c, b, h[b], want);
                ++fails;
                break;
            }
    }
    if (launch(own_shared, 16, 64, 8, d) != cudaSuccess) {
        std::printf("FAIL own_shared refused\n");
        ++fails;
    } else {
        cudaMemcpy(h, d, sizeof(int) * 16, cudaMemcpyDeviceToHost);
        for (int b = 0; b < 16; ++b)
            if (h[b] != b) {
                std::printf("FAIL own_shared: block %d read %d\n", b, h[b]);
                ++fails;
                break;
            }
    }
    // 16 blocks a cluster: refused without the non-portable attribute, run with it
    if (launch(exchange, 32, 32, 16, d) != cudaErrorInvalidClusterSize) {
        std::printf("FAIL a cluster of 16 ran without cudaFuncAttributeNonPortableClusterSizeAllowed\n");
        ++fails;
    }
    cudaGetLastError();
    cudaFuncSetAttribute(exchange, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (launch(exchange, 32, 32, 16, d) != cudaSuccess) {
        std::printf("FAIL a cluster of 16 refused with the attribute\n");
        ++fails;
    } else {
        cudaMemcpy(h, d, sizeof(int) * 32, cudaMemcpyDeviceToHost);
        const int want = 1000 * 16 * 15 / 2 + 16 * (31 * 32 / 2);
        if (h[0] != want || h[31] != want) {
            std::printf("FAIL exchange over 16 blocks: got %d, want %d\n", h[0], want);
            ++fails;
        }
    }
    if (launch(exchange, 12, 32, 8, d) == cudaSuccess) {  // not whole clusters
        std::printf("FAIL a grid of 12 blocks ran in clusters of 8\n");
        ++fails;
    }
    cudaGetLastError();
    cudaFree(d);
    std::printf(fails ? "selftest: %d failing\n" : "selftest: ok\n", fails);
    return fails ? 1 : 0;
}
