// Host emulation (tools/cuda_emu/run.sh) of the few CUDA features the MLA / KDA kernels use:
// one OS thread per CUDA thread, blocks run one after another, __shared__ as static (one
// block at a time), __syncthreads and warp shuffles through std::barrier.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned char u8;
struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __restrict__
#define __shared__ static
static std::barrier<>* g_block;
static std::barrier<>* g_warp[32];
static float g_shfl[1024];
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __int_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline void __syncthreads() { g_block->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int o) {
    int t = threadIdx.x, w = t >> 5;
    g_shfl[t] = v;
    g_warp[w]->arrive_and_wait();
    float r = g_shfl[t ^ o];
    g_warp[w]->arrive_and_wait();
    return r;
}
using std::max; using std::min;
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
#define NEG_INF __int_as_float(0xff800000)
template <class F>
void launch(dim3 grid, dim3 block, F f) {
    gridDim = grid;
    blockDim = block;
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            std::barrier<> bb(block.x);
            g_block = &bb;
            std::vector<std::unique_ptr<std::barrier<>>> wb;
            for (unsigned w = 0; w * 32 < block.x; w++) {
                wb.emplace_back(new std::barrier<>(std::min(32u, block.x - 32 * w)));
                g_warp[w] = wb.back().get();
            }
            std::vector<std::thread> ts;
            for (unsigned t = 0; t < block.x; t++)
                ts.emplace_back([=] {
                    threadIdx.x = t;
                    blockIdx.x = bx;
                    blockIdx.y = by;
                    f();
                    g_warp[t >> 5]->arrive_and_drop();
                    g_block->arrive_and_drop();
                });
            for (auto& t : ts) t.join();
        }
}
