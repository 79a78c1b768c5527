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
//! result never depends on arrival order. One decode token whose experts are all resident (no
//! expert store) takes every expert's gate and up projections in one parallel region and their
//! down projections in a second (`resident_token_experts`), the same values and the same
//! reduction.

use std::io;

use super::layers::{add_into, mm, mm_each, mm_many, rms_norm_rows, silu};
use super::loading::MatRef;
use crate::backend::cpu::ops::softmax_inplace;
use crate::backend::cpu::Matrix;
use crate::store::{NextExperts, NextReads, UnitBytes, WeightStore};

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
/// `View` is what one expert's compute sees ([`ExpertView`] for SwiGLU experts of three
/// row-major matrices).
pub trait ExpertSource {
    /// One expert's weights, borrowed for the duration of [`ExpertSource::with_expert`].
    type View<'a>;
    /// Announces the experts of `layer` a batch uses, in ascending id order, before any of them
    /// is taken (so reads can start at once), then what the pass reads after them (`next`);
    /// `first_rows[i]` is the first batch row that uses `ids[i]` (a speculative verification's
    /// draft rows are told apart by it).
    fn plan_experts(&mut self, layer: usize, ids: &[usize], first_rows: &[usize], next: &NextReads);
    /// Runs `f` on expert `id` of `layer`; experts are taken in the order they were planned.
    ///
    /// Errors: the expert's bytes could not be read (the message names the file).
    fn with_expert<R>(
        &mut self,
        layer: usize,
        id: usize,
        f: impl FnOnce(&Self::View<'_>) -> R,
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
        f: &mut impl FnMut(usize, &Self::View<'_>),
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

impl ExpertMats {
    /// The matrices inside `u`, the bytes of the expert's unit.
    fn view<'a>(&self, u: &'a UnitBytes) -> ExpertView<'a> {
        ExpertView {
            gate: self.gate.view(u),
            up: self.up.view(u),
            down: self.down.view(u),
        }
    }
}

impl ExpertSource for StoreExperts<'_> {
    type View<'a> = ExpertView<'a>;

    fn plan_experts(
        &mut self,
        layer: usize,
        ids: &[usize],
        first_rows: &[usize],
        next: &NextReads,
    ) {
        let l = &self.table.units[layer];
        plan_in_store(self.store, layer, ids, first_rows, next, |e| l[e].0);
    }

    fn for_each_landed(
        &mut self,
        layer: usize,
        ids: &[usize],
        f: &mut impl FnMut(usize, &ExpertView),
    ) -> io::Result<()> {
        let l = &self.table.units[layer];
        landed_in_store(self.store, layer, ids, |e| l[e].0, &mut |id, u| {
            f(id, &l[id].1.view(u))
        })
    }

    fn with_expert<R>(
        &mut self,
        layer: usize,
        id: usize,
        f: impl FnOnce(&ExpertView<'_>) -> R,
    ) -> io::Result<R> {
        let (unit, m) = self.table.units[layer][id];
        self.store.with_unit(unit, |u| f(&m.view(u)))
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

/// One MoE layer's routed-experts step, as the decoder skeleton hands it to
/// [`super::decoder::Blocks::experts`]:
/// add the routed experts of layer `layer` to `out` (`n × hidden`) for the normed rows `xn`
/// (`n × hidden`) routed by `routes` (one list of (expert, weight) per row), the reads in
/// `next` planned right after the experts' (see [`moe_forward_with`]).
pub struct ExpertStep<'a> {
    pub store: &'a mut WeightStore,
    pub layer: usize,
    pub routes: &'a [Vec<(usize, f32)>],
    pub xn: &'a [f32],
    pub out: &'a mut [f32],
    pub next: NextReads,
}

/// A decoder's routed-experts step ([`ExpertStep`]) over SwiGLU experts kept
/// in the store as units (`table`), `d` the hidden size: [`moe_forward`].
///
/// Errors: an expert could not be read.
pub(super) fn store_swiglu_experts(
    table: &UnitExperts,
    d: usize,
    step: ExpertStep<'_>,
) -> io::Result<()> {
    let mut step = step;
    if resident_token_experts(table, d, &mut step) {
        return Ok(());
    }
    let mut src = StoreExperts {
        table,
        store: step.store,
    };
    moe_forward(
        &mut src,
        step.layer,
        step.routes,
        step.xn,
        d,
        step.out,
        &step.next,
    )
}

/// One token's routed experts when every one of them is resident and no expert store is
/// attached (a decode step with the weights in RAM): the gate and up projections of all of
/// them in one parallel region, their down projections in a second ([`mm_many`],
/// [`mm_each`]), instead of two regions per expert; the reads after them planned as
/// [`plan_in_store`] plans them (resident units need no read). Each expert's output and the
/// reduction in ascending id order are those of [`moe_forward`], bit for bit. `false` (nothing
/// done) when the step is not such a step.
fn resident_token_experts(table: &UnitExperts, d: usize, step: &mut ExpertStep<'_>) -> bool {
    let [route] = step.routes else {
        return false;
    };
    let units = &table.units[step.layer];
    if step.store.experts().is_some()
        || route.is_empty()
        || !route.windows(2).all(|p| p[0].0 < p[1].0)
        || !route
            .iter()
            .all(|&(e, _)| step.store.resident(units[e].0).is_some())
    {
        return false;
    }
    step.store.plan_next(&step.next);
    let store: &WeightStore = step.store;
    let views: Vec<ExpertView> = route
        .iter()
        .map(|&(e, _)| {
            let (unit, m) = &units[e];
            m.view(store.resident(*unit).expect("resident"))
        })
        .collect();
    let ff = views[0].gate.rows;
    let k = views.len();
    let mut gu = vec![0f32; 2 * k * ff];
    {
        let ws: Vec<&Matrix> = views.iter().flat_map(|v| [&v.gate, &v.up]).collect();
        let mut ys: Vec<&mut [f32]> = views
            .iter()
            .zip(gu.chunks_exact_mut(2 * ff))
            .flat_map(|(_, pair)| {
                let (g, u) = pair.split_at_mut(ff);
                [g, u]
            })
            .collect();
        mm_many(&ws, step.xn, 1, &mut ys);
    }
    let mut acts = vec![0f32; k * ff];
    for (a, pair) in acts.chunks_exact_mut(ff).zip(gu.chunks_exact(2 * ff)) {
        let (g, u) = pair.split_at(ff);
        for ((o, &gv), &uv) in a.iter_mut().zip(g).zip(u) {
            *o = silu(gv) * uv;
        }
    }
    let mut ys = vec![0f32; k * d];
    {
        let ws: Vec<&Matrix> = views.iter().map(|v| &v.down).collect();
        let xs: Vec<&[f32]> = acts.chunks_exact(ff).collect();
        let mut outs: Vec<&mut [f32]> = ys.chunks_exact_mut(d).collect();
        mm_each(&ws, &xs, &mut outs);
    }
    // the reduction of `moe_forward_with`: ascending expert id, each output times its weight
    for (&(_, wt), y) in route.iter().zip(ys.chunks_exact(d)) {
        for (o, v) in step.out[..d].iter_mut().zip(y) {
            *o += wt * v;
        }
    }
    true
}

/// The MoE feed-forward of layer `layer` for `n` tokens with SwiGLU experts
/// ([`ExpertView`]): [`moe_forward_with`] computing `down(silu(gate(x)) · up(x))`.
///
/// Errors: an expert could not be read.
pub fn moe_forward<S>(
    src: &mut S,
    layer: usize,
    routes: &[Vec<(usize, f32)>],
    x: &[f32],
    d: usize,
    out: &mut [f32],
    next: &NextReads,
) -> io::Result<()>
where
    S: for<'a> ExpertSource<View<'a> = ExpertView<'a>>,
{
    moe_forward_with(src, layer, routes, x, d, out, next, |w, xg, m, y| {
        let ff = w.gate.rows;
        let mut g = vec![0f32; m * ff];
        let mut u = vec![0f32; m * ff];
        mm_many(&[&w.gate, &w.up], xg, m, &mut [&mut g, &mut u]);
        g.iter_mut().zip(&u).for_each(|(a, b)| *a = silu(*a) * b);
        mm(&w.down, &g, m, y);
    })
}

/// The MoE feed-forward of layer `layer` for `n` tokens: `routes[t]` are token `t`'s (expert,
/// weight) pairs in ascending id order, `x` the normed input (`n × d`). Adds
/// `Σ_e w_e · expert_e(x_t)` to each row of `out` (`n × d`), experts in ascending id order;
/// `expert(view, xg, m, y)` computes one expert over its `m` gathered rows `xg` (`m × d`)
/// into `y` (`m × d`). The reads `next` are planned right after the experts (the store's
/// plan step that follows them: [`ExpertSource::plan_experts`]).
///
/// Errors: an expert could not be read.
#[allow(clippy::too_many_arguments)]
pub fn moe_forward_with<S: ExpertSource>(
    src: &mut S,
    layer: usize,
    routes: &[Vec<(usize, f32)>],
    x: &[f32],
    d: usize,
    out: &mut [f32],
    next: &NextReads,
    mut expert: impl FnMut(&S::View<'_>, &[f32], usize, &mut [f32]),
) -> io::Result<()> {
    // union of the batch's experts, ascending, with each expert's (token, weight) group
    let mut groups: std::collections::BTreeMap<usize, Vec<(usize, f32)>> = Default::default();
    for (t, r) in routes.iter().enumerate() {
        for &(e, w) in r {
            groups.entry(e).or_default().push((t, w));
        }
    }
    let ids: Vec<usize> = groups.keys().copied().collect();
    // groups list their tokens in row order: the first is the first row using the expert
    let first_rows: Vec<usize> = groups.values().map(|g| g[0].0).collect();
    src.plan_experts(layer, &ids, &first_rows, next);
    // each expert's output rows (group order), computed as its bytes land
    let mut outs: std::collections::BTreeMap<usize, Vec<f32>> = Default::default();
    src.for_each_landed(layer, &ids, &mut |e, w| {
        let group = &groups[&e];
        let m = group.len();
        let mut xg = vec![0f32; m * d];
        for (i, &(t, _)) in group.iter().enumerate() {
            xg[i * d..(i + 1) * d].copy_from_slice(&x[t * d..(t + 1) * d]);
        }
        let mut y = vec![0f32; m * d];
        expert(w, &xg, m, &mut y);
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

    /// 1×1 experts (gate 1, up `id + 1`, down 1) recording the order they are planned and taken.
    struct Fake {
        planned: Vec<usize>,
        taken: Vec<usize>,
    }

    impl ExpertSource for Fake {
        type View<'a> = ExpertView<'a>;

        fn plan_experts(
            &mut self,
            _layer: usize,
            ids: &[usize],
            _first_rows: &[usize],
            next: &NextReads,
        ) {
            self.planned.extend_from_slice(ids);
            self.planned.extend(next.units.iter().map(|u| 100 + u));
        }
        fn with_expert<R>(
            &mut self,
            _layer: usize,
            id: usize,
            f: impl FnOnce(&ExpertView<'_>) -> R,
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
        let next = NextReads {
            units: vec![7],
            experts: NextExperts::None,
        };
        moe_forward(&mut src, 0, &routes, &x, 1, &mut out, &next).unwrap();
        // the experts, then what comes after them (unit 7, recorded as 107)
        assert_eq!(src.planned, [0, 1, 3, 107]);
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
