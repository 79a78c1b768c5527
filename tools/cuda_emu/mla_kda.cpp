// A host emulation of the MLA and KDA kernels (src/backend/cuda/kernels/mla_kda.cu), run
// through shim.h, against an f32 transcription of the CPU's code (backend/cpu/mla.rs,
// backend/cpu/kda.rs) on random inputs, with the launches of backend/cuda/mla_kda.rs. It
// checks the kernels' logic (indexing, synchronisation, the online softmax) where no GPU is
// found; the GPU tests (backend/cuda/tests.rs) remain the real check. Exit status 1 when MLA
// is off by more than 1e-5 of max|cpu| or the KDA scan is not bit for bit. Run by run.sh.
#include "shim.h"
#include "../../src/backend/cuda/kernels/mla_kda.cu"
#include <cstdio>
#include <random>
#include "check.h"
// ---- the CPU's MLA (backend/cpu/mla.rs), f32, sums in order
static void mla_cpu(int nh, int nope, int rope, int vd, int rank, float scale, const V& q, const V& K, const V* Vs,
                    const V& cache, int pos0, V& out) {
    int qh = nope + rope, n = q.size() / (nh * qh), width = rank + rope;
    std::vector<V> qa(nh, V(n * rank, 0.f));
    for (int h = 0; h < nh; h++)
        for (int t = 0; t < n; t++)
            for (int r = 0; r < rank; r++) {
                if (!Vs) {
                    float a = 0;
                    for (int i = 0; i < nope; i++) a += q[(t * nh + h) * qh + i] * K[((size_t)h * (nope + vd) + i) * rank + r];
                    qa[h][t * rank + r] = a;
                } else {
                    float a = 0;
                    for (int i = 0; i < nope; i++) a += K[((size_t)h * rank + r) * nope + i] * q[(t * nh + h) * qh + i];
                    qa[h][t * rank + r] = a;
                }
            }
    const V& Vm = Vs ? *Vs : K;
    int v_row0 = Vs ? 0 : nope, v_stride = Vs ? vd : nope + vd;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < nh; h++) {
            int p = pos0 + t;
            V sc(p + 1);
            for (int j = 0; j <= p; j++) {
                float a = 0, b = 0;
                for (int r = 0; r < rank; r++) a += qa[h][t * rank + r] * cache[(size_t)j * width + r];
                for (int r = 0; r < rope; r++) b += q[(t * nh + h) * qh + nope + r] * cache[(size_t)j * width + rank + r];
                sc[j] = (a + b) * scale;
            }
            float m = -INFINITY;
            for (float x : sc) m = std::max(m, x);
            double sum = 0;
            for (auto& x : sc) { x = std::exp(x - m); sum += x; }
            float inv = (float)(1.0 / sum);
            for (auto& x : sc) x *= inv;
            V ctx(rank, 0.f);
            for (int j = 0; j <= p; j++)
                for (int r = 0; r < rank; r++) ctx[r] += sc[j] * cache[(size_t)j * width + r];
            for (int k = 0; k < vd; k++) {
                float o = 0;
                for (int r = 0; r < rank; r++) o += Vm[((size_t)h * v_stride + v_row0 + k) * rank + r] * ctx[r];
                out[(t * nh + h) * vd + k] = o;
            }
        }
}
// ---- mla_kda.rs's launches, mirrored
static void head_dot(const float* w, u64 hs, u64 w0, int len, const float* x, int xs, int n, int nh, int width, float* out) {
    u64 outputs = (u64)n * nh * width;
    launch({(unsigned)((outputs + 7) / 8), 1, 1}, {256, 1, 1}, [=] { mla_head_dot(w, hs, w0, len, x, xs, n, nh, width, out); });
}
static void mla_dev(int nh, int nope, int rope, int vd, int rank, float scale, const V& q, const V& K, const V* Vs,
                    const V& lat, int pos0, V& out) {
    int qh = nope + rope, n = q.size() / (nh * qh);
    V qa(n * nh * rank), ctx(n * nh * rank);
    if (!Vs) {
        size_t total = (size_t)n * nh * rank;
        const float *qp = q.data(), *kp = K.data();
        float* qap = qa.data();
        launch({(unsigned)((total + 255) / 256), 1, 1}, {256, 1, 1}, [=] { mla_absorb_joint(qp, kp, n, nh, qh, nope, vd, rank, qap); });
    } else {
        head_dot(K.data(), (u64)rank * nope, 0, nope, q.data(), qh, n, nh, rank, qa.data());
    }
    {
        const float *qap = qa.data(), *qp = q.data(), *lp = lat.data();
        float* cp = ctx.data();
        launch({(unsigned)(n * nh), 1, 1}, {32 * MLA_WARPS, 1, 1}, [=] { mla_attention(qap, qp, lp, nh, qh, nope, rope, rank, pos0, scale, cp); });
    }
    if (!Vs) head_dot(K.data(), (u64)(nope + vd) * rank, (u64)nope * rank, rank, ctx.data(), rank, n, nh, vd, out.data());
    else head_dot(Vs->data(), (u64)vd * rank, 0, rank, ctx.data(), rank, n, nh, vd, out.data());
}
// ---- the CPU's KDA (backend/cpu/kda.rs delta_step)
static void kda_cpu(int heads, int dk, int dv, const V& q, const V& k, const V& v, const V& g, const V& beta, float* S, V& out) {
    int n = beta.size() / heads;
    for (int h = 0; h < heads; h++) {
        float* s = S + (size_t)h * dk * dv;
        for (int t = 0; t < n; t++) {
            size_t th = (size_t)t * heads + h;
            for (int i = 0; i < dk; i++) { float e = std::exp(g[th * dk + i]); for (int j = 0; j < dv; j++) s[i * dv + j] *= e; }
            V d(v.begin() + th * dv, v.begin() + (th + 1) * dv);
            for (int i = 0; i < dk; i++) for (int j = 0; j < dv; j++) d[j] -= s[i * dv + j] * k[th * dk + i];
            for (auto& x : d) x *= beta[th];
            float* o = &out[th * dv];
            for (int j = 0; j < dv; j++) o[j] = 0;
            for (int i = 0; i < dk; i++) for (int j = 0; j < dv; j++) { s[i * dv + j] += k[th * dk + i] * d[j]; o[j] += s[i * dv + j] * q[th * dk + i]; }
        }
    }
}
static void kda_dev(int heads, int dk, int dv, const V& q, const V& k, const V& v, const V& g, const V& beta, float* S, V& out) {
    int n = beta.size() / heads;
    const float *qp = q.data(), *kp = k.data(), *vp = v.data(), *gp = g.data(), *bp = beta.data();
    float* op = out.data();
    launch({(unsigned)heads, (unsigned)((dv + KDA_COLS - 1) / KDA_COLS), 1}, {KDA_COLS, 1, 1},
           [=] { kda_scan(qp, kp, vp, gp, bp, S, heads, dk, dv, n, op); });
}
static void l2(V& x, int d, float sc) {
    for (size_t r = 0; r < x.size(); r += d) {
        float ss = 0;
        for (int i = 0; i < d; i++) ss += x[r + i] * x[r + i];
        float inv = 1.f / std::sqrt(ss + 1e-6f);
        for (int i = 0; i < d; i++) x[r + i] *= inv * sc;
    }
}
int main() {
    rng.seed(5);
    int bad = 0;
    struct C { int nh, nope, rope, vd, rank; bool joint; };
    std::vector<C> cs = {{3, 24, 8, 20, 40, true}, {3, 24, 8, 20, 40, false}, {2, 64, 32, 48, 256, true},
                         {4, 128, 64, 128, 512, true}, {4, 128, 64, 128, 512, false}};
    for (auto c : cs) {
        int krows = c.joint ? c.nh * (c.nope + c.vd) : c.nh * c.rank, kcols = c.joint ? c.rank : c.nope;
        V K = rnd((size_t)krows * kcols, 4.f), Vw = rnd((size_t)c.nh * c.vd * c.rank, 4.f);
        double rms = 4 / std::sqrt(3.0);
        float scale = 1.0 / (rms * std::sqrt((double)c.nope * c.rank));
        int positions = 310, qh = c.nope + c.rope;
        V lat = rnd((size_t)positions * (c.rank + c.rope), 2.f);
        int steps[4][2] = {{0, 5}, {5, 1}, {6, 3}, {300, 1}};
        for (auto& st : steps) {
            int pos0 = st[0], n = st[1];
            V q = rnd((size_t)n * c.nh * qh, 2.f);
            V want(n * c.nh * c.vd), got(n * c.nh * c.vd, NAN);
            mla_cpu(c.nh, c.nope, c.rope, c.vd, c.rank, scale, q, K, c.joint ? nullptr : &Vw, lat, pos0, want);
            mla_dev(c.nh, c.nope, c.rope, c.vd, c.rank, scale, q, K, c.joint ? nullptr : &Vw, lat, pos0, got);
            double e = worst_rel(got, want);
            bad |= !(e <= 1e-5);
            printf("mla %d heads, nope %d, rope %d, v %d, rank %d, joint %d, %d rows at %d: %.3e\n", c.nh, c.nope, c.rope, c.vd, c.rank, c.joint, n, pos0, e);
        }
    }
    int kc[3][4] = {{4, 128, 128, 7}, {3, 40, 72, 5}, {2, 256, 64, 3}};
    for (auto& c : kc) {
        int heads = c[0], dk = c[1], dv = c[2], n = c[3];
        V s0 = rnd((size_t)heads * dk * dv, 1.f), s1 = s0;
        V q = rnd((size_t)n * heads * dk, 2.f), k = rnd((size_t)n * heads * dk, 2.f), v = rnd((size_t)n * heads * dv, 2.f);
        l2(q, dk, 1.f / std::sqrt((float)dk));
        l2(k, dk, 1.f);
        V g = rnd((size_t)n * heads * dk, 2.f), beta = rnd((size_t)n * heads, 2.f);
        for (auto& x : g) x = -0.15f * (x + 2.f);
        for (auto& x : beta) x = 1.f / (1.f + std::exp(-x));
        V want(n * heads * dv), got(n * heads * dv, NAN);
        kda_cpu(heads, dk, dv, q, k, v, g, beta, s0.data(), want);
        kda_dev(heads, dk, dv, q, k, v, g, beta, s1.data(), got);
        double e = worst_rel(got, want), es = worst_rel(s1, s0);
        bad |= e != 0.0 || es != 0.0;
        printf("kda %d heads of %d x %d, %d tokens: out %.3e, state %.3e\n", heads, dk, dv, n, e, es);
    }
    printf(bad ? "FAILED\n" : "ok\n");
    return bad;
}
