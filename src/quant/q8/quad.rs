//! The quad layouts of `--numerics q8` (see the parent module): token quads of Q8_0 and
//! Q8_K activations for the AVX-512 VNNI quad tiles (4 tokens × 4 weight rows per 16-lane
//! register), their tile signatures and the scalar references they equal bit for bit.

use super::acts::{KMeta, Q8Acts, QK};

/// Rows (and tokens) of a quad: a 16-lane register holds 4 tokens × 4 weight rows, lane
/// `4q + p` the pair (token `q`, row `p`) of its quads.
pub(crate) const QUAD: usize = 4;

/// Q8_0 activations in token quads for the quad tile: per quad, block and 4-value group,
/// 16 bytes (the group of each of the quad's 4 tokens, made unsigned: `q + 128`), and per
/// quad and block the 4 tokens' scales. Tokens past `n` are zero (scale 0).
#[derive(Default)]
pub(crate) struct QuadActs {
    pub cols: usize,
    pub quads: usize,
    pub a: Vec<u8>,
    pub dx: Vec<f32>,
}

impl QuadActs {
    /// Regroups the first `n` rows of `q` (Q8_0 activations) into quads (tests; the
    /// product builds quads in parallel).
    #[cfg(test)]
    pub(crate) fn build(&mut self, q: &Q8Acts, n: usize) {
        let cols = q.cols;
        let (nb, ng) = (cols / 32, cols / 4);
        self.cols = cols;
        self.quads = n.div_ceil(QUAD);
        self.a.resize(self.quads * ng * 16, 0);
        self.dx.resize(self.quads * nb * QUAD, 0.0);
        for (qd, (ac, dc)) in self
            .a
            .chunks_exact_mut(ng * 16)
            .zip(self.dx.chunks_exact_mut(nb * QUAD))
            .enumerate()
        {
            quad_of(q, n, qd, ac, dc);
        }
    }
}

/// Quad `qd` of `q`'s first `n` rows into `ac` (`cols * 4` bytes) and `dc` (`cols / 8`).
pub(crate) fn quad_of(q: &Q8Acts, n: usize, qd: usize, ac: &mut [u8], dc: &mut [f32]) {
    let cols = q.cols;
    let nb = cols / 32;
    for tq in 0..QUAD {
        let t = qd * QUAD + tq;
        if t < n {
            let row = &q.qs[t * cols..][..cols];
            for (g, v) in row.chunks_exact(4).enumerate() {
                let o = &mut ac[g * 16 + tq * 4..][..4];
                for (ob, &vb) in o.iter_mut().zip(v) {
                    *ob = (vb as u8) ^ 0x80;
                }
            }
            for b in 0..nb {
                dc[b * QUAD + tq] = q.d[t * nb + b];
            }
        } else {
            for g in 0..cols / 4 {
                ac[g * 16 + tq * 4..][..4].fill(0x80);
            }
            for b in 0..nb {
                dc[b * QUAD + tq] = 0.0;
            }
        }
    }
}

/// Prepared rows of a 32-value type in row quads for the quad tile: per quad, block and
/// 4-value group, 16 bytes (the group of each of the quad's 4 rows, signed); per quad and
/// block the rows' scales `dw` and `init = −128 · Σ w` of each row's block.
#[derive(Default)]
pub(crate) struct QuadRows {
    pub w: Vec<i8>,
    pub dw: Vec<f32>,
    pub init: Vec<i32>,
}

impl QuadRows {
    /// Regroups `nr` prepared rows (`w`: `nr × cols`, `d`: `nr × cols / 32`) into quads;
    /// rows past `nr` are zero.
    pub(crate) fn build(&mut self, w: &[i8], d: &[f32], nr: usize, cols: usize) {
        let (nb, ng) = (cols / 32, cols / 4);
        let quads = nr.div_ceil(QUAD);
        self.w.resize(quads * ng * 16, 0);
        self.dw.resize(quads * nb * QUAD, 0.0);
        self.init.resize(quads * nb * QUAD, 0);
        for qd in 0..quads {
            for p in 0..QUAD {
                let r = qd * QUAD + p;
                for b in 0..nb {
                    let o = (qd * nb + b) * QUAD + p;
                    if r < nr {
                        let wb = &w[r * cols + 32 * b..][..32];
                        self.dw[o] = d[r * nb + b];
                        self.init[o] = -128 * wb.iter().map(|&v| v as i32).sum::<i32>();
                        for g in 0..8 {
                            let dst = (qd * ng + 8 * b + g) * 16 + 4 * p;
                            self.w[dst..dst + 4].copy_from_slice(&wb[4 * g..4 * g + 4]);
                        }
                    } else {
                        self.dw[o] = 0.0;
                        self.init[o] = 0;
                        for g in 0..8 {
                            let dst = (qd * ng + 8 * b + g) * 16 + 4 * p;
                            self.w[dst..dst + 4].fill(0);
                        }
                    }
                }
            }
        }
    }
}

/// A quad tile: the dots of row quads `rq0..rq0 + nrq` of `w` with token quads
/// `tq0..tq0 + ntq` of `a`; `out[(i * ntq + j) * 16 + 4q + p]` is (row `4(rq0 + i) + p`,
/// token `4(tq0 + j) + q`). Each pair's value is [`ref_pair32`]'s.
pub(crate) type QuadTileFn =
    fn(w: &QuadRows, rq0: usize, nrq: usize, a: &QuadActs, tq0: usize, ntq: usize, out: &mut [f32]);

/// The scalar reference of one quad-tile pair: per block `b` in order, the exact integer
/// sum `s` of the block's 32 products, then `acc = fma(s, dw · dx, acc)` from 0.
#[cfg(test)]
pub(crate) fn ref_pair32(w: &[i8], d: &[f32], a: &[i8], da: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (b, (wb, ab)) in w.chunks_exact(32).zip(a.chunks_exact(32)).enumerate() {
        let s: i32 = wb.iter().zip(ab).map(|(&x, &y)| x as i32 * y as i32).sum();
        acc = (s as f32).mul_add(d[b] * da[b], acc);
    }
    acc
}

/// Prepared K-quant rows in row quads for the K quad tile: per quad and 4-value group, 16
/// bytes (each of the quad's rows' unsigned `q`); per quad and superblock the rows' `d`,
/// `dmin` (4 each), per 16-value sub-block their scales (4 × i32), and per pair of
/// sub-blocks their mins (4 dwords of two i16). Rows past `nr` are zero.
#[derive(Default)]
pub(crate) struct QuadKRows {
    pub q: Vec<u8>,
    pub sc: Vec<i32>,
    pub mn: Vec<i32>,
    pub d: Vec<f32>,
    pub dmin: Vec<f32>,
}

impl QuadKRows {
    /// Regroups `nr` prepared rows (`q`: `nr × cols`, `m`: `nr × cols / 256`).
    pub(crate) fn build(&mut self, q: &[u8], m: &[KMeta], nr: usize, cols: usize) {
        let (nsb, ng) = (cols / QK, cols / 4);
        let quads = nr.div_ceil(QUAD);
        self.q.resize(quads * ng * 16, 0);
        self.sc.resize(quads * nsb * 16 * QUAD, 0);
        self.mn.resize(quads * nsb * 8 * QUAD, 0);
        self.d.resize(quads * nsb * QUAD, 0.0);
        self.dmin.resize(quads * nsb * QUAD, 0.0);
        for qd in 0..quads {
            for p in 0..QUAD {
                let r = qd * QUAD + p;
                let real = r < nr;
                for g in 0..ng {
                    let dst = (qd * ng + g) * 16 + 4 * p;
                    match real {
                        true => self.q[dst..dst + 4].copy_from_slice(&q[r * cols + 4 * g..][..4]),
                        false => self.q[dst..dst + 4].fill(0),
                    }
                }
                for sb in 0..nsb {
                    let km = if real {
                        m[r * nsb + sb]
                    } else {
                        KMeta::default()
                    };
                    let o = (qd * nsb + sb) * QUAD + p;
                    self.d[o] = km.d;
                    self.dmin[o] = km.dmin;
                    for j in 0..16 {
                        self.sc[((qd * nsb + sb) * 16 + j) * QUAD + p] = km.sc[j] as i32;
                    }
                    for jj in 0..8 {
                        let pair = (km.mn[2 * jj] as u16 as u32)
                            | ((km.mn[2 * jj + 1] as u16 as u32) << 16);
                        self.mn[((qd * nsb + sb) * 8 + jj) * QUAD + p] = pair as i32;
                    }
                }
            }
        }
    }
}

/// Q8_K activations in token quads for the K quad tile: per quad and 4-value group, 16
/// bytes (each token's signed `q`); per quad, superblock and pair of 16-sums, 4 dwords of
/// two i16 sums; per quad and superblock the 4 scales. Tokens past `n` are zero.
#[derive(Default)]
pub(crate) struct QuadKActs {
    pub cols: usize,
    pub a: Vec<i8>,
    pub bs: Vec<i32>,
    pub dx: Vec<f32>,
}

impl QuadKActs {
    /// Resizes for `n` tokens of `cols` values; returns the per-quad lengths (a, bs, dx).
    pub(crate) fn shape(&mut self, n: usize, cols: usize) -> (usize, usize, usize) {
        let quads = n.div_ceil(QUAD);
        let nsb = cols / QK;
        let lens = (cols * QUAD, nsb * 8 * QUAD, nsb * QUAD);
        self.cols = cols;
        self.a.resize(quads * lens.0, 0);
        self.bs.resize(quads * lens.1, 0);
        self.dx.resize(quads * lens.2, 0.0);
        lens
    }

    /// Regroups the first `n` rows of `q` (Q8_K activations) into quads (tests).
    #[cfg(test)]
    pub(crate) fn build(&mut self, q: &Q8Acts, n: usize) {
        let (la, lb, ld) = self.shape(n, q.cols);
        for (qd, ((a, b), d)) in self
            .a
            .chunks_exact_mut(la)
            .zip(self.bs.chunks_exact_mut(lb))
            .zip(self.dx.chunks_exact_mut(ld))
            .enumerate()
        {
            quad_k_of(q, n, qd, a, b, d);
        }
    }
}

/// Quad `qd` of `q`'s first `n` Q8_K rows (see [`QuadKActs`]).
pub(crate) fn quad_k_of(
    q: &Q8Acts,
    n: usize,
    qd: usize,
    a: &mut [i8],
    bs: &mut [i32],
    dx: &mut [f32],
) {
    let cols = q.cols;
    let nsb = cols / QK;
    for tq in 0..QUAD {
        let t = qd * QUAD + tq;
        let real = t < n;
        for g in 0..cols / 4 {
            let o = &mut a[g * 16 + tq * 4..][..4];
            match real {
                true => o.copy_from_slice(&q.qs[t * cols + 4 * g..][..4]),
                false => o.fill(0),
            }
        }
        for sb in 0..nsb {
            dx[sb * QUAD + tq] = if real { q.d[t * nsb + sb] } else { 0.0 };
            for jj in 0..8 {
                let (lo, hi) = match real {
                    true => {
                        let b = &q.bsums[(t * nsb + sb) * 16..];
                        (b[2 * jj], b[2 * jj + 1])
                    }
                    false => (0, 0),
                };
                bs[(sb * 8 + jj) * QUAD + tq] =
                    ((lo as u16 as u32) | ((hi as u16 as u32) << 16)) as i32;
            }
        }
    }
}

/// A K quad tile, as [`QuadTileFn`] over [`QuadKRows`] and [`QuadKActs`]; each pair's value
/// is [`ref_pair_k`]'s.
pub(crate) type QuadKTileFn = fn(
    w: &QuadKRows,
    rq0: usize,
    nrq: usize,
    a: &QuadKActs,
    tq0: usize,
    ntq: usize,
    out: &mut [f32],
);

/// The scalar reference of one K quad-tile pair: per superblock in order, the exact
/// integers `S = Σ_s sc[s] · Σ_{i ∈ s} q · a` and `M = Σ_s mn[s] · bsum[s]`, then
/// `acc = fma(S, d · dx, acc)`, `accm = fma(M, dmin · dx, accm)`; the result is `acc − accm`.
#[cfg(test)]
pub(crate) fn ref_pair_k(q: &[u8], m: &[KMeta], a: &[i8], da: &[f32], bs: &[i16]) -> f32 {
    let (mut acc, mut accm) = (0f32, 0f32);
    for (sb, km) in m.iter().enumerate() {
        let (mut s, mut mi) = (0i32, 0i32);
        for j in 0..16 {
            let e = sb * QK + 16 * j;
            let p: i32 = (0..16).map(|i| q[e + i] as i32 * a[e + i] as i32).sum();
            s += km.sc[j] as i32 * p;
            mi += km.mn[j] as i32 * bs[sb * 16 + j] as i32;
        }
        acc = (s as f32).mul_add(km.d * da[sb], acc);
        accm = (mi as f32).mul_add(km.dmin * da[sb], accm);
    }
    acc - accm
}
