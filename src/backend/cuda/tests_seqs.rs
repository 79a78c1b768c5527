//! The ops over several sequences of one pass (`seqs.rs`: RoPE, key/value writes and
//! attention, each one launch over every row) against each sequence alone on the GPU, bit
//! for bit (each test skips without a GPU, as the rest of `tests.rs`).

use super::*;

/// The spans of sequences given as (first position, rows), their rows stacked in order.
fn spans_of(seqs: &[(usize, usize)]) -> Vec<crate::backend::SeqSpan> {
    let mut r0 = 0;
    seqs.iter()
        .map(|&(pos0, rows)| {
            r0 += rows;
            crate::backend::SeqSpan {
                r0: r0 - rows,
                rows,
                pos0,
            }
        })
        .collect()
}

/// RoPE frequencies of base 10⁴ for heads of `head_dim`.
fn inv_freq(head_dim: usize) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| 1e4f32.powf(-((2 * i) as f32) / head_dim as f32))
        .collect()
}

/// Several sequences' RoPE and attention in one launch each (per-row positions and slots) give
/// each sequence's results alone on the GPU bit for bit: three sequences (a decode row, a
/// prompt of 5 rows, a decode row late in its cache), with sinks and a window.
#[test]
fn several_sequences_equal_each_alone() {
    let dev = device_or_skip!();
    let mut rng = Rng::new(23);
    let s = AttnShape {
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 64,
        window: Some(40),
        softcap: None,
    };
    let (qd, kvd) = (s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
    let seqs = [(3, 1), (0, 5), (60, 1)];
    let spans = spans_of(&seqs);
    let n: usize = seqs.iter().map(|s| s.1).sum();
    let inv = inv_freq(s.head_dim);
    let q = random_x(n * qd, &mut rng);
    // RoPE of every row at its sequence's positions, against each span alone
    let mut dq = dev.upload(&q).unwrap();
    dev.rope_seqs_dev(&mut dq, qd, &spans, s.head_dim, &inv, false, 0.125)
        .unwrap();
    let got = download(dev, &dq);
    let mut want = Vec::new();
    for sp in &spans {
        let mut one = dev.upload(&q[sp.r0 * qd..(sp.r0 + sp.rows) * qd]).unwrap();
        dev.rope(&mut one, sp.rows, s.head_dim, sp.pos0, &inv, false, 0.125)
            .unwrap();
        want.extend(download(dev, &one));
    }
    assert!(bits(&got) == bits(&want), "rope_seqs");
    let caches: Vec<(CudaBuf, CudaBuf)> = seqs
        .iter()
        .map(|&(p, m)| {
            let k = random_x((p + m) * kvd, &mut rng);
            let v = random_x((p + m) * kvd, &mut rng);
            (dev.upload(&k).unwrap(), dev.upload(&v).unwrap())
        })
        .collect();
    let kv: Vec<(&CudaBuf, &CudaBuf)> = caches.iter().map(|(k, v)| (k, v)).collect();
    let sinks = [0.5f32, -1.0, 2.0, 0.0];
    let mut out = dev.zeros(n * qd).unwrap();
    dev.attention_seqs_dev(&s, &dq, &kv, &spans, Some(&sinks), &mut out)
        .unwrap();
    let got = download(dev, &out);
    let mut want = Vec::new();
    for (sp, &(k, v)) in spans.iter().zip(&kv) {
        let one = dev
            .upload(&download(dev, &dq)[sp.r0 * qd..(sp.r0 + sp.rows) * qd])
            .unwrap();
        let mut o = dev.zeros(sp.rows * qd).unwrap();
        dev.attention(&s, &one, k, v, sp.pos0, Some(&sinks), &mut o)
            .unwrap();
        want.extend(download(dev, &o));
    }
    assert!(want.iter().any(|v| *v != 0.0));
    assert!(bits(&got) == bits(&want), "attention_seqs");
    let err = dev
        .attention_seqs_dev(&s, &dq, &kv[..2], &spans, None, &mut out)
        .unwrap_err()
        .to_string();
    assert_eq!(err, "attention_seqs: 2 key/value slots for 3 sequences");
}

/// Several sequences' new keys and values written into their slots in one launch equal the
/// copies per sequence (the trait's default), and a slot too short is refused by name.
#[test]
fn one_launch_writes_each_sequences_keys_and_values() {
    let dev = device_or_skip!();
    let mut rng = Rng::new(29);
    let width = 48;
    let seqs = [(3, 1), (0, 5), (60, 1)];
    let spans = spans_of(&seqs);
    let n: usize = seqs.iter().map(|s| s.1).sum();
    let (k, v) = (random_x(n * width, &mut rng), random_x(n * width, &mut rng));
    let (dk, dv) = (dev.upload(&k).unwrap(), dev.upload(&v).unwrap());
    // the slots' old contents, the same in both sets of slots
    let old: Vec<(Vec<f32>, Vec<f32>)> = seqs
        .iter()
        .map(|&(p, m)| {
            let n = (p + m + 2) * width;
            (random_x(n, &mut rng), random_x(n, &mut rng))
        })
        .collect();
    let up = |o: &[(Vec<f32>, Vec<f32>)]| -> Vec<(CudaBuf, CudaBuf)> {
        o.iter()
            .map(|(a, b)| (dev.upload(a).unwrap(), dev.upload(b).unwrap()))
            .collect()
    };
    let (mut got, mut want) = (up(&old), up(&old));
    let mut g: Vec<(&mut CudaBuf, &mut CudaBuf)> = got.iter_mut().map(|(a, b)| (a, b)).collect();
    dev.write_kv_seqs_dev(&dk, &dv, width, &spans, &mut g)
        .unwrap();
    let mut w: Vec<(&mut CudaBuf, &mut CudaBuf)> = want.iter_mut().map(|(a, b)| (a, b)).collect();
    crate::backend::write_kv_seqs_by_copies(dev, &dk, &dv, width, &spans, &mut w).unwrap();
    for ((gk, gv), (wk, wv)) in got.iter().zip(&want) {
        assert!(bits(&download(dev, gk)) == bits(&download(dev, wk)), "keys");
        assert!(
            bits(&download(dev, gv)) == bits(&download(dev, wv)),
            "values"
        );
    }
    // the last sequence's row landed at its position 60
    let last = download(dev, &got[2].0);
    assert!(bits(&last[60 * width..61 * width]) == bits(&k[6 * width..7 * width]));
    let mut short = dev.zeros(60 * width).unwrap();
    let mut other = dev.zeros(61 * width).unwrap();
    let mut g: Vec<(&mut CudaBuf, &mut CudaBuf)> = got.iter_mut().map(|(a, b)| (a, b)).collect();
    g[2] = (&mut short, &mut other);
    let err = dev
        .write_kv_seqs_dev(&dk, &dv, width, &spans, &mut g)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "write_kv_seqs: slots of 2880 and 2928 floats, 2928 needed for 61 positions"
    );
}

/// A sequence with no rows in the pass (a slot waiting) changes nothing: RoPE, key/value
/// writes and attention with it equal those without it, bit for bit.
#[test]
fn a_sequence_without_rows_is_skipped() {
    let dev = device_or_skip!();
    let mut rng = Rng::new(31);
    let s = AttnShape {
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 32,
        window: None,
        softcap: None,
    };
    let (qd, kvd) = (s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
    let span = |r0, rows, pos0| crate::backend::SeqSpan { r0, rows, pos0 };
    let with = [span(0, 1, 3), span(1, 0, 9), span(1, 2, 0)];
    let without = [span(0, 1, 3), span(1, 2, 0)];
    let inv = inv_freq(s.head_dim);
    let (q, k, v) = (
        random_x(3 * qd, &mut rng),
        random_x(3 * kvd, &mut rng),
        random_x(3 * kvd, &mut rng),
    );
    let slot = |n: usize, rng: &mut Rng| random_x(n * kvd, rng);
    let old = [slot(4, &mut rng), slot(10, &mut rng), slot(2, &mut rng)];
    let run = |spans: &[crate::backend::SeqSpan], which: &[usize]| -> Vec<Vec<u32>> {
        let mut dq = dev.upload(&q).unwrap();
        dev.rope_seqs_dev(&mut dq, qd, spans, s.head_dim, &inv, false, 1.0)
            .unwrap();
        let (dk, dv) = (dev.upload(&k).unwrap(), dev.upload(&v).unwrap());
        let mut slots: Vec<(CudaBuf, CudaBuf)> = which
            .iter()
            .map(|&i| (dev.upload(&old[i]).unwrap(), dev.upload(&old[i]).unwrap()))
            .collect();
        let mut m: Vec<(&mut CudaBuf, &mut CudaBuf)> =
            slots.iter_mut().map(|(a, b)| (a, b)).collect();
        dev.write_kv_seqs_dev(&dk, &dv, kvd, spans, &mut m).unwrap();
        let kv: Vec<(&CudaBuf, &CudaBuf)> = slots.iter().map(|(a, b)| (a, b)).collect();
        let mut out = dev.zeros(3 * qd).unwrap();
        dev.attention_seqs_dev(&s, &dq, &kv, spans, None, &mut out)
            .unwrap();
        let mut all = vec![bits(&download(dev, &dq)), bits(&download(dev, &out))];
        for (a, b) in &slots {
            all.push(bits(&download(dev, a)));
            all.push(bits(&download(dev, b)));
        }
        all
    };
    let got = run(&with, &[0, 1, 2]);
    let want = run(&without, &[0, 2]);
    assert!(got[..2] == want[..2], "queries and attention");
    assert!(got[2..4] == want[2..4] && got[6..8] == want[4..6], "slots");
    // the waiting sequence's slot is untouched
    assert!(got[4] == bits(&old[1]) && got[5] == bits(&old[1]));
}
