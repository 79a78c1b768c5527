//! What a generation measured, as text and JSON: the `--stats` table ([`stats_table`], with
//! [`expert_table`] for the expert store), the `--stats-json` object ([`stats_json`]) that
//! `deltafin bench` also writes per scenario, and the physical limit's drive bandwidth
//! ([`limit_bandwidth`]).

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
         generated tokens     {} ({:?})\n\
         time to first token  {:.3} s\n\
         decode               {:.2} tok/s\n\
         disk read / token    {} (decode), {} (prefill total)\n\
         reads issued         {}\n\
         I/O wait             {:.3} s ({wait_share:.0}% of run)\n\
         placement            {}\n\
         numerics             {}\n\
         resident weights     {}, not resident {} (read from disk when a pass uses it), stream buffers {}, KV cache {}, activations {}\n\
         peak RSS             {}\n\
         seed                 {seed}\n",
        s.prompt_tokens,
        s.generated_tokens,
        finish,
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

/// The `--stats-json` object.
pub fn stats_json(
    s: &GenStats,
    p: &Placement,
    finish: &Finish,
    seed: u64,
    load_s: f64,
    bandwidth: Option<u64>,
) -> serde_json::Value {
    let mut v = stats_json_base(s, p, finish, seed, load_s);
    if let Some(sp) = &s.speculative {
        v["speculative"] = sp.json();
    }
    if let Some(e) = &s.experts {
        let (b, b_source) = limit_bandwidth(s, bandwidth);
        let limit = e.limit_tok_s(b, s.generated_tokens.saturating_sub(1));
        v["experts"] = serde_json::to_value(e).expect("serializable");
        v["experts"]["drives"] = e
            .drives()
            .iter()
            .map(|(d, bytes, reads, busy, bw)| {
                serde_json::json!({"drive": d, "bytes": bytes, "reads": reads, "busy_s": busy, "bandwidth_bytes_per_s": bw})
            })
            .collect();
        v["physical_limit"] = serde_json::json!({
            "bandwidth_bytes_per_s": b,
            "bandwidth_source": b_source,
            "limit_tok_s": limit,
            "fraction": if limit.is_finite() && limit > 0.0 { s.decode_tok_s() / limit } else { 0.0 },
        });
    }
    v
}

/// `B` for the physical limit: the given drive bandwidth, else the expert reads' own
/// bandwidth while the drives were busy (decode), with where it came from.
pub fn limit_bandwidth(s: &GenStats, given: Option<u64>) -> (f64, &'static str) {
    if let Some(b) = given {
        return (b as f64, "--drive-bandwidth");
    }
    let Some(e) = &s.experts else {
        return (0.0, "none");
    };
    let (bytes, busy) = e
        .drives()
        .iter()
        .fold((0u64, 0f64), |a, d| (a.0 + d.1, a.1.max(d.3)));
    if busy > 0.0 {
        (bytes as f64 / busy, "measured busy-time bandwidth")
    } else {
        (0.0, "none")
    }
}

/// The expert store part of `--stats` (empty when every expert is resident).
pub fn expert_table(s: &GenStats, bandwidth: Option<u64>) -> String {
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
    let (b, src) = limit_bandwidth(s, bandwidth);
    let limit = e.limit_tok_s(b, s.generated_tokens.saturating_sub(1));
    if limit.is_finite() && limit > 0.0 {
        out += &format!(
            "physical limit       {limit:.2} tok/s at B = {:.1} MB/s ({src}): {:.0}% reached\n",
            b / 1e6,
            100.0 * s.decode_tok_s() / limit
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
        "finish": format!("{finish:?}"),
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
    })
}
