// Step 7 of the GEMM ladder: step 6's warp-specialised wgmma kernel in FP8, with the block scales
// of DeepSeek-V3's recipe applied as DeepGEMM applies them.
//
// C (M x N) = (A * sa) @ (B * sb)^T; A (M x K) and B (N x K) are e4m3 codes, both K-major (row-major
// with K contiguous: FP8 wgmma reads both operands K-major, it has no transposed form); sa holds
// one fp32 factor per row of A and K block of 128 (A's 1 x 128 tiles), stored K block by K block
// (sa[kb * M + row]); sb one per 128 x 128 tile of B (sb[nb * ceil(K/128) + kb]). The factors
// multiply: they are the inverses of the scales the codes were made with.
//
// Changes from step 6:
// - the multiply is wgmma.mma_async.m64n128k32.f32.e4m3.e4m3: 32 K per instruction (fp8 is one
//   byte), so a 128-byte swizzled row holds 128 K and one stage is one K block of the scales;
// - B is K-major like A: its tile is 128 rows of N, each 128 bytes of K, read by the same
//   descriptor as A's;
// - promotion: each K block is multiplied into fresh fp32 accumulators (the first instruction of
//   the block overwrites them), and once those multiplies are done the block's result is added
//   into the running sum times its two factors, in ordinary fp32 registers. The tensor cores add
//   FP8 products in a narrower accumulator than fp32 (about 14 bits of mantissa on Hopper,
//   DeepSeek-V3 section 3.3.2), so a sum over all of K inside them loses precision as K grows;
//   over 128 it does not, and the block factors must be applied per block anyway;
// - tiles of 128 x 128 (BN 128): two sets of accumulators (the block's and the sum) would not fit
//   a thread's registers at BN 256.
// - promotion overlapped (OVERLAP 1, the default): two sets of block accumulators, so that block
//   k + 1 is multiplying into one while block k, in the other, is waited for and added. With one
//   set (OVERLAP 0) a warpgroup's tensor work stops at every promotion, and only the other
//   consumer warpgroup's multiplies fill that time. The loop is peeled so that ptxas can see
//   which group each wait retires; where it cannot, it serialises the multiplies (warning C7514).
//
// Two schedules tried on top (off by default, timed by fp16lab.bench.fp8's step-7 variants):
// - CLUSTER_M = 2: two blocks of a cluster take the two 128-row halves of a 256 x 128 tile and
//   share B's tile: each fetches 64 of its rows and multicasts them into both blocks' shared
//   memory, so a block brings 24 KB per K block from L2 instead of 32. A stage is then free only
//   when the consumers of both blocks are done with it: each consumer warp arrives on the empty
//   barrier of both blocks (ARRIVE_CLUSTER 1: with a cluster-scope release; 0: the default);
// - PERSISTENT = 1: one block per SM loops over the tiles, so the producer fills the next tile's
//   stages while the consumers promote and store the last one.
// On the H200 neither moved step 7 beyond the run's noise, and the cluster-scope release halved
// its speed (benchmarks/KERNEL_NOTES.md, ninth session).
//
// Any shape: TMA zero-fills rows and K beyond the matrices, the factors of rows beyond M are
// never read, and the stores are bounds-checked. TMA needs 16-byte row pitches: K a multiple of
// 16; the launcher checks. N a multiple of 8 (the paired stores).
//
// Build: nvcc -gencode=arch=compute_90a,code=sm_90a -cubin, as step 6.
#include <cuda_bf16.h>
#include <stdint.h>

#include "hopper.cuh"

#ifndef STAGES
#define STAGES 6      // 6 x (128 x 128 + 128 x 128) B = 192 KB of shared memory
#endif
#ifndef GROUP_M
#define GROUP_M 8     // block-rows swept together for L2 reuse
#endif
#ifndef OVERLAP
#define OVERLAP 1     // 1: the next K block multiplies while this one is promoted (0: one after the other)
#endif
#ifndef CLUSTER_M
#define CLUSTER_M 1   // blocks per cluster along M that share (multicast) B's tile
#endif
#ifndef ARRIVE_CLUSTER
#define ARRIVE_CLUSTER 0  // 1: free a stage in the cluster's blocks with a cluster-scope release
#endif
#ifndef PERSISTENT
#define PERSISTENT 0  // 1: one block per SM loops over the tiles
#endif
// Diagnostic switch for fp16lab.bench.fp8's step-7 variants (on in every kernel that computes):
#ifndef PROMOTE
#define PROMOTE 1     // 0: no promotion and no factors: all of K summed in the tensor cores; 2: the
                      // promotion with factors of 1, not loaded (both wrong for block-scaled
                      // operands; they time what the promotion and its loads cost)
#endif
static_assert(CLUSTER_M == 1 || CLUSTER_M == 2, "clusters of 1 or 2 blocks along M");
static_assert(!(PERSISTENT && CLUSTER_M > 1), "the persistent schedule runs without clusters");

constexpr int BM = 128, BN = 128, BK = 128;     // BK: K per stage = one scale block = 128 bytes
constexpr int THREADS = 384;                    // producer warpgroup + 2 consumer warpgroups
constexpr int CONSUMER_WARPS = 8;
constexpr int A_BYTES = BM * BK;                // one stage of A: 128 rows of 128 bytes
constexpr int B_BYTES = BN * BK;                // one stage of B: 128 rows (of N) of 128 bytes
constexpr int STAGE_BYTES = A_BYTES + B_BYTES;  // what a stage's full barrier waits for
constexpr int B_ROWS = BN / CLUSTER_M;          // rows of B's tile each block of a cluster fetches

// d (64 x 128, fp32, 64 per thread) = A (64 x 32) * B (32 x 128) (+ d where accumulate is set),
// both e4m3, both K-major, read from shared memory through their descriptors; scale A and B by 1.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                      int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
        WGMMA_ACC64_NAMES
        "}, %64, %65, p, 1, 1;\n}\n"
        : WGMMA_ACC64(d)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// The first row and column of tile `tile` (the block index, or the persistent loop's counter):
// this kernel's tile, cluster and group sizes in hopper.cuh's grouped order.
__device__ __forceinline__ void tile_origin(int tile, int M, int N, int& row0, int& col0) {
    grouped_tile_origin<BM, BN, CLUSTER_M, GROUP_M>(tile, M, N, row0, col0);
}

__device__ __forceinline__ void store2(float* p, float x, float y) { *reinterpret_cast<float2*>(p) = make_float2(x, y); }
__device__ __forceinline__ void store2(__nv_bfloat16* p, float x, float y) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}

// Waits for the stage of K slice `it` (counted over the block's life) and issues its four
// multiplies into d (the first overwrites d).
__device__ __forceinline__ void issue_block(float (&d)[64], const unsigned char* smem, uint64_t* full, int half,
                                            int it, bool keep = false) {
    const int s = it % STAGES;
    mbar_wait(&full[s], (it / STAGES) & 1);
    const unsigned char* a = smem + s * STAGE_BYTES + half * 64 * 128;
    const unsigned char* b = smem + s * STAGE_BYTES + A_BYTES;
    fence_accumulators(d);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 32; ++kk)  // 32 bytes of K per instruction
        wgmma_m64n128k32_e4m3(d, desc_k_major(a + kk * 32), desc_k_major(b + kk * 32), keep || kk > 0);
    wgmma_commit();
}

// Frees stage s for the producer(s): one arrival per warp, on the empty barrier of every block of
// the cluster (each block's producer writes into both blocks' B tiles).
__device__ __forceinline__ void release(uint64_t* empty, int s) {
    if (CLUSTER_M == 1) {
        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(&empty[s])) : "memory");
    } else {
#pragma unroll
        for (int cta = 0; cta < CLUSTER_M; ++cta) mbar_arrive_remote<ARRIVE_CLUSTER>(&empty[s], cta);
    }
}

// Adds slice `it`'s result (`done`, its multiplies waited for) times the block's factors into
// sum, having first freed the slice's stage for the producer.
__device__ __forceinline__ void promote(float (&sum)[64], float (&done)[64], uint64_t* empty, float f0, float f8,
                                        int it) {
    fence_accumulators(done);
    if (threadIdx.x % 32 == 0) release(empty, it % STAGES);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        sum[4 * j] += f0 * done[4 * j];
        sum[4 * j + 1] += f0 * done[4 * j + 1];
        sum[4 * j + 2] += f8 * done[4 * j + 2];
        sum[4 * j + 3] += f8 * done[4 * j + 3];
    }
}

// Consumer warpgroup `half` (0 or 1): multiplies its 64 rows of the tile at (row0, col0) over all
// K blocks into sum, promoting each block with its factors. `it` counts K slices over the
// block's life (the stages' barrier phases run on from one tile to the next).
__device__ __forceinline__ void consume_tile(float (&sum)[64], const unsigned char* smem, uint64_t* full,
                                             uint64_t* empty, const float* __restrict__ sa,
                                             const float* __restrict__ sb, int M, int row0, int col0,
                                             int half, int k_tiles, int& it) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4;
#pragma unroll
    for (int i = 0; i < 64; ++i) sum[i] = 0.f;
#if !PROMOTE
    // diagnostic: every block multiplied into sum, as step 6 does; the slice before is freed
    // while this one's multiplies run
    (void)sa, (void)sb, (void)M, (void)row0, (void)col0, (void)warp;
    for (int kt = 0; kt < k_tiles; ++kt) {
        issue_block(sum, smem, full, half, it + kt, kt > 0);
        wgmma_wait<1>();
        fence_accumulators(sum);
        if (kt > 0 && lane == 0) release(empty, (it + kt - 1) % STAGES);
    }
    wgmma_wait<0>();
    fence_accumulators(sum);
    if (lane == 0) release(empty, (it + k_tiles - 1) % STAGES);
#else
    const int r = row0 + half * 64 + warp * 16 + lane / 4;  // this thread's rows: r and r + 8
    const float* sa0 = sa + r;
    const float* sbt = sb + static_cast<size_t>(col0 / BN) * k_tiles;
    const bool row_in = r < M, row8_in = r + 8 < M;
    // the factors of K block kt for this thread's two rows (sa times sb)
    auto factors = [&](int kt, float& f0, float& f8) {
#if PROMOTE == 2
        // diagnostic: the promotion without its loads
        (void)kt, (void)sa0, (void)sbt;
        f0 = row_in ? 1.f : 0.f;
        f8 = row8_in ? 1.f : 0.f;
#else
        const float fb = sbt[kt];
        f0 = row_in ? sa0[static_cast<size_t>(kt) * M] * fb : 0.f;
        f8 = row8_in ? sa0[static_cast<size_t>(kt) * M + 8] * fb : 0.f;
#endif
    };
    float f0, f8;
#if OVERLAP
    // two sets of block accumulators: block kt + 1 multiplies into one while block kt, in the
    // other, is waited for and promoted, so the tensor cores have work during the promotion
    float even[64], odd[64];
    issue_block(even, smem, full, half, it);
    int kt = 0;
    for (; kt + 2 < k_tiles; kt += 2) {  // blocks kt + 1 and kt + 2 exist
        factors(kt, f0, f8);
        issue_block(odd, smem, full, half, it + kt + 1);
        wgmma_wait<1>();  // block kt is done; kt + 1 may still run
        promote(sum, even, empty, f0, f8, it + kt);
        factors(kt + 1, f0, f8);
        issue_block(even, smem, full, half, it + kt + 2);
        wgmma_wait<1>();
        promote(sum, odd, empty, f0, f8, it + kt + 1);
    }
    // block kt is in flight in `even`, and one more block may follow
    factors(kt, f0, f8);
    if (kt + 1 < k_tiles) {
        issue_block(odd, smem, full, half, it + kt + 1);
        wgmma_wait<1>();
        promote(sum, even, empty, f0, f8, it + kt);
        factors(kt + 1, f0, f8);
        wgmma_wait<0>();
        promote(sum, odd, empty, f0, f8, it + kt + 1);
    } else {
        wgmma_wait<0>();
        promote(sum, even, empty, f0, f8, it + kt);
    }
#else
    float block[64];
    for (int kt = 0; kt < k_tiles; ++kt) {
        factors(kt, f0, f8);  // read while the block's multiplies run
        issue_block(block, smem, full, half, it + kt);
        wgmma_wait<0>();
        promote(sum, block, empty, f0, f8, it + kt);
    }
#endif  // OVERLAP
#endif  // PROMOTE
    it += k_tiles;
}

// Writes a consumer warpgroup's 64 x 128 sums. Layout of m64n128: warp w holds rows 16w..16w+15;
// per 8 columns j, a lane holds (row lane/4, columns 2*(lane%4) + {0, 1}) and the same columns
// 8 rows further down.
template <typename OutT>
__device__ __forceinline__ void store_tile(const float (&sum)[64], OutT* __restrict__ C, int M, int N, int row0,
                                           int col0) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4;
    const int r = row0 + warp * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const int c = col0 + j * 8 + (lane % 4) * 2;  // N is a multiple of 8: c < N covers c + 1
        if (c < N) {
            if (r < M) store2(C + static_cast<size_t>(r) * N + c, sum[4 * j], sum[4 * j + 1]);
            if (r + 8 < M) store2(C + static_cast<size_t>(r + 8) * N + c, sum[4 * j + 2], sum[4 * j + 3]);
        }
    }
}

template <typename OutT>
__device__ __forceinline__ void gemm_fp8(const TensorMap& map_a, const TensorMap& map_b, const float* __restrict__ sa,
                                         const float* __restrict__ sb, OutT* __restrict__ C, int M, int N, int K) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = swizzle_aligned(smem_raw);
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];

    const int warpgroup = threadIdx.x / 128;
    const int k_tiles = (K + BK - 1) / BK;
    // Without PERSISTENT a block does the tile of its own index; with it, tiles blockIdx.x,
    // blockIdx.x + gridDim.x, ...
    const int tiles = PERSISTENT ? (M + BM - 1) / BM * ((N + BN - 1) / BN) : blockIdx.x + 1;
    const int tile_step = PERSISTENT ? gridDim.x : 1;

    init_stage_barriers<STAGES, CLUSTER_M>(full, empty, CONSUMER_WARPS * CLUSTER_M);

    int it = 0, row0, col0;
    if (warpgroup == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (threadIdx.x == 0) {
            const unsigned rank = cluster_rank<CLUSTER_M>();
            for (int tile = blockIdx.x; tile < tiles; tile += tile_step) {
                tile_origin(tile, M, N, row0, col0);
                for (int kt = 0; kt < k_tiles; ++kt, ++it) {
                    const int s = it % STAGES;
                    if (it >= STAGES) mbar_wait(&empty[s], (it / STAGES + 1) & 1);  // its previous use is done
                    unsigned char* a = smem + s * STAGE_BYTES;
                    mbar_expect_tx(&full[s], STAGE_BYTES);
                    tma_load(a, &map_a, &full[s], kt * BK, row0);
                    if (CLUSTER_M == 1)
                        tma_load(a + A_BYTES, &map_b, &full[s], kt * BK, col0);
                    else  // this block's rows of B's tile, into every block of the cluster
                        tma_load_multicast(a + A_BYTES + rank * B_ROWS * BK, &map_b, &full[s], kt * BK,
                                           col0 + rank * B_ROWS, (1 << CLUSTER_M) - 1);
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
        const int half = warpgroup - 1;  // warpgroup 1: rows 0-63 of the tile; warpgroup 2: rows 64-127
        float sum[64];
        for (int tile = blockIdx.x; tile < tiles; tile += tile_step) {
            tile_origin(tile, M, N, row0, col0);
            consume_tile(sum, smem, full, empty, sa, sb, M, row0, col0, half, k_tiles, it);
            store_tile(sum, C, M, N, row0 + half * 64, col0);
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
wgmma_fp8_f32(const __grid_constant__ TensorMap map_a, const __grid_constant__ TensorMap map_b, const float* sa,
              const float* sb, float* C, int M, int N, int K) {
    gemm_fp8<float>(map_a, map_b, sa, sb, C, M, N, K);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) CLUSTER_ATTR
wgmma_fp8_bf16(const __grid_constant__ TensorMap map_a, const __grid_constant__ TensorMap map_b, const float* sa,
               const float* sb, __nv_bfloat16* C, int M, int N, int K) {
    gemm_fp8<__nv_bfloat16>(map_a, map_b, sa, sb, C, M, N, K);
}
