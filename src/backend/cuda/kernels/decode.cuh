// Deltafin CUDA kernels: block decoders of the stored weight encodings.
//
// Compiled at run time by NVRTC (src/backend/cuda/kernels.rs joins the files of this folder
// into one program), so no header is included: the integer types and the half-precision
// conversion are defined here.
//
// The layouts are the GGML/GGUF ones that src/quant/scalar.rs documents, and every decoder
// computes each value with the same f32 operations as that file's scalar decoder
// (`__fmul_rn` / `__fsub_rn` where the compiler could otherwise fuse a multiply and an add),
// so a decoded row equals the CPU's `quant::dequantize_row` bit for bit.
//
// A row is decoded in units of 32 consecutive elements: unit `u` holds elements
// `32u .. 32u + 32` (fewer for the last unit of a float or FP8 row whose length is not a
// multiple of 32; the missing values are zero).

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// Type codes: the order of `cuda::kernels::KernelType` in Rust.
#define T_F32 0
#define T_F16 1
#define T_BF16 2
#define T_Q8_0 3
#define T_Q4_0 4
#define T_Q5_0 5
#define T_Q4_K 6
#define T_Q6_K 7
#define T_MXFP4 8
#define T_F8B128 9

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }

// A little-endian u16 at an even address.
__device__ __forceinline__ u16 ld16(const u8* p) { return *(const u16*)p; }

// E8M0 scale byte times one half: 2^(e - 128) (quant::scalar::e8m0_half).
__device__ __forceinline__ float e8m0_half(u8 e) {
    return e < 2 ? __uint_as_float(0x00200000u << e) : __uint_as_float(((u32)e - 1) << 23);
}

// E2M1 value of nibble q, doubled (quant::scalar::MXFP4_VALUES): magnitudes 0, 1, 2, 3, 4, 6,
// 8, 12 packed in nibbles (a table in constant memory would serialize the lanes' different
// indices), bit 3 the sign; an int, so that -0 is +0 as in the table.
__device__ __forceinline__ float mxfp4_value(u32 q) {
    const int m = (int)((0xC8643210u >> (4 * (q & 7))) & 15);
    return (float)((q & 8) ? -m : m);
}

// One E4M3 byte as f32, exactly (quant::fp8::format::e4m3_bits).
__device__ __forceinline__ float e4m3_to_f32(u8 b) {
    u32 sign = ((u32)(b & 0x80)) << 24;
    u32 e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return __uint_as_float(sign | 0x7FC00000u);
    if (e == 0) {
        if (m == 0) return __uint_as_float(sign);
        u32 p = 31 - __clz(m);
        return __uint_as_float(sign | ((127 - 9 + p) << 23) | ((m << (23 - p)) & 0x7FFFFF));
    }
    return __uint_as_float(sign | ((e + 120) << 23) | (m << 20));
}

// Decodes unit `u` of `row` (a row of `cols` elements of type T) into w[0..32].
template <int T>
__device__ __forceinline__ void decode32(const u8* __restrict__ row, int u, int cols, float* w) {
    const int e0 = u << 5;
    const int n = min(32, cols - e0);
    if (T == T_F32) {
        const float* p = (const float*)row + e0;
        if (n == 32 && (((u64)p) & 15) == 0) {
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 v = ((const float4*)p)[i];
                w[4 * i] = v.x;
                w[4 * i + 1] = v.y;
                w[4 * i + 2] = v.z;
                w[4 * i + 3] = v.w;
            }
        } else {
            for (int i = 0; i < 32; i++) w[i] = i < n ? p[i] : 0.0f;
        }
    } else if (T == T_F16 || T == T_BF16) {
        const u16* p = (const u16*)row + e0;
        if (n == 32 && (((u64)p) & 15) == 0) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint4 v = ((const uint4*)p)[i];
                u32 q[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    u16 lo = (u16)(q[j] & 0xFFFF), hi = (u16)(q[j] >> 16);
                    w[8 * i + 2 * j] = T == T_F16 ? f16_to_f32(lo) : bf16_to_f32(lo);
                    w[8 * i + 2 * j + 1] = T == T_F16 ? f16_to_f32(hi) : bf16_to_f32(hi);
                }
            }
        } else {
            for (int i = 0; i < 32; i++)
                w[i] = i < n ? (T == T_F16 ? f16_to_f32(p[i]) : bf16_to_f32(p[i])) : 0.0f;
        }
    } else if (T == T_Q8_0) {
        const u8* b = row + 34 * u;
        const float d = f16_to_f32(ld16(b));
#pragma unroll
        for (int i = 0; i < 16; i++) {
            u16 q = ld16(b + 2 + 2 * i);
            w[2 * i] = d * (float)(i8)(q & 0xFF);
            w[2 * i + 1] = d * (float)(i8)(q >> 8);
        }
    } else if (T == T_Q4_0) {
        const u8* b = row + 18 * u;
        const float d = f16_to_f32(ld16(b));
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u16 q = ld16(b + 2 + 2 * i);
            u8 q0 = q & 0xFF, q1 = q >> 8;
            w[2 * i] = d * (float)((int)(q0 & 15) - 8);
            w[2 * i + 1] = d * (float)((int)(q1 & 15) - 8);
            w[2 * i + 16] = d * (float)((int)(q0 >> 4) - 8);
            w[2 * i + 17] = d * (float)((int)(q1 >> 4) - 8);
        }
    } else if (T == T_Q5_0) {
        const u8* b = row + 22 * u;
        const float d = f16_to_f32(ld16(b));
        const u32 qh = (u32)ld16(b + 2) | ((u32)ld16(b + 4) << 16);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u16 q = ld16(b + 6 + 2 * i);
#pragma unroll
            for (int k = 0; k < 2; k++) {
                const int j = 2 * i + k;
                const u8 qb = k == 0 ? (q & 0xFF) : (q >> 8);
                const u32 lo = (qb & 15) | (((qh >> j) & 1) << 4);
                const u32 hi = (qb >> 4) | (((qh >> (j + 16)) & 1) << 4);
                w[j] = d * (float)((int)lo - 16);
                w[j + 16] = d * (float)((int)hi - 16);
            }
        }
    } else if (T == T_MXFP4) {
        const u8* b = row + 17 * u;
        const float d = e8m0_half(b[0]);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const u8 q = b[1 + j];
            w[j] = d * mxfp4_value(q & 15);
            w[j + 16] = d * mxfp4_value(q >> 4);
        }
    } else if (T == T_Q4_K) {
        const u8* b = row + 144 * (u >> 3);
        const int r = u & 7;
        const float d = f16_to_f32(ld16(b));
        const float dmin = f16_to_f32(ld16(b + 2));
        const u8* s = b + 4;
        u32 sc, m;
        if (r < 4) {
            sc = s[r] & 63;
            m = s[r + 4] & 63;
        } else {
            sc = (s[r + 4] & 15) | ((s[r - 4] >> 6) << 4);
            m = (s[r + 4] >> 4) | ((s[r] >> 6) << 4);
        }
        const float d1 = d * (float)sc;
        const float m1 = dmin * (float)m;
        const uint4* qs = (const uint4*)(b + 16 + 32 * (r >> 1));
        const int shift = 4 * (r & 1);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            uint4 v = qs[i];
            u32 q[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const u32 byte = (q[j >> 2] >> (8 * (j & 3))) & 0xFF;
                w[16 * i + j] = __fsub_rn(__fmul_rn(d1, (float)((byte >> shift) & 15)), m1);
            }
        }
    } else if (T == T_Q6_K) {
        const u8* b = row + 210 * (u >> 3);
        const int s = u & 7;
        const int h = s >> 2;
        const float d = f16_to_f32(ld16(b + 208));
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int c = 2 * (s & 3) + half;
            const u8* lo = b + 64 * h + 16 * (c & 3);
            const u8* hi = b + 128 + 32 * h + 16 * (c & 1);
            const int ns = 4 * (c >> 2), hs = 2 * (c >> 1);
            const float ds = d * (float)(i8)b[192 + 8 * h + c];
#pragma unroll
            for (int k = 0; k < 16; k++) {
                const int q = ((lo[k] >> ns) & 15) | (((hi[k] >> hs) & 3) << 4);
                w[16 * half + k] = ds * (float)(q - 32);
            }
        }
    } else if (T == T_F8B128) {
        // blocks of a 4-byte f32 scale then 128 bytes (the last block may be shorter)
        const int blk = e0 >> 7;
        const u8* b = row + 132 * blk;
        const float scale = __uint_as_float((u32)b[0] | ((u32)b[1] << 8) | ((u32)b[2] << 16) | ((u32)b[3] << 24));
        const u8* q = b + 4 + (e0 & 127);
        for (int i = 0; i < 32; i++) w[i] = i < n ? e4m3_to_f32(q[i]) * scale : 0.0f;
    }
}

// Whether the type's units are whole blocks that never run past the row (every quantized
// GGUF type: rows are whole blocks of 32 or 256).
template <int T>
__device__ __forceinline__ bool whole_units() {
    return T != T_F32 && T != T_F16 && T != T_BF16 && T != T_F8B128;
}

// The matrix-vector kernels split a unit among 4 lanes: part p (0..4) of unit u is 8 values,
// w[0..4] the elements at e0 + part_a(p) .. + 4 and w[4..8] those at e0 + part_b(p) .. + 4
// (e0 = 32u): 8 consecutive elements, or for the types whose bytes hold element j and j + 16
// (Q4_0, Q5_0, MXFP4) bytes 4p .. 4p + 4 of the nibbles. Same values as decode32.
template <int T>
__device__ __forceinline__ bool split_nibbles() {
    return T == T_Q4_0 || T == T_Q5_0 || T == T_MXFP4;
}
template <int T>
__device__ __forceinline__ int part_a(int p) {
    return split_nibbles<T>() ? 4 * p : 8 * p;
}
template <int T>
__device__ __forceinline__ int part_b(int p) {
    return split_nibbles<T>() ? 16 + 4 * p : 8 * p + 4;
}

template <int T>
__device__ __forceinline__ void decode8(const u8* __restrict__ row, int u, int p, int cols, float* w) {
    const int e0 = u << 5;
    const int e = e0 + 8 * p;     // the first element of a contiguous part
    const int n = max(0, min(8, cols - e));
    if (T == T_F32) {
        const float* q = (const float*)row + e;
        if (n == 8 && (((u64)q) & 15) == 0) {
            const float4 a = ((const float4*)q)[0], b = ((const float4*)q)[1];
            w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
            w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
        } else {
            for (int i = 0; i < 8; i++) w[i] = i < n ? q[i] : 0.0f;
        }
    } else if (T == T_F16 || T == T_BF16) {
        const u16* q = (const u16*)row + e;
        if (n == 8 && (((u64)q) & 15) == 0) {
            const uint4 v = *(const uint4*)q;
            const u32 h[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const u16 lo = (u16)(h[j] & 0xFFFF), hi = (u16)(h[j] >> 16);
                w[2 * j] = T == T_F16 ? f16_to_f32(lo) : bf16_to_f32(lo);
                w[2 * j + 1] = T == T_F16 ? f16_to_f32(hi) : bf16_to_f32(hi);
            }
        } else {
            for (int i = 0; i < 8; i++)
                w[i] = i < n ? (T == T_F16 ? f16_to_f32(q[i]) : bf16_to_f32(q[i])) : 0.0f;
        }
    } else if (T == T_Q8_0) {
        const u8* b = row + 34 * u;
        const float d = f16_to_f32(ld16(b));
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const u16 q = ld16(b + 2 + 8 * p + 2 * i);
            w[2 * i] = d * (float)(i8)(q & 0xFF);
            w[2 * i + 1] = d * (float)(i8)(q >> 8);
        }
    } else if (T == T_Q4_0) {
        const u8* b = row + 18 * u;
        const float d = f16_to_f32(ld16(b));
        const u32 q = (u32)ld16(b + 2 + 4 * p) | ((u32)ld16(b + 4 + 4 * p) << 16);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const u32 qb = (q >> (8 * i)) & 0xFF;
            w[i] = d * (float)((int)(qb & 15) - 8);
            w[4 + i] = d * (float)((int)(qb >> 4) - 8);
        }
    } else if (T == T_Q5_0) {
        const u8* b = row + 22 * u;
        const float d = f16_to_f32(ld16(b));
        const u32 qh = (u32)ld16(b + 2) | ((u32)ld16(b + 4) << 16);
        const u32 q = (u32)ld16(b + 6 + 4 * p) | ((u32)ld16(b + 8 + 4 * p) << 16);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int j = 4 * p + i;
            const u32 qb = (q >> (8 * i)) & 0xFF;
            const u32 lo = (qb & 15) | (((qh >> j) & 1) << 4);
            const u32 hi = (qb >> 4) | (((qh >> (j + 16)) & 1) << 4);
            w[i] = d * (float)((int)lo - 16);
            w[4 + i] = d * (float)((int)hi - 16);
        }
    } else if (T == T_MXFP4) {
        const u8* b = row + 17 * u;
        const float d = e8m0_half(b[0]);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const u32 q = b[1 + 4 * p + i];
            w[i] = d * mxfp4_value(q & 15);
            w[4 + i] = d * mxfp4_value(q >> 4);
        }
    } else if (T == T_Q4_K) {
        const u8* b = row + 144 * (u >> 3);
        const int r = u & 7;
        const float d = f16_to_f32(ld16(b));
        const float dmin = f16_to_f32(ld16(b + 2));
        const u8* s = b + 4;
        u32 sc, m;
        if (r < 4) {
            sc = s[r] & 63;
            m = s[r + 4] & 63;
        } else {
            sc = (s[r + 4] & 15) | ((s[r - 4] >> 6) << 4);
            m = (s[r + 4] >> 4) | ((s[r] >> 6) << 4);
        }
        const float d1 = d * (float)sc;
        const float m1 = dmin * (float)m;
        const uint2 v = *(const uint2*)(b + 16 + 32 * (r >> 1) + 8 * p);
        const int shift = 4 * (r & 1);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const u32 byte = ((i < 4 ? v.x : v.y) >> (8 * (i & 3))) & 0xFF;
            w[i] = __fsub_rn(__fmul_rn(d1, (float)((byte >> shift) & 15)), m1);
        }
    } else if (T == T_Q6_K) {
        const u8* b = row + 210 * (u >> 3);
        const int s = u & 7, h = s >> 2;
        const int c = 2 * (s & 3) + (p >> 1);
        const int k0 = 8 * (p & 1);
        const u8* lo = b + 64 * h + 16 * (c & 3) + k0;
        const u8* hi = b + 128 + 32 * h + 16 * (c & 1) + k0;
        const int ns = 4 * (c >> 2), hs = 2 * (c >> 1);
        const float ds = f16_to_f32(ld16(b + 208)) * (float)(i8)b[192 + 8 * h + c];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int q = ((lo[k] >> ns) & 15) | (((hi[k] >> hs) & 3) << 4);
            w[k] = ds * (float)(q - 32);
        }
    } else if (T == T_F8B128) {
        const u8* b = row + 132 * (e >> 7);
        const float scale = __uint_as_float((u32)b[0] | ((u32)b[1] << 8) | ((u32)b[2] << 16) | ((u32)b[3] << 24));
        const u8* q = b + 4 + (e & 127);
        for (int i = 0; i < 8; i++) w[i] = i < n ? e4m3_to_f32(q[i]) * scale : 0.0f;
    }
}
