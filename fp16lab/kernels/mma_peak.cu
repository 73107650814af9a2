// Microbenchmark: the peak rate of mma.sync.m16n8k16 (fp16 in, fp32 accumulate) on this GPU.
//
// Every warp multiplies register-resident fragments into ACC independent accumulators, over
// and over, with no memory traffic: the rate it reaches is the ceiling for any kernel built
// on mma.sync (and on the WMMA API, which compiles to the same HMMA instructions). On Hopper
// cuBLAS uses wgmma instead, which this instruction cannot reach.
#include <cuda_fp16.h>

#define ACC 16

__device__ __forceinline__ void mma_16816(float* d, const unsigned* a, const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The loop both kernels run: ACC independent accumulators, accumulator t fed by A fragment
// t % NA and B fragment (t / NA) % NB, so NA = NB = 1 repeats one pair and NA = NB = 4 cycles
// through all 16 pairs. The sum of the accumulators is written so that the work is kept.
template <int NA, int NB>
__device__ __forceinline__ void peak_loop(const unsigned (&a)[NA][4], const unsigned (&b)[NB][2],
                                          float* out, int iters) {
    float acc[ACC][4];
#pragma unroll
    for (int t = 0; t < ACC; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[t][e] = 0.0f;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int t = 0; t < ACC; ++t) mma_16816(acc[t], a[t % NA], b[(t / NA) % NB]);
    }
    float s = 0.0f;
#pragma unroll
    for (int t = 0; t < ACC; ++t) s += acc[t][0] + acc[t][1] + acc[t][2] + acc[t][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

extern "C" __global__ void mma_sync_peak(float* out, int iters) {
    // non-zero operands that differ between lanes (zeros can run faster than real data)
    const float x = 0.001f * (float)(threadIdx.x % 32 + 1);
    const __half2 h = __floats2half2_rn(x, -0.5f * x);
    const unsigned u = *reinterpret_cast<const unsigned*>(&h);
    const unsigned a[1][4] = {{u, u ^ 0x00010001u, u ^ 0x00020002u, u ^ 0x00030003u}};
    const unsigned b[1][2] = {{u ^ 0x00040004u, u ^ 0x00050005u}};
    peak_loop(a, b, out, iters);
}

// The same with operands that change on every instruction, as they do in a GEMM: 4 A and 4 B
// fragments per lane from `bits` (random finite fp16 pairs, 24 words per lane), cycled. Toggling
// operand bits costs the tensor cores power, so under a power limit this rate can sit below the
// constant-operand one: it is the roof a GEMM on real data meets.
extern "C" __global__ void mma_sync_peak_varied(const unsigned* __restrict__ bits, float* out, int iters) {
    const unsigned* p = bits + (threadIdx.x % 32) * 24;
    unsigned a[4][4], b[4][2];
#pragma unroll
    for (int f = 0; f < 4; ++f) {
#pragma unroll
        for (int e = 0; e < 4; ++e) a[f][e] = p[4 * f + e];
#pragma unroll
        for (int e = 0; e < 2; ++e) b[f][e] = p[16 + 2 * f + e];
    }
    peak_loop(a, b, out, iters);
}
