// Step 5 of the GEMM ladder: warp-level mma.sync and ldmatrix in inline PTX.
//
// C (M x N) = A (M x K) @ B (K x N); A and B row-major fp16, accumulation in fp32.
// Changes from step 4:
// - the WMMA API is replaced by the PTX instructions it hides: ldmatrix.x4 loads four 8x8
//   fp16 matrices from shared memory into the exact register layout that
//   mma.sync.m16n8k16 expects (.trans transposes B's row-major tiles on the way), and
//   mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 multiplies a 16x16 A fragment by a
//   16x8 B fragment into 4 fp32 accumulators per thread;
// - with the layout in our hands the accumulators are stored straight from registers to
//   global memory (no staging through shared memory) and the padding is replaced by an
//   XOR swizzle of the 16-byte chunks inside each row: no wasted shared memory, and the
//   8 row addresses of every ldmatrix phase still land in 8 different bank groups;
// - each warp owns a 64 x 64 tile (4 x 8 mma tiles = 128 fp32 accumulators per thread),
//   and the ring is 4 stages deep.
//
// Any shape: as in step 4 (zero-filling cp.async, bounds-checked stores; K and N
// multiples of 8, padded by the launcher otherwise).
#include <cuda_fp16.h>

#define BK 32        // the A swizzle below assumes 64-byte rows
#define GROUP_M 8    // block-rows per L2 group

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

__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
// d += a (16x16, row) * b (16x8, col), fp16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_16816(float* d, const unsigned* a, const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Swizzled offsets (in halfs) of 16-byte chunk c of row r. A rows are 64 bytes (4 chunks):
// rows r and r+2 share banks, so the chunk index is XORed with (r/2) mod 4. B rows are
// BN*2 bytes (a multiple of 128): every row shares banks, so the low 3 bits of the chunk
// index are XORed with r mod 8.
__device__ __forceinline__ int a_swz(int r, int c) { return r * BK + ((c ^ ((r >> 1) & 3)) << 3); }
template <int BN>
__device__ __forceinline__ int b_swz(int r, int c) { return r * BN + ((c ^ (r & 7)) << 3); }

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

__device__ __forceinline__ void store2(float* p, float x, float y) { *reinterpret_cast<float2*>(p) = make_float2(x, y); }
__device__ __forceinline__ void store2(__half* p, float x, float y) { *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y); }

template <int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, typename OutT>
__device__ __forceinline__ void gemm_mma(const __half* __restrict__ A, const __half* __restrict__ B,
                                         OutT* __restrict__ C, int M, int N, int K) {
    constexpr int THREADS = WARPS_M * WARPS_N * 32;
    constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
    constexpr int MT = WM / 16, NT = WN / 8;  // m16n8 tiles per warp
    constexpr int A_STAGE = BM * BK, B_STAGE = BK * BN;  // halfs per stage
    static_assert(NT % 2 == 0, "B fragments are loaded two n8 tiles at a time");

    extern __shared__ __align__(128) unsigned char smem[];
    __half* As = reinterpret_cast<__half*>(smem);
    __half* Bs = As + STAGES * A_STAGE;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    int bm, bn;
    block_tile(M, N, BM, BN, bm, bn);

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    const int KT = (K + BK - 1) / BK;
    auto load_slice = [&](int stage, int kt) {
        const int k0 = kt * BK;
        __half* as = As + stage * A_STAGE;
        __half* bs = Bs + stage * B_STAGE;
#pragma unroll
        for (int i = tid; i < BM * BK / 8; i += THREADS) {
            const int r = i / (BK / 8), c = i % (BK / 8);
            const bool p = bm + r < M && k0 + c * 8 < K;
            cp_async_16(as + a_swz(r, c), p ? A + (size_t)(bm + r) * K + k0 + c * 8 : A, p);
        }
#pragma unroll
        for (int i = tid; i < BK * BN / 8; i += THREADS) {
            const int r = i / (BN / 8), c = i % (BN / 8);
            const bool p = k0 + r < K && bn + c * 8 < N;
            cp_async_16(bs + b_swz<BN>(r, c), p ? B + (size_t)(k0 + r) * N + bn + c * 8 : B, p);
        }
    };

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load_slice(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int next = kt + STAGES - 1;
        if (next < KT) load_slice(next % STAGES, next);
        cp_async_commit();

        const __half* as = As + (kt % STAGES) * A_STAGE;
        const __half* bs = Bs + (kt % STAGES) * B_STAGE;
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            unsigned af[MT][4], bf[NT][2];
            // ldmatrix: lane l gives the address of row (l % 16) of the fragment, chunk l / 16.
#pragma unroll
            for (int i = 0; i < MT; ++i)
                ldmatrix_x4(af[i], as + a_swz(wm * WM + i * 16 + (lane % 16), kk * 2 + lane / 16));
#pragma unroll
            for (int j = 0; j < NT; j += 2)
                ldmatrix_x4_trans(&bf[j][0], bs + b_swz<BN>(kk * 16 + (lane % 16), (wn * WN + j * 8) / 8 + lane / 16));
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NT; ++j) mma_16816(acc[i][j], af[i], bf[j]);
        }
    }
    cp_async_wait<0>();

    // Accumulator layout of m16n8: lane holds rows lane/4 and lane/4 + 8, columns 2*(lane%4) + {0,1}.
#pragma unroll
    for (int i = 0; i < MT; ++i) {
        const int row = bm + wm * WM + i * 16 + lane / 4;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int col = bn + wn * WN + j * 8 + (lane % 4) * 2;
            if (col < N) {  // N is a multiple of 8, so col + 1 < N too
                if (row < M) store2(C + (size_t)row * N + col, acc[i][j][0], acc[i][j][1]);
                if (row + 8 < M) store2(C + (size_t)(row + 8) * N + col, acc[i][j][2], acc[i][j][3]);
            }
        }
    }
}

#define INSTANTIATE(NAME, BM, BN, WARPS_M, WARPS_N, STAGES)                                           \
    extern "C" __global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)                               \
    NAME##_f32(const __half* A, const __half* B, float* C, int M, int N, int K) {                     \
        gemm_mma<BM, BN, WARPS_M, WARPS_N, STAGES, float>(A, B, C, M, N, K);                          \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)                               \
    NAME##_f16(const __half* A, const __half* B, __half* C, int M, int N, int K) {                    \
        gemm_mma<BM, BN, WARPS_M, WARPS_N, STAGES, __half>(A, B, C, M, N, K);                         \
    }

// name                   BM   BN  warps  stages   dynamic shared memory
INSTANTIATE(mma_sync,     128, 256, 2, 4, 4)   // 4 x (128x32 + 32x256) x 2 B = 96 KB
INSTANTIATE(mma_sync_128, 128, 128, 2, 2, 4)   // 4 x (128x32 + 32x128) x 2 B = 64 KB, 4 warps of 64x64
