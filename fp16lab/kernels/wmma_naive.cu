// Step 1 of the GEMM ladder: naive WMMA.
//
// C (M x N) = A (M x K) @ B (K x N); A and B row-major fp16, accumulation in fp32.
// One warp owns one 16x16 tile of C and walks K in steps of 16, reading its A and B
// fragments straight from global memory with wmma::load_matrix_sync. Nothing is reused
// between warps: every fragment is fetched from global memory (or L2) again by every
// warp that needs it, which is why this kernel runs at a few percent of cuBLAS.
//
// Any shape: a tile that is fully inside the matrices (and whose rows are 32-byte aligned,
// M, N, K multiples of 16) is loaded directly; an edge tile is copied through a small
// per-warp staging buffer with zeros outside the matrices.
#include <cuda_fp16.h>
#include <mma.h>

using namespace nvcuda;

#define WARPS_PER_BLOCK 4

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
__device__ __forceinline__ void gemm_naive(const __half* __restrict__ A, const __half* __restrict__ B,
                                           OutT* __restrict__ C, int M, int N, int K) {
    __shared__ __align__(32) __half a_stage[WARPS_PER_BLOCK][16 * 16];
    __shared__ __align__(32) __half b_stage[WARPS_PER_BLOCK][16 * 16];
    __shared__ __align__(32) float c_stage[WARPS_PER_BLOCK][16 * 16];

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int tile = blockIdx.x * WARPS_PER_BLOCK + warp;
    const int tiles_n = (N + 15) / 16;
    const int row0 = (tile / tiles_n) * 16, col0 = (tile % tiles_n) * 16;
    if (row0 >= M) return;  // the whole warp leaves together; no block-wide barrier below

    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);

    // load_matrix_sync needs 32-byte aligned rows: true when K and N are multiples of 16.
    const bool direct = (K % 16 == 0) && (N % 16 == 0) && row0 + 16 <= M && col0 + 16 <= N;
    for (int k0 = 0; k0 < K; k0 += 16) {
        if (direct) {
            wmma::load_matrix_sync(a, A + (size_t)row0 * K + k0, K);
            wmma::load_matrix_sync(b, B + (size_t)k0 * N + col0, N);
        } else {
            for (int i = lane; i < 256; i += 32) {
                const int r = i / 16, c = i % 16;
                a_stage[warp][i] = (row0 + r < M && k0 + c < K) ? A[(size_t)(row0 + r) * K + k0 + c]
                                                                 : __float2half(0.0f);
                b_stage[warp][i] = (k0 + r < K && col0 + c < N) ? B[(size_t)(k0 + r) * N + col0 + c]
                                                                 : __float2half(0.0f);
            }
            __syncwarp();
            wmma::load_matrix_sync(a, a_stage[warp], 16);
            wmma::load_matrix_sync(b, b_stage[warp], 16);
            __syncwarp();  // the next iteration overwrites the staging buffers
        }
        wmma::mma_sync(acc, a, b, acc);
    }
    store_tile<OutT>(c_stage[warp], acc, C, row0, col0, M, N, lane);
}

extern "C" __global__ void __launch_bounds__(WARPS_PER_BLOCK * 32)
wmma_naive_f32(const __half* A, const __half* B, float* C, int M, int N, int K) {
    gemm_naive<float>(A, B, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(WARPS_PER_BLOCK * 32)
wmma_naive_f16(const __half* A, const __half* B, __half* C, int M, int N, int K) {
    gemm_naive<__half>(A, B, C, M, N, K);
}
