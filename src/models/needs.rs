//! What a model needs in RAM besides its weights, as each family states it
//! ([`MemoryNeeds`]), and the bytes [`super::budget`] reserves for it ([`MemoryNeeds::reserve`],
//! the one place the thread count and the batch size enter).

use super::LoadOptions;

/// RAM a model needs besides its weights, in bytes ([`MemoryNeeds::reserve`]).
pub(super) struct Reserved {
    /// KV cache for `n_ctx` tokens.
    pub kv_bytes: usize,
    /// Activations, resident norms and other small vectors.
    pub scratch_bytes: usize,
    /// Context the KV cache holds, in tokens (for the error message).
    pub n_ctx: usize,
}

/// A family's memory needs besides its weights, in `f32` floats (4 bytes each), independent
/// of the batch size, the context length and the thread count. Each family builds it once
/// (`memory_needs` on its config), and [`MemoryNeeds::reserve`] turns it into bytes for a
/// pass over `nb = n_batch.max(1)` rows, `T` threads ([`crate::models::layers::pass_threads`])
/// and a context of `n_ctx = n_ctx.min(max_ctx).max(1)` tokens:
///
/// - per-sequence state (reported as the KV cache):
///   `4 · (n_ctx · state_ctx_floats + state_floats)` bytes;
/// - activations and resident vectors: `4 · (nb · row_floats + pass_floats
///   + n_ctx · ctx_floats + T · (n_ctx · thread_ctx_floats + thread_floats
///   + nb · thread_row_floats) + vector_floats)` bytes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct MemoryNeeds {
    /// Activation floats per batch row: hidden rows, projections, feed-forward rows, router
    /// logits.
    pub row_floats: usize,
    /// Activation floats per pass, whatever the rows: the logits row (`vocab_size`).
    pub pass_floats: usize,
    /// Activation floats per context token besides the state (the final hidden rows a
    /// multi-token-prediction layer reads).
    pub ctx_floats: usize,
    /// Scratch floats per thread per context token: attention scores.
    pub thread_ctx_floats: usize,
    /// Scratch floats per thread, fixed: multi-head latent attention's absorbed query and
    /// output rows.
    pub thread_floats: usize,
    /// Scratch floats per thread per batch row: the delta rule's per-head copies of `q`, `k`,
    /// `g`, `v` and `beta` (`layers::kda`).
    pub thread_row_floats: usize,
    /// Per-sequence state floats per context token: KV rows, or latent rows, over all layers.
    pub state_ctx_floats: usize,
    /// Per-sequence state floats whatever the context: recurrent states.
    pub state_floats: usize,
    /// Floats of the resident vectors: norms, biases, short-convolution weights.
    pub vector_floats: usize,
    /// The longest context the model takes (`max_position_embeddings`), in tokens:
    /// `--ctx-size` is capped to it.
    pub max_ctx: usize,
}

impl MemoryNeeds {
    /// The bytes to reserve for a load with `opts.n_ctx` and `opts.n_batch` (see the type's
    /// formula), with the context length the state is sized for.
    pub fn reserve(&self, opts: &LoadOptions) -> Reserved {
        self.reserve_with(opts.n_batch, opts.n_ctx, super::layers::pass_threads())
    }

    /// [`MemoryNeeds::reserve`] for `n_batch` rows, `n_ctx` tokens and `threads` threads.
    fn reserve_with(&self, n_batch: usize, n_ctx: usize, threads: usize) -> Reserved {
        let nb = n_batch.max(1);
        let n_ctx = n_ctx.min(self.max_ctx).max(1);
        let per_thread =
            n_ctx * self.thread_ctx_floats + self.thread_floats + nb * self.thread_row_floats;
        let floats = nb * self.row_floats
            + self.pass_floats
            + n_ctx * self.ctx_floats
            + threads * per_thread
            + self.vector_floats;
        Reserved {
            kv_bytes: 4 * (n_ctx * self.state_ctx_floats + self.state_floats),
            scratch_bytes: 4 * floats,
            n_ctx,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_follows_the_formula() {
        let n = MemoryNeeds {
            row_floats: 10,
            pass_floats: 1000,
            ctx_floats: 2,
            thread_ctx_floats: 1,
            thread_floats: 7,
            thread_row_floats: 3,
            state_ctx_floats: 16,
            state_floats: 100,
            vector_floats: 50,
            max_ctx: 64,
        };
        // 4 rows, 200 tokens capped to 64, 2 threads
        let r = n.reserve_with(4, 200, 2);
        assert_eq!(r.n_ctx, 64);
        assert_eq!(r.kv_bytes, 4 * (64 * 16 + 100));
        assert_eq!(
            r.scratch_bytes,
            4 * (4 * 10 + 1000 + 64 * 2 + 2 * (64 + 7 + 4 * 3) + 50)
        );
        // a batch of 0 counts as 1 row, a context of 0 as 1 token
        let r = n.reserve_with(0, 0, 1);
        assert_eq!(r.n_ctx, 1);
        assert_eq!(r.kv_bytes, 4 * (16 + 100));
        assert_eq!(r.scratch_bytes, 4 * (10 + 1000 + 2 + (1 + 7 + 3) + 50));
    }
}
