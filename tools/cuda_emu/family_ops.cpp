// A host emulation of the family ops' kernels (src/backend/cuda/kernels/family_ops.cu), run
// through shim.h with the launches of backend/cuda/family_ops.rs, against f32 transcriptions
// of the CPU's code (backend/cpu/device.rs and the kernels it calls: ops.rs rms_norm, mla.rs
// rope_slice, kda.rs short_conv_silu / l2norm_eps / decay / sigmoid, blocks.rs gated_head_norm
// / res_mix / swiglu_oai, mod.rs matmul_t) on random inputs. Both sides call the host's
// expf / logf / sin / cos here, so what differs is the kernels' indexing, synchronisation and
// summation order: the ops whose kernels sum in the CPU's order must match bit for bit, the
// others (f64 block sums: RMSNorms, res_mix) within 1e-5 of max|cpu| (the GPU tests' bound).
// Exit status 1 otherwise.
// Run by run.sh.
#include "shim.h"
inline float __fdiv_rn(float a, float b) { return a / b; }
#include "../../src/backend/cuda/kernels/family_ops.cu"
#include <algorithm>
#include <cstdio>
#include <random>
#include "check.h"
static bool same_bits(const V& a, const V& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * 4) == 0;
}
static int bad = 0;
static void report(const char* what, const V& got, const V& want, bool exact) {
    double e = worst_rel(got, want);
    bool eq = same_bits(got, want);
    bool ok = exact ? eq : e <= 1e-5;
    bad |= !ok;
    printf("%-44s %s %.3e%s\n", what, eq ? "bit for bit," : "rel", e, ok ? "" : "  <-- FAILED");
}
static unsigned blocks_of(size_t n) { return (unsigned)((n + 255) / 256); }
static float sigm(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// ---- the CPU's formulas
static void rms_norm_cpu(float* x, const float* w, int d, float eps, const float* gate) {
    double ss = 0;
    for (int i = 0; i < d; i++) ss += (double)x[i] * (double)x[i];
    float scale = 1.0f / std::sqrt((float)(ss / d) + eps);
    for (int i = 0; i < d; i++) {
        float y = x[i] * scale * w[i];
        if (gate) y = y * sigm(gate[i]);
        x[i] = y;
    }
}
static void rope_tail_cpu(V& x, int rows, int width, int pos0, const V& f, bool il, float scale) {
    int half = f.size(), row = x.size() / rows;
    for (int t = 0; t < rows; t++)
        for (int s = 0; s < row / width; s++) {
            float* h = &x[(size_t)t * row + s * width + width - 2 * half];
            if (il) {
                V tmp(2 * half);
                for (int i = 0; i < half; i++) { tmp[i] = h[2 * i]; tmp[half + i] = h[2 * i + 1]; }
                memcpy(h, tmp.data(), 8 * half);
            }
            for (int i = 0; i < half; i++) {
                double th = (double)(pos0 + t) * (double)f[i];
                float sn = (float)std::sin(th), c = (float)std::cos(th);
                float a = h[i], b = h[i + half];
                h[i] = a * c - b * sn;
                h[i + half] = a * sn + b * c;
            }
            if (scale != 1.0f)
                for (int i = 0; i < 2 * half; i++) h[i] *= scale;
        }
}
static void conv_cpu(V& q, V& k, V& v, int rows, const V& taps, int conv, V& state) {
    int dim = q.size() / rows, ch = 3 * dim;
    V ext((size_t)(conv - 1 + rows) * ch);
    memcpy(ext.data(), state.data(), 4 * (size_t)(conv - 1) * ch);
    for (int t = 0; t < rows; t++)
        for (int i = 0; i < 3; i++)
            memcpy(&ext[(size_t)(conv - 1 + t) * ch + i * dim], &(i == 0 ? q : i == 1 ? k : v)[(size_t)t * dim], 4 * dim);
    for (int t = 0; t < rows; t++)
        for (int c = 0; c < ch; c++) {
            float acc = 0;
            for (int j = 0; j < conv; j++) acc += taps[c * conv + j] * ext[(size_t)(t + j) * ch + c];
            V& m = c < dim ? q : c < 2 * dim ? k : v;
            m[(size_t)t * dim + c % dim] = acc / (1.0f + std::exp(-acc));
        }
    memcpy(state.data(), &ext[(size_t)rows * ch], 4 * (size_t)(conv - 1) * ch);
}
static void l2_cpu(V& x, int d, float eps, float scale) {
    for (size_t h = 0; h < x.size(); h += d) {
        float ss = 0;
        for (int i = 0; i < d; i++) ss += x[h + i] * x[h + i];
        float inv = 1.0f / std::sqrt(ss + eps);
        for (int i = 0; i < d; i++) x[h + i] *= inv;
        if (scale != 1.0f)
            for (int i = 0; i < d; i++) x[h + i] *= scale;
    }
}
static void decay_cpu(V& g, const V& a_log, const V& dt, bool has_lb, float lb) {
    int dim = dt.size(), dk = dim / a_log.size();
    for (size_t e = 0; e < g.size(); e++) {
        int i = e % dim;
        float a = std::exp(a_log[i / dk]), x = g[e] + dt[i];
        float sp = x > 20.0f ? x : std::log(1.0f + std::exp(x));
        g[e] = has_lb ? lb * sigm(a * x) : -a * sp;
    }
}
static void res_mix_cpu(const std::vector<V>& bank, const V& cur, const V& w, float eps, V& out) {
    int d = w.size(), nb = bank.size();
    for (size_t t = 0; t < cur.size() / d; t++) {
        V p(nb + 1);
        for (int s = 0; s <= nb; s++) {
            const float* x = (s < nb ? bank[s].data() : cur.data()) + t * d;
            float ss = 0;
            for (int e = 0; e < d; e++) ss += x[e] * x[e];
            float r = 1.0f / std::sqrt(ss / (float)d + eps), sc = 0;
            for (int e = 0; e < d; e++) sc += x[e] * r * w[e];
            p[s] = sc;
        }
        float m = -INFINITY, sum = 0;
        for (float x : p) m = std::max(m, x);
        for (auto& x : p) { x = std::exp(x - m); sum += x; }
        for (auto& x : p) x /= sum;
        for (int e = 0; e < d; e++) {
            float y = 0;
            for (int s = 0; s < nb; s++) y += bank[s][t * d + e] * p[s];
            out[t * d + e] = y + cur[t * d + e] * p[nb];
        }
    }
}
static float swiglu_cpu(float g, float u, float alpha, float limit) {
    g = std::fmin(g, limit);  // Rust's f32::min: a NaN gate gives the limit
    u = std::clamp(u, -limit, limit);
    return (u + 1.0f) * (g / (1.0f + std::exp(-(g * alpha))));
}

int main() {
    rng.seed(11);
    // RMSNorm of a row's head (MLA's latent: 512 of 576) and KDA's gated head norm
    {
        int rows = 5, width = 576, d = 512;
        V x = rnd((size_t)rows * width, 3.f), w = rnd(d, 1.5f), want = x, got = x;
        for (int t = 0; t < rows; t++) rms_norm_cpu(&want[(size_t)t * width], w.data(), d, 1e-6f, nullptr);
        float *xp = got.data(), *wp = w.data();
        launch({(unsigned)rows, 1, 1}, {256, 1, 1}, [=] { rms_norm_part(xp, width, d, wp, 1e-6f, nullptr); });
        report("rms_norm_head 5 rows, 512 of 576", got, want, false);
        int heads = 7, hd = 128;
        V o = rnd((size_t)heads * hd, 3.f), gate = rnd((size_t)heads * hd, 4.f), w2 = rnd(hd, 1.5f), want2 = o, got2 = o;
        for (int h = 0; h < heads; h++) rms_norm_cpu(&want2[(size_t)h * hd], w2.data(), hd, 1e-5f, &gate[(size_t)h * hd]);
        float *op = got2.data(), *w2p = w2.data(), *gp = gate.data();
        launch({(unsigned)heads, 1, 1}, {256, 1, 1}, [=] { rms_norm_part(op, hd, hd, w2p, 1e-5f, gp); });
        report("gated_head_norm 7 heads of 128", got2, want2, false);
    }
    // MLA's RoPE tails: queries (heads of 192, rope 64) and the latent row (576, rope 64)
    for (int il = 0; il < 2; il++)
        for (auto [rows, width, per, pos0, scale] : std::vector<std::tuple<int, int, int, int, float>>{
                 {3, 192, 4, 7, 1.0f}, {2, 576, 1, 300, 1.25f}, {1, 96, 3, 0, 0.8f}}) {
            int half = 32;
            V f(half);
            for (int i = 0; i < half; i++) f[i] = std::pow(10000.f, -2.f * i / (2 * half));
            V x = rnd((size_t)rows * per * width, 2.f), want = x, got = x;
            rope_tail_cpu(want, rows, width, pos0, f, il, scale);
            float *xp = got.data(), *fp = f.data();
            launch({(unsigned)(rows * per), 1, 1}, {(unsigned)std::min(half, 256), 1, 1},
                   [=] { rope_tail(xp, width, per, half, pos0, fp, il, scale); });
            char what[80];
            snprintf(what, sizeof what, "rope_tail %d rows x %d of %d at %d%s", rows, per, width, pos0, il ? ", interleaved" : "");
            report(what, got, want, true);
        }
    // KDA's convolution from a non-zero state: a prompt then one token, outputs and state
    for (auto [dim, conv] : std::vector<std::pair<int, int>>{{96, 4}, {40, 3}, {16, 1}}) {
        V taps = rnd((size_t)3 * dim * conv, 1.f), state = rnd((size_t)std::max(conv - 1, 0) * 3 * dim, 2.f);
        V sg = state;
        for (int rows : {5, 1, 2}) {
            V q = rnd((size_t)rows * dim, 2.f), k = rnd((size_t)rows * dim, 2.f), v = rnd((size_t)rows * dim, 2.f);
            V wq = q, wk = k, wv = v, gq = q, gk = k, gv = v;
            conv_cpu(wq, wk, wv, rows, taps, conv, state);
            float *a = gq.data(), *b = gk.data(), *c = gv.data(), *tp = taps.data(), *sp = sg.data();
            launch({blocks_of(3 * dim), 1, 1}, {256, 1, 1}, [=] { kda_conv(a, b, c, rows, dim, tp, conv, sp); });
            V want = wq, got = gq;
            want.insert(want.end(), wk.begin(), wk.end());
            want.insert(want.end(), wv.begin(), wv.end());
            got.insert(got.end(), gk.begin(), gk.end());
            got.insert(got.end(), gv.begin(), gv.end());
            want.insert(want.end(), state.begin(), state.end());
            got.insert(got.end(), sg.begin(), sg.end());
            char what[80];
            snprintf(what, sizeof what, "kda_conv dim %d, %d taps, %d rows (+ state)", dim, conv, rows);
            report(what, got, want, true);
        }
    }
    // L2 norms of heads, scaled and not
    for (float scale : {1.0f, 0.0883883f}) {
        int d = 128;
        V x = rnd((size_t)9 * d, 2.f), want = x, got = x;
        l2_cpu(want, d, 1e-6f, scale);
        float* xp = got.data();
        launch({1, 1, 1}, {256, 1, 1}, [=] { l2norm_heads(xp, 9, d, 1e-6f, scale); });
        report(scale == 1.0f ? "l2norm_heads 9 of 128" : "l2norm_heads 9 of 128, scaled", got, want, true);
    }
    // KDA's decay, softplus (some above 20) and lower-bounded
    for (int lb = 0; lb < 2; lb++) {
        int heads = 4, dk = 16, dim = heads * dk, rows = 3;
        V g = rnd((size_t)rows * dim, 25.f), a_log = rnd(heads, 1.f), dt = rnd(dim, 2.f), want = g, got = g;
        decay_cpu(want, a_log, dt, lb, -5.0f);
        float *gp = got.data(), *ap = a_log.data(), *dp = dt.data();
        u64 n = g.size();
        launch({blocks_of(n), 1, 1}, {256, 1, 1}, [=] { kda_decay(gp, n, dim, dk, ap, dp, lb, -5.0f); });
        report(lb ? "kda_decay lower bound -5" : "kda_decay softplus", got, want, true);
    }
    // sigmoid and the output gate
    {
        V x = rnd(1000, 10.f), g = rnd(1000, 10.f), ws = x, wm = x, gs = x, gm = x;
        for (auto& v : ws) v = sigm(v);
        for (size_t i = 0; i < wm.size(); i++) wm[i] = wm[i] * sigm(g[i]);
        float *sp = gs.data(), *mp = gm.data(), *gp = g.data();
        launch({blocks_of(1000), 1, 1}, {256, 1, 1}, [=] { sigmoid_mul(sp, nullptr, 1000); });
        launch({blocks_of(1000), 1, 1}, {256, 1, 1}, [=] { sigmoid_mul(mp, gp, 1000); });
        report("sigmoid 1000", gs, ws, true);
        report("mul_sigmoid 1000", gm, wm, true);
    }
    // Kimi K3's residual mix: no checkpoint, one, five
    for (int nb : {0, 1, 5}) {
        int d = 700, rows = 3;
        std::vector<V> bank;
        for (int s = 0; s < nb; s++) bank.push_back(rnd((size_t)rows * d, 1.f + s));
        V cur = rnd((size_t)rows * d, 2.f), w = rnd(d, 1.f), want(cur.size()), got(cur.size(), NAN);
        if (nb == 0) want = cur;
        else res_mix_cpu(bank, cur, w, 1e-6f, want);
        std::vector<u64> ptrs;
        for (auto& b : bank) ptrs.push_back((u64)b.data());
        const u64* pp = ptrs.data();
        const float *cp = cur.data(), *wp = w.data();
        float* op = got.data();
        launch({(unsigned)rows, 1, 1}, {256, 1, 1}, [=] { res_mix(pp, nb, cp, d, wp, 1e-6f, op); });
        char what[80];
        snprintf(what, sizeof what, "res_mix %d checkpoints, 3 rows of 700", nb);
        report(what, got, want, false);
    }
    // GPT-OSS: row biases, the clamped SwiGLU (pairs and two inputs), input-major products
    {
        int d = 300, rows = 4;
        V x = rnd((size_t)rows * d, 3.f), b = rnd(d, 1.f), want = x, got = x;
        for (size_t i = 0; i < x.size(); i++) want[i] += b[i % d];
        float *xp = got.data(), *bp = b.data();
        u64 n = x.size();
        launch({blocks_of(n), 1, 1}, {256, 1, 1}, [=] { add_rows(xp, bp, n, d); });
        report("add_rows 4 rows of 300", got, want, true);
        V gu = rnd(2000, 12.f), up = rnd(1000, 12.f), wp(1000), ws(1000), gp(1000, NAN), gs(1000, NAN);
        for (int i = 0; i < 1000; i++) {
            wp[i] = swiglu_cpu(gu[2 * i], gu[2 * i + 1], 1.702f, 7.0f);
            ws[i] = swiglu_cpu(gu[i], up[i], 1.702f, 7.0f);
        }
        const float *gup = gu.data(), *upp = up.data();
        float *pp = gp.data(), *sp = gs.data();
        launch({blocks_of(1000), 1, 1}, {256, 1, 1}, [=] { swiglu_oai(gup, nullptr, 1000, 1.702f, 7.0f, pp); });
        launch({blocks_of(1000), 1, 1}, {256, 1, 1}, [=] { swiglu_oai(gup, upp, 1000, 1.702f, 7.0f, sp); });
        report("swiglu_oai pairs", gp, wp, true);
        report("swiglu_oai gate and up", gs, ws, true);
    }
    for (auto [k, m, rows, panel] : std::vector<std::tuple<int, int, int, int>>{{100, 300, 1, 100}, {100, 300, 11, 37}, {64, 40, 8, 64}}) {
        V w = rnd((size_t)k * m, 1.f), x = rnd((size_t)rows * k, 2.f), want((size_t)rows * m, 0.f), got((size_t)rows * m, NAN);
        for (int t = 0; t < rows; t++)
            for (int i = 0; i < k; i++)
                for (int j = 0; j < m; j++) want[(size_t)t * m + j] += x[(size_t)t * k + i] * w[(size_t)i * m + j];
        // family_ops.rs's matmul_t_panel without cuBLAS: panels of stored rows, groups of 8 rows
        for (int i0 = 0; i0 < k; i0 += panel) {
            int pk = std::min(panel, k - i0);
            for (int t0 = 0; t0 < rows; t0 += MT_ROWS) {
                int r = std::min(MT_ROWS, rows - t0);
                const float *pp = &w[(size_t)i0 * m], *xp = &x[(size_t)t0 * k];
                float* yp = &got[(size_t)t0 * m];
                launch({blocks_of(m), 1, 1}, {256, 1, 1}, [=] { matmul_t(pp, pk, m, xp, k, i0, r, i0 > 0, yp); });
            }
        }
        char what[80];
        snprintf(what, sizeof what, "matmul_t %dx%d, %d rows, panels of %d", k, m, rows, panel);
        report(what, got, want, true);
    }
    printf(bad ? "FAILED\n" : "ok\n");
    return bad;
}
