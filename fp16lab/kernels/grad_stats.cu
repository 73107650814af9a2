// Per-gradient exponent histograms and max|g| in one launch (fp16lab.diagnostics' GradientMonitor,
// compiled and launched through fp16lab.kernels.compiler and .launch).
#include <cuda_fp16.h>
/* fp16lab.diagnostics passes both (-D) from its N_BINS and _STATS_THREADS; the defaults are the
   same numbers, for compiling this file on its own. */
#ifndef N_BINS
#define N_BINS 258
#endif
#ifndef THREADS
#define THREADS 256
#endif
#define UNROLL 8

__device__ __forceinline__ unsigned int abs_bits(const void* p, int kind, long long i) {
    unsigned int b;
    if (kind == 0) b = __ldg(reinterpret_cast<const unsigned int*>(p) + i);
    else if (kind == 1) b = __float_as_uint(__half2float(__ushort_as_half(
                            __ldg(reinterpret_cast<const unsigned short*>(p) + i))));
    else b = (unsigned int)__ldg(reinterpret_cast<const unsigned short*>(p) + i) << 16;
    return b & 0x7fffffffu;
}

extern "C" __global__ void __launch_bounds__(THREADS)
grad_stats(const unsigned long long* __restrict__ ptrs, const int* __restrict__ kinds,
           const int* __restrict__ chunk_grad, const long long* __restrict__ chunk_start,
           const long long* __restrict__ chunk_end, unsigned long long* __restrict__ hist,
           unsigned int* __restrict__ maxbits) {
    __shared__ unsigned int h[N_BINS];
    __shared__ unsigned int wmax[THREADS / 32];
    for (int i = threadIdx.x; i < N_BINS; i += THREADS) h[i] = 0u;
    __syncthreads();
    const int g = chunk_grad[blockIdx.x];
    const long long start = chunk_start[blockIdx.x], end = chunk_end[blockIdx.x];
    const void* p = reinterpret_cast<const void*>(ptrs[g]);
    const int kind = kinds[g];
    const int lane = threadIdx.x & 31;
    unsigned int m = 0u;
    /* every lane runs the same number of trips (the match below needs the whole warp) */
    for (long long base = start; base < end; base += (long long)THREADS * UNROLL) {
        unsigned int u[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const long long i = base + threadIdx.x + (long long)k * THREADS;
            u[k] = i < end ? abs_bits(p, kind, i) : 0xffffffffu;  /* all ones: no element */
        }
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const bool real = u[k] != 0xffffffffu;
            /* bin: zero 0, float32 subnormal 1, exponent field E -> E + 1, inf 256, NaN 257 */
            const unsigned int bin = real ? (u[k] >> 23) + 1u + (u[k] > 0x7f800000u) - (u[k] == 0u)
                                          : 0xffffffffu;
            if (real) m = max(m, u[k]);
            const unsigned int peers = __match_any_sync(0xffffffffu, bin);
            if (real && lane == __ffs(peers) - 1) atomicAdd(&h[bin], (unsigned int)__popc(peers));
        }
    }
    for (int off = 16; off > 0; off >>= 1) m = max(m, __shfl_down_sync(0xffffffffu, m, off));
    if (lane == 0) wmax[threadIdx.x / 32] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int bm = 0u;
        for (int w = 0; w < THREADS / 32; ++w) bm = max(bm, wmax[w]);
        atomicMax(&maxbits[g], bm);
    }
    unsigned long long* row = hist + (long long)g * N_BINS;
    for (int i = threadIdx.x; i < N_BINS; i += THREADS)
        if (h[i]) atomicAdd(&row[i], (unsigned long long)h[i]);
}
