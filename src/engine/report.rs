//! What a generation measured, as text and JSON: the `--stats` table ([`stats_table`], with
//! [`expert_table`] for the expert store), the `--stats-json` object ([`stats_json`]) that
//! `deltafin bench` also writes per scenario, and the physical limit of decode
//! ([`physical_limit`]).
//!
//! The physical limit: decoding `n` tokens read `D` bytes from disk (streamed spine or dense
//! layers and expert reads together, as counted, not as modelled), so the drives delivered
//! `D / t` bytes/s over the decode's `t` seconds and `tok/s = (D / t) / R` with `R = D / n`
//! the bytes read per token. With `B` the drives' bandwidth, `D / t ≤ B`, so
//! `tok/s ≤ B / R`: the limit, and the fraction reached is `(D / t) / B`. `B` is
//! `--drive-bandwidth`, else the reads' measured busy-time bandwidth; a `B` below the rate
//! the drives delivered (`D / t`) is provably not their bandwidth (busy time counted twice
//! where reads of several files overlap, or a `--drive-bandwidth` measured at another request
//! size), and the delivered rate replaces it, so the fraction is at most 100% by construction.
//! The old model `B / (L · k · (1 − h) · S)` divided by an estimate of the expert bytes per
//! token instead: `S` is the largest expert's read (an expert of a smaller type reads less),
//! misses served by reads already in flight were counted as whole reads, and the streamed
//! spine was left out, so the "limit" could be exceeded.

use super::session::{Finish, GenStats};
use crate::models::Placement;

fn mib(b: f64) -> String {
    format!("{:.1} MiB", b / 1048576.0)
}

/// The `--stats` text.
pub fn stats_table(s: &GenStats, p: &Placement, finish: &Finish, seed: u64, load_s: f64) -> String {
    let wait_share = if s.ttft_s + s.decode_s > 0.0 {
        100.0 * s.io_wait_s / (s.ttft_s + s.decode_s)
    } else {
        0.0
    };
    format!(
        "\n--- stats ---\n\
         load                 {load_s:.3} s (model header, tokenizer, resident weights)\n\
         prompt tokens        {}\n\
         generated tokens     {} ({}: {})\n\
         time to first token  {:.3} s\n\
         decode               {:.2} tok/s\n\
         disk read / token    {} (decode), {} (prefill total)\n\
         reads issued         {}\n\
         I/O wait             {:.3} s ({wait_share:.0}% of run)\n\
         placement            {}\n\
         numerics             {}\n\
         resident weights     {}, not resident {} (read from disk when a pass uses it), stream buffers {}, KV cache {}, activations {}\n\
         peak RSS             {}\n\
         parallel loops       {}\n\
         seed                 {seed}\n",
        s.prompt_tokens,
        s.generated_tokens,
        finish.as_str(),
        finish.detail(),
        s.ttft_s,
        s.decode_tok_s(),
        mib(s.decode_bytes_per_token()),
        mib(s.prefill_bytes as f64),
        s.reads,
        s.io_wait_s,
        p.summary,
        numerics_note(p.numerics),
        mib(p.resident_bytes as f64),
        mib(p.streamed_bytes as f64),
        mib(p.stream_buffer_bytes as f64),
        mib(p.kv_bytes as f64),
        mib(p.scratch_bytes as f64),
        mib(s.peak_rss as f64),
        pool_note(s),
    )
}

/// How a decode used the CPU pool ([`PoolStats`] of `s.pool_decode`): parallel regions per
/// token, their mean length and tasks, the share of the pool's thread time inside them that
/// tasks ran, and the share of decode time outside them (one thread: routing, norms,
/// sampling, waiting for reads).
///
/// [`PoolStats`]: crate::backend::cpu::pool::PoolStats
pub fn pool_note(s: &GenStats) -> String {
    let p = &s.pool_decode;
    let n = s.generated_tokens.saturating_sub(1);
    if n == 0 || p.regions == 0 || s.decode_s <= 0.0 {
        return "none in decode".into();
    }
    let outside = 100.0 * (1.0 - p.wall_ns as f64 / 1e9 / s.decode_s).max(0.0);
    format!(
        "decode: {:.1} regions / token, {:.0} µs and {:.0} tasks each; tasks ran {:.0}% of the \
         {} threads' time inside them; {outside:.0}% of decode time outside them",
        p.regions as f64 / n as f64,
        p.wall_ns as f64 / 1e3 / p.regions as f64,
        p.tasks as f64 / p.regions as f64,
        p.busy_pct(s.threads),
        s.threads,
    )
}

/// How `--stats` names the numerics: `exact`, or `q8` with what it changes.
fn numerics_note(n: crate::models::Numerics) -> String {
    match n {
        crate::models::Numerics::Exact => "exact".into(),
        n => format!(
            "{n} (lossy: activations quantized to 8 bits per block, integer dots for Q8_0/Q4_0/Q5_0/MXFP4/Q4_K/Q5_K/Q6_K weights in every pass, prompts and decode; other types exact)"
        ),
    }
}

/// The `--stats-json` object (`finish` as [`Finish::as_str`], with `stop_string` for a stop
/// string).
pub fn stats_json(
    s: &GenStats,
    p: &Placement,
    finish: &Finish,
    seed: u64,
    load_s: f64,
    bandwidth: Option<u64>,
) -> serde_json::Value {
    let mut v = stats_json_base(s, p, finish, seed, load_s);
    if let Finish::Stop(text) = finish {
        v["stop_string"] = text.as_str().into();
    }
    if let Some(sp) = &s.speculative {
        v["speculative"] = sp.json();
    }
    if let Some(e) = &s.experts {
        v["experts"] = serde_json::to_value(e).expect("serializable");
        v["experts"]["drives"] = e
            .drives()
            .iter()
            .map(|(d, bytes, reads, busy, bw)| {
                serde_json::json!({"drive": d, "bytes": bytes, "reads": reads, "busy_s": busy, "bandwidth_bytes_per_s": bw})
            })
            .collect();
    }
    if let Some(l) = physical_limit(s, bandwidth) {
        v["physical_limit"] = serde_json::json!({
            "bandwidth_bytes_per_s": l.bandwidth,
            "bandwidth_source": l.source,
            "stated_bandwidth_bytes_per_s": l.stated_bandwidth,
            "bytes_per_token": l.bytes_per_token,
            "expert_bytes_per_token": l.expert_bytes_per_token,
            "delivered_bytes_per_s": l.delivered,
            "limit_tok_s": l.limit_tok_s,
            "fraction": l.fraction,
        });
    }
    v
}

/// The physical limit of decode (see the module docs), for `--stats`, `--stats-json` and
/// `bench`.
#[derive(Clone, Debug, PartialEq)]
pub struct PhysicalLimit {
    /// `B`, bytes/s.
    pub bandwidth: f64,
    /// Where `B` came from: `--drive-bandwidth`, `measured busy-time bandwidth`, or `delivered
    /// read rate` (when that was above the other).
    pub source: &'static str,
    /// `B` as given or measured, before the delivered rate replaced a lower one.
    pub stated_bandwidth: f64,
    /// `R`: bytes read from disk per decoded token (after the first).
    pub bytes_per_token: f64,
    /// The expert store's share of `R`.
    pub expert_bytes_per_token: f64,
    /// `D / t`: bytes/s the reads delivered over the decode.
    pub delivered: f64,
    /// `B / R`, tokens/s.
    pub limit_tok_s: f64,
    /// Decode tok/s over the limit, `delivered / B`: at most 1.
    pub fraction: f64,
}

/// The physical limit of `s`'s decode with drive bandwidth `given` (bytes/s; default: the
/// measured busy-time bandwidth of the decode's reads); `None` when the decode read nothing
/// (everything resident) or decoded no token after the first.
pub fn physical_limit(s: &GenStats, given: Option<u64>) -> Option<PhysicalLimit> {
    let n = s.generated_tokens.saturating_sub(1);
    if n == 0 || s.decode_bytes == 0 || s.decode_s <= 0.0 {
        return None;
    }
    let d = s.decode_bytes as f64;
    let delivered = d / s.decode_s;
    let expert_busy = s
        .experts
        .as_ref()
        .map_or(0.0, |e| e.drives().iter().fold(0f64, |a, x| a.max(x.3)));
    let busy = s.decode_read_busy_s + expert_busy;
    let (stated, src) = match given {
        Some(b) => (b as f64, "--drive-bandwidth"),
        None if busy > 0.0 => (d / busy, "measured busy-time bandwidth"),
        None => (0.0, "none"),
    };
    let (b, source) = if delivered > stated {
        (delivered, "delivered read rate")
    } else {
        (stated, src)
    };
    let r = d / n as f64;
    let limit = b / r;
    Some(PhysicalLimit {
        bandwidth: b,
        source,
        stated_bandwidth: stated,
        bytes_per_token: r,
        expert_bytes_per_token: s
            .experts
            .as_ref()
            .map_or(0.0, |e| e.decode.bytes as f64 / n as f64),
        delivered,
        limit_tok_s: limit,
        fraction: delivered / b,
    })
}

/// The `--stats` line of the physical limit ([`physical_limit`]).
pub fn limit_line(s: &GenStats, given: Option<u64>) -> String {
    let Some(l) = physical_limit(s, given) else {
        return "physical limit       none (decode read nothing from disk)\n".into();
    };
    let stated = match (l.source, given) {
        ("delivered read rate", Some(_)) => format!(
            "; --drive-bandwidth {:.1} MB/s is below it, so it is not the drives' bandwidth",
            l.stated_bandwidth / 1e6
        ),
        ("delivered read rate", None) if l.stated_bandwidth > 0.0 => format!(
            "; the busy-time bandwidth {:.1} MB/s is below it (overlapping reads' busy time counted twice)",
            l.stated_bandwidth / 1e6
        ),
        _ => String::new(),
    };
    format!(
        "physical limit       {:.2} tok/s = B / R, B = {:.1} MB/s ({}{stated}), R = {} read per token ({} of it experts): {:.0}% reached\n",
        l.limit_tok_s,
        l.bandwidth / 1e6,
        l.source,
        mib(l.bytes_per_token),
        mib(l.expert_bytes_per_token),
        100.0 * l.fraction
    )
}

/// The expert store part of `--stats` (empty when every expert is resident).
pub fn expert_table(s: &GenStats) -> String {
    let Some(e) = &s.experts else {
        return String::new();
    };
    let n = s.generated_tokens.saturating_sub(1).max(1) as f64;
    let d = &e.decode;
    let mut out = format!(
        "--- experts ---\n\
         engine               {}\n\
         cache                {} ({} of {} used)\n\
         hit rate             {:.1}% decode ({} hits, {} misses), {:.1}% prefill\n\
         expert reads / token {:.1} ({} per expert read of {})\n\
         I/O wait / compute   {:.3} s / {:.3} s in decode ({:.0}% waiting)\n",
        e.engine,
        e.cache_policy,
        mib(e.cache_used_bytes as f64),
        mib(e.cache_budget_bytes as f64),
        100.0 * d.hit_rate,
        d.hits,
        d.misses,
        100.0 * e.prefill.hit_rate,
        d.misses as f64 / n,
        mib(d.bytes as f64 / (d.misses.max(1)) as f64),
        mib(e.expert_bytes as f64),
        d.io_wait_s,
        d.compute_s,
        100.0 * d.io_wait_s / (d.io_wait_s + d.compute_s).max(1e-12),
    );
    if e.prefetch {
        out += &format!(
            "prefetch             recall {:.1}% ({} of {} misses), {} guesses read, {} wasted ({}), {} cancelled\n",
            100.0 * d.prefetch_recall,
            d.prefetch_hits,
            d.misses,
            d.prefetch_reads,
            d.prefetch_wasted,
            mib(d.prefetch_wasted_bytes as f64),
            d.prefetch_cancelled
        );
    } else {
        out += "prefetch             off\n";
    }
    out += &prefill_layers_table(e);
    for (drive, bytes, reads, busy, bw) in e.drives() {
        out += &format!(
            "drive {drive:14} {} in {reads} reads, busy {busy:.3} s, {:.1} MB/s while busy\n",
            mib(bytes as f64),
            bw / 1e6
        );
    }
    out
}

/// The prefill's per-layer lines of `--stats`: spine and expert compute, expert read wait,
/// bytes read, experts touched and read amplification per layer
/// ([`crate::store::telemetry::LayerIo`]), with their sums; empty without expert uses in the
/// prefill.
pub fn prefill_layers_table(e: &crate::store::telemetry::ExpertRunStats) -> String {
    let ls = &e.prefill_layers;
    if ls.iter().all(|l| l.uses == 0) {
        return String::new();
    }
    let mut out = format!(
        "prefill per layer    {:>5} {:>8} {:>9} {:>7} {:>9} {:>7} {:>6}\n",
        "layer", "spine s", "experts s", "wait s", "MiB read", "touched", "ampl"
    );
    let row = |name: &str, spine: f64, comp: f64, wait: f64, bytes: u64, t: u64, a: f64| {
        format!(
            "                     {name:>5} {spine:>8.3} {comp:>9.3} {wait:>7.3} {:>9.1} {t:>7} {a:>6.3}\n",
            bytes as f64 / 1048576.0
        )
    };
    for l in ls {
        out += &row(
            &l.layer.to_string(),
            l.spine_s,
            l.compute_s,
            l.io_wait_s,
            l.bytes,
            l.experts_touched,
            l.read_amplification,
        );
    }
    let sum = |f: &dyn Fn(&crate::store::telemetry::LayerIo) -> f64| ls.iter().map(f).sum::<f64>();
    let bytes: u64 = ls.iter().map(|l| l.bytes).sum();
    let touched: u64 = ls.iter().map(|l| l.experts_touched).sum();
    let tb: u64 = ls.iter().map(|l| l.touched_bytes).sum();
    out += &row(
        "all",
        sum(&|l| l.spine_s),
        sum(&|l| l.compute_s),
        sum(&|l| l.io_wait_s),
        bytes,
        touched,
        if tb > 0 {
            bytes as f64 / tb as f64
        } else {
            0.0
        },
    );
    out
}

fn stats_json_base(
    s: &GenStats,
    p: &Placement,
    finish: &Finish,
    seed: u64,
    load_s: f64,
) -> serde_json::Value {
    serde_json::json!({
        "load_s": load_s,
        "prompt_tokens": s.prompt_tokens,
        "generated_tokens": s.generated_tokens,
        "finish": finish.as_str(),
        "ttft_s": s.ttft_s,
        "decode_s": s.decode_s,
        "decode_tok_s": s.decode_tok_s(),
        "decode_bytes_per_token": s.decode_bytes_per_token(),
        "prefill_bytes": s.prefill_bytes,
        "decode_bytes": s.decode_bytes,
        "reads": s.reads,
        "io_wait_s": s.io_wait_s,
        "peak_rss_bytes": s.peak_rss,
        "placement": p.summary,
        "numerics": p.numerics.name(),
        "resident_bytes": p.resident_bytes,
        "streamed_bytes_per_pass": p.streamed_bytes,
        "stream_buffer_bytes": p.stream_buffer_bytes,
        "kv_bytes": p.kv_bytes,
        "scratch_bytes": p.scratch_bytes,
        "seed": seed,
        "threads": s.threads,
        "pool": {
            "prefill": pool_json(&s.pool_prefill),
            "decode": pool_json(&s.pool_decode),
        },
    })
}

/// A [`crate::backend::cpu::pool::PoolStats`] as JSON (times in seconds).
fn pool_json(p: &crate::backend::cpu::pool::PoolStats) -> serde_json::Value {
    serde_json::json!({
        "regions": p.regions,
        "tasks": p.tasks,
        "wall_s": p.wall_ns as f64 / 1e9,
        "busy_s": p.busy_ns as f64 / 1e9,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_note_gives_regions_per_token_busy_share_and_time_outside() {
        let mut s = GenStats {
            generated_tokens: 11,
            decode_s: 1.0,
            threads: 4,
            ..Default::default()
        };
        assert_eq!(pool_note(&s), "none in decode");
        s.pool_decode = crate::backend::cpu::pool::PoolStats {
            regions: 500,
            tasks: 8000,
            wall_ns: 800_000_000,
            busy_ns: 1_600_000_000,
        };
        assert_eq!(
            pool_note(&s),
            "decode: 50.0 regions / token, 1600 µs and 16 tasks each; tasks ran 50% of the \
             4 threads' time inside them; 20% of decode time outside them"
        );
    }

    /// 5 tokens (4 decoded after the first) reading 400 MB in 2 s of decode: 200 MB/s
    /// delivered, R = 100 MB per token, 2 tok/s.
    fn stats(busy_s: f64) -> GenStats {
        GenStats {
            generated_tokens: 5,
            decode_s: 2.0,
            decode_bytes: 400_000_000,
            decode_read_busy_s: busy_s,
            ..Default::default()
        }
    }

    #[test]
    fn the_limit_is_bandwidth_over_bytes_read_per_token() {
        let l = physical_limit(&stats(0.0), Some(400_000_000)).unwrap();
        assert_eq!(l.source, "--drive-bandwidth");
        assert_eq!(l.bytes_per_token, 1e8);
        assert_eq!(l.limit_tok_s, 4.0);
        assert_eq!(l.fraction, 0.5);
        assert_eq!(l.delivered, 2e8);
        // measured: 400 MB in 1 s of busy reads
        let l = physical_limit(&stats(1.0), None).unwrap();
        assert_eq!(l.source, "measured busy-time bandwidth");
        assert_eq!((l.bandwidth, l.limit_tok_s, l.fraction), (4e8, 4.0, 0.5));
    }

    #[test]
    fn a_bandwidth_below_the_delivered_rate_is_replaced_so_the_fraction_stays_at_most_one() {
        // a --drive-bandwidth of 100 MB/s cannot be right when 200 MB/s arrived
        let l = physical_limit(&stats(0.0), Some(100_000_000)).unwrap();
        assert_eq!(l.source, "delivered read rate");
        assert_eq!((l.stated_bandwidth, l.bandwidth), (1e8, 2e8));
        assert_eq!((l.limit_tok_s, l.fraction), (2.0, 1.0));
        assert_eq!(
            limit_line(&stats(0.0), Some(100_000_000)),
            "physical limit       2.00 tok/s = B / R, B = 200.0 MB/s (delivered read rate; \
             --drive-bandwidth 100.0 MB/s is below it, so it is not the drives' bandwidth), \
             R = 95.4 MiB read per token (0.0 MiB of it experts): 100% reached\n"
        );
        // busy time summed over overlapping reads: 4 s in a 2 s decode
        let l = physical_limit(&stats(4.0), None).unwrap();
        assert_eq!((l.source, l.fraction), ("delivered read rate", 1.0));
    }

    #[test]
    fn no_limit_without_reads_in_decode() {
        let s = GenStats {
            decode_bytes: 0,
            ..stats(0.0)
        };
        assert_eq!(physical_limit(&s, Some(1)), None);
        assert_eq!(
            limit_line(&s, None),
            "physical limit       none (decode read nothing from disk)\n"
        );
        assert!(
            stats_json(&s, &Placement::default(), &Finish::Eos, 0, 0.0, None)
                .get("physical_limit")
                .is_none()
        );
    }

    #[test]
    fn finish_reasons_are_openai_words() {
        let s = stats(1.0);
        let p = Placement::default();
        let cases = [
            (Finish::Eos, "stop", "(stop: end-of-generation token)"),
            (Finish::Stop("x".into()), "stop", "(stop: stop string)"),
            (Finish::Length, "length", "(length: max tokens)"),
            (Finish::ContextFull, "length", "(length: context full)"),
            (Finish::Interrupted, "interrupted", "(interrupted: Ctrl-C)"),
        ];
        for (f, word, text) in cases {
            let j = stats_json(&s, &p, &f, 0, 0.0, None);
            assert_eq!(j["finish"], word);
            let stop = matches!(f, Finish::Stop(_)).then_some("x");
            assert_eq!(j["stop_string"].as_str(), stop);
            assert!(
                stats_table(&s, &p, &f, 0, 0.0)
                    .contains(&format!("generated tokens     5 {text}\n")),
                "{f:?}"
            );
        }
    }
}
