//! The KV cache: keys and values of every past position, per layer, in f32; or, for
//! multi-head latent attention (DeepSeek V2/V3), one compressed latent row per position; and,
//! for recurrent layers (Kimi Delta Attention), a fixed-size state per layer beside them.

/// Keys and values for `n_ctx` positions of `n_layers` layers, each position holding
/// `kv_dim = n_kv_heads × head_dim` floats for K and for V. Memory: at most
/// `n_layers × n_ctx × kv_dim × 2 × 4` bytes. On the CPU a layer's vectors grow with the
/// positions written ([`KvCache::reserve_rows`], called by the CPU's
/// `models::device::Device::kv_slots`), so a cache holds memory for the positions it has held
/// rather than its whole capacity (the server's slots share one context: `serve` without
/// `--parallel`), and [`KvCache::release`] gives it back.
pub struct KvCache {
    /// Per layer, keys (position-major, `kv_dim` floats a position): at least `len ×
    /// kv_dim` floats on the CPU once the layer ran, at most `n_ctx × kv_dim`; empty for a
    /// layer that holds none (a recurrent layer) and for a cache on a device.
    pub k: Vec<Vec<f32>>,
    /// Per layer, values, as [`KvCache::k`] (empty for a latent cache).
    pub v: Vec<Vec<f32>>,
    /// Capacity in positions.
    pub n_ctx: usize,
    /// Floats per position per layer for K (and for V).
    pub kv_dim: usize,
    /// Positions filled so far.
    pub len: usize,
    /// Per layer, the recurrent state of a recurrent layer (empty for attention layers):
    /// a fixed number of floats whatever the position, zero before the first token
    /// ([`KvCache::with_state`]).
    pub state: Vec<Vec<f32>>,
    /// The final hidden states (before the final norm) of the cached positions, kept only
    /// when [`HiddenRows::on`]: what a multi-token-prediction drafter reads after each pass.
    pub hidden: HiddenRows,
    /// The keys and values, latent rows or recurrent states in a device's memory when the
    /// model computes on one (its `models::device::Device` slots, each allocated at its
    /// layer's first use); [`KvCache::k`] and [`KvCache::v`] are then empty, and
    /// [`KvCache::state`] holds the zeroed state the device's copy starts from. `None` on the
    /// CPU.
    pub dev: Option<Box<dyn std::any::Any + Send>>,
}

/// The final hidden state (the residual stream after the last layer, before the final
/// RMSNorm; `hidden` floats per position) of the positions `pos0 .. pos0 + rows.len() /
/// width`, appended by every forward pass while `on` and read by a multi-token-prediction
/// drafter ([`crate::models::Mtp`]), which needs `h_i` for every position `i` (DeepSeek-V3
/// technical report, sec. 2.2), also of positions it caught up on before, when the sequence
/// changes after them (a request reusing only a prefix of the cache). Rolled back with the
/// cache ([`KvCache::truncate`]). Memory: `4 × hidden` bytes per cached position (at most the
/// cache's `n_ctx` positions, budgeted at load).
#[derive(Clone, Debug, Default)]
pub struct HiddenRows {
    /// Whether forward passes record their rows (set for models loaded with their MTP layer).
    pub on: bool,
    /// Floats per position.
    pub width: usize,
    /// Position of the first row held.
    pub pos0: usize,
    /// `n × width` floats, position-major.
    pub rows: Vec<f32>,
}

impl HiddenRows {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.rows.len().checked_div(self.width).unwrap_or(0)
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Records the rows `x` (`n × width`) of positions `pos0 ..` when on: appended when they
    /// continue the rows held, else (a gap, or positions already held being recomputed) the
    /// rows held from `pos0` on are replaced.
    pub fn record(&mut self, pos0: usize, x: &[f32], width: usize) {
        if !self.on || width == 0 {
            return;
        }
        if self.width != width || pos0 < self.pos0 || pos0 > self.pos0 + self.len() {
            self.width = width;
            self.pos0 = pos0;
            self.rows.clear();
        }
        self.rows.truncate((pos0 - self.pos0) * width);
        self.rows.extend_from_slice(x);
    }

    /// Forgets the rows of positions `>= n`.
    pub fn truncate(&mut self, n: usize) {
        if n <= self.pos0 {
            self.rows.clear();
            self.pos0 = n;
        } else {
            self.rows
                .truncate((n - self.pos0).min(self.len()) * self.width);
        }
    }

    /// The row of position `p`, when held.
    pub fn row(&self, p: usize) -> Option<&[f32]> {
        let i = p.checked_sub(self.pos0).filter(|&i| i < self.len())?;
        Some(&self.rows[i * self.width..(i + 1) * self.width])
    }
}

impl KvCache {
    /// A cache of `n_ctx` positions (no memory until a pass writes to it:
    /// [`KvCache::reserve_rows`]).
    pub fn new(n_layers: usize, n_ctx: usize, kv_dim: usize) -> Self {
        Self {
            k: (0..n_layers).map(|_| Vec::new()).collect(),
            v: (0..n_layers).map(|_| Vec::new()).collect(),
            n_ctx,
            kv_dim,
            len: 0,
            state: (0..n_layers).map(|_| Vec::new()).collect(),
            hidden: HiddenRows::default(),
            dev: None,
        }
    }

    /// A latent cache (multi-head latent attention, DeepSeek-V2 paper §2.1): per layer and
    /// position one row of `width` floats (the normed KV latent followed by the shared rotary
    /// key) kept in [`KvCache::k`]; [`KvCache::v`] stays empty. `kv_dim` is `width`. Memory:
    /// at most `n_layers × n_ctx × width × 4` bytes, grown as [`KvCache::new`]'s.
    pub fn new_latent(n_layers: usize, n_ctx: usize, width: usize) -> Self {
        Self {
            k: (0..n_layers).map(|_| Vec::new()).collect(),
            v: (0..n_layers).map(|_| Vec::new()).collect(),
            n_ctx,
            kv_dim: width,
            len: 0,
            state: (0..n_layers).map(|_| Vec::new()).collect(),
            hidden: HiddenRows::default(),
            dev: None,
        }
    }

    /// This cache with a recurrent state of `floats[l]` floats (zeros) for each layer `l`
    /// with a non-zero count; those layers keep no per-position rows (their [`KvCache::k`] and
    /// [`KvCache::v`] become empty). Hybrid models (Kimi Linear, Kimi K3) mix such layers with
    /// latent-attention layers.
    pub fn with_state(mut self, floats: &[usize]) -> Self {
        for (l, &f) in floats.iter().enumerate().take(self.k.len()) {
            if f > 0 {
                self.k[l] = Vec::new();
                self.v[l] = Vec::new();
                self.state[l] = vec![0.0; f];
            }
        }
        self
    }

    /// Bytes a latent cache of these dimensions holds.
    pub fn latent_bytes_for(n_layers: usize, n_ctx: usize, width: usize) -> usize {
        n_layers * n_ctx * width * 4
    }

    /// Bytes a cache of these dimensions holds.
    pub fn bytes_for(n_layers: usize, n_ctx: usize, kv_dim: usize) -> usize {
        n_layers * n_ctx * kv_dim * 2 * 4
    }

    /// Forgets every position and zeroes every recurrent state (keeps the allocation; a
    /// cache with a recurrent state on a device drops its device slots, which the next pass
    /// makes again from the zeroed host state).
    pub fn clear(&mut self) {
        self.len = 0;
        self.hidden.truncate(0);
        self.state.iter_mut().for_each(|s| s.fill(0.0));
        if self.state.iter().any(|s| !s.is_empty()) {
            self.dev = None;
        }
    }

    /// Grows `rows` (one layer's keys, values or latent rows, `kv_dim` floats a position) to
    /// hold at least `upto` positions, at most `n_ctx`: to 5/4 of the positions it holds when
    /// that is more, so that a sequence's growth copies each position a bounded number of
    /// times (at most 4 on average) while holding at most a quarter more than it uses; the
    /// new floats are zeros.
    pub fn reserve_rows(rows: &mut Vec<f32>, upto: usize, n_ctx: usize, kv_dim: usize) {
        let kv_dim = kv_dim.max(1);
        let held = rows.len() / kv_dim;
        let upto = upto.min(n_ctx);
        if held < upto {
            let grown = upto.max(held + held / 4).min(n_ctx) * kv_dim;
            // exact: `resize` alone would double the capacity
            rows.reserve_exact(grown - rows.len());
            rows.resize(grown, 0.0);
        }
    }

    /// Frees the memory of the positions past [`KvCache::len`] on the host (after a
    /// [`KvCache::truncate`] that kept a shorter prefix), so that what the cache holds is what
    /// it uses.
    pub fn shrink_to_len(&mut self) {
        let keep = self.len * self.kv_dim;
        for rows in self.k.iter_mut().chain(self.v.iter_mut()) {
            if rows.len() > keep {
                rows.truncate(keep);
                rows.shrink_to_fit();
            }
        }
    }

    /// Positions' worth of memory this cache holds on the host now: the longest layer's
    /// keys (or latent rows) over `kv_dim` (the recurrent states aside).
    pub fn held_positions(&self) -> usize {
        let longest = self.k.iter().map(Vec::len).max().unwrap_or(0);
        longest.checked_div(self.kv_dim).unwrap_or(0)
    }

    /// Forgets every position ([`KvCache::clear`]) and frees the memory its positions held:
    /// the host vectors and a device's slots.
    pub fn release(&mut self) {
        self.clear();
        for rows in self.k.iter_mut().chain(self.v.iter_mut()) {
            *rows = Vec::new();
        }
        self.dev = None;
    }

    /// Keeps the first `n` positions and forgets the rest (no-op when `n >= len`) and returns
    /// the number of positions kept: the cache is append-only and position-major, so the
    /// entries of positions `< n` do not depend on later ones and the next forward pass
    /// continues at position `n`. Used to reuse the KV of a prompt prefix shared with the
    /// previous request. A recurrent state (KDA) cannot be rolled back to an earlier position,
    /// so a cache holding one is cleared whole when `n < len`, and 0 is returned.
    pub fn truncate(&mut self, n: usize) -> usize {
        if n < self.len && self.state.iter().any(|s| !s.is_empty()) {
            self.clear();
        } else {
            self.len = self.len.min(n);
        }
        self.hidden.truncate(self.len);
        self.len
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rows_grow_with_the_positions_and_release_frees_them() {
        let mut c = super::KvCache::new(2, 100, 3);
        assert_eq!(c.held_positions(), 0, "no memory before a pass");
        super::KvCache::reserve_rows(&mut c.k[0], 8, c.n_ctx, 3);
        assert_eq!((c.k[0].len(), c.k[0].capacity()), (24, 24));
        // a quarter more than it held when that is more than asked
        super::KvCache::reserve_rows(&mut c.k[0], 9, c.n_ctx, 3);
        assert_eq!((c.k[0].len(), c.k[0].capacity()), (30, 30));
        super::KvCache::reserve_rows(&mut c.k[0], 5, c.n_ctx, 3);
        assert_eq!(c.k[0].len(), 30, "never shrinks");
        super::KvCache::reserve_rows(&mut c.k[0], 99, c.n_ctx, 3);
        assert_eq!(c.k[0].len(), 297);
        super::KvCache::reserve_rows(&mut c.k[0], 100, c.n_ctx, 3);
        assert_eq!(c.k[0].len(), 300, "capped at n_ctx");
        super::KvCache::reserve_rows(&mut c.k[0], 500, c.n_ctx, 3);
        assert_eq!(c.k[0].len(), 300);
        assert_eq!(c.held_positions(), 100);
        c.len = 7;
        c.shrink_to_len();
        assert_eq!(
            (c.k[0].len(), c.k[0].capacity(), c.held_positions()),
            (21, 21, 7)
        );
        c.release();
        assert_eq!((c.len, c.held_positions(), c.k[0].capacity()), (0, 0, 0));
    }

    #[test]
    fn truncate_keeps_a_prefix_only() {
        let mut c = super::KvCache::new(1, 8, 2);
        c.len = 5;
        c.truncate(7);
        assert_eq!(c.len, 5);
        assert_eq!(c.truncate(3), 3);
        assert_eq!(c.len, 3);
    }

    #[test]
    fn hidden_rows_follow_the_cache() {
        let mut c = super::KvCache::new(1, 8, 2);
        c.hidden.record(0, &[1.0, 2.0], 1);
        assert!(c.hidden.is_empty(), "off: nothing recorded");
        c.hidden.on = true;
        c.hidden.record(0, &[1.0, 2.0, 3.0], 1);
        c.len = 3;
        c.hidden.record(3, &[4.0], 1);
        c.len = 4;
        assert_eq!(c.hidden.rows, vec![1.0, 2.0, 3.0, 4.0]);
        c.truncate(2);
        assert_eq!(c.hidden.rows, vec![1.0, 2.0]);
        assert_eq!((c.hidden.pos0, c.hidden.row(1)), (0, Some(&[2.0][..])));
        assert_eq!(c.hidden.row(2), None);
        // a recomputed position replaces what followed it
        c.hidden.record(1, &[7.0, 8.0], 1);
        assert_eq!(c.hidden.rows, vec![1.0, 7.0, 8.0]);
        // a gap starts over
        c.hidden.record(6, &[9.0], 1);
        assert_eq!((c.hidden.pos0, c.hidden.rows.clone()), (6, vec![9.0]));
        c.clear();
        assert!(c.hidden.is_empty() && c.hidden.on);
    }

    #[test]
    fn truncate_clears_a_cache_with_recurrent_state() {
        let mut c = super::KvCache::new(2, 8, 2).with_state(&[0, 4]);
        c.len = 5;
        c.state[1].fill(1.5);
        assert_eq!(c.truncate(5), 5, "keeping every position keeps the state");
        assert_eq!(c.state[1], vec![1.5; 4]);
        assert_eq!(c.truncate(3), 0, "a recurrent state cannot be rolled back");
        assert_eq!(c.len, 0);
        assert_eq!(c.state[1], vec![0.0; 4]);
    }

    #[test]
    fn clear_drops_the_device_slots_of_a_recurrent_cache_only() {
        // a device's slots stand in as any value: a recurrent cache drops them (the device
        // makes them again from the zeroed host state), a KV or latent cache keeps them
        let mut c = super::KvCache::new_latent(2, 8, 3).with_state(&[0, 4]);
        assert!(c.k.iter().all(|k| k.is_empty()), "no host rows");
        c.dev = Some(Box::new(7u8));
        c.clear();
        assert!(c.dev.is_none());
        let mut c = super::KvCache::new_latent(2, 8, 3);
        c.dev = Some(Box::new(7u8));
        c.len = 4;
        c.clear();
        assert_eq!((c.len, c.dev.is_some()), (0, true));
    }
}
