// Step 4 of the GEMM ladder: a multi-stage cp.async pipeline (still the WMMA API).
//
// C (M x N) = A (M x K) @ B (K x N); A and B row-major fp16, accumulation in fp32.
// Changes from step 3:
// - global -> shared copies use cp.async (16 bytes each), which writes shared memory
//   directly without passing through registers and does not block the thread;
// - STAGES slices of K are in flight at once (a ring of STAGES shared-memory buffers):
//   while the warps multiply slice k, the copies for slices k+1 .. k+STAGES-1 are already
//   on their way, so the wait for global memory overlaps the tensor-core work;
// - the buffers no longer fit in the 48 KB of static shared memory: they are dynamic
//   shared memory, whose limit the launcher raises (cudaFuncSetAttribute);
// - tile shape, warp layout and stage count are template parameters, instantiated below
//   for a 128 x 128 block (8 warps of 64 x 32) and a 128 x 256 block (8 warps of 64 x 64);
// - blocks are numbered in groups of GROUP_M block-rows, so blocks that run at the same
//   time share A and B tiles in the L2 cache.
//
// Any shape: cp.async with a source size of 0 bytes fills the 16-byte chunk with zeros,
// so chunks outside the matrices read as zeros. K and N must be multiples of 8 (chunks are
// fully inside or fully outside); the Python launcher pads them when they are not.
#include <cuda_fp16.h>
#include <mma.h>

using namespace nvcuda;

#define BK 32
#define PAD 8        // halfs of padding per shared-memory row (16 bytes)
#define GROUP_M 8    // block-rows per L2 group

template <typename OutT> __device__ __forceinline__ OutT to_out(float x);
template <> __device__ __forceinline__ float to_out<float>(float x) { return x; }
template <> __device__ __forceinline__ __half to_out<__half>(float x) { return __float2half_rn(x); }

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous copy global -> shared; copies 0 bytes (zero-fills) when !pred.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool pred) {
    const int bytes = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Maps the linear block index to a (block-row, block-column) so that GROUP_M block-rows
// are swept together: the blocks resident at one time reuse each other's tiles from L2.
__device__ __forceinline__ void block_tile(int M, int N, int BMv, int BNv, int& bm, int& bn) {
    const int grid_m = (M + BMv - 1) / BMv, grid_n = (N + BNv - 1) / BNv;
    const int pid = blockIdx.x, width = GROUP_M * grid_n;
    const int first_m = (pid / width) * GROUP_M;
    const int group = min(grid_m - first_m, GROUP_M);
    bm = (first_m + (pid % width) % group) * BMv;
    bn = ((pid % width) / group) * BNv;
}

// Writes one 16x16 fp32 accumulator tile to C through a per-warp staging buffer, so that
// edge tiles (partly outside M x N) and fp16 outputs are plain, bounds-checked stores.
template <typename OutT>
__device__ __forceinline__ void store_tile(float* stage,
                                           const wmma::fragment<wmma::accumulator, 16, 16, 16, float>& acc,
                                           OutT* C, int row0, int col0, int M, int N, int lane) {
    wmma::store_matrix_sync(stage, acc, 16, wmma::mem_row_major);
    __syncwarp();
    for (int i = lane; i < 256; i += 32) {
        const int r = row0 + i / 16, c = col0 + i % 16;
        if (r < M && c < N) C[(size_t)r * N + c] = to_out<OutT>(stage[i]);
    }
    __syncwarp();
}

template <int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, typename OutT>
__device__ __forceinline__ void gemm_pipeline(const __half* __restrict__ A, const __half* __restrict__ B,
                                              OutT* __restrict__ C, int M, int N, int K) {
    constexpr int THREADS = WARPS_M * WARPS_N * 32;
    constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
    constexpr int FM = WM / 16, FN = WN / 16;
    constexpr int LDA_S = BK + PAD, LDB_S = BN + PAD;
    constexpr int A_STAGE = BM * LDA_S, B_STAGE = BK * LDB_S;  // halfs per stage

    extern __shared__ __align__(128) unsigned char smem[];
    __half* As = reinterpret_cast<__half*>(smem);
    __half* Bs = As + STAGES * A_STAGE;
    float* Cs = reinterpret_cast<float*>(smem);  // epilogue staging, reuses the ring

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    int bm, bn;
    block_tile(M, N, BM, BN, bm, bn);

    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a[FM];
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    const int KT = (K + BK - 1) / BK;
    auto load_slice = [&](int stage, int kt) {
        const int k0 = kt * BK;
        __half* as = As + stage * A_STAGE;
        __half* bs = Bs + stage * B_STAGE;
#pragma unroll
        for (int i = tid; i < BM * BK / 8; i += THREADS) {
            const int r = i / (BK / 8), c = (i % (BK / 8)) * 8;
            const bool p = bm + r < M && k0 + c < K;
            cp_async_16(as + r * LDA_S + c, p ? A + (size_t)(bm + r) * K + k0 + c : A, p);
        }
#pragma unroll
        for (int i = tid; i < BK * BN / 8; i += THREADS) {
            const int r = i / (BN / 8), c = (i % (BN / 8)) * 8;
            const bool p = k0 + r < K && bn + c < N;
            cp_async_16(bs + r * LDB_S + c, p ? B + (size_t)(k0 + r) * N + bn + c : B, p);
        }
    };

    // Prologue: STAGES-1 slices in flight. One commit group per slice, empty ones included,
    // so that "wait until at most STAGES-2 groups are pending" always means "slice kt landed".
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load_slice(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // slice kt visible to all warps; slice kt-1's buffer free to refill
        const int next = kt + STAGES - 1;
        if (next < KT) load_slice(next % STAGES, next);
        cp_async_commit();

        const __half* as = As + (kt % STAGES) * A_STAGE;
        const __half* bs = Bs + (kt % STAGES) * B_STAGE;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
#pragma unroll
            for (int i = 0; i < FM; ++i)
                wmma::load_matrix_sync(a[i], as + (wm * WM + i * 16) * LDA_S + kk, LDA_S);
#pragma unroll
            for (int j = 0; j < FN; ++j) {
                wmma::load_matrix_sync(b, bs + kk * LDB_S + wn * WN + j * 16, LDB_S);
#pragma unroll
                for (int i = 0; i < FM; ++i) wmma::mma_sync(acc[i][j], a[i], b, acc[i][j]);
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // all warps done with the ring before it becomes epilogue staging
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j)
            store_tile<OutT>(Cs + warp * 256, acc[i][j], C, bm + wm * WM + i * 16, bn + wn * WN + j * 16, M, N, lane);
}

#define INSTANTIATE(NAME, BM, BN, WARPS_M, WARPS_N, STAGES)                                           \
    extern "C" __global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)                               \
    NAME##_f32(const __half* A, const __half* B, float* C, int M, int N, int K) {                     \
        gemm_pipeline<BM, BN, WARPS_M, WARPS_N, STAGES, float>(A, B, C, M, N, K);                     \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)                               \
    NAME##_f16(const __half* A, const __half* B, __half* C, int M, int N, int K) {                    \
        gemm_pipeline<BM, BN, WARPS_M, WARPS_N, STAGES, __half>(A, B, C, M, N, K);                    \
    }

// name                        BM   BN  warps  stages   dynamic shared memory
INSTANTIATE(wmma_pipeline,     128, 128, 2, 4, 3)   // 3 x (128x40 + 32x136) x 2 B = 56.8 KB
INSTANTIATE(wmma_pipeline_256, 128, 256, 2, 4, 3)   // 3 x (128x40 + 32x264) x 2 B = 81.4 KB
