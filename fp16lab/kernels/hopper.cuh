// Hopper building blocks shared by the wgmma kernels (steps 6 and 7 of the GEMM ladder):
// mbarriers, TMA copies, shared-memory matrix descriptors and the wgmma fences. Nothing here
// depends on a kernel's tile sizes; what does stays in the kernel's own file.
#pragma once
#include <stdint.h>

// The 128-byte CUtensorMap made by cuTensorMapEncodeTiled on the host (opaque to the kernel).
struct alignas(64) TensorMap { unsigned long long opaque[16]; };

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ---- mbarriers -------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}
// One arrival that also announces how many bytes the copies will deliver in this phase.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}
// Spins until the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
    unsigned done = 0;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(smem_u32(bar)), "r"(parity)
            : "memory");
    } while (!done);
}

// ---- TMA ---------------------------------------------------------------------------------------
// Copies the box at coordinates (c0 = column, c1 = row) of the tensor map into shared memory and
// completes its bytes on `bar`.
__device__ __forceinline__ void tma_load(void* dst, const TensorMap* map, uint64_t* bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
        ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
        : "memory");
}

// ---- thread-block clusters ----------------------------------------------------------------------
// This block's rank in its cluster (0 without clusters: pass the kernel's cluster size).
template <int CLUSTER>
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r = 0;
    if (CLUSTER > 1) asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Arrives on the barrier at `bar`'s shared-memory offset in block `cta` of the cluster. With
// CLUSTER_RELEASE the arrival is a cluster-scope release (.release.cluster); without, it has the
// default semantics (.release.cta), enough where the arrival only says that this warp's reads of
// a stage are finished (waited for) and the stage is next written by the copy engine.
template <bool CLUSTER_RELEASE>
__device__ __forceinline__ void mbar_arrive_remote(uint64_t* bar, unsigned cta) {
    if (CLUSTER_RELEASE) {
        asm volatile(
            "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
            "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n"
            ::"r"(smem_u32(bar)), "r"(cta)
            : "memory");
    } else {
        asm volatile(
            "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
            "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n"
            ::"r"(smem_u32(bar)), "r"(cta)
            : "memory");
    }
}
// The box lands at the same offset in every block of the cluster named by the mask, counted on
// each block's own barrier at `bar`'s offset (tma_load is the one-block copy).
__device__ __forceinline__ void tma_load_multicast(void* dst, const TensorMap* map, uint64_t* bar, int c0, int c1,
                                                   uint16_t mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%3, %4}], [%2], %5;"
        ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "h"(mask)
        : "memory");
}

// ---- tiles and stages -------------------------------------------------------------------------
// Maps a tile index (the block index, or a persistent loop's counter) to the tile's first row
// and column, for BM x BN tiles. Clusters of CLUSTER consecutive blocks take CLUSTER consecutive
// block-rows of one block-column; GROUP such cluster-rows are swept together so that the tiles
// in flight at one time reuse each other's A and B from L2.
template <int BM_, int BN_, int CLUSTER, int GROUP>
__device__ __forceinline__ void grouped_tile_origin(int tile, int M, int N, int& row0, int& col0) {
    const int grid_m = (M + BM_ * CLUSTER - 1) / (BM_ * CLUSTER), grid_n = (N + BN_ - 1) / BN_;
    const int pid = tile / CLUSTER, width = GROUP * grid_n;
    const int first_m = (pid / width) * GROUP;
    const int group = min(grid_m - first_m, GROUP);
    row0 = ((first_m + (pid % width) % group) * CLUSTER + tile % CLUSTER) * BM_;
    col0 = ((pid % width) / group) * BN_;
}

// The dynamic shared memory's first byte on a 1024-byte boundary: the 128-byte swizzle repeats
// every 1024 bytes, so every tile must start on one.
__device__ __forceinline__ unsigned char* swizzle_aligned(unsigned char* p) {
    return p + ((1024 - (smem_u32(p) & 1023)) & 1023);
}

// Thread 0 initialises the ring's barriers: each stage's full barrier waits for one arrival (the
// producer's expect_tx, then the bytes), its empty barrier for `consumers` (every consumer warp
// of the cluster); then the whole cluster (or block) waits until they are, so that no copy or
// remote arrival reaches a barrier before it exists.
template <int STAGES_, int CLUSTER>
__device__ __forceinline__ void init_stage_barriers(uint64_t* full, uint64_t* empty, unsigned consumers) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES_; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], consumers);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if (CLUSTER > 1) cluster_sync(); else __syncthreads();
}

// Called by every thread at a clustered kernel's end: no block may leave while another block of
// its cluster can still write into its shared memory or arrive on its barriers.
template <int CLUSTER>
__device__ __forceinline__ void leave_cluster() {
    if (CLUSTER > 1) {
        __syncwarp();
        cluster_sync();
    }
}

// ---- wgmma -------------------------------------------------------------------------------------
// Shared-memory matrix descriptor: start address, leading and stride byte offsets (all in
// 16-byte units) and the swizzle mode (1 << 62: 128-byte swizzle, the layout TMA wrote).
__device__ __forceinline__ uint64_t smem_desc(const void* p, unsigned lead_bytes, unsigned stride_bytes) {
    return static_cast<uint64_t>((smem_u32(p) & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lead_bytes >> 4) << 16) |
           (static_cast<uint64_t>(stride_bytes >> 4) << 32) | (1ull << 62);
}
// A K-major operand as TMA writes it in the 128-byte swizzle: rows of 128 bytes along K, 8-row
// groups 1024 bytes apart (the stride offset; the leading offset is unused). A of steps 6 and 7,
// and B of step 7.
__device__ __forceinline__ uint64_t desc_k_major(const void* p) { return smem_desc(p, 16, 1024); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
// Tells the compiler the accumulators may change here, so that it reads none of them before the
// asynchronous multiplies that write them have been waited for.
template <int R>
__device__ __forceinline__ void fence_accumulators(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The 64 fp32 accumulators (float d[64]) of an m64n128 wgmma as asm operands %0-%63: their names
// in the instruction, and the read-write operands themselves.
#define WGMMA_ACC64_NAMES \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WGMMA_ACC64(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
