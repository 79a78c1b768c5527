//! The Mixture-of-Experts block's host side: routing, the expert tables and the store's side of
//! a layer's experts (planning the union of a batch's experts addressed by (layer, expert id),
//! taking them as they land), and the prefetcher's guesses. The experts compute on a device
//! (`moe_dev.rs`).
//!
//! Routing follows Hugging Face `Qwen3MoeTopKRouter` (transformers 5,
//! `models/qwen3_moe/modeling_qwen3_moe.py`): `softmax(x Wᵣᵀ)` over all experts, the `k`
//! largest probabilities, divided by their sum when `norm_topk_prob`. Ties keep the lower id.
//!
//! Reduction order (`moe_dev::experts_on_with`): for every token, expert outputs (each already
//! multiplied by its routing weight) are added in **ascending expert id** order, which is also
//! the order transformers' expert loop adds them in. Experts are planned in ascending id order,
//! each at most once per layer per batch, and computed in the order their bytes land
//! ([`landed_in_store`]); each expert's output is kept until the reduction, so the result never
//! depends on arrival order.

use std::io;

use super::layers::{add_into, mm, rms_norm_rows};
use super::loading::MatRef;
use crate::backend::cpu::ops::softmax_inplace;
use crate::store::{NextExperts, NextReads, UnitBytes, WeightStore};

/// One expert's SwiGLU matrices inside its unit: `gate`, `up` (`ff × d`), `down` (`d × ff`).
#[derive(Clone, Copy, Debug)]
pub struct ExpertMats {
    pub gate: MatRef,
    pub up: MatRef,
    pub down: MatRef,
}

/// Experts held as [`WeightStore`] units, one unit per expert holding its three matrices:
/// `units[layer][id] = (unit, mats)`; layers without experts have an empty list.
pub struct UnitExperts {
    pub units: Vec<Vec<(usize, ExpertMats)>>,
}

/// Announces the experts `ids` of `layer` (first used by the batch rows `first_rows`) to
/// `store`: to its expert store when one is attached, else as the units `unit(id)` to its
/// streamer (resident units are skipped); then what the pass reads after them (`next`,
/// [`WeightStore::plan_next`]).
pub(super) fn plan_in_store(
    store: &mut WeightStore,
    layer: usize,
    ids: &[usize],
    first_rows: &[usize],
    next: &NextReads,
    unit: impl Fn(usize) -> usize,
) {
    match store.experts_mut() {
        Some(es) => es.plan(layer, ids, first_rows),
        None => store.plan(ids.iter().map(|&e| unit(e))),
    }
    store.plan_next(next);
}

/// Runs `f(id, bytes)` on each of the experts `ids` of `layer` planned last through
/// [`plan_in_store`]: in the order their reads land from the expert store (bytes in their
/// re-encoded form when it re-encodes), else unit by unit in planned order.
///
/// Errors: an expert's bytes could not be read (the message names the file and expert).
pub(super) fn landed_in_store(
    store: &mut WeightStore,
    layer: usize,
    ids: &[usize],
    unit: impl Fn(usize) -> usize,
    f: &mut dyn FnMut(usize, &UnitBytes),
) -> io::Result<()> {
    if let Some(es) = store.experts_mut() {
        return es.for_each_landed(layer, f);
    }
    for &id in ids {
        store.with_unit(unit(id), |u| f(id, u))?;
    }
    Ok(())
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

/// Top-`k` routing on the raw router logits, then a softmax over the `k` kept logits
/// (transformers' `GptOssTopKRouter`, `models/gpt_oss/modeling_gpt_oss.py`): the chosen
/// (expert id, weight) pairs in ascending id order, weights summing to 1. Ties keep the lower
/// id.
pub fn route_topk_softmax(logits: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let mut w: Vec<f32> = order[..k.min(logits.len())]
        .iter()
        .map(|&e| logits[e])
        .collect();
    softmax_inplace(&mut w);
    let mut chosen: Vec<(usize, f32)> = order.iter().copied().zip(w).collect();
    chosen.sort_by_key(|c| c.0);
    chosen
}

/// DeepSeek V3 routing of one token from its router logits (`n_experts`), as transformers'
/// `DeepseekV3TopkRouter` (`models/deepseek_v3/modeling_deepseek_v3.py`) computes it:
/// scores `s = sigmoid(logits)`; choice scores `s + bias` (`e_score_correction_bias`, used for
/// selection only); experts split into `n_group` equal groups, each scored by the sum of its
/// two largest choice scores; the `topk_group` best groups kept; the `k` best choice scores
/// among their experts chosen. Weights are the unbiased `s` of the chosen experts, divided by
/// their sum (+1e-20) when `norm_topk_prob`, times `scaling` (`routed_scaling_factor`).
/// Returns (expert id, weight) pairs in ascending id order; ties keep the lower id.
pub fn route_sigmoid_grouped(
    logits: &[f32],
    bias: &[f32],
    k: usize,
    n_group: usize,
    topk_group: usize,
    norm_topk_prob: bool,
    scaling: f32,
) -> Vec<(usize, f32)> {
    let ne = logits.len();
    let s: Vec<f32> = logits.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect();
    let choice: Vec<f32> = s.iter().zip(bias).map(|(a, b)| a + b).collect();
    let per = ne / n_group.max(1);
    // descending by value, lower index first on ties (stable sort)
    let top = |v: &[f32], idx: &mut Vec<usize>| idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]));
    let mut keep = vec![true; ne];
    if n_group > 1 {
        let gs: Vec<f32> = choice
            .chunks_exact(per)
            .map(|g| {
                let mut i: Vec<usize> = (0..g.len()).collect();
                top(g, &mut i);
                g[i[0]] + g[i[1]]
            })
            .collect();
        let mut gi: Vec<usize> = (0..n_group).collect();
        top(&gs, &mut gi);
        keep = vec![false; ne];
        for &g in &gi[..topk_group.min(n_group)] {
            keep[g * per..(g + 1) * per].fill(true);
        }
    }
    let masked: Vec<f32> = choice
        .iter()
        .zip(&keep)
        .map(|(&c, &k)| if k { c } else { f32::NEG_INFINITY })
        .collect();
    let mut order: Vec<usize> = (0..ne).collect();
    top(&masked, &mut order);
    let mut chosen: Vec<(usize, f32)> = order[..k.min(ne)].iter().map(|&e| (e, s[e])).collect();
    if norm_topk_prob {
        let sum: f32 = chosen.iter().map(|c| c.1).sum::<f32>() + 1e-20;
        chosen.iter_mut().for_each(|c| c.1 /= sum);
    }
    chosen.iter_mut().for_each(|c| c.1 *= scaling);
    chosen.sort_by_key(|c| c.0);
    chosen
}

/// The experts a batch's `routes` use (each token's (expert, weight) pairs), heaviest summed
/// routing weight first, ties to the lower id: the order in which guesses are prefetched.
pub fn rank_by_weight(routes: &[Vec<(usize, f32)>]) -> Vec<usize> {
    let mut sum: std::collections::BTreeMap<usize, f32> = Default::default();
    for &(e, w) in routes.iter().flatten() {
        *sum.entry(e).or_default() += w;
    }
    let mut v: Vec<(usize, f32)> = sum.into_iter().collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    v.into_iter().map(|(e, _)| e).collect()
}

/// A MoE layer's router inside its spine unit, as [`next_experts`] applies it.
pub(super) struct RouterRef<'a> {
    /// The spine unit holding the router.
    pub unit: usize,
    /// The router matrix (`n_experts × hidden`).
    pub router: MatRef,
    /// The layer's post-attention RMSNorm weights (`hidden`) and its epsilon.
    pub norm: &'a [f32],
    pub eps: f32,
    /// The router bias added to every token's logits (`n_experts`; GPT-OSS), if any.
    pub bias: Option<&'a [f32]>,
}

/// A model's MoE routers and routing function, as the forward pass and [`next_experts`] use
/// them.
pub(super) trait Routers {
    /// Number of decoder layers.
    fn n_layers(&self) -> usize;
    /// Layer `l`'s router; `None` for a layer without one (a dense layer) or past the last.
    fn router(&self, l: usize) -> Option<RouterRef<'_>>;
    /// One token's routing in MoE layer `l` from its router logits (`n_experts`, bias added):
    /// the chosen (expert id, weight) pairs in ascending id order.
    fn route(&self, l: usize, logits: &[f32]) -> Vec<(usize, f32)>;
}

/// Every token's routing in MoE layer `l` from the router logits of `n` tokens
/// (`n × n_experts`, bias added), by [`Routers::route`].
pub(super) fn route_rows(
    m: &impl Routers,
    l: usize,
    logits: &[f32],
    n_experts: usize,
) -> Vec<Vec<(usize, f32)>> {
    logits
        .chunks_exact(n_experts)
        .map(|r| m.route(l, r))
        .collect()
}

/// The last token's routes of a pass's first MoE layer, [`next_experts`]'s guesses for the
/// next pass: `kept` takes the last of `routes` (one per token) the first time it is called
/// in a pass and keeps it after.
pub(super) fn keep_first<'a>(
    kept: &'a mut Option<Vec<(usize, f32)>>,
    routes: &[Vec<(usize, f32)>],
) -> &'a [(usize, f32)] {
    kept.get_or_insert_with(|| routes.last().cloned().unwrap_or_default())
}

/// The expert store's step after layer `l`'s experts ([`NextExperts`]): the experts of the
/// MoE layer planned after them, guessed and ranked best first ([`rank_by_weight`]), for the
/// store's prefetch ([`crate::store::ExpertStore::prefetch`]); nothing when there is no expert
/// store or its prefetch is off. While the store's read-ahead is on (long batches), the next
/// MoE layer of the pass read ahead whole instead ([`crate::store::ExpertStore::read_ahead`]),
/// and nothing after the last one.
///
/// When layer `l + 1` is a MoE layer whose router is resident, the guesses are its router
/// (and bias) and routing applied to `x` (the residual stream after layer `l`'s attention,
/// `n × hidden`) normed with layer `l + 1`'s post-attention norm; when its router is not
/// resident, there are none. After the last MoE layer, they are `first` (the experts the first
/// MoE layer gave the pass's last token) for the next pass's first MoE layer.
pub(super) fn next_experts(
    m: &impl Routers,
    store: &WeightStore,
    l: usize,
    x: &[f32],
    first: &[(usize, f32)],
) -> NextExperts {
    let Some(es) = store.experts() else {
        return NextExperts::None;
    };
    if es.read_ahead_active() {
        // a long batch: the next MoE layer of this pass, all of it, in file order
        return match ((l + 1)..m.n_layers()).find(|&i| m.router(i).is_some()) {
            Some(layer) => NextExperts::ReadAhead { layer },
            None => NextExperts::None,
        };
    }
    if !es.prefetch_enabled() {
        return NextExperts::None;
    }
    if let Some(r) = m.router(l + 1) {
        let Some(ub) = store.resident(r.unit) else {
            return NextExperts::None;
        };
        let (d, ne) = (r.norm.len(), r.router.rows);
        let n = x.len() / d;
        let mut xn = vec![0f32; n * d];
        rms_norm_rows(x, r.norm, r.eps, &mut xn);
        let mut logits = vec![0f32; n * ne];
        mm(&r.router.view(ub), &xn, n, &mut logits);
        if let Some(b) = r.bias {
            logits.chunks_exact_mut(ne).for_each(|row| add_into(row, b));
        }
        let guesses = rank_by_weight(&route_rows(m, l + 1, &logits, ne));
        NextExperts::Prefetch {
            layer: l + 1,
            guesses,
        }
    } else if ((l + 1)..m.n_layers()).all(|i| m.router(i).is_none()) {
        match (0..m.n_layers()).find(|&i| m.router(i).is_some()) {
            Some(layer) => NextExperts::Prefetch {
                layer,
                guesses: rank_by_weight(&[first.to_vec()]),
            },
            None => NextExperts::None,
        }
    } else {
        NextExperts::None
    }
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

    #[test]
    fn gpt_oss_routing_is_a_softmax_over_the_kept_logits() {
        // top-2 of [0, 2, -1, 2 + ln 3]: ids 1 and 3, weights softmax([2, 2 + ln 3]) = 1/4, 3/4
        let l = [0.0, 2.0, -1.0, 2.0 + 3f32.ln()];
        let r = route_topk_softmax(&l, 2);
        assert_eq!(r.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 3]);
        assert!(
            (r[0].1 - 0.25).abs() < 1e-6 && (r[1].1 - 0.75).abs() < 1e-6,
            "{r:?}"
        );
    }

    #[test]
    fn sigmoid_routing_limits_groups_and_uses_unbiased_weights() {
        // 4 groups of 2; logits 0 → s = 0.5 except where set
        let mut l = [0f32; 8];
        l[1] = 2.0; // group 0: s = 0.881
        l[6] = 1.0; // group 3: s = 0.731
        l[7] = 1.0;
        let mut b = [0f32; 8];
        b[2] = 0.6; // group 1 scores 1.1 + 0.5 = 1.6 (biased), beats group 0 (1.381)
        b[3] = 0.0;
        // groups by top-2 sum: g0 = 1.381, g1 = 1.6, g2 = 1.0, g3 = 1.462 → keep g1, g3
        let r = route_sigmoid_grouped(&l, &b, 2, 4, 2, true, 2.5);
        // best in {2, 3, 6, 7}: 2 (1.1 biased), then 6 (0.731, lower id than 7)
        assert_eq!(r.iter().map(|c| c.0).collect::<Vec<_>>(), [2, 6]);
        let s6 = 1.0 / (1.0 + (-1f32).exp());
        let sum = 0.5 + s6 + 1e-20;
        assert!((r[0].1 - 0.5 / sum * 2.5).abs() < 1e-6, "{r:?}");
        assert!((r[1].1 - s6 / sum * 2.5).abs() < 1e-6, "{r:?}");
        // one group: plain top-k of the biased scores, weights unnormalised
        let r = route_sigmoid_grouped(&l, &b, 2, 1, 1, false, 1.0);
        assert_eq!(r, vec![(1, 1.0 / (1.0 + (-2f32).exp())), (2, 0.5)]);
    }
}
