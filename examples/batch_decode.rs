//! Aggregate decode speed of `Model::forward_batch` with N sequences decoding together, against
//! one: `cargo run --release --example batch_decode -- MODEL [N,…] [STEPS] [BUDGET_MIB] [CACHE]
//! [NUMERICS] [DEVICE]` (defaults: the demo model, 1,2,4,8, 32 steps, every weight resident,
//! `lfu-da` (`none` reads every expert use), `exact` (or `q8`), `cpu` (or `cuda`, `auto`); `-`
//! keeps a default; the CPU's threads: rayon's, `RAYON_NUM_THREADS`). Each sequence is
//! prefilled alone with its own 8-token prompt, then every step is one pass over all N
//! sequences (one new token each, greedy). Prints, per N, aggregate and per-sequence tok/s and
//! the bytes read per generated token (streamed weights and routed experts: the store's I/O
//! counter, which counts both), alternating the
//! N values over 3 rounds and keeping each one's best.
use std::time::Instant;

use rayon::prelude::*;

use deltafin::backend::cpu::pool::PoolStats;
use deltafin::engine::sampler::argmax;
use deltafin::load::open_any;
use deltafin::models::{KvCache, LoadOptions, Logits, SeqPass};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = match args.first() {
        Some(p) if p != "-" => std::path::PathBuf::from(p),
        _ => deltafin::pull::ensure_demo_model()?,
    };
    let ns: Vec<usize> = args
        .get(1)
        .map_or("1,2,4,8", |s| s.as_str())
        .split(',')
        .map(|s| s.parse().expect("N"))
        .collect();
    let steps: usize = args.get(2).map_or(32, |s| s.parse().expect("STEPS"));
    let budget: Option<u64> = args
        .get(3)
        .filter(|s| *s != "-")
        .map(|s| s.parse::<u64>().expect("MiB") << 20);
    let numerics = match args.get(5).map(String::as_str) {
        Some("q8") => deltafin::backend::cpu::Numerics::Q8,
        _ => deltafin::backend::cpu::Numerics::Exact,
    };
    let cache = match args.get(4).map(String::as_str) {
        Some("none") => deltafin::store::CachePolicy::None,
        _ => deltafin::store::CachePolicy::LfuDa,
    };
    let device: deltafin::backend::DeviceKind = match args.get(6).map(String::as_str) {
        None | Some("-") => Default::default(),
        Some(d) => d.parse().map_err(anyhow::Error::msg)?,
    };
    let opened = open_any(Some(&path))?;
    let n_ctx = 64;
    let opts = LoadOptions {
        ram_budget: budget,
        n_ctx: n_ctx * ns.iter().max().copied().unwrap_or(1),
        n_batch: 16,
        numerics,
        device,
        experts: deltafin::store::ExpertStoreOptions {
            cache,
            ..Default::default()
        },
        ..Default::default()
    };
    let (model, mut store) = opened.load_weights(&opts)?;
    println!("{}: {}", path.display(), model.placement().summary);
    let v = model.vocab_size() as u32;
    let bytes = |s: &deltafin::store::WeightStore| s.stats().snapshot().0;
    let mut best = vec![(0f64, 0f64, PoolStats::default()); ns.len()];
    for _round in 0..3 {
        for (i, &n) in ns.iter().enumerate() {
            let mut caches: Vec<KvCache> = (0..n).map(|_| model.new_cache(n_ctx)).collect();
            let mut last = Vec::new();
            for (s, c) in caches.iter_mut().enumerate() {
                let prompt: Vec<u32> = (0..8)
                    .map(|t| (1000 + 37 * s as u32 + 11 * t) % v)
                    .collect();
                let l = model.forward(&mut store, c, &prompt, Logits::Last)?;
                last.push(argmax(&l) as u32);
            }
            let b0 = bytes(&store);
            let p0 = PoolStats::now();
            let t0 = Instant::now();
            for _ in 0..steps {
                let toks: Vec<[u32; 1]> = last.iter().map(|&t| [t]).collect();
                let mut batch: Vec<SeqPass> = caches
                    .iter_mut()
                    .zip(&toks)
                    .map(|(c, t)| SeqPass::new(c, t, Logits::Last))
                    .collect();
                let out = model.forward_batch(&mut store, &mut batch)?;
                // as the server samples its slots: in parallel
                last = out.par_iter().map(|l| argmax(l) as u32).collect();
            }
            let s = t0.elapsed().as_secs_f64();
            let tok = (n * steps) as f64;
            let per_tok = (bytes(&store) - b0) as f64 / tok;
            if tok / s > best[i].0 {
                best[i] = (tok / s, per_tok, PoolStats::now().since(&p0));
            }
        }
    }
    println!(
        "| sequences | aggregate tok/s | per sequence tok/s | ratio to 1 | bytes read / token \
         | ms / step | parallel regions / step | µs / region | pool busy % | % of step outside regions |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let one = best[0].0;
    let threads = rayon::current_num_threads() as f64;
    for (i, &n) in ns.iter().enumerate() {
        let (agg, b, p) = best[i];
        let step_ms = 1e3 * n as f64 / agg;
        let regions = p.regions as f64 / steps as f64;
        let region_us = p.wall_ns as f64 / 1e3 / p.regions.max(1) as f64;
        let busy = 100.0 * p.busy_ns as f64 / (threads * p.wall_ns.max(1) as f64);
        let outside = 100.0 - 100.0 * (p.wall_ns as f64 / 1e6 / steps as f64) / step_ms;
        println!(
            "| {n} | {agg:.1} | {:.1} | {:.2} | {b:.0} | {step_ms:.2} | {regions:.0} | {region_us:.0} \
             | {busy:.0} | {outside:.0} |",
            agg / n as f64,
            agg / one,
        );
    }
    println!("({threads} threads)");
    Ok(())
}
