// Test helpers shared by the host emulations (mla_kda.cpp, family_ops.cpp): random inputs
// and the worst relative difference. Each program seeds `rng` at the start of main.
#pragma once
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>
using V = std::vector<float>;
static std::mt19937_64 rng;
// n floats uniform in [-a, a)
static V rnd(size_t n, float a) {
    std::uniform_real_distribution<float> d(-a, a);
    V v(n);
    for (auto& x : v) x = d(rng);
    return v;
}
// max |got - want| / max |want| (the difference itself where want is all zeros); 1e30 for a
// non-finite value or lengths that differ
static double worst_rel(const V& got, const V& want) {
    double sc = 0, e = 0;
    for (size_t i = 0; i < got.size(); i++) {
        if (!std::isfinite(got[i]) || got.size() != want.size()) return 1e30;
        sc = std::max(sc, (double)std::fabs(want[i]));
        e = std::max(e, (double)std::fabs(got[i] - want[i]));
    }
    return sc == 0 ? e : e / sc;
}
