//! Kimi K3's routed experts as compressed-tensors MXFP4 (`quantization_config.format =
//! "mxfp4-pack-quantized"`, group 32), as a Hugging Face K3 checkpoint stores them: per
//! projection a `weight_packed` (`[rows, cols / 2]` bytes, element `2i` of a row in the low
//! nibble of byte `i`, `2i + 1` in the high one) and a `weight_scale` (`[rows, cols / 32]` E8M0
//! bytes). That is GPT-OSS's Hugging Face MXFP4 layout (`*_blocks` / `*_scales`), so one expert
//! is repacked into GGML `MXFP4` blocks by [`repack_hf_mxfp4`], as llama.cpp's converter
//! (`conversion/base.py`, `repack_mxfp4_blocks`) does for its K3 GGUF files: the same values,
//! the same kernels. A read expert is repacked as it lands (the store's transform), a resident
//! one once at load; the repacked expert has as many bytes as the six tensors read.

use crate::models::budget::recycling_transform;
use crate::models::loading::MatRef;
use crate::models::moe::{ExpertMats, UnitExperts};
use crate::quant::mxfp4::repack_hf_mxfp4;
use crate::quant::GgmlType;
use crate::store::{AlignedBuf, ExpertTransform, UnitBytes, WeightStore};

/// One MXFP4 expert: where its gate, up and down `(weight_packed, weight_scale)` lie in its unit
/// as read.
#[derive(Clone, Copy, Debug)]
pub(super) struct ExpertRepack {
    raw: [(MatRef, MatRef); 3],
}

impl ExpertRepack {
    /// From the three `(packed, scale)` byte tensors (each `packed` `rows × cols / 2`, each
    /// `scale` `rows × cols / 32` bytes; checked by the loader).
    pub fn new(raw: [(MatRef, MatRef); 3]) -> Self {
        Self { raw }
    }

    /// Bytes of the repacked expert: 17 per group of 32 elements.
    pub fn total(&self) -> usize {
        self.raw.iter().map(|(_, s)| 17 * s.bytes).sum()
    }

    /// The expert's matrices in the repacked unit: gate, up, down one after the other in its
    /// single piece, GGML `MXFP4`.
    pub fn mats(&self) -> ExpertMats {
        let mut at = 0;
        let [g, u, d] = self.raw.map(|(p, s)| {
            let m = MatRef { piece: 0, offset: at, ty: GgmlType::MXFP4, rows: p.rows, cols: 2 * p.cols, bytes: 17 * s.bytes };
            at += m.bytes;
            m
        });
        ExpertMats { gate: g, up: u, down: d }
    }

    /// Repacks the expert read into `raw` into `buf` (at least [`ExpertRepack::total`] bytes).
    pub fn apply(&self, raw: &UnitBytes, mut buf: AlignedBuf) -> UnitBytes {
        let total = self.total();
        let out = &mut buf.as_mut_slice()[..total];
        let span = |m: &MatRef| &raw.piece(m.piece)[m.offset..m.offset + m.bytes];
        let mut at = 0;
        for (p, s) in &self.raw {
            let n = 17 * s.bytes;
            repack_hf_mxfp4(span(p), span(s), &mut out[at..at + n]);
            at += n;
        }
        UnitBytes::from_parts(buf, vec![(0, total)])
    }
}

/// Every MXFP4 expert of a model, per layer (empty layers: dense, or experts in a GGML type).
#[derive(Default)]
pub(super) struct Mxfp4Experts {
    pub layers: Vec<Vec<ExpertRepack>>,
}

impl Mxfp4Experts {
    /// No expert is MXFP4.
    pub fn is_empty(&self) -> bool {
        self.layers.iter().all(Vec::is_empty)
    }

    /// The store's re-encoding of a read expert, and the bytes of the largest repacked one;
    /// `None` when no expert is MXFP4.
    pub fn transform(&self) -> Option<(ExpertTransform, usize)> {
        let out = self.layers.iter().flatten().map(ExpertRepack::total).max()?;
        let table = self.layers.clone();
        let t = recycling_transform(move |layer, e, raw, buf| table[layer][e].apply(raw, buf));
        Some((t, out))
    }

    /// Repacks the resident experts of `experts` (the loaded table, unit ids final) in `store`,
    /// keeping only the GGML layout.
    pub fn repack_resident(&self, experts: &UnitExperts, store: &mut WeightStore) {
        for (le, lr) in experts.units.iter().zip(&self.layers) {
            for ((u, _), r) in le.iter().zip(lr) {
                if store.is_resident(*u) {
                    store.transform_resident(*u, |b| r.apply(b, AlignedBuf::new(r.total())));
                }
            }
        }
    }
}
