//! Blocks shared by the architectures, written against any device (`generic.rs`: projections,
//! norms, residuals, the gated feed-forward, grouped-query attention over the KV slots;
//! `mixers.rs`: KDA and multi-head latent attention), the hybrid layer layout of the Kimi
//! families (`hybrid.rs`), and the few host helpers the skeleton and the prefetcher use. Every
//! output element is computed the same way whatever the batch size and thread count, so
//! prefill equals token-by-token decode.

pub mod generic;
pub mod hybrid;
pub mod mixers;

/// Causal attention over a KV cache, RMSNorm of rows, GeGLU of rows and the pass's thread
/// count, from the backend.
pub use crate::backend::cpu::{
    attn::{attention, attention_with_sinks, AttnShape},
    gelu::geglu_rows,
    ops::{rms_norm_rows, silu},
    pool::threads as pass_threads,
};
/// The MLA and KDA kernels, with the shared blocks that call them.
pub use crate::backend::cpu::{kda, mla};

use super::rope::RopeStyle;

use crate::backend::cpu::{matmul, matvec};
use crate::quant::dequantize_row;

/// Gemma's logit soft-capping `cap · tanh(x / cap)` and the RoPE inverse frequencies, for the
/// families that apply them outside the shared blocks.
pub use crate::backend::cpu::ops::{rope_inv_freq, softcap};
/// A weight matrix view in its stored encoding (`rows × cols`), what the blocks below take.
pub use crate::backend::cpu::Matrix;

/// A one-row weight (a bias, `1 × cols`) decoded to f32 (`cols` values).
pub fn row_f32(b: &Matrix) -> Vec<f32> {
    let mut v = vec![0f32; b.cols];
    dequantize_row(b.ty, b.data, &mut v);
    v
}

/// `Y = X Wᵀ` for `n` rows of `x` (`n × w.cols`) into `y` (`n × w.rows`); matvec for one row.
pub fn mm(w: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    if n == 1 {
        matvec(w, x, y)
    } else {
        matmul(w, x, n, y)
    }
}

/// `x += y` element-wise (residual connection).
pub fn add_into(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

/// How `generic::gqa_attention_on` rotates and scales q and k.
pub struct GqaRope<'a> {
    /// Inverse frequencies (`head_dim / 2`).
    pub inv_freq: &'a [f32],
    pub style: RopeStyle,
    /// Multiplies q after RoPE (the score scale, times any YaRN attention factor).
    pub q_scale: f32,
    /// Multiplies k after RoPE (a YaRN attention factor, else 1).
    pub k_scale: f32,
    /// Epsilon of the q/k norms.
    pub eps: f32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{cpu::Cpu, Backend};
    use crate::models::batch::Seqs;
    use crate::models::KvCache;
    use crate::quant::GgmlType;

    /// f32 bytes of a `rows × cols` matrix filled from `seed`.
    fn f32_bytes(rows: usize, cols: usize, seed: u32) -> Vec<u8> {
        let mut x = seed;
        (0..rows * cols)
            .flat_map(|_| {
                x = x.wrapping_mul(1664525).wrapping_add(1013904223);
                ((x >> 8) as f32 / (1u32 << 24) as f32 - 0.5).to_le_bytes()
            })
            .collect()
    }

    /// The backend's ops, wired by hand as grouped-query attention wires them (projections,
    /// RoPE and scale, the cache, attention, output projection), give
    /// `generic::gqa_attention_on`'s output on the CPU bit for bit, and the keys it wrote to
    /// the cache.
    #[test]
    fn backend_ops_compose_to_the_attention_block() {
        let (d, nh, nkv, hd, pos0, n) = (32, 4, 2, 8, 3, 2);
        let (qd, kvd) = (nh * hd, nkv * hd);
        let bytes: Vec<Vec<u8>> = [(qd, d), (kvd, d), (kvd, d), (d, qd)]
            .iter()
            .enumerate()
            .map(|(i, &(r, c))| f32_bytes(r, c, 7 + i as u32))
            .collect();
        let m = |i: usize, r, c| Matrix::new(GgmlType::F32, r, c, &bytes[i]).unwrap();
        let (wq, wk, wv, wo) = (m(0, qd, d), m(1, kvd, d), m(2, kvd, d), m(3, d, qd));
        let shape = AttnShape {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            window: None,
            softcap: None,
        };
        let inv_freq = rope_inv_freq(hd, 10000.0, 1.0);
        let rope = GqaRope {
            inv_freq: &inv_freq,
            style: RopeStyle::Neox,
            q_scale: 0.25,
            k_scale: 1.0,
            eps: 1e-6,
        };
        let be = Cpu::default();
        let w = |m| generic::W { m, keep: true };
        let gqa = generic::GqaOn {
            q: w(wq),
            k: w(wk),
            v: w(wv),
            o: w(wo),
            biases: None,
            qk_norm: None,
            sinks: None,
        };
        let xn: Vec<f32> = f32_bytes(n, d, 99)
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        // earlier positions already in the cache
        let past: Vec<f32> = f32_bytes(pos0, kvd, 5)
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let mut cache = KvCache::new(1, 8, kvd);
        KvCache::reserve_rows(&mut cache.k[0], 8, 8, kvd);
        KvCache::reserve_rows(&mut cache.v[0], 8, 8, kvd);
        cache.k[0][..pos0 * kvd].copy_from_slice(&past);
        cache.v[0][..pos0 * kvd].copy_from_slice(&past);
        let mut c = KvCache::new(1, 8, kvd);
        c.k[0].clone_from(&cache.k[0]);
        c.v[0].clone_from(&cache.v[0]);
        let mut seqs = Seqs::one(&mut c, pos0, n);
        let want = generic::gqa_attention_on(&be, &shape, &gqa, &rope, &xn, &mut seqs, 0).unwrap();

        let x = be.upload(&xn).unwrap();
        let (mut q, mut k, mut v) = (
            be.zeros(n * qd).unwrap(),
            be.zeros(n * kvd).unwrap(),
            be.zeros(n * kvd).unwrap(),
        );
        be.matmul(wq, &x, n, &mut q).unwrap();
        be.matmul(wk, &x, n, &mut k).unwrap();
        be.matmul(wv, &x, n, &mut v).unwrap();
        be.rope(&mut q, n, hd, pos0, &inv_freq, false, 0.25)
            .unwrap();
        be.rope(&mut k, n, hd, pos0, &inv_freq, false, 1.0).unwrap();
        let (mut kc, mut vc) = (
            cache.k[0][..pos0 * kvd].to_vec(),
            cache.v[0][..pos0 * kvd].to_vec(),
        );
        kc.extend_from_slice(&k);
        vc.extend_from_slice(&v);
        let mut att = be.zeros(n * qd).unwrap();
        be.attention(&shape, &q, &kc, &vc, pos0, None, &mut att)
            .unwrap();
        let mut o = be.zeros(n * d).unwrap();
        be.matmul(wo, &att, n, &mut o).unwrap();
        let mut got = vec![0f32; n * d];
        be.download(&o, &mut got).unwrap();
        assert!(want.iter().any(|v| *v != 0.0));
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(&c.k[0][pos0 * kvd..(pos0 + n) * kvd], &kc[pos0 * kvd..]);
    }
}
