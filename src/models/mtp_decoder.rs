//! A decoder's multi-token-prediction layer ([`MtpLayer`](super::mtp_layer::MtpLayer), DeepSeek-V3 technical report,
//! sec. 2.2; the Hugging Face layout is `model.layers.{num_hidden_layers}.*`), run as
//! [`crate::models::Mtp`] by the [`Decoder`] that owns it: the embedding of the next token
//! and the hidden state of the current position, each RMS-normed, concatenated (embedding
//! first) and projected by `eh_proj` (`hidden × 2·hidden`), then one full decoder block of
//! the family (its [`Blocks::spine_on`] as layer `index`, and its routed experts through the
//! same expert store as the target's, addressed as layer `index`, by [`Blocks::experts_on`]),
//! then `shared_head.norm` and the LM head: the layer's own `shared_head.head` when the
//! checkpoint has one, else the model's. The block runs on the decoder's CPU backend (the
//! families with such a layer need ops CUDA lacks).
//!
//! The block's KV cache is a cache of `index + 1` layers of which only layer `index` holds
//! rows ([`crate::models::Mtp::new_mtp_cache`]), so the family's spine runs unchanged.

use anyhow::{bail, Context, Result};

use super::batch::Seqs;
use super::decoder::{Blocks, CacheShape, Decoder, ScratchOn};
use super::moe_dev::ExpertStepOn;
use super::mtp_layer::MtpLayer;
use crate::backend::Backend;
use crate::models::layers::{add_into, mm, rms_norm_rows};
use crate::models::moe::route_rows;
use crate::models::{run_pass, KvCache, Logits, Mtp, MtpOut};
use crate::store::{NextExperts, NextReads, WeightStore};

impl<B: Blocks> Decoder<B> {
    /// This decoder with its multi-token-prediction layer `m`, whose units are in the
    /// decoder's store; its caches then record hidden rows ([`KvCache::hidden`]).
    pub fn with_mtp(mut self, m: MtpLayer<B::Layer>) -> Self {
        self.mtp = Some(m);
        self
    }

    /// Queues the head the layer uses (its own or the model's; nothing when resident).
    fn plan_mtp_head(&self, m: &MtpLayer<B::Layer>, store: &mut WeightStore) {
        m.head.as_ref().unwrap_or(&self.head).plan(store)
    }
}

impl<B: Blocks> Mtp for Decoder<B> {
    fn hidden_size(&self) -> usize {
        self.dims.hidden_size
    }

    fn new_mtp_cache(&self, n_ctx: usize) -> KvCache {
        let n = n_ctx.min(self.dims.context_length);
        let index = self.mtp.as_ref().map_or(0, |m| m.index);
        let mut c = match self.dims.cache {
            CacheShape::Kv { kv_dim } => KvCache::new(1, n, kv_dim),
            CacheShape::Latent { width } => KvCache::new_latent(1, n, width),
        };
        for v in [&mut c.k, &mut c.v, &mut c.state] {
            v.splice(0..0, (0..index).map(|_| Vec::new()));
        }
        c
    }

    fn forward_mtp(
        &self,
        store: &mut WeightStore,
        cache: &mut KvCache,
        hidden: &[f32],
        tokens: &[u32],
        logits: Logits,
    ) -> Result<MtpOut> {
        let m = self
            .mtp
            .as_ref()
            .context("this model was loaded without a multi-token-prediction layer")?;
        let b = &self.blocks;
        let (n, d, vocab) = (tokens.len(), self.dims.hidden_size, self.dims.vocab_size);
        if hidden.len() != n * d {
            bail!(
                "multi-token prediction over {n} tokens needs {n} × {d} hidden floats, got {}",
                hidden.len()
            );
        }
        if b.tail_unit(&m.layer).is_some() || b.routed_width().is_some() {
            bail!("multi-token prediction is not supported for layers with a routed tail");
        }
        let moe = b.is_moe(&m.layer);
        let plan = |s: &mut WeightStore| {
            match &m.embed {
                Some(e) => e.plan_rows(s, tokens),
                None => self.embedding.plan(s, tokens, d),
            }
            s.plan([m.unit]);
            if !moe {
                self.plan_mtp_head(m, s);
            }
        };
        let mut out_hidden = Vec::new();
        let logits = run_pass(store, cache, tokens, vocab, plan, |store, cache| {
            let pos0 = cache.len;
            let mut e = vec![0f32; n * d];
            match &m.embed {
                Some(c) => c.rows(store, tokens, d, &mut e)?,
                None => self.embedding.rows(store, tokens, d, &mut e)?,
            }
            let mut x = vec![0f32; n * d];
            let dev = &self.cpu;
            let mut s = ScratchOn {
                xn: vec![0f32; n * d],
                router: Vec::new(),
                shared: None,
                bank: Vec::new(),
            };
            store.with_unit(m.unit, |u| {
                // [enorm(e_i); hnorm(h_i)] per row, then eh_proj
                let mut cat = vec![0f32; n * 2 * d];
                for r in 0..n {
                    let row = &mut cat[r * 2 * d..(r + 1) * 2 * d];
                    let (ce, ch) = row.split_at_mut(d);
                    rms_norm_rows(&e[r * d..(r + 1) * d], &m.enorm, m.eps, ce);
                    rms_norm_rows(&hidden[r * d..(r + 1) * d], &m.hnorm, m.eps, ch);
                }
                mm(&m.eh_proj.view(u), &cat, n, &mut x);
                let keep = false;
                let mut seqs = Seqs::one(cache, pos0, n);
                b.spine_on(dev, m.index, &m.layer, u, keep, &mut seqs, &mut x, &mut s)
            })??;
            if moe {
                let routes = route_rows(self, m.index, &s.router, b.n_experts());
                let mut out = vec![0f32; n * d];
                b.experts_on(
                    dev,
                    ExpertStepOn {
                        store,
                        layer: m.index,
                        routes: &routes,
                        xn: &s.xn,
                        out: &mut out,
                        next: NextReads {
                            units: m.head.as_ref().unwrap_or(&self.head).units(),
                            experts: NextExperts::None,
                        },
                    },
                )?;
                if let Some(sh) = &s.shared {
                    dev.add(&mut out, sh)?;
                }
                add_into(&mut x, &out);
            }
            let rows = match logits {
                Logits::Last => n - 1..n,
                Logits::All => 0..n,
            };
            let k = rows.len();
            let mut h = vec![0f32; k * d];
            rms_norm_rows(
                &x[rows.start * d..rows.end * d],
                &m.head_norm,
                m.eps,
                &mut h,
            );
            let mut out = vec![0f32; k * vocab];
            m.head
                .as_ref()
                .unwrap_or(&self.head)
                .logits(store, &h, k, vocab, &mut out)?;
            b.finish_logits(&mut out);
            out_hidden = x;
            Ok(out)
        })?;
        Ok(MtpOut {
            logits,
            hidden: out_hidden,
        })
    }
}
