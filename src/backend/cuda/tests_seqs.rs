//! The ops over several sequences of one pass (`seqs.rs`: RoPE and attention launched on
//! views of each sequence's rows) against each sequence alone on the GPU, bit for bit (each
//! test skips without a GPU, as the rest of `tests.rs`).

use super::*;

/// Several sequences' RoPE and attention in one call (views at each sequence's rows) give
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
    let mut spans = Vec::new();
    let mut r0 = 0;
    for &(pos0, rows) in &seqs {
        spans.push(crate::backend::SeqSpan { r0, rows, pos0 });
        r0 += rows;
    }
    let n = r0;
    let inv: Vec<f32> = (0..s.head_dim / 2)
        .map(|i| 1e4f32.powf(-((2 * i) as f32) / s.head_dim as f32))
        .collect();
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
