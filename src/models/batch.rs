//! A forward pass over several sequences at once: each sequence brings its own KV cache and
//! recurrent state (its *slot*, owned by the caller) and a run of consecutive positions; their
//! rows are stacked in one activation matrix, so that every row-wise step (projections, norms,
//! the dense feed-forward, the LM head) runs once over all of them and a MoE layer reads the
//! union of the sequences' experts once. Only the steps that look at positions (RoPE, writing
//! and reading the KV cache, a recurrent scan) run per sequence ([`Seqs::each`]).
//!
//! Every kernel computes a row the same way whatever the other rows of its batch
//! (`kernels` module header), so a sequence's logits in a batch equal its logits alone bit for
//! bit (`tests/batch_pass.rs`).

use super::{KvCache, Logits};

/// One sequence's part of a forward pass, as the caller hands it to
/// [`super::Model::forward_batch`]: its slot (`cache`: KV rows, latent rows or recurrent states
/// of every layer, its length the first position of `tokens`), the new tokens, and which
/// positions' logits to return.
pub struct SeqPass<'a> {
    /// The sequence's slot; `tokens` go to positions `cache.len ..` and are appended to it
    /// when the pass succeeds.
    pub cache: &'a mut KvCache,
    /// The sequence's new token ids (at least one).
    pub tokens: &'a [u32],
    /// Which of its positions' logits the pass returns.
    pub logits: Logits,
}

impl<'a> SeqPass<'a> {
    /// The part of `tokens` at the end of `cache`, returning `logits`.
    pub fn new(cache: &'a mut KvCache, tokens: &'a [u32], logits: Logits) -> Self {
        Self {
            cache,
            tokens,
            logits,
        }
    }
}

/// One sequence's rows inside a pass, as a layer sees them: its slot, the position of its
/// first row, and how many rows it has. Its rows are the next `n` rows of the pass after the
/// sequences before it.
pub struct SeqRows<'a> {
    /// The sequence's slot (KV, latent or recurrent state per layer).
    pub cache: &'a mut KvCache,
    /// Position of the sequence's first row in this pass.
    pub pos0: usize,
    /// Rows (tokens) of the sequence in this pass.
    pub n: usize,
}

/// The sequences of one pass, in row order: sequence `i`'s rows follow sequence `i - 1`'s in
/// every `rows × width` activation matrix of the pass.
pub struct Seqs<'a> {
    list: Vec<SeqRows<'a>>,
}

impl<'a> Seqs<'a> {
    /// The sequences `list`, their rows stacked in this order.
    pub fn new(list: Vec<SeqRows<'a>>) -> Self {
        Self { list }
    }

    /// One sequence of `n` rows at positions `pos0 ..` over `cache`.
    pub fn one(cache: &'a mut KvCache, pos0: usize, n: usize) -> Self {
        Self::new(vec![SeqRows { cache, pos0, n }])
    }

    /// Rows of the pass (all sequences).
    pub fn rows(&self) -> usize {
        self.list.iter().map(|s| s.n).sum()
    }

    /// Number of sequences.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether the pass has no sequence.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Each sequence with the index of its first row in the pass.
    pub fn each(&mut self) -> impl Iterator<Item = (usize, &mut SeqRows<'a>)> {
        let mut r0 = 0;
        self.list.iter_mut().map(move |s| {
            let at = r0;
            r0 += s.n;
            (at, s)
        })
    }
}

/// Row `r0 .. r0 + n` of a row-major matrix `m` whose rows are `width` wide.
pub fn rows_of(m: &[f32], width: usize, r0: usize, n: usize) -> &[f32] {
    &m[r0 * width..(r0 + n) * width]
}

/// [`rows_of`], mutable.
pub fn rows_of_mut(m: &mut [f32], width: usize, r0: usize, n: usize) -> &mut [f32] {
    &mut m[r0 * width..(r0 + n) * width]
}
