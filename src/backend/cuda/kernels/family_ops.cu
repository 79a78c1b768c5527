// The ops only some families need (backend::Op), each the CPU's formula with the same f32
// operations in the same order wherever CUDA allows: MLA's partial RMSNorm and RoPE
// (backend/cpu/device.rs rms_norm_head, rope_tail; cpu/mla.rs rope_slice), the KDA
// convolution, L2 norms, decay, sigmoids and gated norm (cpu/kda.rs, cpu/blocks.rs), Kimi
// K3's residual mix (cpu/blocks.rs res_mix), GPT-OSS's row biases, input-major products
// (cpu/mod.rs matmul_t) and clamped SwiGLU (cpu/blocks.rs swiglu_oai). Products and sums are
// written with __fmul_rn / __fadd_rn so the compiler cannot fuse them; expf / logf / sin /
// cos are CUDA's, so the ops calling them agree with the CPU within rounding, the others
// (L2 norms, biases, input-major products) bit for bit. One exception to the CPU's order:
// res_mix sums each source's squares and scores over the block in f64 (the CPU sums in f32,
// in order), so its weights can differ from the CPU's by more than one rounding on wide rows
// (the GPU test bounds the output at 1e-5 relative).

// The largest rotary slice rope_tail takes (floats; the CPU's rope_slice holds 512).
#define ROPE_TAIL_MAX 512
// The largest KDA convolution (taps per channel).
#define KDA_MAX_CONV 8
// The most sources (banked checkpoints and the current rows) one res_mix takes.
#define RES_MIX_MAX 64
// Rows of one matmul_t launch (accumulators per thread).
#define MT_ROWS 8

// Σ over the block of v in f64 (blockDim.x = 256, a power of two), into every thread.
__device__ __forceinline__ double block_sum_f64(double v, double* part) {
    part[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    const double r = part[0];
    __syncthreads();
    return r;
}

// RMSNorm in place of the first d floats of row blockIdx.x of x (rows `stride` floats
// apart), as rms_norm: scale = 1 / sqrt(mean(x²) + eps) with the squares summed in f64,
// x ← x · scale · w; with `gate` (KDA's gated output norm, stride = d) then × σ(gate) of the
// same element. blockDim.x = 256.
extern "C" __global__ void rms_norm_part(float* x, int stride, int d, const float* __restrict__ w, float eps,
                                         const float* __restrict__ gate) {
    __shared__ double part[256];
    float* xr = x + (u64)blockIdx.x * stride;
    double ss = 0.0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += (double)xr[i] * (double)xr[i];
    ss = block_sum_f64(ss, part);
    const float scale = 1.0f / sqrtf((float)(ss / (double)d) + eps);
    const float* gr = gate ? gate + (u64)blockIdx.x * stride : nullptr;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float y = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
        if (gr) y = __fmul_rn(y, __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-gr[i]))));
        xr[i] = y;
    }
}

// MLA's RoPE of the last 2·half floats of slice blockIdx.x of x (slices `width` floats
// apart; `per_row` slices per row, row t at position pos0 + t): with `interleaved` the pairs
// (2i, 2i+1) are first regrouped into halves (i, half + i), then NeoX halves rotate by
// θ = pos · inv_freq[i] (f64, sin and cos rounded to f32), then × scale when scale ≠ 1.
// The slice is staged in shared memory, so the regrouping reads before anything is written.
extern "C" __global__ void rope_tail(float* x, int width, int per_row, int half, int pos0,
                                     const float* __restrict__ inv_freq, int interleaved, float scale) {
    __shared__ float t[ROPE_TAIL_MAX];
    const int row = blockIdx.x / per_row;
    float* s = x + (u64)blockIdx.x * width + (width - 2 * half);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        t[i] = interleaved ? s[2 * i] : s[i];
        t[half + i] = interleaved ? s[2 * i + 1] : s[half + i];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const double theta = (double)(pos0 + row) * (double)inv_freq[i];
        const float sn = (float)sin(theta), c = (float)cos(theta);
        const float a = t[i], b = t[half + i];
        float ra = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, sn));
        float rb = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, c));
        if (scale != 1.0f) {
            ra = __fmul_rn(ra, scale);
            rb = __fmul_rn(rb, scale);
        }
        s[i] = ra;
        s[half + i] = rb;
    }
}

// KDA's short causal convolution and SiLU over channel c of [q | k | v] (3·dim channels, one
// thread each), the n rows in order: y_t = silu(Σ_j w_c,j · x_{t−conv+1+j}) summed in j
// order from 0 (one rounding per product and per sum), the conv − 1 inputs before row 0
// read from state ((conv − 1) × 3·dim, oldest row first) and the last conv − 1 written back.
extern "C" __global__ void kda_conv(float* q, float* k, float* v, int n, int dim, const float* __restrict__ taps,
                                    int conv, float* state) {
    const int ch = 3 * dim;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= ch) return;
    float* x = c < dim ? q : c < 2 * dim ? k : v;
    const int col = c % dim;
    float win[KDA_MAX_CONV];
    for (int j = 0; j < conv - 1; j++) win[j] = state[(u64)j * ch + c];
    const float* w = taps + (u64)c * conv;
    for (int t = 0; t < n; t++) {
        float* xt = x + (u64)t * dim + col;
        const float in = *xt;
        float acc = 0.0f;
        for (int j = 0; j < conv - 1; j++) acc = __fadd_rn(acc, __fmul_rn(w[j], win[j]));
        acc = __fadd_rn(acc, __fmul_rn(w[conv - 1], in));
        *xt = __fdiv_rn(acc, __fadd_rn(1.0f, expf(-acc)));
        for (int j = 0; j + 1 < conv - 1; j++) win[j] = win[j + 1];
        if (conv > 1) win[conv - 2] = in;
    }
    for (int j = 0; j < conv - 1; j++) state[(u64)j * ch + c] = win[j];
}

// L2 norm of `heads` slices of d floats of x, one thread each: x ← x · (1 / sqrt(Σx² + eps)),
// the squares summed in order in f32, then × scale when scale ≠ 1 (cpu/kda.rs l2norm_eps).
extern "C" __global__ void l2norm_heads(float* x, u64 heads, int d, float eps, float scale) {
    const u64 h = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= heads) return;
    float* xh = x + h * d;
    float ss = 0.0f;
    for (int i = 0; i < d; i++) ss = __fadd_rn(ss, __fmul_rn(xh[i], xh[i]));
    const float inv = __fdiv_rn(1.0f, sqrtf(__fadd_rn(ss, eps)));
    for (int i = 0; i < d; i++) {
        float y = __fmul_rn(xh[i], inv);
        if (scale != 1.0f) y = __fmul_rn(y, scale);
        xh[i] = y;
    }
}

// KDA's log decay of n elements of g (rows of dim, heads of dk = dim / heads): with
// x = g + dt_bias and a = exp(A_log_h), −a · softplus(x) (softplus: x above 20 as is, else
// ln(1 + eˣ)), or with has_lb, lb · σ(a · x) (cpu/kda.rs decay).
extern "C" __global__ void kda_decay(float* g, u64 n, int dim, int dk, const float* __restrict__ a_log,
                                     const float* __restrict__ dt_bias, int has_lb, float lb) {
    const u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    const int i = (int)(e % dim);
    const float a = expf(a_log[i / dk]);
    const float x = __fadd_rn(g[e], dt_bias[i]);
    float y;
    if (has_lb) {
        y = __fmul_rn(lb, __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-__fmul_rn(a, x)))));
    } else {
        const float sp = x > 20.0f ? x : logf(__fadd_rn(1.0f, expf(x)));
        y = __fmul_rn(-a, sp);
    }
    g[e] = y;
}

// x ← σ(x), or with g, x ← x · σ(g); σ(z) = 1 / (1 + e^−z).
extern "C" __global__ void sigmoid_mul(float* x, const float* __restrict__ g, u64 n) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (g) {
        x[i] = __fmul_rn(x[i], __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g[i]))));
    } else {
        x[i] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x[i])));
    }
}

// Kimi K3's attention-residual mix of row blockIdx.x (d floats) of nb banked checkpoints
// (bank[s], device addresses) and cur into out: each source scores Σ_e (x_e · r) · w_e with
// r = 1 / sqrt(Σx² / d + eps) (sums over the block in f64), the scores softmaxed in f32 in
// the CPU's order (max, e^(s − max), sum in order, divide), then out = Σ_s p_s · x_s in
// source order (banked, then cur), one rounding per product and per sum. blockDim.x = 256.
extern "C" __global__ void res_mix(const u64* __restrict__ bank, int nb, const float* __restrict__ cur, int d,
                                   const float* __restrict__ w, float eps, float* __restrict__ out) {
    __shared__ double part[256];
    __shared__ float p[RES_MIX_MAX];
    const u64 r0 = (u64)blockIdx.x * d;
    for (int s = 0; s <= nb; s++) {
        const float* x = (s < nb ? (const float*)bank[s] : cur) + r0;
        double ss = 0.0;
        for (int e = threadIdx.x; e < d; e += blockDim.x) ss += (double)x[e] * (double)x[e];
        ss = block_sum_f64(ss, part);
        const float r = 1.0f / sqrtf(__fadd_rn((float)ss / (float)d, eps));
        double sc = 0.0;
        for (int e = threadIdx.x; e < d; e += blockDim.x) sc += (double)__fmul_rn(__fmul_rn(x[e], r), w[e]);
        sc = block_sum_f64(sc, part);
        if (threadIdx.x == 0) p[s] = (float)sc;
    }
    if (threadIdx.x == 0) {
        float m = NEG_INF;
        for (int s = 0; s <= nb; s++) m = fmaxf(m, p[s]);
        float sum = 0.0f;
        for (int s = 0; s <= nb; s++) {
            p[s] = expf(__fsub_rn(p[s], m));
            sum = __fadd_rn(sum, p[s]);
        }
        for (int s = 0; s <= nb; s++) p[s] = __fdiv_rn(p[s], sum);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
        float y = 0.0f;
        for (int s = 0; s < nb; s++) y = __fadd_rn(y, __fmul_rn(((const float*)bank[s])[r0 + e], p[s]));
        out[r0 + e] = __fadd_rn(y, __fmul_rn(cur[r0 + e], p[nb]));
    }
}

// x ← x + b for every d-wide row of x (n floats).
extern "C" __global__ void add_rows(float* x, const float* __restrict__ b, u64 n, int d) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fadd_rn(x[i], b[i % d]);
}

// GPT-OSS's clamped SwiGLU of n outputs: with up null, of the interleaved pairs
// (gate_up[2i], gate_up[2i+1]), else of gate_up[i] and up[i]: g' = min(g, limit),
// u' = clamp(u, −limit, limit) (NaN stays NaN), (u' + 1) · (g' / (1 + e^−(g'·α))).
extern "C" __global__ void swiglu_oai(const float* __restrict__ gate_up, const float* __restrict__ up, u64 n,
                                      float alpha, float limit, float* __restrict__ out) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = up ? gate_up[i] : gate_up[2 * i];
    float u = up ? up[i] : gate_up[2 * i + 1];
    g = fminf(g, limit);
    if (u == u) u = fminf(fmaxf(u, -limit), limit);
    const float s = __fdiv_rn(g, __fadd_rn(1.0f, expf(-__fmul_rn(g, alpha))));
    out[i] = __fmul_rn(__fadd_rn(u, 1.0f), s);
}

// The input-major product over one panel of f32 weight rows: for the rows t < r of x (k
// floats apart, this panel's inputs from column i0) and the m outputs (one thread each),
// y[t][j] = (acc ? y[t][j] : 0) + Σ_{i < pk} x[t][i0 + i] · w[i][j], the terms added one by
// one in ascending i with one rounding per product and per sum, as the CPU's matmul_t.
extern "C" __global__ void matmul_t(const float* __restrict__ w, int pk, int m, const float* __restrict__ x, int k,
                                    int i0, int r, int acc, float* y) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= m) return;
    float a[MT_ROWS];
    for (int t = 0; t < MT_ROWS; t++) a[t] = (t < r && acc) ? y[(u64)t * m + j] : 0.0f;
    for (int i = 0; i < pk; i++) {
        const float wv = w[(u64)i * m + j];
#pragma unroll
        for (int t = 0; t < MT_ROWS; t++)
            if (t < r) a[t] = __fadd_rn(a[t], __fmul_rn(x[(u64)t * k + i0 + i], wv));
    }
    for (int t = 0; t < r; t++) y[(u64)t * m + j] = a[t];
}
