//! Multi-head latent attention (DeepSeek-V2 paper, Liu et al. 2024, §2.1; DeepSeek V3) over a
//! compressed cache: every past position keeps only its normed KV latent `c` (`kv_lora_rank`)
//! and the shared rotary key `k_rot` (`qk_rope_head_dim`). The per-head keys and values that
//! transformers' `DeepseekV3Attention.expand_kv` builds (`kv_b_proj(c)` split into `k_nope` and
//! `v`) are never materialised: with `W_k,h` / `W_v,h` the `kv_b_proj` rows of head `h`,
//!
//! * `q_nope,h · k_nope,h,j = (W_k,hᵀ q_nope,h) · c_j` (the query is absorbed once per token),
//! * `Σ_j p_j v_h,j = W_v,h (Σ_j p_j c_j)` (the output is expanded once per token).
//!
//! The sums run in a different order than transformers' (f32 rounding differs in the last
//! bits), but every output depends only on its own token's inputs and the cache, so a batched
//! prompt gives the same numbers as token-by-token decode.

use rayon::prelude::*;

use crate::backend::cpu::ops::{rope_neox, softmax_inplace};
use crate::backend::cpu::Matrix;
use crate::quant::{dequantize_row, dot_row};

/// Shape of one MLA layer.
#[derive(Clone, Copy, Debug)]
pub struct MlaShape {
    pub n_heads: usize,
    /// `qk_nope_head_dim`: query/key width without position.
    pub nope: usize,
    /// `qk_rope_head_dim`: rotary width (shared key across heads).
    pub rope: usize,
    /// `v_head_dim`.
    pub v: usize,
    /// `kv_lora_rank`: latent width.
    pub rank: usize,
    /// Softmax scale of the scores.
    pub scale: f32,
}

/// Rotary embedding of one rotary slice `x` (`2 · inv_freq.len()` values) at position `pos`.
/// `interleave` (transformers' `rope_interleave`, `apply_rotary_pos_emb_interleave`): pairs
/// `(x[2i], x[2i+1])` rotate by frequency `i` and the result is laid out de-interleaved
/// (`[x'_0, x'_2, …, x'_1, x'_3, …]`), as transformers returns it; otherwise NeoX halves.
/// The result is multiplied by `att` (YaRN's attention factor) when it is not 1.
pub fn rope_slice(x: &mut [f32], pos: usize, inv_freq: &[f32], interleave: bool, att: f32) {
    let half = inv_freq.len();
    if interleave {
        let mut t = [0f32; 512];
        let t = &mut t[..2 * half];
        for i in 0..half {
            t[i] = x[2 * i];
            t[half + i] = x[2 * i + 1];
        }
        x.copy_from_slice(t);
    }
    rope_neox(x, pos, inv_freq);
    if att != 1.0 {
        x.iter_mut().for_each(|v| *v *= att);
    }
}

/// The up-projections from the latent to per-head keys (no position) and values.
#[derive(Clone, Copy)]
pub enum MlaWeights<'a> {
    /// `kv_b_proj` as Hugging Face stores it: `n_heads · (nope + v)` rows × `rank` columns,
    /// per head `nope` key rows then `v` value rows.
    Joint(&'a Matrix<'a>),
    /// llama.cpp's split form (`convert_hf_to_gguf.py` for `deepseek2`): `k_b` is each head's
    /// key block transposed, `n_heads · rank` rows × `nope` columns (GGML shape
    /// `[nope, rank, n_heads]`), and `v_b` the value rows, `n_heads · v` rows × `rank` columns
    /// (GGML shape `[rank, v, n_heads]`).
    Split {
        k: &'a Matrix<'a>,
        v: &'a Matrix<'a>,
    },
}

/// Causal MLA for `n` query tokens at positions `pos0..pos0+n`.
///
/// * `q`: `n × n_heads × (nope + rope)`, rotary parts already rotated;
/// * `w`: the latent's key and value up-projections ([`MlaWeights`]);
/// * `cache`: position-major rows of `rank + rope` floats (latent, rotary key) for positions
///   `0..pos0+n`;
/// * `out`: `n × n_heads × v`.
///
/// Scores `scale · ((W_kᵀ q_nope) · c_j + q_rot · k_rot,j)`, softmax in f32 in position order,
/// latent context `Σ_j p_j c_j`, output rows `dot_row(W_v row, context)`. The absorbed query
/// is summed over the key rows in order (joint form) or one `dot_row` per latent index (split
/// form). One task per head for the absorbed queries, one per (token, head) for the rest.
pub fn mla_attention(
    s: &MlaShape,
    q: &[f32],
    w: MlaWeights,
    cache: &[f32],
    pos0: usize,
    out: &mut [f32],
) {
    let (nh, nope, rope, vd, rank) = (s.n_heads, s.nope, s.rope, s.v, s.rank);
    let qh = nope + rope;
    let n = q.len() / (nh * qh);
    let width = rank + rope;
    // absorbed queries, per head: n × rank
    let q_abs: Vec<Vec<f32>> = (0..nh)
        .into_par_iter()
        .map(|h| {
            let mut acc = vec![0f32; n * rank];
            match w {
                MlaWeights::Joint(kv_b) => {
                    let mut wr = vec![0f32; rank];
                    for i in 0..nope {
                        dequantize_row(kv_b.ty, kv_b.row(h * (nope + vd) + i), &mut wr);
                        for t in 0..n {
                            let qi = q[(t * nh + h) * qh + i];
                            for (a, &wv) in acc[t * rank..(t + 1) * rank].iter_mut().zip(&wr) {
                                *a += qi * wv;
                            }
                        }
                    }
                }
                MlaWeights::Split { k, .. } => {
                    for t in 0..n {
                        let qn = &q[(t * nh + h) * qh..(t * nh + h) * qh + nope];
                        for (r, a) in acc[t * rank..(t + 1) * rank].iter_mut().enumerate() {
                            *a = dot_row(k.ty, k.row(h * rank + r), qn);
                        }
                    }
                }
            }
            acc
        })
        .collect();
    let (v_mat, v_row0, v_stride) = match w {
        MlaWeights::Joint(kv_b) => (kv_b, nope, nope + vd),
        MlaWeights::Split { v, .. } => (v, 0, vd),
    };
    out.par_chunks_mut(vd).enumerate().for_each(|(i, o)| {
        let (t, h) = (i / nh, i % nh);
        let p = pos0 + t;
        let qa = &q_abs[h][t * rank..(t + 1) * rank];
        let qr = &q[(t * nh + h) * qh + nope..(t * nh + h + 1) * qh];
        let mut scores: Vec<f32> = (0..=p)
            .map(|j| {
                let row = &cache[j * width..(j + 1) * width];
                let a: f32 = qa.iter().zip(&row[..rank]).map(|(x, y)| x * y).sum();
                let b: f32 = qr.iter().zip(&row[rank..]).map(|(x, y)| x * y).sum();
                (a + b) * s.scale
            })
            .collect();
        softmax_inplace(&mut scores);
        let mut ctx = vec![0f32; rank];
        for (j, &pj) in scores.iter().enumerate() {
            for (c, &l) in ctx.iter_mut().zip(&cache[j * width..j * width + rank]) {
                *c += pj * l;
            }
        }
        for (k, ov) in o.iter_mut().enumerate() {
            *ov = dot_row(v_mat.ty, v_mat.row(h * v_stride + v_row0 + k), &ctx);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::GgmlType;

    /// The absorbed computation equals attention over explicitly expanded keys and values.
    #[test]
    fn latent_attention_equals_expanded_attention() {
        let s = MlaShape {
            n_heads: 2,
            nope: 3,
            rope: 2,
            v: 2,
            rank: 4,
            scale: 0.7,
        };
        let f = |i: usize| ((i * 37 % 23) as f32 - 11.0) / 9.0;
        let rows = s.n_heads * (s.nope + s.v);
        let w: Vec<f32> = (0..rows * s.rank).map(|i| f(i + 5)).collect();
        let wb: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let kv_b = Matrix::new(GgmlType::F32, rows, s.rank, &wb).unwrap();
        let (n, width) = (3, s.rank + s.rope);
        let cache: Vec<f32> = (0..n * width).map(|i| f(i + 100)).collect();
        let q: Vec<f32> = (0..n * s.n_heads * (s.nope + s.rope))
            .map(|i| f(i + 200))
            .collect();
        let mut out = vec![0f32; n * s.n_heads * s.v];
        mla_attention(&s, &q, MlaWeights::Joint(&kv_b), &cache, 0, &mut out);
        // expanded reference in f64
        let wr = |r: usize, c: usize| w[r * s.rank + c] as f64;
        for t in 0..n {
            for h in 0..s.n_heads {
                let qo = (t * s.n_heads + h) * (s.nope + s.rope);
                let mut sc: Vec<f64> = (0..=t)
                    .map(|j| {
                        let c = &cache[j * width..];
                        let mut d = 0.0;
                        for i in 0..s.nope {
                            let k: f64 = (0..s.rank).map(|r| wr(h * 5 + i, r) * c[r] as f64).sum();
                            d += q[qo + i] as f64 * k;
                        }
                        for i in 0..s.rope {
                            d += q[qo + s.nope + i] as f64 * c[s.rank + i] as f64;
                        }
                        d * 0.7
                    })
                    .collect();
                let m = sc.iter().cloned().fold(f64::MIN, f64::max);
                sc.iter_mut().for_each(|x| *x = (*x - m).exp());
                let z: f64 = sc.iter().sum();
                for k in 0..s.v {
                    let mut o = 0.0;
                    for (j, p) in sc.iter().enumerate() {
                        let v: f64 = (0..s.rank)
                            .map(|r| wr(h * 5 + s.nope + k, r) * cache[j * width + r] as f64)
                            .sum();
                        o += p / z * v;
                    }
                    let got = out[(t * s.n_heads + h) * s.v + k] as f64;
                    assert!((got - o).abs() < 1e-5, "t{t} h{h} k{k}: {got} vs {o}");
                }
            }
        }
    }

    /// llama.cpp's split `k_b` (transposed per head) / `v_b` give the joint `kv_b`'s output.
    #[test]
    fn split_weights_equal_joint_weights() {
        let s = MlaShape {
            n_heads: 2,
            nope: 3,
            rope: 2,
            v: 2,
            rank: 4,
            scale: 0.7,
        };
        let f = |i: usize| ((i * 37 % 23) as f32 - 11.0) / 9.0;
        let per = s.nope + s.v;
        let w: Vec<f32> = (0..s.n_heads * per * s.rank).map(|i| f(i + 5)).collect();
        let (mut kb, mut vb) = (Vec::new(), Vec::new());
        for h in 0..s.n_heads {
            for r in 0..s.rank {
                for i in 0..s.nope {
                    kb.push(w[(h * per + i) * s.rank + r]);
                }
            }
            for k in 0..s.v {
                vb.extend_from_slice(&w[(h * per + s.nope + k) * s.rank..][..s.rank]);
            }
        }
        let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let (wb, kbb, vbb) = (bytes(&w), bytes(&kb), bytes(&vb));
        let joint = Matrix::new(GgmlType::F32, s.n_heads * per, s.rank, &wb).unwrap();
        let k = Matrix::new(GgmlType::F32, s.n_heads * s.rank, s.nope, &kbb).unwrap();
        let v = Matrix::new(GgmlType::F32, s.n_heads * s.v, s.rank, &vbb).unwrap();
        let n = 3;
        let cache: Vec<f32> = (0..n * (s.rank + s.rope)).map(|i| f(i + 100)).collect();
        let q: Vec<f32> = (0..n * s.n_heads * (s.nope + s.rope))
            .map(|i| f(i + 200))
            .collect();
        let mut a = vec![0f32; n * s.n_heads * s.v];
        let mut b = a.clone();
        mla_attention(&s, &q, MlaWeights::Joint(&joint), &cache, 0, &mut a);
        mla_attention(
            &s,
            &q,
            MlaWeights::Split { k: &k, v: &v },
            &cache,
            0,
            &mut b,
        );
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn interleaved_rope_rotates_pairs_and_deinterleaves() {
        let mut x = [1.0f32, 2.0, 3.0, 4.0];
        let inv = [1.0f32, 0.5];
        rope_slice(&mut x, 1, &inv, true, 1.0);
        let (c0, s0, c1, s1) = (1f32.cos(), 1f32.sin(), 0.5f32.cos(), 0.5f32.sin());
        let want = [
            1.0 * c0 - 2.0 * s0,
            3.0 * c1 - 4.0 * s1,
            2.0 * c0 + 1.0 * s0,
            4.0 * c1 + 3.0 * s1,
        ];
        for (g, w) in x.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{x:?} vs {want:?}");
        }
    }
}
