//! The decoder's one layer loop, on any [`Device`] (the CPU or a GPU), through
//! [`Blocks::spine_on`], [`Blocks::experts_on`], [`Blocks::tail_on`] and
//! [`Blocks::finish_hidden_on`]: the residual stream, the normed rows and the cache slots live
//! on the device; routing, the expert store and sampling stay on the host (the router logits
//! come back each MoE layer, and the residual stream when the expert store guesses the next
//! layer's experts from it).
//!
//! The reads are planned as `decoder.rs`'s module header says. The embedding rows are decoded
//! on the host and uploaded (`n × hidden` floats per pass).

use anyhow::Result;

use super::batch::{SeqPass, SeqRows, Seqs};
use super::decoder::{Blocks, Decoder, ScratchOn};
use super::device::Device;
use super::layers::generic::norm_on;
use super::moe::{keep_first, next_experts, route_rows};
use super::moe_dev::ExpertStepOn;
use super::Logits;
use crate::store::{NextReads, WeightStore};

impl<B: Blocks> Decoder<B> {
    /// The layer loop on `dev` for the sequences of `batch` whose tokens, concatenated in
    /// order, are `tokens`: one logits vector per sequence (`decoder.rs`'s
    /// `forward_planned` on a device).
    ///
    /// Errors: a streamed weight or expert could not be read; the device's.
    pub(super) fn forward_on<D: Device>(
        &self,
        dev: &D,
        store: &mut WeightStore,
        batch: &mut [SeqPass<'_>],
        tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>> {
        let b = &self.blocks;
        let (n, d) = (tokens.len(), self.dims.hidden_size);
        let modes: Vec<(Logits, usize)> =
            batch.iter().map(|p| (p.logits, p.tokens.len())).collect();
        let mut seqs = Seqs::new(
            batch
                .iter_mut()
                .map(|p| SeqRows {
                    pos0: p.cache.len,
                    n: p.tokens.len(),
                    cache: &mut *p.cache,
                })
                .collect(),
        );
        let whole = b.plan_whole_pass();
        let mut xh = vec![0f32; n * d];
        self.embedding.rows(store, tokens, d, &mut xh)?;
        b.scale_embeddings(&mut xh);
        let mut x = dev.upload(&xh)?;
        let mut s = ScratchOn {
            xn: dev.zeros(n * d)?,
            router: Vec::new(),
            shared: None,
            bank: Vec::new(),
        };
        let mut first_routes: Option<Vec<(usize, f32)>> = None;
        for (l, (unit, w)) in self.layers.iter().enumerate() {
            let moe = b.is_moe(w);
            if !moe && !whole {
                self.plan_after(store, l);
            }
            let t = std::time::Instant::now();
            let keep = store.resident(*unit).is_some();
            store.with_unit(*unit, |u| {
                b.spine_on(dev, l, w, u, keep, &mut seqs, &mut x, &mut s)
            })??;
            if let Some(es) = store.experts_mut() {
                es.add_spine_ns(l, t.elapsed().as_nanos() as u64);
            }
            if moe {
                let routes = route_rows(self, l, &s.router, b.n_experts());
                let first = keep_first(&mut first_routes, &routes);
                let tail = b.tail_unit(w);
                let mut out = dev.zeros(n * b.routed_width().unwrap_or(d))?;
                // what the pass reads after the experts, queued by the store right after them
                let mut next = NextReads::default();
                next.units.extend(tail);
                if !whole {
                    match self.layers.get(l + 1) {
                        Some((u, _)) => next.units.push(*u),
                        None => next.units.extend(self.head.units()),
                    }
                }
                if store.experts().is_some() {
                    dev.download(&x, &mut xh)?;
                }
                next.experts = next_experts(self, store, l, &xh, first);
                b.experts_on(
                    dev,
                    ExpertStepOn {
                        store: &mut *store,
                        layer: l,
                        routes: &routes,
                        xn: &s.xn,
                        out: &mut out,
                        next,
                    },
                )?;
                if let Some(t) = tail {
                    let keep = store.resident(t).is_some();
                    out = store.with_unit(t, |u| b.tail_on(dev, l, w, u, keep, &out, n))??;
                }
                // Σ routed + shared, then the residual (the module header of decoder.rs)
                if let Some(sh) = s.shared.take() {
                    dev.add(&mut out, &sh)?;
                }
                dev.add(&mut x, &out)?;
            }
        }
        b.finish_hidden_on(dev, &mut x, n, &mut s)?;
        if seqs.each().any(|(_, sq)| sq.cache.hidden.on) {
            dev.download(&x, &mut xh)?;
            for (r0, sq) in seqs.each() {
                let rows = &xh[r0 * d..(r0 + sq.n) * d];
                sq.cache.hidden.record(sq.pos0, rows, d);
            }
        }
        // the rows that return logits, every sequence's, through the head at once
        let mut picked = Vec::new();
        let mut r0 = 0;
        for &(which, m) in &modes {
            match which {
                Logits::Last => picked.push(r0 + m - 1),
                Logits::All => picked.extend(r0..r0 + m),
            }
            r0 += m;
        }
        let (vocab, m) = (self.dims.vocab_size, picked.len());
        let h = match m == n {
            true => x,
            false => {
                let mut h = dev.zeros(m * d)?;
                dev.gather_rows(&x, d, &picked, &mut h)?;
                h
            }
        };
        let h = norm_on(dev, &h, m * d, &self.final_norm, self.dims.final_norm_eps)?;
        // each sequence's logits: a span of the head's `m × vocab` output
        let mut spans = Vec::with_capacity(modes.len());
        let mut at = 0;
        for &(which, rows) in &modes {
            let len = vocab * if which == Logits::Last { 1 } else { rows };
            spans.push(at..at + len);
            at += len;
        }
        let mut outs = self.head_logits_on(dev, store, &h, m, vocab, &spans)?;
        for o in &mut outs {
            b.finish_logits(o);
        }
        Ok(outs)
    }

    /// The LM head over `m` normed rows `h` on `dev`: the `m × vocab` logits on the host, one
    /// vector per span of `spans` (ranges of floats tiling `0..m × vocab`, see
    /// [`crate::backend::Backend::download_spans`]), the resident head kept on the device,
    /// streamed chunks copied for this pass.
    ///
    /// Errors: a streamed chunk could not be read; the device's.
    fn head_logits_on<D: Device>(
        &self,
        dev: &D,
        store: &mut WeightStore,
        h: &D::Buf,
        m: usize,
        vocab: usize,
        spans: &[std::ops::Range<usize>],
    ) -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::new();
        for (unit, r0, mr) in self.head.parts() {
            let keep = store.resident(unit).is_some();
            let mut y = dev.zeros(m * mr.rows)?;
            store.with_unit(unit, |u| dev.matmul_host(&mr.view(u), keep, h, m, &mut y))??;
            if mr.rows == vocab {
                // the whole head in one part: its product is the logits
                return dev.download_spans(y, m * vocab, spans);
            }
            out.resize(m * vocab, 0.0);
            let tmp = dev.download_owned(y, m * mr.rows)?;
            for i in 0..m {
                out[i * vocab + r0..i * vocab + r0 + mr.rows]
                    .copy_from_slice(&tmp[i * mr.rows..(i + 1) * mr.rows]);
            }
        }
        crate::backend::check_spans(spans, out.len())?;
        crate::backend::split_spans(out, spans)
    }
}
