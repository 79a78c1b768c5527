//! Grouped-query attention of several sequences in one call (a decode step of a batch: one
//! query row per sequence, each over its own KV cache), as `Backend::attention_seqs` runs it
//! on the CPU. Each sequence's outputs are [`attention_with_sinks`]'s for it alone, bit for
//! bit; only the split over the pool differs.

use super::attn::{attention_with_sinks, lanes_shape, AttnShape};
use super::attn_decode;

/// One sequence's rows in a pass of several ([`attention_seqs`], `Backend::rope_seqs`):
/// rows `r0 .. r0 + rows` of the pass's buffers, at positions `pos0 .. pos0 + rows` of its
/// cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqSpan {
    pub r0: usize,
    pub rows: usize,
    pub pos0: usize,
}

/// Why `spans` are not a pass's sequences over a buffer of `rows` rows, or `None`: the ops
/// over several sequences ([`attention_seqs`], `Backend::rope_seqs`,
/// `Backend::attention_seqs`) take spans that cover rows `0 .. rows` in order, each starting
/// where the last ended (as `models::batch::Seqs::each` gives them). Disjoint spans are what
/// makes [`attention_seqs`]'s parallel writes sound, and a single span then covers the whole
/// buffer, which the one-sequence shortcuts rely on.
pub fn spans_error(spans: &[SeqSpan], rows: usize) -> Option<String> {
    let mut at = 0;
    for sp in spans {
        if sp.r0 != at {
            return Some(format!(
                "sequence rows {}..{} where row {at} was expected (the spans must cover the pass's rows in order)",
                sp.r0,
                sp.r0 + sp.rows
            ));
        }
        at += sp.rows;
    }
    (at != rows).then(|| format!("the sequences cover {at} rows of {rows}"))
}

/// [`attention_with_sinks`] of several sequences in one call: sequence `i`'s query rows
/// `spans[i].r0 ..` of `q` (`rows × n_heads × head_dim`, all sequences' rows stacked) over
/// its own keys and values `kv[i]`, into the same rows of `out`. The values are each
/// sequence's alone, bit for bit. What changes is the parallel split: a sequence whose
/// attention is a decode step over a short cache (the lanes of `attn_decode.rs`, under its
/// `SERIAL_KEYS` keys) is one task of a single region over all such sequences, instead of
/// a region of its own whose wake-ups cost more than its work (a decode step of 8 sequences
/// of Gemma 3 270M had 8 regions a layer); the others run one after another, each split over
/// the pool as alone.
///
/// Panics when `kv` and `spans` differ in length, or the spans are not `q`'s rows in order
/// ([`spans_error`]).
pub fn attention_seqs(
    s: &AttnShape,
    q: &[f32],
    kv: &[(&[f32], &[f32])],
    spans: &[SeqSpan],
    sinks: Option<&[f32]>,
    out: &mut [f32],
) {
    assert_eq!(kv.len(), spans.len(), "one key/value slot per sequence");
    assert_eq!(q.len(), out.len(), "queries and outputs");
    let qd = s.n_heads * s.head_dim;
    if let Some(e) = spans_error(spans, q.len() / qd.max(1)) {
        panic!("attention_seqs: {e}");
    }
    let rows_of = |sp: &SeqSpan| sp.r0 * qd..(sp.r0 + sp.rows) * qd;
    let lanes = lanes_shape(s);
    let small = |sp: &SeqSpan| {
        attn_decode::fits(&lanes, sp.rows)
            && (sp.pos0 + sp.rows) * s.n_kv_heads < attn_decode::SERIAL_KEYS
    };
    let (mut few, mut alone): (Vec<usize>, Vec<usize>) =
        (0..spans.len()).partition(|&i| small(&spans[i]));
    if few.len() < 2 {
        // one short sequence (alone, or beside prompts): its own region, as alone
        alone.append(&mut few);
        alone.sort_unstable();
    }
    for i in alone {
        let (k, v) = kv[i];
        let r = rows_of(&spans[i]);
        attention_with_sinks(s, &q[r.clone()], k, v, spans[i].pos0, sinks, &mut out[r]);
    }
    let o = OutRows(out.as_mut_ptr(), out.len());
    let o = &o;
    super::pool::for_each_task(few.len(), |j| {
        let i = few[j];
        let (k, v) = kv[i];
        let r = rows_of(&spans[i]);
        // SAFETY: the spans' rows are disjoint (checked above: consecutive, in order) and
        // inside `out` (the slice below checks the range against its length); each task
        // writes its own.
        let dst = unsafe { o.rows(r.clone()) };
        attn_decode::lanes_on(&lanes, &q[r], k, v, spans[i].pos0, sinks, true, dst);
    });
}

/// `out`'s pointer and length, shared by the tasks of [`attention_seqs`] (each writes the
/// rows of its own sequence).
struct OutRows(*mut f32, usize);
// SAFETY: tasks write disjoint ranges (see `attention_seqs`), and `out` outlives the region.
unsafe impl Sync for OutRows {}
impl OutRows {
    /// The floats `r` of `out`. Safety: no other live slice overlaps `r`.
    #[allow(clippy::mut_from_ref)]
    unsafe fn rows(&self, r: std::ops::Range<usize>) -> &mut [f32] {
        assert!(
            r.start <= r.end && r.end <= self.1,
            "rows {r:?} of {} floats",
            self.1
        );
        // SAFETY: inside the allocation (asserted); exclusivity is the caller's
        unsafe { std::slice::from_raw_parts_mut(self.0.add(r.start), r.end - r.start) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Several sequences in one call give each sequence's outputs alone, bit for bit: decode
    /// rows over short caches (one region), a long cache and a prompt of several rows (each
    /// split alone), with grouped heads, a window, a cap and sinks, on pools of 1, 3 threads.
    #[test]
    fn several_sequences_equal_each_alone() {
        let s = AttnShape {
            n_heads: 8,
            n_kv_heads: 2,
            head_dim: 32,
            window: Some(600),
            softcap: Some(30.0),
        };
        // (pos0, rows): the short decode steps, a long one (past SERIAL_KEYS), a prompt
        let seqs = [(0, 1), (9, 1), (700, 1), (40, 1), (3, 12), (1, 2)];
        let kvd = s.n_kv_heads * s.head_dim;
        let qd = s.n_heads * s.head_dim;
        let mut x = 7u32;
        let mut next = move || {
            x = x.wrapping_mul(1664525).wrapping_add(1013904223);
            (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        let caches: Vec<(Vec<f32>, Vec<f32>)> = seqs
            .iter()
            .map(|&(p, n)| {
                let k = (0..(p + n) * kvd).map(|_| 3.0 * next()).collect();
                let v = (0..(p + n) * kvd).map(|_| next()).collect();
                (k, v)
            })
            .collect();
        let rows: usize = seqs.iter().map(|s| s.1).sum();
        let q: Vec<f32> = (0..rows * qd).map(|_| next()).collect();
        let mut spans = Vec::new();
        let mut r0 = 0;
        for &(pos0, n) in &seqs {
            spans.push(SeqSpan { r0, rows: n, pos0 });
            r0 += n;
        }
        let kv: Vec<(&[f32], &[f32])> = caches.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        let sinks = [0.5f32, -1.0, 2.0, 0.0, 1.0, 0.3, -0.2, 0.9];
        for sk in [None, Some(&sinks[..])] {
            let mut want = vec![0f32; q.len()];
            for (sp, &(k, v)) in spans.iter().zip(&kv) {
                let r = sp.r0 * qd..(sp.r0 + sp.rows) * qd;
                attention_with_sinks(&s, &q[r.clone()], k, v, sp.pos0, sk, &mut want[r]);
            }
            assert!(want.iter().all(|v| v.is_finite()) && want.iter().any(|v| *v != 0.0));
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut got = vec![f32::NAN; q.len()];
                pool.install(|| attention_seqs(&s, &q, &kv, &spans, sk, &mut got));
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{threads} threads, sinks {}", sk.is_some());
            }
        }
    }

    /// Spans that overlap (two tasks writing the same rows) or leave rows out are refused.
    #[test]
    fn spans_must_be_the_rows_in_order() {
        let sp = |r0, rows| SeqSpan { r0, rows, pos0: 0 };
        assert_eq!(spans_error(&[sp(0, 2), sp(2, 1)], 3), None);
        assert_eq!(
            spans_error(&[sp(0, 1), sp(0, 1)], 2).as_deref(),
            Some("sequence rows 0..1 where row 1 was expected (the spans must cover the pass's rows in order)")
        );
        assert_eq!(
            spans_error(&[sp(0, 1)], 4).as_deref(),
            Some("the sequences cover 1 rows of 4")
        );
        let s = AttnShape {
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 4,
            window: None,
            softcap: None,
        };
        let kv = [0f32; 4];
        let slots: [(&[f32], &[f32]); 2] = [(&kv, &kv), (&kv, &kv)];
        let r = std::panic::catch_unwind(|| {
            let mut out = [0f32; 4];
            attention_seqs(&s, &[0.5; 4], &slots, &[sp(0, 1), sp(0, 1)], None, &mut out);
        });
        assert!(r.is_err(), "overlapping spans must panic");
    }

    #[test]
    #[should_panic(expected = "one key/value slot per sequence")]
    fn a_slot_per_sequence_is_required() {
        let s = AttnShape {
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 4,
            window: None,
            softcap: None,
        };
        let spans = [SeqSpan {
            r0: 0,
            rows: 1,
            pos0: 0,
        }];
        attention_seqs(&s, &[0.0; 4], &[], &spans, None, &mut [0.0; 4]);
    }
}
