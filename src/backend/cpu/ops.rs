//! Element-wise and per-row operations of transformer blocks: RMSNorm, RoPE (NeoX and
//! interleaved layouts), GELU, softmax.
//! Scalar, deterministic and independent of thread count; the heavy work is in the matrix
//! kernels; only a prompt's rows are split over threads ([`rms_norm_rows`]).

use rayon::prelude::*;

/// RMSNorm of one row: `out[i] = x[i] / sqrt(mean(x²) + eps) * w[i]` (Zhang & Sennrich 2019).
/// The mean is accumulated in f64. `x`, `w` and `out` have the same length.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert!(x.len() == w.len() && x.len() == out.len());
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = 1.0 / ((ss / x.len() as f64) as f32 + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// In-place RMSNorm of one row (see [`rms_norm`]).
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    debug_assert_eq!(x.len(), w.len());
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = 1.0 / ((ss / x.len() as f64) as f32 + eps).sqrt();
    for (o, &g) in x.iter_mut().zip(w) {
        *o = *o * scale * g;
    }
}

/// Inverse frequencies of rotary embeddings (Su et al. 2021, RoFormer): for a head of
/// `head_dim` dimensions rotated in full, `inv_freq[i] = freq_scale / base^(2i / head_dim)`
/// for `i < head_dim / 2`. `freq_scale` is 1 without scaling and `1 / factor` for linear
/// position interpolation.
pub fn rope_inv_freq(head_dim: usize, base: f32, freq_scale: f32) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| {
            ((freq_scale as f64) / (base as f64).powf(2.0 * i as f64 / head_dim as f64)) as f32
        })
        .collect()
}

/// The rotation of every frequency at position `pos`: `sc[i] = (sin θ, cos θ)` with
/// `θ = pos · inv_freq[i]` in f64, rounded to f32, as [`rope_neox`] and [`rope_interleaved`]
/// compute them; computed once per position for all heads ([`rope_neox_sc`],
/// [`rope_interleaved_sc`] give the same values).
pub fn rope_angles(pos: usize, inv_freq: &[f32], sc: &mut Vec<(f32, f32)>) {
    sc.clear();
    sc.extend(inv_freq.iter().map(|&f| {
        let theta = pos as f64 * f as f64;
        (theta.sin() as f32, theta.cos() as f32)
    }));
}

/// Positions whose angles [`with_rope_angles`] keeps per thread (a decode step of up to 32
/// sequences at two sets of frequencies, Gemma 3's local and global layers).
const ANGLE_SLOTS: usize = 64;

/// One position's angles kept by [`with_rope_angles`], with the frequencies they are for.
struct Angles {
    pos: usize,
    inv_freq: Vec<f32>,
    sc: Vec<(f32, f32)>,
}

std::thread_local! {
    /// This thread's kept angles and the slot the next new position replaces.
    static ANGLES: std::cell::RefCell<(Vec<Angles>, usize)> =
        const { std::cell::RefCell::new((Vec::new(), 0)) };
}

/// Calls `f` with [`rope_angles`]`(pos, inv_freq)`, kept per thread for the last
/// [`ANGLE_SLOTS`] (position, frequencies) pairs: a decode step ropes q and k of every layer
/// at the same positions, and layers share their frequencies, so each sequence's angles are
/// computed once or twice a step instead of twice per layer (the sines and cosines were a
/// tenth of a batch's attention time outside parallel regions on 16 cores, BENCHMARKS.md,
/// session 22). A kept entry matches on the position and the frequencies' values, so the
/// angles are those `rope_angles` gives, bit for bit. `f` runs while the thread's entries
/// are borrowed: it must not call `with_rope_angles` (it panics with "already borrowed").
pub fn with_rope_angles<R>(pos: usize, inv_freq: &[f32], f: impl FnOnce(&[(f32, f32)]) -> R) -> R {
    ANGLES.with(|cell| {
        let mut guard = cell.borrow_mut();
        let (kept, next) = &mut *guard;
        let hit = kept.iter().position(|a| {
            a.pos == pos
                && a.inv_freq.len() == inv_freq.len()
                && a.inv_freq
                    .iter()
                    .zip(inv_freq)
                    .all(|(x, y)| x.to_bits() == y.to_bits())
        });
        let i = match hit {
            Some(i) => i,
            None => {
                let i = if kept.len() < ANGLE_SLOTS {
                    kept.push(Angles {
                        pos,
                        inv_freq: Vec::new(),
                        sc: Vec::new(),
                    });
                    kept.len() - 1
                } else {
                    let i = *next;
                    *next = (*next + 1) % ANGLE_SLOTS;
                    i
                };
                let a = &mut kept[i];
                a.pos = pos;
                a.inv_freq.clear();
                a.inv_freq.extend_from_slice(inv_freq);
                rope_angles(pos, inv_freq, &mut a.sc);
                i
            }
        };
        f(&kept[i].sc)
    })
}

/// [`rope_neox`] with the angles of [`rope_angles`] (`x.len() == 2 * sc.len()`).
pub fn rope_neox_sc(x: &mut [f32], sc: &[(f32, f32)]) {
    let half = sc.len();
    debug_assert_eq!(x.len(), 2 * half);
    for (i, &(s, c)) in sc.iter().enumerate() {
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * c - b * s;
        x[i + half] = a * s + b * c;
    }
}

/// [`rope_interleaved`] with the angles of [`rope_angles`] (`x.len() == 2 * sc.len()`).
pub fn rope_interleaved_sc(x: &mut [f32], sc: &[(f32, f32)]) {
    debug_assert_eq!(x.len(), 2 * sc.len());
    for (pair, &(s, c)) in x.chunks_exact_mut(2).zip(sc) {
        let (a, b) = (pair[0], pair[1]);
        pair[0] = a * c - b * s;
        pair[1] = a * s + b * c;
    }
}

/// Applies rotary embeddings in the "NeoX" layout (dimension `i` pairs with `i + d/2`, as
/// Hugging Face `rotate_half` and llama.cpp `LLAMA_ROPE_TYPE_NEOX` do) to one head `x` of
/// `2 * inv_freq.len()` values at position `pos`. Angles are computed in f64.
pub fn rope_neox(x: &mut [f32], pos: usize, inv_freq: &[f32]) {
    let half = inv_freq.len();
    debug_assert_eq!(x.len(), 2 * half);
    for (i, &f) in inv_freq.iter().enumerate() {
        let theta = pos as f64 * f as f64;
        let (s, c) = (theta.sin() as f32, theta.cos() as f32);
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * c - b * s;
        x[i + half] = a * s + b * c;
    }
}

/// Applies rotary embeddings in the original interleaved layout (dimension `2i` pairs with
/// `2i + 1`, as RoFormer defines it and llama.cpp's `LLAMA_ROPE_TYPE_NORM` computes it) to one
/// head `x` of `2 * inv_freq.len()` values at position `pos`. llama.cpp's converter permutes the
/// rows of Llama's q/k projections so that this layout on its GGUF weights equals the NeoX
/// layout ([`rope_neox`]) on the Hugging Face weights. Angles are computed in f64.
pub fn rope_interleaved(x: &mut [f32], pos: usize, inv_freq: &[f32]) {
    debug_assert_eq!(x.len(), 2 * inv_freq.len());
    for (pair, &f) in x.chunks_exact_mut(2).zip(inv_freq) {
        let theta = pos as f64 * f as f64;
        let (s, c) = (theta.sin() as f32, theta.cos() as f32);
        let (a, b) = (pair[0], pair[1]);
        pair[0] = a * c - b * s;
        pair[1] = a * s + b * c;
    }
}

/// GELU with the tanh approximation (Hendrycks & Gimpel 2016):
/// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
}

/// In-place softmax over `x` (max-subtracted for stability; the sum is accumulated in f64).
pub fn softmax_inplace(x: &mut [f32]) {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Soft-capping `cap * tanh(x / cap)` (Gemma 2 attention and final logits).
#[inline]
pub fn softcap(x: f32, cap: f32) -> f32 {
    cap * (x / cap).tanh()
}

/// SiLU (swish), `x · σ(x) = x / (1 + e^(−x))` (Elfwing et al. 2017; Hugging Face `ACT2FN["silu"]`).
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Floats up to which [`rms_norm_rows`] and [`super::gelu::geglu_rows`] stay on the calling
/// thread (a decode step of up to 16 rows 2048 wide: 16 sequences of a 2048-wide model's
/// norms, or of GeGLU over a 2048-wide intermediate): a fork-join over the
/// pool costs more than their arithmetic (on the device host's 16 cores, with the LM head's
/// output zeroed in parallel: 8 sequences of the demo model 628-670 tok/s against 623-656,
/// the step's time outside parallel regions 30-32% against 34-35%; BENCHMARKS.md, session 22).
pub const SERIAL_FLOATS: usize = 1 << 15;

/// RMSNorm of every `d`-wide row of `x` into `out` (same shape) with weight `w` (`d`), split
/// over the pool's threads by rows past [`SERIAL_FLOATS`] floats (each row's values do not
/// depend on the split).
pub fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    if x.len() <= SERIAL_FLOATS {
        for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            rms_norm(xr, w, eps, or);
        }
    } else {
        // rows are independent: split a prompt's rows over threads (same values per row)
        x.par_chunks_exact(d)
            .zip(out.par_chunks_exact_mut(d))
            .for_each(|(xr, or)| rms_norm(xr, w, eps, or));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_rows() {
        let x = [3.0f32, 4.0];
        let mut o = [0f32; 2];
        rms_norm(&x, &[1.0, 2.0], 0.0, &mut o);
        // rms = sqrt((9+16)/2) = 3.5355339
        assert!(
            (o[0] - 0.848_528_1).abs() < 1e-6 && (o[1] - 2.262_741_7).abs() < 1e-6,
            "{o:?}"
        );
        let mut y = x;
        rms_norm_inplace(&mut y, &[1.0, 2.0], 0.0);
        assert_eq!(y, o);
    }

    /// The kept angles are `rope_angles`' for the position and frequencies asked, whatever
    /// was asked before: two frequency sets at the same positions, and more positions than
    /// the thread keeps (so entries are replaced and asked for again).
    #[test]
    fn kept_rope_angles_are_the_computed_ones() {
        let sets = [rope_inv_freq(8, 10000.0, 1.0), rope_inv_freq(8, 1e6, 0.125)];
        let mut want = Vec::new();
        for round in 0..2 {
            for pos in (0..3 * ANGLE_SLOTS).rev() {
                for inv in &sets {
                    rope_angles(pos, inv, &mut want);
                    let got = with_rope_angles(pos, inv, |sc| sc.to_vec());
                    let bits = |v: &[(f32, f32)]| -> Vec<(u32, u32)> {
                        v.iter().map(|(a, b)| (a.to_bits(), b.to_bits())).collect()
                    };
                    assert_eq!(bits(&got), bits(&want), "round {round}, position {pos}");
                }
            }
        }
        // a set differing in one frequency is not the kept one
        let mut other = sets[0].clone();
        other[3] *= 2.0;
        rope_angles(5, &other, &mut want);
        with_rope_angles(5, &sets[0], |_| ());
        assert_eq!(with_rope_angles(5, &other, |sc| sc.to_vec()), want);
    }

    #[test]
    fn rope_rotates_pairs_and_keeps_norm() {
        let inv = rope_inv_freq(4, 10000.0, 1.0);
        assert_eq!(inv, vec![1.0, 0.01]);
        let mut x = [1.0f32, 0.0, 0.0, 1.0];
        rope_neox(&mut x, 1, &inv);
        // pair (0,2) rotates by 1 rad, pair (1,3) by 0.01 rad
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[2] - 1f32.sin()).abs() < 1e-6);
        assert!((x[1] + 0.01f32.sin()).abs() < 1e-6 && (x[3] - 0.01f32.cos()).abs() < 1e-6);
        let mut z = [0.5f32, -1.0, 2.0, 0.25];
        rope_neox(&mut z, 0, &inv);
        assert_eq!(z, [0.5, -1.0, 2.0, 0.25]);
        // the precomputed angles give the same values bit for bit
        let inv = rope_inv_freq(8, 10000.0, 1.0);
        let mut sc = Vec::new();
        rope_angles(37, &inv, &mut sc);
        let h = [0.3f32, -1.2, 0.7, 2.0, 5.5, -0.25, 1e-3, 9.0];
        let (mut a, mut b) = (h, h);
        rope_neox(&mut a, 37, &inv);
        rope_neox_sc(&mut b, &sc);
        assert_eq!(a.map(f32::to_bits), b.map(f32::to_bits));
        let (mut a, mut b) = (h, h);
        rope_interleaved(&mut a, 37, &inv);
        rope_interleaved_sc(&mut b, &sc);
        assert_eq!(a.map(f32::to_bits), b.map(f32::to_bits));
    }

    #[test]
    fn interleaved_rope_rotates_adjacent_pairs_like_neox_on_permuted_rows() {
        let inv = rope_inv_freq(4, 10000.0, 1.0);
        let mut x = [1.0f32, 0.0, 0.0, 1.0];
        rope_interleaved(&mut x, 1, &inv);
        // pair (0,1) rotates by 1 rad, pair (2,3) by 0.01 rad
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[1] - 1f32.sin()).abs() < 1e-6);
        assert!((x[2] + 0.01f32.sin()).abs() < 1e-6 && (x[3] - 0.01f32.cos()).abs() < 1e-6);
        // NeoX on [a0, a1, b0, b1] equals interleaved on [a0, b0, a1, b1], reordered back
        let (mut neox, mut inter) = ([0.3f32, -1.2, 0.7, 2.0], [0.3f32, 0.7, -1.2, 2.0]);
        rope_neox(&mut neox, 5, &inv);
        rope_interleaved(&mut inter, 5, &inv);
        assert_eq!(neox, [inter[0], inter[2], inter[1], inter[3]]);
    }

    #[test]
    fn gelu_and_softmax_values() {
        assert_eq!(gelu_tanh(0.0), 0.0);
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-5);
        assert!((gelu_tanh(-3.0) + 0.003_637_4).abs() < 1e-6);
        let mut s = [1.0f32, 2.0, 3.0];
        softmax_inplace(&mut s);
        assert!(
            (s[0] - 0.090_030_57).abs() < 1e-7 && (s[2] - 0.665_240_9).abs() < 1e-7,
            "{s:?}"
        );
    }
}
