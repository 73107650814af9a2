// Step 2 of the GEMM ladder: shared-memory tiled WMMA.
//
// C (M x N) = A (M x K) @ B (K x N); A and B row-major fp16, accumulation in fp32.
// A block of 8 warps owns a BM x BN = 128 x 128 tile of C. For each BK = 32 slice of K the
// block copies the A (128 x 32) and B (32 x 128) tiles into shared memory once, and every
// warp then reads its fragments from there: each element fetched from global memory now
// feeds 4 (A) or 2 (B) warps instead of one, and each warp computes a 64 x 32 tile
// (4 x 2 fragments), so each fragment it loads feeds several mma_sync calls.
//
// Any shape: the global loads are element by element with zeros outside the matrices.
#include <cuda_fp16.h>
#include <mma.h>

using namespace nvcuda;

#define BM 128
#define BN 128
#define BK 32
#define WARPS_M 2
#define WARPS_N 4
#define THREADS (WARPS_M * WARPS_N * 32)
#define WM (BM / WARPS_M)  // 64 rows of C per warp
#define WN (BN / WARPS_N)  // 32 columns of C per warp
#define FM (WM / 16)       // 4 fragments down
#define FN (WN / 16)       // 2 fragments across
#define LDA_S BK           // shared-memory row length of the A tile, in halfs
#define LDB_S BN           // shared-memory row length of the B tile, in halfs

template <typename OutT> __device__ __forceinline__ OutT to_out(float x);
template <> __device__ __forceinline__ float to_out<float>(float x) { return x; }
template <> __device__ __forceinline__ __half to_out<__half>(float x) { return __float2half_rn(x); }

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

template <typename OutT>
__device__ __forceinline__ void gemm_smem(const __half* __restrict__ A, const __half* __restrict__ B,
                                          OutT* __restrict__ C, int M, int N, int K) {
    __shared__ __align__(128) __half As[BM * LDA_S];
    __shared__ __align__(128) __half Bs[BK * LDB_S];
    __shared__ __align__(128) float Cs[WARPS_M * WARPS_N][16 * 16];

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;

    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a[FM];
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b[FN];
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    for (int k0 = 0; k0 < K; k0 += BK) {
        // Global -> shared, one half at a time, zeros outside the matrices.
        for (int i = tid; i < BM * BK; i += THREADS) {
            const int r = i / BK, c = i % BK;
            As[r * LDA_S + c] = (bm + r < M && k0 + c < K) ? A[(size_t)(bm + r) * K + k0 + c]
                                                          : __float2half(0.0f);
        }
        for (int i = tid; i < BK * BN; i += THREADS) {
            const int r = i / BN, c = i % BN;
            Bs[r * LDB_S + c] = (k0 + r < K && bn + c < N) ? B[(size_t)(k0 + r) * N + bn + c]
                                                          : __float2half(0.0f);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
#pragma unroll
            for (int i = 0; i < FM; ++i)
                wmma::load_matrix_sync(a[i], As + (wm * WM + i * 16) * LDA_S + kk, LDA_S);
#pragma unroll
            for (int j = 0; j < FN; ++j)
                wmma::load_matrix_sync(b[j], Bs + kk * LDB_S + wn * WN + j * 16, LDB_S);
#pragma unroll
            for (int i = 0; i < FM; ++i)
#pragma unroll
                for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();  // the next slice overwrites As and Bs
    }
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j)
            store_tile<OutT>(Cs[warp], acc[i][j], C, bm + wm * WM + i * 16, bn + wn * WN + j * 16, M, N, lane);
}

extern "C" __global__ void __launch_bounds__(THREADS)
wmma_smem_f32(const __half* A, const __half* B, float* C, int M, int N, int K) {
    gemm_smem<float>(A, B, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(THREADS)
wmma_smem_f16(const __half* A, const __half* B, __half* C, int M, int N, int K) {
    gemm_smem<__half>(A, B, C, M, N, K);
}
