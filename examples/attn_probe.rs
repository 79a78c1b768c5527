//! Timing of one decode step's attention (one query row over a KV cache) at the Qwen3-30B-A3B
//! shape (32 query heads, 4 key/value heads of 128) after 45, 990 and 4005 cached positions:
//! `cargo run --release --example attn_probe -- [THREADS]`. Prints ms per call (median of 15
//! after 3 warm-ups) and the KV bytes per millisecond it read.
use deltafin::backend::cpu::attn::{attention, AttnShape};

fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    t[t.len() / 2]
}

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("THREADS"))
        .unwrap_or(0);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let s = AttnShape {
        n_heads: 32,
        n_kv_heads: 4,
        head_dim: 128,
        window: None,
        softcap: None,
    };
    let kvd = s.n_kv_heads * s.head_dim;
    for pos in [45usize, 990, 4005] {
        let total = pos + 1;
        let mut x = 7u32;
        let mut next = move || {
            x = x.wrapping_mul(1664525).wrapping_add(1013904223);
            (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        let k: Vec<f32> = (0..total * kvd).map(|_| next()).collect();
        let v: Vec<f32> = (0..total * kvd).map(|_| next()).collect();
        let q: Vec<f32> = (0..s.n_heads * s.head_dim).map(|_| next() * 0.1).collect();
        let mut o = vec![0f32; q.len()];
        let t = pool.install(|| {
            (0..18)
                .map(|_| {
                    let t0 = std::time::Instant::now();
                    attention(&s, &q, &k, &v, pos, &mut o);
                    t0.elapsed().as_secs_f64() * 1e3
                })
                .skip(3)
                .collect::<Vec<_>>()
        });
        let ms = median(t);
        let bytes = (2 * total * kvd * 4) as f64;
        println!(
            "threads {} pos {pos:5}: {ms:.3} ms ({:.1} GB/s of K and V), out[0] {}",
            pool.current_num_threads(),
            bytes / ms / 1e6,
            o[0]
        );
    }
}
