// Multi-head latent attention (backend/cpu/mla.rs, mla_attention) and the KDA delta rule
// (backend/cpu/kda.rs, delta_rule), on weights already decoded to f32 rows (the deq_*
// kernels, bit for bit the CPU's dequantize_row).
//
// MLA of one sequence's n query rows (row t at position p = pos0 + t), per head h:
//   qa[t][h]  = W_k,hᵀ q_nope[t][h]                 (mla_absorb_joint, or mla_head_dot on k_b)
//   s_j       = scale · (qa · c_j + q_rot · k_rot,j)  for j = 0 ..= p   (mla_attention)
//   ctx[t][h] = Σ_j softmax(s)_j c_j                                      (mla_attention)
//   out[t][h] = W_v,h ctx[t][h]                                           (mla_head_dot)
// where the latent row of position j is [c_j (rank floats) | k_rot,j (rope floats)].

#define MLA_WARPS 8
#define MLA_MAX_RANK 1024
#define MLA_MAX_ROPE 256
#define MLA_RANK_PER_LANE (MLA_MAX_RANK / 32)
#define MLA_ROPE_PER_LANE (MLA_MAX_ROPE / 32)

// The absorbed queries from the joint kv_b_proj (f32, per head `nope` key rows then `vd`
// value rows, `rank` columns): qa[(t·nh + h)·rank + r] = Σ_i q[(t·nh + h)·qh + i] ·
// W[(h·(nope + vd) + i)·rank + r], summed over i in order with one rounding per product and
// per sum, as the CPU's joint form. One thread per (t, h, r).
extern "C" __global__ void mla_absorb_joint(const float* __restrict__ q, const float* __restrict__ w, int n, int nh,
                                            int qh, int nope, int vd, int rank, float* __restrict__ qa) {
    const u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (u64)n * nh * rank) return;
    const int r = (int)(e % rank);
    const u64 th = e / rank;  // t · nh + h
    const int h = (int)(th % nh);
    const float* qt = q + th * qh;
    const float* wh = w + (u64)h * (nope + vd) * rank + r;
    float acc = 0.0f;
    for (int i = 0; i < nope; i++) acc = __fadd_rn(acc, __fmul_rn(qt[i], wh[(u64)i * rank]));
    qa[e] = acc;
}

// Per-head products of f32 weight rows with per-(row, head) vectors, one warp per output:
// out[(t·nh + h)·width + o] = Σ_{c < len} w[h·head_stride + w0 + o·len + c] · x[(t·nh + h)·x_stride + c]
// for t < n, h < nh, o < width. The split form's absorbed queries (k_b: head_stride rank·nope,
// len nope, x the queries) and every form's outputs (the value rows: len rank, x the latent
// contexts). Lanes take c = lane, lane + 32, ... (fma), summed by a shuffle butterfly.
extern "C" __global__ void mla_head_dot(const float* __restrict__ w, u64 head_stride, u64 w0, int len,
                                        const float* __restrict__ x, int x_stride, int n, int nh, int width,
                                        float* __restrict__ out) {
    const u64 o_all = (u64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (o_all >= (u64)n * nh * width) return;
    const int o = (int)(o_all % width);
    const u64 th = o_all / width;  // t · nh + h
    const int h = (int)(th % nh);
    const float* wr = w + (u64)h * head_stride + w0 + (u64)o * len;
    const float* xr = x + th * x_stride;
    float acc = 0.0f;
    for (int c = lane; c < len; c += 32) acc = fmaf(wr[c], xr[c], acc);
    acc = warp_sum(acc);
    if (lane == 0) out[o_all] = acc;
}

// The latent attention of query row t, head h (block t · nh + h, MLA_WARPS warps): scores
// scale · (qa · c_j + q_rot · k_rot,j) over positions 0 ..= pos0 + t, softmax, and the
// probability-weighted sum of the latents c_j into ctx[(t·nh + h)·rank ..]. As attention.cu:
// warp w takes positions w, w + MLA_WARPS, ..., the lanes split the dimensions (lane l holds
// l, l + 32, ...), each warp keeps an online softmax, merged in shared memory. rank ≤
// MLA_MAX_RANK, rope ≤ MLA_MAX_ROPE.
extern "C" __global__ void __launch_bounds__(32 * MLA_WARPS)
    mla_attention(const float* __restrict__ qa, const float* __restrict__ q, const float* __restrict__ latent, int nh,
                  int qh, int nope, int rope, int rank, int pos0, float scale, float* __restrict__ ctx) {
    __shared__ float s_m[MLA_WARPS], s_l[MLA_WARPS];
    __shared__ float s_acc[MLA_WARPS][MLA_MAX_RANK];
    const int t = blockIdx.x / nh, h = blockIdx.x % nh;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int width = rank + rope;
    const int p = pos0 + t;
    const u64 th = (u64)t * nh + h;
    const float* qa_h = qa + th * rank;
    const float* qr_h = q + th * qh + nope;

    float qn[MLA_RANK_PER_LANE], acc[MLA_RANK_PER_LANE], qr[MLA_ROPE_PER_LANE];
#pragma unroll
    for (int i = 0; i < MLA_RANK_PER_LANE; i++) {
        const int d = lane + 32 * i;
        qn[i] = d < rank ? qa_h[d] : 0.0f;
        acc[i] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < MLA_ROPE_PER_LANE; i++) {
        const int d = lane + 32 * i;
        qr[i] = d < rope ? qr_h[d] : 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (int j = warp; j <= p; j += MLA_WARPS) {
        const float* row = latent + (u64)j * width;
        float a = 0.0f, b = 0.0f;
#pragma unroll
        for (int i = 0; i < MLA_RANK_PER_LANE; i++) {
            const int d = lane + 32 * i;
            if (d < rank) a = fmaf(qn[i], row[d], a);
        }
#pragma unroll
        for (int i = 0; i < MLA_ROPE_PER_LANE; i++) {
            const int d = lane + 32 * i;
            if (d < rope) b = fmaf(qr[i], row[rank + d], b);
        }
        a = warp_sum(a);
        b = warp_sum(b);
        const float s = __fmul_rn(__fadd_rn(a, b), scale);
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new);
        const float e = expf(s - m_new);
        l = l * corr + e;
#pragma unroll
        for (int i = 0; i < MLA_RANK_PER_LANE; i++) {
            const int d = lane + 32 * i;
            if (d < rank) acc[i] = fmaf(e, row[d], acc[i] * corr);
        }
        m = m_new;
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < MLA_RANK_PER_LANE; i++) {
        const int d = lane + 32 * i;
        if (d < rank) s_acc[warp][d] = acc[i];
    }
    __syncthreads();
    float mx = NEG_INF;
    for (int w = 0; w < MLA_WARPS; w++) mx = fmaxf(mx, s_m[w]);
    float denom = 0.0f;
    float f[MLA_WARPS];
    for (int w = 0; w < MLA_WARPS; w++) {
        f[w] = s_l[w] > 0.0f ? expf(s_m[w] - mx) : 0.0f;
        denom += s_l[w] * f[w];
    }
    const float inv = 1.0f / denom;
    float* o = ctx + th * rank;
    for (int d = threadIdx.x; d < rank; d += blockDim.x) {
        float sum = 0.0f;
        for (int w = 0; w < MLA_WARPS; w++) sum += s_acc[w][d] * f[w];
        o[d] = sum * inv;
    }
}

// The KDA delta rule over n tokens (backend/cpu/kda.rs, delta_step, token by token): per head
// h the state S (dk × dv, row-major, `state + h·dk·dv`) evolves as
//   S ← diag(exp g_t) S;  δ = β_t (v_t − Sᵀ k_t);  S ← S + k_t ⊗ δ;  o_t = Sᵀ q_t
// with q (scaled), k (L2-normed), g: n × heads × dk; v, out: n × heads × dv; beta: n × heads.
// Column j of S only meets column j, so block (h, c) takes columns c·KDA_COLS + x of head h,
// one thread each, the state tile in shared memory; each token's q, k and exp(g) are staged
// in shared memory. Each column sums in the CPU's order with one rounding per product and
// per sum (exp: CUDA's expf). dk ≤ KDA_MAX_DK; blockDim.x = KDA_COLS.

#define KDA_COLS 32
#define KDA_MAX_DK 256

extern "C" __global__ void __launch_bounds__(KDA_COLS)
    kda_scan(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
             const float* __restrict__ g, const float* __restrict__ beta, float* state, int heads, int dk, int dv,
             int n, float* __restrict__ out) {
    __shared__ float s_s[KDA_MAX_DK][KDA_COLS];
    __shared__ float s_q[KDA_MAX_DK], s_k[KDA_MAX_DK], s_e[KDA_MAX_DK];
    const int h = blockIdx.x, x = threadIdx.x;
    const int j = blockIdx.y * KDA_COLS + x;
    const bool active = j < dv;
    float* st = state + (u64)h * dk * dv + j;
    for (int i = 0; i < dk; i++) s_s[i][x] = active ? st[(u64)i * dv] : 0.0f;
    for (int t = 0; t < n; t++) {
        const u64 th = (u64)t * heads + h;
        __syncthreads();  // the previous token's reads of s_q, s_k, s_e are done
        for (int i = x; i < dk; i += blockDim.x) {
            s_q[i] = q[th * dk + i];
            s_k[i] = k[th * dk + i];
            s_e[i] = expf(g[th * dk + i]);
        }
        __syncthreads();
        if (!active) continue;
        float d = v[th * dv + j];
        for (int i = 0; i < dk; i++) {
            const float s = __fmul_rn(s_s[i][x], s_e[i]);
            s_s[i][x] = s;
            d = __fsub_rn(d, __fmul_rn(s, s_k[i]));
        }
        d = __fmul_rn(d, beta[th]);
        float o = 0.0f;
        for (int i = 0; i < dk; i++) {
            const float s = __fadd_rn(s_s[i][x], __fmul_rn(s_k[i], d));
            s_s[i][x] = s;
            o = __fadd_rn(o, __fmul_rn(s, s_q[i]));
        }
        out[th * dv + j] = o;
    }
    if (active)
        for (int i = 0; i < dk; i++) st[(u64)i * dv] = s_s[i][x];
}
