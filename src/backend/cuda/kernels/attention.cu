// Causal grouped-query attention of one sequence's query rows over its cached keys and values
// (backend/cpu/attn.rs, attention_with_sinks): query row t is at position p = pos0 + t and
// attends to positions lo ..= p (lo = p + 1 - window with a sliding window, else 0); scores
// are q·k (q already scaled), soft-capped when cap > 0, softmaxed (with the head's sink logit
// in the maximum and the denominator when sinks is non-null) and used to weight the values.
//
// One block per (row, head), ATT_WARPS warps. Warp w takes positions lo + w, lo + w +
// ATT_WARPS, ...: the lanes split the head's dimensions (lane l holds l, l + 32, ...), a
// shuffle butterfly sums the score, and the warp keeps an online softmax (running maximum,
// denominator, weighted value sum). The warps' partial results are merged in shared memory.
// Head dimensions up to ATT_MAX_DIM. `attention` takes one sequence's rows (row t at pos0 + t);
// `attention_rows` several sequences' rows in one launch, row t's key slot, value slot and
// position read from meta[3t], meta[3t + 1], meta[3t + 2].

#define ATT_WARPS 8
#define ATT_MAX_DIM 512
#define ATT_PER_LANE (ATT_MAX_DIM / 32)
#define NEG_INF __int_as_float(0xff800000)

// Head h of one query row qh (hd floats) at position p over the slots k, v into o (hd floats).
__device__ __forceinline__ void attention_head(const float* __restrict__ qh, const float* __restrict__ k,
                                               const float* __restrict__ v, int n_heads, int n_kv_heads,
                                               int head_dim, int h, int p, int window, float cap,
                                               const float* __restrict__ sinks, float* __restrict__ o) {
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][ATT_MAX_DIM];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int hd = head_dim;
    const int kvd = n_kv_heads * hd;
    const int kv_off = (h / (n_heads / n_kv_heads)) * hd;
    const int lo = window > 0 ? max(0, p + 1 - window) : 0;

    float qr[ATT_PER_LANE], acc[ATT_PER_LANE];
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) {
        const int d = lane + 32 * i;
        qr[i] = d < hd ? qh[d] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (int j = lo + warp; j <= p; j += ATT_WARPS) {
        const float* kj = k + (u64)j * kvd + kv_off;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_PER_LANE; i++) {
            const int d = lane + 32 * i;
            if (d < hd) s = fmaf(qr[i], kj[d], s);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (cap > 0.0f) s = cap * tanhf(s / cap);
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new);
        const float e = expf(s - m_new);
        l = l * corr + e;
        const float* vj = v + (u64)j * kvd + kv_off;
#pragma unroll
        for (int i = 0; i < ATT_PER_LANE; i++) {
            const int d = lane + 32 * i;
            if (d < hd) acc[i] = fmaf(e, vj[d], acc[i] * corr);
        }
        m = m_new;
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) {
        const int d = lane + 32 * i;
        if (d < hd) s_acc[warp][d] = acc[i];
    }
    __syncthreads();
    float mx = sinks ? sinks[h] : NEG_INF;
    for (int w = 0; w < ATT_WARPS; w++) mx = fmaxf(mx, s_m[w]);
    float denom = sinks ? expf(sinks[h] - mx) : 0.0f;
    float f[ATT_WARPS];
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = s_l[w] > 0.0f ? expf(s_m[w] - mx) : 0.0f;
        denom += s_l[w] * f[w];
    }
    const float inv = 1.0f / denom;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float sum = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) sum += s_acc[w][d] * f[w];
        o[d] = sum * inv;
    }
}

extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS)
    attention(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, int n_heads,
              int n_kv_heads, int head_dim, int pos0, int window, float cap, const float* __restrict__ sinks,
              float* __restrict__ out) {
    const int t = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
    const u64 off = ((u64)t * n_heads + h) * head_dim;
    attention_head(q + off, k, v, n_heads, n_kv_heads, head_dim, h, pos0 + t, window, cap, sinks, out + off);
}

extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS)
    attention_rows(const float* __restrict__ q, const u64* __restrict__ meta, int n_heads, int n_kv_heads,
                   int head_dim, int window, float cap, const float* __restrict__ sinks, float* __restrict__ out) {
    const int t = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
    const u64 off = ((u64)t * n_heads + h) * head_dim;
    const float* k = (const float*)meta[3 * (u64)t];
    const float* v = (const float*)meta[3 * (u64)t + 1];
    const int p = (int)meta[3 * (u64)t + 2];
    attention_head(q + off, k, v, n_heads, n_kv_heads, head_dim, h, p, window, cap, sinks, out + off);
}
