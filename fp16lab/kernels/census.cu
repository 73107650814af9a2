// One-pass census of a float32 / float16 / bfloat16 tensor: class counts and a log2 histogram
// (fp16lab.census, compiled and launched through fp16lab.kernels.compiler and .launch).
/* The histogram's range: fp16lab.census passes both (-D) from its HIST_MIN and HIST_MAX; the
   defaults are the same numbers, for compiling this file on its own. */
#ifndef HIST_MIN
#define HIST_MIN (-160)
#endif
#ifndef NBINS
#define NBINS (291)
#endif
#define ACC_FIELDS 8
#define ACC_SUBS (8 + 256)
#define ACC_TICKET (8 + 256 + 32)

/* U: the bit pattern type; MBITS / EBITS: mantissa / exponent field widths; THREADS per block;
   LOADS: 16-byte loads in flight per thread. out: [0] zeros, [1..3] |x| <= T1, T2, T3,
   [4] NaNs, [5..] histogram of floor(log2|x|) from HIST_MIN, then seq (the done flag).
   acc: zero before and after. */
template <typename U, int MBITS, int EBITS, int THREADS, int LOADS>
__device__ __forceinline__ void census_body(const U* __restrict__ x, long long n,
                                            unsigned int t1, unsigned int t2, unsigned int t3,
                                            unsigned long long* __restrict__ acc,
                                            unsigned long long* __restrict__ out,
                                            unsigned long long seq) {
    constexpr int NF = 1 << EBITS;
    constexpr int BIAS = (1 << (EBITS - 1)) - 1;
    constexpr int SUB_EXP = 1 - BIAS - MBITS;   /* a subnormal pattern p is p * 2^SUB_EXP */
    constexpr unsigned int MAG = sizeof(U) == 4 ? 0x7fffffffu : 0x7fffu;
    constexpr unsigned int INF = (unsigned int)(NF - 1) << MBITS;
    constexpr int VEC = 16 / (int)sizeof(U);
    __shared__ __align__(16) unsigned short cnt[NF][THREADS];  /* cnt[field][thread] */
    __shared__ unsigned int sub[32];
    __shared__ unsigned int cls[4];
    __shared__ int last;

    unsigned int* cnt32 = reinterpret_cast<unsigned int*>(&cnt[0][0]);
    for (int i = threadIdx.x; i < NF * THREADS / 2; i += THREADS) cnt32[i] = 0u;
    if (threadIdx.x < 32) sub[threadIdx.x] = 0u;
    if (threadIdx.x < 4) cls[threadIdx.x] = 0u;
    __syncthreads();

    unsigned short* mine = &cnt[0][threadIdx.x];   /* field f at mine[f * THREADS] */
    unsigned int c1 = 0u, c2 = 0u, c3 = 0u, cnan = 0u;
#define TALLY(bits)                                                            \
    {                                                                          \
        unsigned int u_ = (bits) & MAG;                                        \
        c1 += (u_ <= t1);                                                      \
        c2 += (u_ <= t2);                                                      \
        c3 += (u_ <= t3);                                                      \
        cnan += (u_ > INF);                                                    \
        unsigned int f_ = u_ >> MBITS;                                         \
        mine[f_ * THREADS] += 1;                                               \
        if (f_ == 0u && u_ != 0u) atomicAdd(&sub[31 - __clz(u_)], 1u);         \
    }

    /* two 16-bit elements at once (SWAR): with u, t <= 0x7fff, (0x8000 + t) - u stays within its
       half and has bit 15 set iff u <= t; u > INF iff u + (0x7fff - INF) has bit 15 set. Hits
       add into a 16-bit counter per half (a thread sees fewer than 65536 pairs: see the host) */
    const unsigned int T1P = (t1 | 0x8000u) * 0x10001u, T2P = (t2 | 0x8000u) * 0x10001u,
                       T3P = (t3 | 0x8000u) * 0x10001u, NANK = (0x7fffu - INF) * 0x10001u;
    unsigned int p1 = 0u, p2 = 0u, p3 = 0u, pnan = 0u;
#define PAIR(word)                                                             \
    {                                                                          \
        const unsigned int m_ = (word) & 0x7fff7fffu;                          \
        p1 += ((T1P - m_) >> 15) & 0x10001u;                                   \
        p2 += ((T2P - m_) >> 15) & 0x10001u;                                   \
        p3 += ((T3P - m_) >> 15) & 0x10001u;                                   \
        pnan += ((m_ + NANK) >> 15) & 0x10001u;                                \
        const unsigned int lo_ = m_ & 0xffffu, hi_ = m_ >> 16;                 \
        const unsigned int flo_ = lo_ >> MBITS, fhi_ = hi_ >> MBITS;           \
        mine[flo_ * THREADS] += 1;                                             \
        mine[fhi_ * THREADS] += 1;                                             \
        if (flo_ == 0u || fhi_ == 0u) {                                        \
            if (flo_ == 0u && lo_ != 0u) atomicAdd(&sub[31 - __clz(lo_)], 1u); \
            if (fhi_ == 0u && hi_ != 0u) atomicAdd(&sub[31 - __clz(hi_)], 1u); \
        }                                                                      \
    }

    const long long tid = (long long)blockIdx.x * THREADS + threadIdx.x;
    const long long stride = (long long)gridDim.x * THREADS;
    /* prologue: elements before the first 16-byte boundary (fewer than VEC <= stride) */
    long long head = (long long)((16u - (unsigned int)((unsigned long long)x & 15u)) & 15u)
                     / (long long)sizeof(U);
    if (head > n) head = n;
    if (tid < head) TALLY((unsigned int)x[tid])
    const uint4* xv = reinterpret_cast<const uint4*>(x + head);
    const long long nvec = (n - head) / VEC;
    /* software pipelined: the next trip's loads are in flight while this trip is counted */
    uint4 q[LOADS];
#pragma unroll
    for (int k = 0; k < LOADS; ++k)
        q[k] = tid + k * stride < nvec ? __ldg(&xv[tid + k * stride]) : make_uint4(0u, 0u, 0u, 0u);
    /* the fast trips: this trip's and the next trip's loads all in range, so no bounds checks,
       and the data's own subnormals (rare) looked for once per trip, not once per element: no
       branch per element. The trips left (at most two per thread) take the checked loop below */
    const long long fast_end = nvec - (long long)(2 * LOADS - 1) * stride;
    long long i = tid;
    for (; i < fast_end; i += LOADS * stride) {
        uint4 p[LOADS];
        const long long nxt = i + LOADS * stride;
#pragma unroll
        for (int k = 0; k < LOADS; ++k) p[k] = __ldg(&xv[nxt + k * stride]);
        unsigned int rare = 0u;
#pragma unroll
        for (int k = 0; k < LOADS; ++k) {
            const unsigned int w[4] = {q[k].x, q[k].y, q[k].z, q[k].w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if constexpr (sizeof(U) == 4) {
                    const unsigned int u_ = w[j] & MAG;
                    c1 += (u_ <= t1);
                    c2 += (u_ <= t2);
                    c3 += (u_ <= t3);
                    cnan += (u_ > INF);
                    const unsigned int f_ = u_ >> MBITS;
                    mine[f_ * THREADS] += 1;
                    rare |= (f_ == 0u) & (u_ != 0u);
                } else {
                    const unsigned int m_ = w[j] & 0x7fff7fffu;
                    p1 += ((T1P - m_) >> 15) & 0x10001u;
                    p2 += ((T2P - m_) >> 15) & 0x10001u;
                    p3 += ((T3P - m_) >> 15) & 0x10001u;
                    pnan += ((m_ + NANK) >> 15) & 0x10001u;
                    const unsigned int lo_ = m_ & 0xffffu, hi_ = m_ >> 16;
                    const unsigned int flo_ = lo_ >> MBITS, fhi_ = hi_ >> MBITS;
                    mine[flo_ * THREADS] += 1;
                    mine[fhi_ * THREADS] += 1;
                    if constexpr (EBITS >= 8) {  /* bf16: subnormals below 1.2e-38, rare */
                        rare |= ((flo_ == 0u) & (lo_ != 0u)) | ((fhi_ == 0u) & (hi_ != 0u));
                    } else if (flo_ == 0u || fhi_ == 0u) {  /* fp16's start at 6.1e-5: common */
                        if (flo_ == 0u && lo_ != 0u) atomicAdd(&sub[31 - __clz(lo_)], 1u);
                        if (fhi_ == 0u && hi_ != 0u) atomicAdd(&sub[31 - __clz(hi_)], 1u);
                    }
                }
            }
        }
        if (EBITS >= 8 && rare) {  /* a subnormal of the data's type in this trip: bin it by
                                      its leading one */
#pragma unroll
            for (int k = 0; k < LOADS; ++k) {
                const unsigned int w[4] = {q[k].x, q[k].y, q[k].z, q[k].w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const unsigned int m_ = w[j] & MAG;
                    if constexpr (sizeof(U) == 4) {
                        if ((m_ >> MBITS) == 0u && m_ != 0u) atomicAdd(&sub[31 - __clz(m_)], 1u);
                    } else {
                        const unsigned int lo_ = w[j] & 0x7fffu, hi_ = (w[j] >> 16) & 0x7fffu;
                        if ((lo_ >> MBITS) == 0u && lo_ != 0u) atomicAdd(&sub[31 - __clz(lo_)], 1u);
                        if ((hi_ >> MBITS) == 0u && hi_ != 0u) atomicAdd(&sub[31 - __clz(hi_)], 1u);
                    }
                }
            }
        }
#pragma unroll
        for (int k = 0; k < LOADS; ++k) q[k] = p[k];
    }
    for (; i < nvec; i += LOADS * stride) {
        uint4 p[LOADS];
        const long long nxt = i + LOADS * stride;
#pragma unroll
        for (int k = 0; k < LOADS; ++k)
            p[k] = nxt + k * stride < nvec ? __ldg(&xv[nxt + k * stride])
                                           : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int k = 0; k < LOADS; ++k) {
            if (i + k * stride < nvec) {
                const unsigned int w[4] = {q[k].x, q[k].y, q[k].z, q[k].w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    if constexpr (sizeof(U) == 4) {
                        TALLY(w[j])
                    } else {
                        PAIR(w[j])
                    }
                }
            }
        }
#pragma unroll
        for (int k = 0; k < LOADS; ++k) q[k] = p[k];
    }
    /* epilogue: the last (n - head) % VEC elements (fewer than VEC <= stride) */
    const long long rest = head + nvec * VEC + tid;
    if (rest < n) TALLY((unsigned int)x[rest])
#undef TALLY
#undef PAIR
    c1 += (p1 & 0xffffu) + (p1 >> 16);
    c2 += (p2 & 0xffffu) + (p2 >> 16);
    c3 += (p3 & 0xffffu) + (p3 >> 16);
    cnan += (pnan & 0xffffu) + (pnan >> 16);

    /* block sums: class counts by warp shuffles, then the field counters */
    const int lane = threadIdx.x & 31;
    for (int off = 16; off > 0; off >>= 1) {
        c1 += __shfl_down_sync(0xffffffffu, c1, off);
        c2 += __shfl_down_sync(0xffffffffu, c2, off);
        c3 += __shfl_down_sync(0xffffffffu, c3, off);
        cnan += __shfl_down_sync(0xffffffffu, cnan, off);
    }
    if (lane == 0) {
        if (c1) atomicAdd(&cls[0], c1);
        if (c2) atomicAdd(&cls[1], c2);
        if (c3) atomicAdd(&cls[2], c3);
        if (cnan) atomicAdd(&cls[3], cnan);
    }
    __syncthreads();
    if (threadIdx.x < 4 && cls[threadIdx.x])
        atomicAdd(&acc[threadIdx.x], (unsigned long long)cls[threadIdx.x]);
    if (threadIdx.x < MBITS && sub[threadIdx.x])
        atomicAdd(&acc[ACC_SUBS + threadIdx.x], (unsigned long long)sub[threadIdx.x]);
    /* one thread per field sums its row, two counters per 32-bit word; lane l starts at word l,
       so the lanes of a warp read 32 different banks (independent loads, no shuffle chains) */
    constexpr int ROW = THREADS / 2;
    for (int f = threadIdx.x; f < NF; f += THREADS) {
        const unsigned int* row = cnt32 + f * ROW;
        unsigned int s = 0u;
#pragma unroll 8
        for (int j = 0; j < ROW; ++j) {
            const unsigned int w = row[(j + lane) & (ROW - 1)];
            s += (w & 0xffffu) + (w >> 16);
        }
        if (s) atomicAdd(&acc[ACC_FIELDS + f], (unsigned long long)s);
    }

    /* the last block to finish writes the result and leaves the scratch zeroed */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        last = atomicAdd(&acc[ACC_TICKET], 1ull) == (unsigned long long)gridDim.x - 1ull;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int i = threadIdx.x; i < 5 + NBINS; i += THREADS) out[i] = 0ull;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long subs = 0ull;
        for (int k = 0; k < MBITS; ++k) subs += __ldcg(&acc[ACC_SUBS + k]);
        out[0] = __ldcg(&acc[ACC_FIELDS]) - subs;   /* field 0: zeros and subnormals */
        for (int k = 0; k < 4; ++k) out[1 + k] = __ldcg(&acc[k]);
    }
    for (int f = 1 + threadIdx.x; f < NF - 1; f += THREADS)  /* the normal binades */
        out[5 + (f - BIAS) - HIST_MIN] = __ldcg(&acc[ACC_FIELDS + f]);
    for (int k = threadIdx.x; k < MBITS; k += THREADS)        /* the data's subnormals */
        out[5 + (k + SUB_EXP) - HIST_MIN] = __ldcg(&acc[ACC_SUBS + k]);
    __syncthreads();
    for (int i = threadIdx.x; i <= ACC_TICKET; i += THREADS) acc[i] = 0ull;
    /* last, the flag: whoever polls out (mapped host memory) and sees seq there sees the whole
       result, and the scratch already zeroed for the next census on any stream */
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) *reinterpret_cast<volatile unsigned long long*>(&out[5 + NBINS]) = seq;
}

extern "C" __global__ void __launch_bounds__(64)
census_f32(const unsigned int* x, long long n, unsigned int t1, unsigned int t2,
           unsigned int t3, unsigned long long* acc, unsigned long long* out,
           unsigned long long seq) {
    census_body<unsigned int, 23, 8, 64, 4>(x, n, t1, t2, t3, acc, out, seq);
}

extern "C" __global__ void __launch_bounds__(64)
census_bf16(const unsigned short* x, long long n, unsigned int t1, unsigned int t2,
            unsigned int t3, unsigned long long* acc, unsigned long long* out,
           unsigned long long seq) {
    census_body<unsigned short, 7, 8, 64, 4>(x, n, t1, t2, t3, acc, out, seq);
}

extern "C" __global__ void __launch_bounds__(256)
census_f16(const unsigned short* x, long long n, unsigned int t1, unsigned int t2,
           unsigned int t3, unsigned long long* acc, unsigned long long* out,
           unsigned long long seq) {
    census_body<unsigned short, 10, 5, 256, 2>(x, n, t1, t2, t3, acc, out, seq);
}
