//! The routed-experts step on any [`Device`]: [`super::moe::moe_forward`]'s grouping, plan,
//! arrival-order compute and ascending-id reduction, with each expert's rows gathered, its
//! SwiGLU computed and its weighted output scattered back by the device's ops.
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
use crate::store::{NextReads, WeightStore};

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

/// The routed SwiGLU experts of one layer (`table`, units of the store), rows `d` wide, on
/// `dev`: each expert of the batch's union read once, computing its token group as its bytes
/// land; outputs added to `step.out` in ascending expert id order, each row of a group
/// weighted by its routing weight ([`super::moe::moe_forward_with`]'s order, so the CPU's
/// values are its values bit for bit).
///
/// Errors: an expert could not be read (the message names the file and expert); the device's.
pub fn store_swiglu_experts_on<D: Device>(
    dev: &D,
    table: &UnitExperts,
    d: usize,
    step: ExpertStepOn<'_, D>,
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
    let units = &table.units[layer];
    // resident units without an expert store keep their bytes where they are
    let keep =
        |s: &WeightStore, e: usize| s.experts().is_none() && s.resident(units[e].0).is_some();
    let kept: BTreeMap<usize, bool> = ids.iter().map(|&e| (e, keep(store, e))).collect();
    plan_in_store(store, layer, &ids, &first_rows, &next, |e| units[e].0);
    let mut outs: BTreeMap<usize, D::Buf> = BTreeMap::new();
    let mut failed: Option<anyhow::Error> = None;
    landed_in_store(store, layer, &ids, |e| units[e].0, &mut |e, u| {
        if failed.is_some() {
            return;
        }
        let rows: Vec<usize> = groups[&e].iter().map(|g| g.0).collect();
        let m = rows.len();
        let mats = &units[e].1;
        let keep = kept[&e];
        let w = |r: &super::loading::MatRef| W { m: r.view(u), keep };
        let r = dev.zeros(m * d).and_then(|mut xg| {
            dev.gather_rows(xn, d, &rows, &mut xg)?;
            let (g, up, down) = (w(&mats.gate), w(&mats.up), w(&mats.down));
            glu_mlp_on(dev, Glu::Swiglu, [&g, &up, &down], &xg, m)
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
