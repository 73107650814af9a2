// Step 6 of the GEMM ladder: Hopper's warpgroup MMA (wgmma) fed by the tensor memory accelerator (TMA).
//
// C (M x N) = A (M x K) @ B (K x N); A and B row-major fp16, accumulation in fp32.
// Changes from step 5:
// - the multiply is wgmma.mma_async.m64nNk16: one instruction per warpgroup (4 warps, 128
//   threads) multiplies a 64 x 16 tile of A by a 16 x N tile of B (N = 128 or 256) into fp32
//   accumulators held in registers. Both operands are read straight from shared memory through
//   64-bit descriptors (address, strides, swizzle mode): no ldmatrix, no fragments in registers;
// - the copies are TMA: one thread asks the copy engine for a whole 2-D box of A or B
//   (cp.async.bulk.tensor), described on the host by a tensor map (cuTensorMapEncodeTiled,
//   passed as a __grid_constant__ parameter). The engine computes every address, zero-fills
//   what lies outside the matrix (so edges cost nothing), writes the box in the 128-byte swizzle
//   that wgmma reads without bank conflicts, and counts the bytes on an mbarrier;
// - the pipeline runs on mbarriers instead of __syncthreads: a "full" barrier per stage that the
//   consumers wait on (phase flips when the bytes have landed) and an "empty" barrier per stage
//   that the producer waits on (phase flips when every consumer warp is done with it);
// - warp specialisation: warpgroup 0 produces (one thread issues the TMA copies and gives most of
//   its registers back with setmaxnreg), warpgroups 1 and 2 consume, each 64 rows of the 128-row
//   block tile, with 128 fp32 accumulators per thread for a 64 x 256 tile;
// - with CLUSTER_M = 2, two blocks of one thread-block cluster work on the two 128-row halves of
//   a 256-row tile: they share B's tile, each block fetching half of it and multicasting it into
//   both blocks' shared memory (half the B traffic from L2 per block);
// - with PERSISTENT = 1, one block per SM loops over the tiles, and the producer fills the next
//   tile's stages while the consumers store the last one's results.
//
// Any shape: the tensor maps are built for the true M and K (rows and columns outside read as
// zeros), and the stores are bounds-checked. TMA needs the row pitch of A and B to be a multiple
// of 16 bytes: K and N multiples of 8 (the launcher pads otherwise, as for steps 3 to 5).
//
// Build: nvcc -gencode=arch=compute_90a,code=sm_90a -cubin (wgmma and setmaxnreg exist only in
// the "a" target, which runs on Hopper alone); fp16lab.kernels.cubin does this and caches it.
// Tile configuration comes from the launcher as -D flags (fp16lab.kernels.LADDER / VARIANTS);
// the defaults below are the ladder's step 6, for compile checks.
#include <cuda_fp16.h>
#include <stdint.h>

#include "hopper.cuh"

#ifndef BM
#define BM 128        // rows of C per block: 2 consumer warpgroups x 64
#endif
#ifndef BN
#define BN 256        // columns of C per block: the N of one wgmma instruction
#endif
#ifndef BK
#define BK 64         // K per stage: 64 fp16 = one 128-byte swizzled row
#endif
#ifndef STAGES
#define STAGES 4      // 4 x (128 x 64 + 64 x 256) x 2 B = 192 KB of shared memory
#endif
#ifndef CLUSTER_M
#define CLUSTER_M 1   // blocks per cluster along M that share (multicast) the B tile
#endif
#ifndef GROUP_M
#define GROUP_M 8     // block-rows (clusters) swept together for L2 reuse
#endif
#ifndef PERSISTENT
#define PERSISTENT 0  // 1: one block per SM loops over tiles; the next tile's loads overlap the stores
#endif
// Diagnostic switches for benchmarks/wgmma_cluster.py, which times clusters with parts of their
// cooperation switched off (all on in the kernels of fp16lab.kernels):
#ifndef CLUSTER_MULTICAST
#define CLUSTER_MULTICAST 1  // 0: each block of a cluster loads all of B itself
#endif
#ifndef CLUSTER_LOCKSTEP
#define CLUSTER_LOCKSTEP 1   // 0: consumers free their own block's stages only (needs no multicast)
#endif
#ifndef CLUSTER_ARRIVE_SCOPE
#define CLUSTER_ARRIVE_SCOPE 1  // 1: frees a stage with .release.cluster; 0: with the default, .release.cta
#endif

static_assert(BM == 128, "two consumer warpgroups of 64 rows each");
static_assert(BK == 64, "one 128-byte swizzle row of fp16 per K slice");
static_assert(BN == 128 || BN == 256, "wgmma N of 128 or 256");
static_assert(CLUSTER_M == 1 || CLUSTER_M == 2, "clusters of 1 or 2 blocks along M");
static_assert(BN / 64 % CLUSTER_M == 0, "each block of a cluster multicasts whole 64-column boxes");
static_assert(!(PERSISTENT && CLUSTER_M > 1), "the persistent schedule runs without clusters");
static_assert(CLUSTER_LOCKSTEP || !CLUSTER_MULTICAST, "a multicast stage must be free in every block");

constexpr int THREADS = 384;                    // producer warpgroup + 2 consumer warpgroups
constexpr int CONSUMER_WARPS = 8;
constexpr int A_BYTES = BM * BK * 2;            // one stage of A: 128 rows of 128 bytes
constexpr int B_BOX_BYTES = BK * 64 * 2;        // one 64-column box of B: 64 rows of 128 bytes
constexpr int B_BYTES = BK * BN * 2;
constexpr int STAGE_BYTES = A_BYTES + B_BYTES;  // what the full barrier waits for
constexpr bool MULTICAST = CLUSTER_M > 1 && CLUSTER_MULTICAST;
constexpr int RELEASE_CTAS = CLUSTER_M > 1 && CLUSTER_LOCKSTEP ? CLUSTER_M : 1;  // blocks a stage is freed in

// Arrives on the barrier at the same shared-memory offset in block `cta` of the cluster.
__device__ __forceinline__ void mbar_arrive_in(uint64_t* bar, unsigned cta) {
    if (RELEASE_CTAS == 1)  // this block's own barrier
        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
    else
        mbar_arrive_remote<CLUSTER_ARRIVE_SCOPE>(bar, cta);
}

// ---- wgmma ----------------------------------------------------------------------------------
// A: K-major (desc_k_major in hopper.cuh).
__device__ __forceinline__ uint64_t desc_a(const void* p) { return desc_k_major(p); }
// B (N-major): 64-column boxes of BK rows x 128 bytes, BK * 128 bytes apart (leading offset, along
// N); 8-row groups of K 1024 bytes apart (stride offset).
__device__ __forceinline__ uint64_t desc_b(const void* p) { return smem_desc(p, B_BOX_BYTES, 1024); }

// d (64 x 128, fp32, 64 per thread) += A (64 x 16, K-major) * B (16 x 128, N-major), both read
// from shared memory through their descriptors; the last four immediates: scale A by 1, scale B
// by 1, A not transposed (K-major), B transposed (N-major: B's rows are K).
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
        WGMMA_ACC64_NAMES
        "}, %64, %65, p, 1, 1, 0, 1;\n}\n"
        : WGMMA_ACC64(d)
        : "l"(desc_a), "l"(desc_b), "r"(1));
}

// d (64 x 256, fp32, 128 per thread) += A (64 x 16, K-major) * B (16 x 256, N-major), both read
// from shared memory through their descriptors; the last four immediates: scale A by 1, scale B
// by 1, A not transposed (K-major), B transposed (N-major: B's rows are K).
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(desc_a), "l"(desc_b), "r"(1));
}

template <int N>
struct Wgmma;
template <>
struct Wgmma<128> {
    static __device__ __forceinline__ void mma(float (&d)[64], uint64_t a, uint64_t b) { wgmma_m64n128k16(d, a, b); }
};
template <>
struct Wgmma<256> {
    static __device__ __forceinline__ void mma(float (&d)[128], uint64_t a, uint64_t b) { wgmma_m64n256k16(d, a, b); }
};

// The first row and column of tile `tile` (the block index, or the persistent loop's counter):
// this kernel's tile, cluster and group sizes in hopper.cuh's grouped order.
__device__ __forceinline__ void tile_origin(int tile, int M, int N, int& row0, int& col0) {
    grouped_tile_origin<BM, BN, CLUSTER_M, GROUP_M>(tile, M, N, row0, col0);
}

__device__ __forceinline__ void store2(float* p, float x, float y) { *reinterpret_cast<float2*>(p) = make_float2(x, y); }
__device__ __forceinline__ void store2(__half* p, float x, float y) {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y);
}

// Producer, one thread: loads the K slices of one tile into the ring of stages. `it` counts slices
// over the block's whole life, so a stage's barrier phases run on from one tile to the next.
__device__ __forceinline__ void produce_tile(const TensorMap& map_a, const TensorMap& map_b, unsigned char* smem,
                                             uint64_t* full, uint64_t* empty, int row0, int col0, int k_tiles,
                                             int& it) {
    const unsigned rank = cluster_rank<CLUSTER_M>();
    for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        const int s = it % STAGES;
        if (it >= STAGES) mbar_wait(&empty[s], (it / STAGES + 1) & 1);  // its previous use is done
        unsigned char* a = smem + s * STAGE_BYTES;
        unsigned char* b = a + A_BYTES;
        mbar_expect_tx(&full[s], STAGE_BYTES);
        tma_load(a, &map_a, &full[s], kt * BK, row0);
        if (!MULTICAST) {
#pragma unroll
            for (int j = 0; j < BN / 64; ++j) tma_load(b + j * B_BOX_BYTES, &map_b, &full[s], col0 + 64 * j, kt * BK);
        } else {
            constexpr int PER_BLOCK = BN / 64 / CLUSTER_M;
#pragma unroll
            for (int i = 0; i < PER_BLOCK; ++i) {
                const int j = rank * PER_BLOCK + i;
                tma_load_multicast(b + j * B_BOX_BYTES, &map_b, &full[s], col0 + 64 * j, kt * BK, (1 << CLUSTER_M) - 1);
            }
        }
    }
}

// Frees stage s for the producer(s): one arrival per warp on the empty barrier of every block of
// the cluster (each block's producer writes into both blocks' B tiles).
__device__ __forceinline__ void release(uint64_t* empty, int s) {
#pragma unroll
    for (int cta = 0; cta < RELEASE_CTAS; ++cta) mbar_arrive_in(&empty[s], cta);
}

// Consumer warpgroup `half` (0 or 1): multiplies its 64 rows of the tile into d over all K slices.
__device__ __forceinline__ void consume_tile(float (&d)[BN / 2], const unsigned char* smem, uint64_t* full,
                                             uint64_t* empty, int half, int k_tiles, int& it) {
    const bool lane0 = threadIdx.x % 32 == 0;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) d[i] = 0.f;
    for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        const int s = it % STAGES;
        mbar_wait(&full[s], (it / STAGES) & 1);
        const unsigned char* a = smem + s * STAGE_BYTES + half * 64 * 128;
        const unsigned char* b = smem + s * STAGE_BYTES + A_BYTES;
        fence_accumulators(d);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk)  // 16 columns of A = 32 bytes; 16 rows of B = 2048 bytes
            Wgmma<BN>::mma(d, desc_a(a + kk * 32), desc_b(b + kk * 2048));
        wgmma_commit();
        // keep this slice's multiplies in flight; wait for the previous slice's and free its stage
        wgmma_wait<1>();
        fence_accumulators(d);
        if (kt > 0 && lane0) release(empty, (it + STAGES - 1) % STAGES);
    }
    wgmma_wait<0>();
    fence_accumulators(d);
    if (lane0) release(empty, (it + STAGES - 1) % STAGES);  // the tile's last slice
}

// Writes a consumer warpgroup's 64 x BN accumulators. Layout of m64nN: warp w holds rows
// 16w..16w+15; per 8 columns j, a lane holds (row lane/4, columns 2*(lane%4) + {0, 1}) and the
// same columns 8 rows further down.
template <typename OutT>
__device__ __forceinline__ void store_tile(const float (&d)[BN / 2], OutT* __restrict__ C, int M, int N, int row0,
                                           int col0) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4;
    const int r = row0 + warp * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const int c = col0 + j * 8 + (lane % 4) * 2;  // N is a multiple of 8: c < N covers c + 1
        if (c < N) {
            if (r < M) store2(C + static_cast<size_t>(r) * N + c, d[4 * j], d[4 * j + 1]);
            if (r + 8 < M) store2(C + static_cast<size_t>(r + 8) * N + c, d[4 * j + 2], d[4 * j + 3]);
        }
    }
}

template <typename OutT>
__device__ __forceinline__ void gemm_wgmma(const TensorMap& map_a, const TensorMap& map_b, OutT* __restrict__ C,
                                           int M, int N, int K) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = swizzle_aligned(smem_raw);
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];

    const int warpgroup = threadIdx.x / 128;
    const int k_tiles = (K + BK - 1) / BK;
    // Without PERSISTENT a block does the tile of its own index; with it, tiles blockIdx.x,
    // blockIdx.x + gridDim.x, ..., and the producer fills the next tile's stages while the
    // consumers store the last one.
    const int tiles = PERSISTENT ? (M + BM - 1) / BM * ((N + BN - 1) / BN) : blockIdx.x + 1;
    const int tile_step = PERSISTENT ? gridDim.x : 1;

    init_stage_barriers<STAGES, CLUSTER_M>(full, empty, CONSUMER_WARPS * RELEASE_CTAS);

    int it = 0, row0, col0;
    if (warpgroup == 0) {
        // the producer needs few registers: give them to the consumers
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (threadIdx.x == 0) {
            for (int tile = blockIdx.x; tile < tiles; tile += tile_step) {
                tile_origin(tile, M, N, row0, col0);
                produce_tile(map_a, map_b, smem, full, empty, row0, col0, k_tiles, it);
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
        const int half = warpgroup - 1;  // warpgroup 1: rows 0-63 of the tile; warpgroup 2: rows 64-127
        float d[BN / 2];
        for (int tile = blockIdx.x; tile < tiles; tile += tile_step) {
            tile_origin(tile, M, N, row0, col0);
            consume_tile(d, smem, full, empty, half, k_tiles, it);
            store_tile(d, C, M, N, row0 + half * 64, col0);
        }
    }
    leave_cluster<CLUSTER_M>();
}

#if CLUSTER_M > 1
#define CLUSTER_ATTR __cluster_dims__(CLUSTER_M, 1, 1)
#else
#define CLUSTER_ATTR
#endif

extern "C" __global__ void __launch_bounds__(THREADS, 1) CLUSTER_ATTR
wgmma_f32(const __grid_constant__ TensorMap map_a, const __grid_constant__ TensorMap map_b, float* C, int M, int N, int K) {
    gemm_wgmma<float>(map_a, map_b, C, M, N, K);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) CLUSTER_ATTR
wgmma_f16(const __grid_constant__ TensorMap map_a, const __grid_constant__ TensorMap map_b, __half* C, int M, int N, int K) {
    gemm_wgmma<__half>(map_a, map_b, C, M, N, K);
}
