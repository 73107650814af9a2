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
// - tile shape, K slice, warp layout and stage count are template parameters, set once per
//   compilation by the launcher's -D flags (the ladder's step 4: 128 x 128 blocks, 4 warps of
//   64 x 64; variants such as 128 x 256 blocks of 8 warps are fp16lab.kernels.VARIANTS);
//   with PIPE >= 1 the A fragments of the next k16 step are loaded while the current one
//   multiplies; with PIPE == 2 the barrier moves from the top of a slice to its last k16
//   step, so the first fragments of the next slice load while the last multiplies run;
//   PIPE == 3 is step 5's schedule with the WMMA API: A and B fragments both double-buffered,
//   the barrier before the last k16 step's multiplies, the refill one step later (the fastest
//   WMMA kernels here: about 370 TFLOP/s at 8192^3, against 325 for PIPE == 1);
// - blocks are numbered in groups of GROUP_M block-rows, so blocks that run at the same
//   time share A and B tiles in the L2 cache.
//
// Any shape: cp.async with a source size of 0 bytes fills the 16-byte chunk with zeros,
// so chunks outside the matrices read as zeros. K and N must be multiples of 8 (chunks are
// fully inside or fully outside); the Python launcher pads them when they are not.
#include <cuda_fp16.h>
#include <mma.h>

using namespace nvcuda;

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
// edge tiles (partly outside M x N) and fp16 outputs are plain, bounds-checked stores. N is a
// multiple of 8 here (the launcher pads it), so each lane writes 8 consecutive outputs of one
// row as 16-byte vectors where C is 16-byte aligned: 8x fewer store instructions.
__device__ __forceinline__ void store8(float* p, const float* v) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void store8(__half* p, const float* v) {
    __half2 h[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) h[e] = __floats2half2_rn(v[2 * e], v[2 * e + 1]);
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(h);
}

template <typename OutT>
__device__ __forceinline__ void store_tile(float* stage,
                                           const wmma::fragment<wmma::accumulator, 16, 16, 16, float>& acc,
                                           OutT* C, int row0, int col0, int M, int N, int lane) {
    wmma::store_matrix_sync(stage, acc, 16, wmma::mem_row_major);
    __syncwarp();
    if ((reinterpret_cast<unsigned long long>(C) & 15ull) == 0ull) {
        const int r = row0 + lane / 2, c = col0 + (lane % 2) * 8;
        if (r < M && c < N) {  // c + 8 <= N too
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = stage[(lane / 2) * 16 + (lane % 2) * 8 + e];
            store8(C + (size_t)r * N + c, v);
        }
    } else {
        for (int i = lane; i < 256; i += 32) {
            const int r = row0 + i / 16, c = col0 + i % 16;
            if (r < M && c < N) C[(size_t)r * N + c] = to_out<OutT>(stage[i]);
        }
    }
    __syncwarp();
}

template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, int PIPE, typename OutT>
__device__ __forceinline__ void gemm_pipeline(const __half* __restrict__ A, const __half* __restrict__ B,
                                              OutT* __restrict__ C, int M, int N, int K) {
    constexpr int THREADS = WARPS_M * WARPS_N * 32;
    constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
    constexpr int FM = WM / 16, FN = WN / 16, KK = BK / 16;
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

    constexpr bool DB = PIPE >= 1;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a[DB ? 2 : 1][FM];
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    // Global -> shared copies: thread tid copies chunk tid % (BK/8) of rows tid / (BK/8) +
    // multiples of A_ROWS (likewise for B): one source pointer and one destination per thread.
    constexpr int A_CPR = BK / 8, B_CPR = BN / 8;
    constexpr int A_ROWS = THREADS / A_CPR, B_ROWS = THREADS / B_CPR;
    static_assert(THREADS % A_CPR == 0 && THREADS % B_CPR == 0 && BM % A_ROWS == 0 && BK % B_ROWS == 0,
                  "every pass must cover whole rows");
    const int ar = tid / A_CPR, ac = tid % A_CPR, br = tid / B_CPR, bc = tid % B_CPR;
    const __half* a_src = A + (size_t)(bm + ar) * K + ac * 8;
    const __half* b_src = B + (size_t)br * N + bn + bc * 8;
    const bool b_col_ok = bn + bc * 8 < N;
    const int KT = (K + BK - 1) / BK;
    auto load_slice = [&](int stage, int kt) {
        const int k0 = kt * BK;
        __half* as = As + stage * A_STAGE + ar * LDA_S + ac * 8;
        __half* bs = Bs + stage * B_STAGE + br * LDB_S + bc * 8;
        const bool a_k_ok = k0 + ac * 8 < K;
#pragma unroll
        for (int i = 0; i < BM / A_ROWS; ++i)  // src-size 0 reads nothing and zero-fills
            cp_async_16(as + i * A_ROWS * LDA_S, a_src + (size_t)i * A_ROWS * K + k0,
                        a_k_ok && bm + ar + i * A_ROWS < M);
#pragma unroll
        for (int i = 0; i < BK / B_ROWS; ++i)
            cp_async_16(bs + i * B_ROWS * LDB_S, b_src + (size_t)(k0 + i * B_ROWS) * N,
                        b_col_ok && k0 + br + i * B_ROWS < K);
    };
    auto load_a = [&](int buf, const __half* as, int kk) {
#pragma unroll
        for (int i = 0; i < FM; ++i)
            wmma::load_matrix_sync(a[buf][i], as + (wm * WM + i * 16) * LDA_S + kk * 16, LDA_S);
    };

    // Prologue: STAGES-1 slices in flight. One commit group per slice, empty ones included,
    // so that counting pending groups always tells which slices have landed.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load_slice(s, s);
        cp_async_commit();
    }
    if (PIPE < 2) {
        for (int kt = 0; kt < KT; ++kt) {
            cp_async_wait<STAGES - 2>();
            __syncthreads();  // slice kt visible to all warps; slice kt-1's buffer free to refill
            const int next = kt + STAGES - 1;
            if (next < KT) load_slice(next % STAGES, next);
            cp_async_commit();

            const __half* as = As + (kt % STAGES) * A_STAGE;
            const __half* bs = Bs + (kt % STAGES) * B_STAGE;
            if (DB) load_a(0, as, 0);
#pragma unroll
            for (int kk = 0; kk < KK; ++kk) {
                const int cur = DB ? kk % 2 : 0;
                if (DB) {
                    if (kk + 1 < KK) load_a((kk + 1) % 2, as, kk + 1);
                } else {
                    load_a(0, as, kk);
                }
#pragma unroll
                for (int j = 0; j < FN; ++j) {
                    wmma::load_matrix_sync(b, bs + kk * 16 * LDB_S + wn * WN + j * 16, LDB_S);
#pragma unroll
                    for (int i = 0; i < FM; ++i) wmma::mma_sync(acc[i][j], a[cur][i], b, acc[i][j]);
                }
            }
        }
    } else if (PIPE == 3) {
        // mma_sync's schedule with the WMMA API: the fragments of k16 step kk+1 (A and B,
        // two register buffers each) load while step kk multiplies; the barrier sits before
        // the last step's multiplies, which then cover the first loads of the next slice; the
        // buffer of slice kt-1 is refilled at step 0 of slice kt+1's predecessor (every warp
        // has passed a barrier since it last read it).
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> bb[2][FN];
        auto load_b = [&](int buf, const __half* bs, int kk) {
#pragma unroll
            for (int j = 0; j < FN; ++j)
                wmma::load_matrix_sync(bb[buf][j], bs + kk * 16 * LDB_S + wn * WN + j * 16, LDB_S);
        };
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        int read_stage = 0, write_stage = STAGES - 1;
        load_a(0, As, 0);
        load_b(0, Bs, 0);
        for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
            for (int kk = 0; kk < KK; ++kk) {
                if (kk == KK - 1) {
                    cp_async_wait<STAGES - 2>();
                    __syncthreads();  // slice kt+1 visible; every warp is past slice kt-1
                    read_stage = (read_stage + 1) % STAGES;
                }
                load_a((kk + 1) % 2, As + read_stage * A_STAGE, (kk + 1) % KK);
                load_b((kk + 1) % 2, Bs + read_stage * B_STAGE, (kk + 1) % KK);
                if (kk == 0) {
                    if (kt + STAGES - 1 < KT) load_slice(write_stage, kt + STAGES - 1);
                    cp_async_commit();
                    write_stage = (write_stage + 1) % STAGES;
                }
#pragma unroll
                for (int i = 0; i < FM; ++i)
#pragma unroll
                    for (int jj = 0; jj < FN; ++jj) {
                        const int j = (i % 2) ? FN - 1 - jj : jj;
                        wmma::mma_sync(acc[i][j], a[kk % 2][i], bb[kk % 2][j], acc[i][j]);
                    }
            }
        }
    } else {
        static_assert(PIPE < 2 || STAGES >= 3, "the late refill needs 3 or more stages");
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        load_a(0, As, 0);
        for (int kt = 0; kt < KT; ++kt) {
            const __half* as = As + (kt % STAGES) * A_STAGE;
            const __half* bs = Bs + (kt % STAGES) * B_STAGE;
#pragma unroll
            for (int kk = 0; kk < KK; ++kk) {
                if (kk == KK - 1) {
                    // Groups committed so far: STAGES-1+kt; slice kt+1 is in when at most
                    // STAGES-3 are pending. After the barrier every warp is done with slice
                    // kt-1, so its buffer is refilled here (not earlier: slower warps may still
                    // be reading it), and the next slice's first A fragments are loaded while
                    // this step's multiplies run.
                    cp_async_wait<STAGES - 3>();
                    __syncthreads();
                    const int next = kt + STAGES - 1;
                    if (next < KT) load_slice(next % STAGES, next);
                    cp_async_commit();
                    load_a((kk + 1) % 2, As + ((kt + 1) % STAGES) * A_STAGE, 0);
                } else {
                    load_a((kk + 1) % 2, as, kk + 1);
                }
#pragma unroll
                for (int j = 0; j < FN; ++j) {
                    wmma::load_matrix_sync(b, bs + kk * 16 * LDB_S + wn * WN + j * 16, LDB_S);
#pragma unroll
                    for (int i = 0; i < FM; ++i) wmma::mma_sync(acc[i][j], a[kk % 2][i], b, acc[i][j]);
                }
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

// One configuration per compilation: the launcher passes it as -D flags from the kernel's entry in
// fp16lab.kernels (LADDER or VARIANTS), where the tile sizes are written once. The defaults are the
// ladder's step 4 (for compile checks): 128x128 blocks, K slices of 32, 2 x 2 warps of 64x64,
// 4 stages, A fragments prefetched (PIPE 1); 4 x (128x40 + 32x136) x 2 B = 74 KB.
#ifndef CFG_BM
#define CFG_BM 128
#endif
#ifndef CFG_BN
#define CFG_BN 128
#endif
#ifndef CFG_BK
#define CFG_BK 32
#endif
#ifndef CFG_WARPS_M
#define CFG_WARPS_M 2
#endif
#ifndef CFG_WARPS_N
#define CFG_WARPS_N 2
#endif
#ifndef CFG_STAGES
#define CFG_STAGES 4
#endif
#ifndef CFG_PIPE
#define CFG_PIPE 1
#endif

extern "C" __global__ void __launch_bounds__(CFG_WARPS_M * CFG_WARPS_N * 32)
wmma_pipeline_f32(const __half* A, const __half* B, float* C, int M, int N, int K) {
    gemm_pipeline<CFG_BM, CFG_BN, CFG_BK, CFG_WARPS_M, CFG_WARPS_N, CFG_STAGES, CFG_PIPE, float>(A, B, C, M, N, K);
}
extern "C" __global__ void __launch_bounds__(CFG_WARPS_M * CFG_WARPS_N * 32)
wmma_pipeline_f16(const __half* A, const __half* B, __half* C, int M, int N, int K) {
    gemm_pipeline<CFG_BM, CFG_BN, CFG_BK, CFG_WARPS_M, CFG_WARPS_N, CFG_STAGES, CFG_PIPE, __half>(A, B, C, M, N, K);
}
