//! The weights of a decoder's multi-token-prediction layer (DeepSeek-V3 technical report,
//! sec. 2.2; the Hugging Face layout is `model.layers.{num_hidden_layers}.*`): [`MtpLayer`]
//! and the chunked own-embedding table it may carry ([`ChunkedMatrix`]). Built by a family's
//! loader (DeepSeek V3), held by [`crate::models::decoder::Decoder`] and run by
//! `mtp_decoder.rs`.

use anyhow::{Context, Result};

use crate::models::embed_head::Head;
use crate::models::loading::MatRef;
use crate::quant::dequantize_row;
use crate::store::WeightStore;

/// A `rows × cols` matrix held as chunks of whole rows, each its own unit (resident or
/// streamed like any spine unit): `(unit id, first row, matrix view of the chunk)`. Used for
/// the layer's own embeddings; its own head is a [`Head::Chunks`] of the same chunks.
#[derive(Clone, Debug)]
pub struct ChunkedMatrix {
    pub chunks: Vec<(usize, usize, MatRef)>,
}

impl ChunkedMatrix {
    /// The chunk holding row `r`: `(unit, first row, view)`.
    fn chunk_of(&self, r: usize) -> Option<&(usize, usize, MatRef)> {
        self.chunks
            .iter()
            .find(|(_, r0, m)| (*r0..*r0 + m.rows).contains(&r))
    }

    /// Queues the chunk of each token's row, in order (nothing for resident chunks).
    pub(super) fn plan_rows(&self, store: &mut WeightStore, tokens: &[u32]) {
        for &t in tokens {
            if let Some((u, _, _)) = self.chunk_of(t as usize) {
                store.plan([*u]);
            }
        }
    }

    /// The rows of `tokens`, dequantized into `x` (`n × d`).
    ///
    /// Errors: a streamed chunk could not be read.
    pub(super) fn rows(
        &self,
        store: &mut WeightStore,
        tokens: &[u32],
        d: usize,
        x: &mut [f32],
    ) -> Result<()> {
        for (i, &t) in tokens.iter().enumerate() {
            let (u, r0, m) = self
                .chunk_of(t as usize)
                .context("token outside the table")?;
            let row = &mut x[i * d..(i + 1) * d];
            store.with_unit(*u, |b| {
                dequantize_row(m.ty, m.view(b).row(t as usize - r0), row)
            })?;
        }
        Ok(())
    }
}

/// The multi-token-prediction layer of a decoder (see the module header).
pub struct MtpLayer<L> {
    /// Its layer index: `num_hidden_layers` (the family's norms, routing, experts and the
    /// cache layer are looked up under it).
    pub index: usize,
    /// The spine unit: `eh_proj` and the block's attention, dense MLP or router and shared
    /// experts.
    pub unit: usize,
    /// The block's weights inside `unit`.
    pub layer: L,
    /// `eh_proj` (`hidden × 2·hidden`) inside `unit`.
    pub eh_proj: MatRef,
    /// `enorm`, `hnorm` and `shared_head.norm` weights (`hidden` each).
    pub enorm: Vec<f32>,
    pub hnorm: Vec<f32>,
    pub head_norm: Vec<f32>,
    /// Their RMSNorm epsilon (`rms_norm_eps`).
    pub eps: f32,
    /// `shared_head.head` (`vocab × hidden`) when the checkpoint has one.
    pub head: Option<Head>,
    /// The layer's own `embed_tokens` (`vocab × hidden`) when the checkpoint has one.
    pub embed: Option<ChunkedMatrix>,
}
