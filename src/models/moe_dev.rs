//! The routed-experts step on any [`Device`]: the grouping, plan, arrival-order compute and
//! ascending-id reduction of the MoE block ([`experts_on_with`]), with each expert's rows
//! gathered, its feed-forward computed (a gated GLU: [`store_glu_experts_on`]; GPT-OSS's own
//! in its family) and its weighted output scattered back by the device's ops.
//!
//! An expert's matrices come from the store as host bytes (its unit, or the expert store's
//! buffer it landed in) and a GPU copies them for the products of this pass (the simplest
//! correct tiering: no VRAM expert cache, no pinned staging, no copy stream yet; docs/cuda.md).
//! Experts of a model held wholly resident without an expert store are resident units, kept on
//! the device after their first use.

use std::collections::BTreeMap;

use anyhow::{anyhow, Result};

use super::device::Device;
use super::layers::generic::{glu_mlp_on, W};
use super::moe::{landed_in_store, plan_in_store, UnitExperts};
use crate::backend::Glu;
use crate::store::{NextReads, UnitBytes, WeightStore};

/// One MoE layer's routed-experts step on a device, as the decoder skeleton hands it to
/// `Blocks::experts_on`: add the routed experts of layer `layer` to `out` (`n × width`) for
/// the normed rows `xn` (`n × width`) routed by `routes` (one list of (expert, weight) per
/// row), the reads in `next` planned right after the experts'.
pub struct ExpertStepOn<'a, D: Device> {
    pub store: &'a mut WeightStore,
    pub layer: usize,
    pub routes: &'a [Vec<(usize, f32)>],
    pub xn: &'a D::Buf,
    pub out: &'a mut D::Buf,
    pub next: NextReads,
}

/// The routed gated experts of one layer (`table`, units of the store; activation `act`),
/// rows `d` wide, on `dev`: [`experts_on_with`] with each expert's `down(act(gate·x) ·
/// up·x)` ([`glu_mlp_on`]); a decode token whose experts are all resident takes
/// `resident_token_on` (the same values).
///
/// Errors: an expert could not be read (the message names the file and expert); the device's.
pub fn store_glu_experts_on<D: Device>(
    dev: &D,
    table: &UnitExperts,
    act: Glu,
    d: usize,
    step: ExpertStepOn<'_, D>,
) -> Result<()> {
    let units = &table.units[step.layer];
    if let [route] = step.routes {
        let (store, layer, xn, next) = (&mut *step.store, step.layer, step.xn, &step.next);
        if resident_token_on(dev, table, act, d, store, layer, route, xn, step.out, next)? {
            return Ok(());
        }
    }
    experts_on_with(
        dev,
        d,
        step,
        |e| units[e].0,
        |u, keep, e, xg, m| {
            let mats = &units[e].1;
            let w = |r: &super::loading::MatRef| W { m: r.view(u), keep };
            let (g, up, down) = (w(&mats.gate), w(&mats.up), w(&mats.down));
            glu_mlp_on(dev, act, [&g, &up, &down], xg, m)
        },
    )
}

/// The routed experts of one MoE layer on `dev`, each computed by `expert`, rows `d` wide:
/// each expert of the batch's union (its unit `unit(e)`) read once, its token group gathered
/// and computed as its bytes land (`expert(bytes, keep, e, rows, m)`: `m × d` rows in,
/// a new `m × d` buffer out; `keep`: the unit is resident and no expert store is attached,
/// so a device may keep its copy); outputs added to `step.out` in ascending expert id order,
/// each row of a group weighted by its routing weight (the order of the host MoE step this
/// replaced, so the CPU's values are its values bit for bit).
///
/// Errors: an expert could not be read (the message names the file and expert); the device's.
pub fn experts_on_with<D: Device>(
    dev: &D,
    d: usize,
    step: ExpertStepOn<'_, D>,
    unit: impl Fn(usize) -> usize,
    mut expert: impl FnMut(&UnitBytes, bool, usize, &D::Buf, usize) -> Result<D::Buf>,
) -> Result<()> {
    let ExpertStepOn {
        store,
        layer,
        routes,
        xn,
        out,
        next,
    } = step;
    let mut groups: BTreeMap<usize, Vec<(usize, f32)>> = BTreeMap::new();
    for (t, r) in routes.iter().enumerate() {
        for &(e, w) in r {
            groups.entry(e).or_default().push((t, w));
        }
    }
    let ids: Vec<usize> = groups.keys().copied().collect();
    let first_rows: Vec<usize> = groups.values().map(|g| g[0].0).collect();
    // resident units without an expert store keep their bytes where they are
    let keep = |s: &WeightStore, e: usize| s.experts().is_none() && s.resident(unit(e)).is_some();
    let kept: BTreeMap<usize, bool> = ids.iter().map(|&e| (e, keep(store, e))).collect();
    plan_in_store(store, layer, &ids, &first_rows, &next, &unit);
    let mut outs: BTreeMap<usize, D::Buf> = BTreeMap::new();
    let mut failed: Option<anyhow::Error> = None;
    landed_in_store(store, layer, &ids, &unit, &mut |e, u| {
        if failed.is_some() {
            return;
        }
        let rows: Vec<usize> = groups[&e].iter().map(|g| g.0).collect();
        let m = rows.len();
        let r = dev.zeros(m * d).and_then(|mut xg| {
            dev.gather_rows(xn, d, &rows, &mut xg)?;
            expert(u, kept[&e], e, &xg, m)
        });
        match r {
            Ok(y) => {
                outs.insert(e, y);
            }
            Err(err) => failed = Some(err),
        }
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    for (e, group) in &groups {
        let y = outs
            .get(e)
            .ok_or_else(|| anyhow!("expert {e} of layer {layer} never arrived"))?;
        let rows: Vec<usize> = group.iter().map(|g| g.0).collect();
        let weights: Vec<f32> = group.iter().map(|g| g.1).collect();
        dev.scatter_add_rows(y, d, &rows, &weights, out)?;
    }
    Ok(())
}

/// One token's routed experts when every one of them is resident and no expert store is
/// attached (a decode step with the weights in memory): the gate and up projections of all of
/// them in one call ([`crate::backend::Backend::matmul_host_many`]), their down projections
/// in a second ([`crate::backend::Backend::matmul_host_each`]), so the CPU enters its pool
/// twice per layer instead of twice per expert. The reads after them are planned as
/// `moe::plan_in_store` plans them (resident units need no read). Each expert's output and the
/// reduction in ascending id order are those of the general path above, bit for bit. `false`
/// (nothing done) when the step is not such a step.
///
/// Errors: the device's.
#[allow(clippy::too_many_arguments)]
fn resident_token_on<D: Device>(
    dev: &D,
    table: &UnitExperts,
    act: Glu,
    d: usize,
    store: &mut WeightStore,
    layer: usize,
    route: &[(usize, f32)],
    xn: &D::Buf,
    out: &mut D::Buf,
    next: &NextReads,
) -> Result<bool> {
    let units = &table.units[layer];
    if store.experts().is_some()
        || route.is_empty()
        || !route.windows(2).all(|p| p[0].0 < p[1].0)
        || !route
            .iter()
            .all(|&(e, _)| store.resident(units[e].0).is_some())
    {
        return Ok(false);
    }
    store.plan_next(next);
    let store: &WeightStore = store;
    let mats: Vec<[crate::backend::cpu::Matrix; 3]> = route
        .iter()
        .map(|&(e, _)| {
            let (unit, m) = &units[e];
            let u = store.resident(*unit).expect("resident");
            [m.gate.view(u), m.up.view(u), m.down.view(u)]
        })
        .collect();
    let gate_up: Vec<(&crate::backend::cpu::Matrix, bool)> = mats
        .iter()
        .flat_map(|[g, u, _]| [(g, true), (u, true)])
        .collect();
    let mut gu = gate_up
        .iter()
        .map(|(w, _)| dev.zeros(w.rows))
        .collect::<Result<Vec<_>>>()?;
    {
        let mut refs: Vec<&mut D::Buf> = gu.iter_mut().collect();
        dev.matmul_host_many(&gate_up, xn, 1, &mut refs)?;
    }
    let mut acts = Vec::with_capacity(mats.len());
    let mut it = gu.into_iter();
    while let (Some(mut g), Some(u)) = (it.next(), it.next()) {
        dev.glu(act, &mut g, &u)?;
        acts.push(g);
    }
    let downs: Vec<(&crate::backend::cpu::Matrix, bool)> =
        mats.iter().map(|[_, _, dn]| (dn, true)).collect();
    let mut ys = (0..mats.len())
        .map(|_| dev.zeros(d))
        .collect::<Result<Vec<_>>>()?;
    {
        let xs: Vec<&D::Buf> = acts.iter().collect();
        let mut refs: Vec<&mut D::Buf> = ys.iter_mut().collect();
        dev.matmul_host_each(&downs, &xs, 1, &mut refs)?;
    }
    // the reduction of the general path: ascending expert id, each output times its weight
    for (&(_, wt), y) in route.iter().zip(&ys) {
        dev.scatter_add_rows(y, d, &[0], &[wt], out)?;
    }
    Ok(true)
}
