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
