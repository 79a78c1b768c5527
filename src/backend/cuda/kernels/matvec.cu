// Products of a weight matrix in its stored encoding with 1 to 8 activation rows, and
// row dequantization (embedding rows; f32 panels for the cuBLAS path).
//
// mv_<type>_<R>: y[t][r] = dot(W[r], x[t]) for t < R. One warp per output row r: four lanes
// share each unit of 32 weights (decode8 in decode.cuh), each lane multiplies its 8 decoded
// values into its R accumulators (fma, f32); the 32 lanes are summed by a butterfly of
// shuffles. Each
// weight byte is read once per launch whatever R is, so a decode step (R = 1) and a small
// batch (R ≤ 8) read the matrix once.

#define MV_WARPS 8

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Lane l takes part l % 4 of units l / 4, l / 4 + 8, ... (decode8), so a warp's loads of
// weights and of x cover 8 consecutive units at a time.
template <int T, int R>
__device__ __forceinline__ void matvec(const u8* __restrict__ W, u64 row_bytes, int rows, int cols,
                                       const float* __restrict__ x, float* __restrict__ y) {
    const int r = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const u8* row = W + (u64)r * row_bytes;
    const int p = lane & 3;
    const bool vec = (cols & 3) == 0 && (((u64)x) & 15) == 0;
    float acc[R];
#pragma unroll
    for (int t = 0; t < R; t++) acc[t] = 0.0f;
    const int units = (cols + 31) >> 5;
    for (int u = lane >> 2; u < units; u += 8) {
        float w[8];
        decode8<T>(row, u, p, cols, w);
        const int a = (u << 5) + part_a<T>(p), b = (u << 5) + part_b<T>(p);
        if (vec && (whole_units<T>() || b + 4 <= cols)) {
#pragma unroll
            for (int t = 0; t < R; t++) {
                const float* xr = x + (u64)t * cols;
                const float4 xa = __ldg((const float4*)(xr + a)), xb = __ldg((const float4*)(xr + b));
                float s = acc[t];
                s = fmaf(w[0], xa.x, s);
                s = fmaf(w[1], xa.y, s);
                s = fmaf(w[2], xa.z, s);
                s = fmaf(w[3], xa.w, s);
                s = fmaf(w[4], xb.x, s);
                s = fmaf(w[5], xb.y, s);
                s = fmaf(w[6], xb.z, s);
                s = fmaf(w[7], xb.w, s);
                acc[t] = s;
            }
        } else {
#pragma unroll
            for (int t = 0; t < R; t++) {
                const float* xr = x + (u64)t * cols;
                for (int i = 0; i < 4; i++) {
                    if (a + i < cols) acc[t] = fmaf(w[i], __ldg(xr + a + i), acc[t]);
                    if (b + i < cols) acc[t] = fmaf(w[4 + i], __ldg(xr + b + i), acc[t]);
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < R; t++) {
        const float v = warp_sum(acc[t]);
        if (lane == 0) y[(u64)t * rows + r] = v;
    }
}

// Rows of W decoded to f32: output row i is W's row ids[i] (ids non-null) or row0 + i.
// Grid: x over units (blockDim.x threads each), y over output rows (strided).
template <int T>
__device__ __forceinline__ void dequant_rows(const u8* __restrict__ W, u64 row_bytes, int cols,
                                             const u32* __restrict__ ids, int row0, int n, float* __restrict__ out) {
    const int u = blockIdx.x * blockDim.x + threadIdx.x;
    const int units = (cols + 31) >> 5;
    if (u >= units) return;
    const int e0 = u << 5;
    const int cnt = min(32, cols - e0);
    for (int i = blockIdx.y; i < n; i += gridDim.y) {
        const u64 src = ids ? (u64)ids[i] : (u64)(row0 + i);
        float w[32];
        decode32<T>(W + src * row_bytes, u, cols, w);
        float* o = out + (u64)i * cols + e0;
        for (int k = 0; k < cnt; k++) o[k] = w[k];
    }
}

#define MV_KERNEL(name, T, R)                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS)                                      \
        mv_##name##_##R(const u8* W, u64 row_bytes, int rows, int cols, const float* x, float* y) { \
        matvec<T, R>(W, row_bytes, rows, cols, x, y);                                                \
    }

#define TYPE_KERNELS(name, T)                                                                         \
    MV_KERNEL(name, T, 1)                                                                             \
    MV_KERNEL(name, T, 2)                                                                             \
    MV_KERNEL(name, T, 4)                                                                             \
    MV_KERNEL(name, T, 8)                                                                             \
    extern "C" __global__ void deq_##name(const u8* W, u64 row_bytes, int cols, const u32* ids, int row0, \
                                          int n, float* out) {                                        \
        dequant_rows<T>(W, row_bytes, cols, ids, row0, n, out);                                       \
    }

TYPE_KERNELS(f32, T_F32)
TYPE_KERNELS(f16, T_F16)
TYPE_KERNELS(bf16, T_BF16)
TYPE_KERNELS(q8_0, T_Q8_0)
TYPE_KERNELS(q4_0, T_Q4_0)
TYPE_KERNELS(q5_0, T_Q5_0)
TYPE_KERNELS(q4_k, T_Q4_K)
TYPE_KERNELS(q6_k, T_Q6_K)
TYPE_KERNELS(mxfp4, T_MXFP4)
TYPE_KERNELS(f8b128, T_F8B128)
