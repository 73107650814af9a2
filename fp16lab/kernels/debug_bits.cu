// Debugging kernel: prints the raw 16 bits of a few fp16 values from the device.
//
// printf inside a kernel is the quickest way to see what a kernel really holds: here each
// thread prints the index and the bit pattern of one fp16 value as 4 hex digits, which
// notebook 01's decoder (fp16lab.bits) turns back into sign, exponent and mantissa.
// Device printf writes into a buffer that the driver flushes to the process's stdout at
// the next synchronisation, and the lines of different threads may come in any order.
#include <cuda_fp16.h>

extern "C" __global__ void print_fp16_bits(const __half* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) printf("fp16[%d] = 0x%04x\n", i, (unsigned)__half_as_ushort(x[i]));
}
