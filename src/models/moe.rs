//! The Mixture-of-Experts block: routing, the union of a batch's experts fetched through an
//! [`ExpertSource`] addressed by (layer, expert id), each expert computing its token group, and
//! a fixed-order reduction.
//!
//! Routing follows Hugging Face `Qwen3MoeTopKRouter` (transformers 5,
//! `models/qwen3_moe/modeling_qwen3_moe.py`): `softmax(x Wᵣᵀ)` over all experts, the `k`
//! largest probabilities, divided by their sum when `norm_topk_prob`. Ties keep the lower id.
//!
//! Reduction order: for every token, expert outputs (each already multiplied by its routing
//! weight) are added in **ascending expert id** order, which is also the order transformers'
//! expert loop adds them in. Experts are planned in ascending id order, each at most once per
//! layer per batch, and computed in the order their bytes land
//! ([`ExpertSource::for_each_landed`]); each expert's output is kept until the reduction, so the
//! result never depends on arrival order.

use std::io;

use super::layers::{mm, silu};
use super::loading::MatRef;
use crate::kernels::ops::softmax_inplace;
use crate::kernels::Matrix;
use crate::store::WeightStore;

/// One expert's SwiGLU matrices inside its unit: `gate`, `up` (`ff × d`), `down` (`d × ff`).
#[derive(Clone, Copy, Debug)]
pub struct ExpertMats {
    pub gate: MatRef,
    pub up: MatRef,
    pub down: MatRef,
}

/// One expert's matrices, ready to compute.
pub struct ExpertView<'a> {
    pub gate: Matrix<'a>,
    pub up: Matrix<'a>,
    pub down: Matrix<'a>,
}

/// Where experts come from, addressed by (layer, expert id) whatever the storage layout.
pub trait ExpertSource {
    /// Announces the experts of `layer` a batch uses, in ascending id order, before any of them
    /// is taken (so reads can start at once).
    fn plan_experts(&mut self, layer: usize, ids: &[usize]);
    /// Runs `f` on expert `id` of `layer`; experts are taken in the order they were planned.
    ///
    /// Errors: the expert's bytes could not be read (the message names the file).
    fn with_expert<R>(
        &mut self,
        layer: usize,
        id: usize,
        f: impl FnOnce(&ExpertView) -> R,
    ) -> io::Result<R>;

    /// Runs `f(id, expert)` once for each of the experts `ids` of `layer` planned last, in the
    /// order their bytes become available (any order). The default takes them in planned order
    /// through [`ExpertSource::with_expert`].
    ///
    /// Errors: an expert's bytes could not be read (the message names the file and expert).
    fn for_each_landed(
        &mut self,
        layer: usize,
        ids: &[usize],
        f: &mut dyn FnMut(usize, &ExpertView),
    ) -> io::Result<()> {
        for &id in ids {
            self.with_expert(layer, id, |v| f(id, v))?;
        }
        Ok(())
    }
}

/// Experts held as [`WeightStore`] units, one unit per expert holding its three matrices:
/// `units[layer][id] = (unit, mats)`; layers without experts have an empty list.
pub struct UnitExperts {
    pub units: Vec<Vec<(usize, ExpertMats)>>,
}

/// An [`ExpertSource`] over a [`UnitExperts`] table and the store holding its units.
pub struct StoreExperts<'a> {
    pub table: &'a UnitExperts,
    pub store: &'a mut WeightStore,
}

impl ExpertSource for StoreExperts<'_> {
    fn plan_experts(&mut self, layer: usize, ids: &[usize]) {
        if let Some(es) = self.store.experts_mut() {
            es.plan(layer, ids);
            return;
        }
        let l = &self.table.units[layer];
        self.store.plan(ids.iter().map(|&e| l[e].0));
    }

    fn for_each_landed(
        &mut self,
        layer: usize,
        ids: &[usize],
        f: &mut dyn FnMut(usize, &ExpertView),
    ) -> io::Result<()> {
        let table = self.table;
        let Some(es) = self.store.experts_mut() else {
            for &id in ids {
                self.with_expert(layer, id, |v| f(id, v))?;
            }
            return Ok(());
        };
        es.for_each_landed(layer, &mut |id, u| {
            let m = table.units[layer][id].1;
            f(
                id,
                &ExpertView {
                    gate: m.gate.view(u),
                    up: m.up.view(u),
                    down: m.down.view(u),
                },
            )
        })
    }

    fn with_expert<R>(
        &mut self,
        layer: usize,
        id: usize,
        f: impl FnOnce(&ExpertView) -> R,
    ) -> io::Result<R> {
        let (unit, m) = self.table.units[layer][id];
        self.store.with_unit(unit, |u| {
            f(&ExpertView {
                gate: m.gate.view(u),
                up: m.up.view(u),
                down: m.down.view(u),
            })
        })
    }
}

/// Top-`k` softmax routing of one token from its router logits (`n_experts`): the chosen
/// (expert id, weight) pairs in ascending id order. Weights are the softmax probabilities over
/// all experts, renormalized to sum to 1 over the chosen ones when `norm_topk_prob`.
pub fn route_softmax_topk(logits: &[f32], k: usize, norm_topk_prob: bool) -> Vec<(usize, f32)> {
    let mut p = logits.to_vec();
    softmax_inplace(&mut p);
    let mut order: Vec<usize> = (0..p.len()).collect();
    // descending probability, lower id first on ties (a stable sort keeps id order)
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
    let mut chosen: Vec<(usize, f32)> =
        order[..k.min(p.len())].iter().map(|&e| (e, p[e])).collect();
    if norm_topk_prob {
        let s: f32 = chosen.iter().map(|c| c.1).sum();
        chosen.iter_mut().for_each(|c| c.1 /= s);
    }
    chosen.sort_by_key(|c| c.0);
    chosen
}

/// The MoE feed-forward of layer `layer` for `n` tokens: `routes[t]` are token `t`'s (expert,
/// weight) pairs in ascending id order, `x` the normed input (`n × d`). Adds
/// `Σ_e w_e · expert_e(x_t)` to each row of `out` (`n × d`), experts in ascending id order.
/// `after_plan` runs right after the experts are planned (to queue the reads that come next).
///
/// Errors: an expert could not be read.
pub fn moe_forward<S: ExpertSource>(
    src: &mut S,
    layer: usize,
    routes: &[Vec<(usize, f32)>],
    x: &[f32],
    d: usize,
    out: &mut [f32],
    after_plan: impl FnOnce(&mut S),
) -> io::Result<()> {
    // union of the batch's experts, ascending, with each expert's (token, weight) group
    let mut groups: std::collections::BTreeMap<usize, Vec<(usize, f32)>> = Default::default();
    for (t, r) in routes.iter().enumerate() {
        for &(e, w) in r {
            groups.entry(e).or_default().push((t, w));
        }
    }
    let ids: Vec<usize> = groups.keys().copied().collect();
    src.plan_experts(layer, &ids);
    after_plan(src);
    // each expert's output rows (group order), computed as its bytes land
    let mut outs: std::collections::BTreeMap<usize, Vec<f32>> = Default::default();
    src.for_each_landed(layer, &ids, &mut |e, w| {
        let group = &groups[&e];
        let m = group.len();
        let mut xg = vec![0f32; m * d];
        for (i, &(t, _)) in group.iter().enumerate() {
            xg[i * d..(i + 1) * d].copy_from_slice(&x[t * d..(t + 1) * d]);
        }
        let ff = w.gate.rows;
        let mut g = vec![0f32; m * ff];
        let mut u = vec![0f32; m * ff];
        mm(&w.gate, &xg, m, &mut g);
        mm(&w.up, &xg, m, &mut u);
        g.iter_mut().zip(&u).for_each(|(a, b)| *a = silu(*a) * b);
        let mut y = vec![0f32; m * d];
        mm(&w.down, &g, m, &mut y);
        outs.insert(e, y);
    })?;
    // the reduction, in ascending expert id order whatever the arrival order
    for (e, group) in &groups {
        let y = outs.get(e).ok_or_else(|| {
            io::Error::other(format!("expert {e} of layer {layer} never arrived"))
        })?;
        for (i, &(t, wt)) in group.iter().enumerate() {
            for (o, v) in out[t * d..(t + 1) * d]
                .iter_mut()
                .zip(&y[i * d..(i + 1) * d])
            {
                *o += wt * v;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_keeps_top_k_renormalized_in_id_order() {
        // softmax of [0, ln 3, ln 2, ln 3]: probabilities 1/9, 3/9, 2/9, 3/9
        let l = [0.0, 3f32.ln(), 2f32.ln(), 3f32.ln()];
        let r = route_softmax_topk(&l, 2, true);
        assert_eq!(r.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 3]);
        assert!(
            (r[0].1 - 0.5).abs() < 1e-6 && (r[1].1 - 0.5).abs() < 1e-6,
            "{r:?}"
        );
        let r = route_softmax_topk(&l, 3, false);
        assert_eq!(r.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 2, 3]);
        assert!((r[1].1 - 2.0 / 9.0).abs() < 1e-6, "{r:?}");
    }

    /// 1×1 experts (gate 1, up `id + 1`, down 1) recording the order they are planned and taken.
    struct Fake {
        planned: Vec<usize>,
        taken: Vec<usize>,
    }

    impl ExpertSource for Fake {
        fn plan_experts(&mut self, _layer: usize, ids: &[usize]) {
            self.planned.extend_from_slice(ids);
        }
        fn with_expert<R>(
            &mut self,
            _layer: usize,
            id: usize,
            f: impl FnOnce(&ExpertView) -> R,
        ) -> io::Result<R> {
            self.taken.push(id);
            let up = ((id + 1) as f32).to_le_bytes();
            let one = 1f32.to_le_bytes();
            fn m(b: &[u8; 4]) -> Matrix<'_> {
                Matrix {
                    ty: crate::quant::GgmlType::F32,
                    rows: 1,
                    cols: 1,
                    data: &b[..],
                }
            }
            let v = ExpertView {
                gate: m(&one),
                up: m(&up),
                down: m(&one),
            };
            Ok(f(&v))
        }
    }

    #[test]
    fn moe_reads_each_expert_once_in_id_order_and_weights_outputs() {
        let mut src = Fake {
            planned: vec![],
            taken: vec![],
        };
        let routes = vec![vec![(1, 0.25), (3, 0.75)], vec![(0, 0.5), (3, 0.5)]];
        let x = [2.0f32, -1.0];
        let mut out = [0f32; 2];
        let mut after = false;
        moe_forward(&mut src, 0, &routes, &x, 1, &mut out, |_| after = true).unwrap();
        assert!(after);
        assert_eq!(src.planned, [0, 1, 3]);
        assert_eq!(src.taken, [0, 1, 3]);
        // expert e: silu(x) · (e+1) x
        let f = |x: f32, e: f32| silu(x) * (e + 1.0) * x;
        let want0 = 0.25 * f(2.0, 1.0) + 0.75 * f(2.0, 3.0);
        let want1 = 0.5 * f(-1.0, 0.0) + 0.5 * f(-1.0, 3.0);
        assert!(
            (out[0] - want0).abs() < 1e-6 && (out[1] - want1).abs() < 1e-6,
            "{out:?}"
        );
    }
}
