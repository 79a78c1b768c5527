// Row and element-wise operations of the spine, each the CPU's formula (backend/cpu/ops.rs,
// gelu.rs, device.rs) with the same f32 operations where the CUDA library allows: products
// and sums written with __fmul_rn / __fadd_rn where the compiler could otherwise fuse them;
// expf / tanhf / sin / cos are CUDA's (within 2 ulp of the correctly rounded value).

// RMSNorm of row blockIdx.x (d wide): out = x * (1 / sqrt(mean(x²) + eps)) * w, the sum of
// squares in f64 as on the CPU. blockDim.x = 256.
extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float eps, int d,
                                    float* __restrict__ out) {
    __shared__ double part[256];
    const float* xr = x + (u64)blockIdx.x * d;
    float* o = out + (u64)blockIdx.x * d;
    double ss = 0.0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += (double)xr[i] * (double)xr[i];
    part[threadIdx.x] = ss;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    const float scale = 1.0f / sqrtf((float)(part[0] / (double)d) + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
}

// RoPE over `rows` rows of `width` floats (heads of head_dim = 2 * half), row t at position
// pos0 + t (rope) or pos[t] (rope_rows: several sequences' rows in one launch): θ = pos ·
// inv_freq[i] in f64, rotated as NeoX halves (i, i + half) or interleaved pairs (2i, 2i + 1),
// then × scale when scale ≠ 1. One thread per rotated pair.
__device__ __forceinline__ void rope_pair(float* x, int width, int half, int t, int k, int pos,
                                          const float* __restrict__ inv_freq, int interleaved, float scale) {
    const int head = k / half, i = k % half;
    const double theta = (double)pos * (double)inv_freq[i];
    const float s = (float)sin(theta), c = (float)cos(theta);
    float* h = x + (u64)t * width + (u64)head * 2 * half;
    const int ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
    const float a = h[ia], b = h[ib];
    float ra = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    float rb = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
    if (scale != 1.0f) {
        ra = __fmul_rn(ra, scale);
        rb = __fmul_rn(rb, scale);
    }
    h[ia] = ra;
    h[ib] = rb;
}

extern "C" __global__ void rope(float* x, int rows, int width, int half, int pos0, const float* __restrict__ inv_freq,
                                int interleaved, float scale) {
    const u64 p = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const int pairs = width / 2;
    if (p >= (u64)rows * pairs) return;
    const int t = (int)(p / pairs), k = (int)(p % pairs);
    rope_pair(x, width, half, t, k, pos0 + t, inv_freq, interleaved, scale);
}

extern "C" __global__ void rope_rows(float* x, int rows, int width, int half, const int* __restrict__ pos,
                                     const float* __restrict__ inv_freq, int interleaved, float scale) {
    const u64 p = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const int pairs = width / 2;
    if (p >= (u64)rows * pairs) return;
    const int t = (int)(p / pairs), k = (int)(p % pairs);
    rope_pair(x, width, half, t, k, pos[t], inv_freq, interleaved, scale);
}

// Several sequences' new keys and values into their cache slots in one launch: row blockIdx.x
// of k (blockIdx.y 0) or v (1), `width` floats, copied to the address dst[blockIdx.y · rows +
// blockIdx.x] (rows = gridDim.x).
extern "C" __global__ void write_kv_rows(const float* __restrict__ k, const float* __restrict__ v,
                                         const u64* __restrict__ dst, int width) {
    const u64 r = blockIdx.x, rows = gridDim.x;
    const float* s = (blockIdx.y ? v : k) + r * width;
    float* d = (float*)dst[blockIdx.y * rows + r];
    for (int i = threadIdx.x; i < width; i += blockDim.x) d[i] = s[i];
}

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// The CPU's GELU-tanh (backend/cpu/gelu.rs, gelu_scalar): x / (1 + e^z), z = x (A + B x²)
// clamped to [-86, 88], e^z by Cody-Waite reduction and a degree-7 polynomial.
__device__ __forceinline__ float gelu_tanh(float x) {
    const float A = -1.5957692f, B = -0.071354814f;
    const float LOG2E = 1.4426950408889634f, LN2_HI = 0.69335938f, LN2_LO = -2.1219444e-4f;
    float z = __fmul_rn(x, fmaf(B, __fmul_rn(x, x), A));
    z = fminf(fmaxf(z, -86.0f), 88.0f);
    const float n = rintf(__fmul_rn(z, LOG2E));
    const float r = fmaf(n, -LN2_LO, fmaf(n, -LN2_HI, z));
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(fmaf(p, r, 1.0f), r, 1.0f);
    const float e = __uint_as_float(__float_as_uint(p) + (u32)(((int)n) << 23));
    return __fdiv_rn(x, __fadd_rn(1.0f, e));
}

// gate ← act(gate) · up over n elements. act: 0 SwiGLU, 1 GeGLU (tanh), 2 SiTU (beta,
// linear_beta as backend::Glu::Situ).
extern "C" __global__ void glu(float* g, const float* __restrict__ up, u64 n, int act, float beta, float linear_beta) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = g[i], u = up[i];
    float v;
    if (act == 0) {
        v = __fmul_rn(__fdiv_rn(x, __fadd_rn(1.0f, expf(-x))), u);
    } else if (act == 1) {
        v = __fmul_rn(gelu_tanh(x), u);
    } else {
        const float a = __fmul_rn(__fmul_rn(beta, tanhf(__fdiv_rn(x, beta))), sigmoidf(x));
        const float l = linear_beta > 0.0f ? __fmul_rn(linear_beta, tanhf(__fdiv_rn(u, linear_beta))) : u;
        v = __fmul_rn(a, l);
    }
    g[i] = v;
}

// x ← cap · tanh(x / cap).
extern "C" __global__ void softcap(float* x, u64 n, float cap) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fmul_rn(cap, tanhf(__fdiv_rn(x[i], cap)));
}

// x ← x + y.
extern "C" __global__ void add(float* x, const float* __restrict__ y, u64 n) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fadd_rn(x[i], y[i]);
}

// out[i] = x[rows[i]] for `width`-wide rows, i < n.
extern "C" __global__ void gather_rows(const float* __restrict__ x, int width, const u32* __restrict__ rows, int n,
                                       float* __restrict__ out) {
    const u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (u64)n * width) return;
    const u64 i = e / width, j = e % width;
    out[e] = x[(u64)rows[i] * width + j];
}

// out[rows[i]] += weights[i] · y[i] for i < n in ascending i (one thread per column, so a
// row named twice adds in order, as on the CPU).
extern "C" __global__ void scatter_add_rows(const float* __restrict__ y, int width, const u32* __restrict__ rows,
                                            const float* __restrict__ weights, int n, float* out) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= width) return;
    for (int i = 0; i < n; i++) {
        float* o = out + (u64)rows[i] * width + j;
        *o = __fadd_rn(*o, __fmul_rn(weights[i], y[(u64)i * width + j]));
    }
}
