//! `deltafin bench`: end-to-end scenarios on one model under one RAM budget, written as JSON
//! and a table: tok/s, time to first token, bytes/token, cache hit rate, per-drive bandwidth,
//! I/O wait share and the fraction of the physical limit reached.
//!
//! Scenarios (each loads the model afresh, so the expert cache starts empty):
//! - `cold-decode`: the page cache is dropped first (`sync`, then `3` written to
//!   `/proc/sys/vm/drop_caches`, which needs root; `--keep-page-cache` skips it, and the
//!   output says whether it was dropped or why not), a short prompt, then `-n` greedy tokens;
//! - `warm-decode`: the same, after a first generation of `-n` tokens in the same session, so
//!   the expert cache holds what that run left;
//! - `prefill`: one prompt of `--prompt-tokens` tokens in one batch (time to first token,
//!   bytes);
//! - `cold-prefill`: the same after dropping the page cache as `cold-decode` does (cold time to
//!   first token), with the prefill's compute time (spines and experts), expert read wait,
//!   I/O floor (bytes read / `--drive-bandwidth`) and read amplification in the summary.
//!
//! Each scenario runs `--repetitions` times; the table shows the median (and with more than
//! one run min, median and max) of each metric, as text, Markdown or CSV (`--output`), and
//! `--plot FILE.svg` draws tok/s and bytes read per token per scenario.
//!
//! Prompts are fixed token ids (`(37·i + 11) mod vocab`), end-of-generation tokens are ignored,
//! so every run does the same work.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use super::bench_out::{median_json, plot, spread_json, table, Metrics, Output, ScenarioRuns};
use super::store_args::StoreArgs;
use crate::engine::report::stats_json;
use crate::engine::{GenStats, GenerateOptions, Sampler, SamplerConfig, Session};
use crate::load::{open_any, Options};
use crate::models::Placement;
use crate::store::plan::parse_size;

/// Arguments of `deltafin bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Model: GGUF file, model folder, pack or ORG/NAME [default: the demo model]
    #[arg(
        short,
        long,
        value_name = "MODEL",
        default_value = "",
        hide_default_value = true
    )]
    pub model: PathBuf,
    /// Scenarios, comma-separated: cold-decode, warm-decode, prefill, cold-prefill.
    #[arg(
        long,
        default_value = "cold-decode,warm-decode,prefill",
        value_delimiter = ','
    )]
    pub scenarios: Vec<String>,
    /// RAM budget (as for `run`, and the same default).
    #[arg(long, value_parser = parse_size)]
    pub ram_budget: Option<u64>,
    /// Tokens to decode per decode scenario.
    #[arg(short = 'n', long, default_value_t = 32)]
    pub tokens: usize,
    /// Prompt tokens of the decode scenarios (synthetic ids).
    #[arg(long, default_value_t = 8)]
    pub decode_prompt_tokens: usize,
    /// Prompt text of the decode scenarios, tokenized as `run` tokenizes a raw prompt, instead
    /// of --decode-prompt-tokens synthetic ids (a real text makes speculation's acceptance real).
    #[arg(long)]
    pub prompt: Option<String>,
    /// Prompt tokens of the prefill scenario.
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Worker threads (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Arithmetic of the matrix products (as for `run`: `exact` or the lossy `q8`).
    #[arg(long, default_value = "exact")]
    pub numerics: crate::models::Numerics,
    /// Compute device, as for `run`: cpu, cuda, cuda:N, or auto (the first CUDA GPU when the
    /// model runs on one, else the CPU).
    #[arg(long, default_value = "auto")]
    pub device: crate::backend::DeviceKind,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Speculative decoding in the decode scenarios (greedy, as without it).
    #[command(flatten)]
    pub spec: super::spec_args::SpecArgs,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Runs of each scenario; the table and JSON give min, median and max per metric.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub repetitions: u32,
    /// Form of the results on standard output: `table` (aligned text), `md` (Markdown), `csv`
    /// (a header line, then one line per row) or `json` (the `--json` object). With `md`,
    /// `csv` and `json` the notes go to standard error.
    #[arg(long, value_enum, default_value = "table")]
    pub output: super::bench_out::Output,
    /// Draw tok/s and MiB read per token per scenario (medians, min-max lines) into this SVG
    /// file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Leave the page cache as it is before the cold scenarios (they drop it by default).
    #[arg(long)]
    pub keep_page_cache: bool,
}

/// Empties the page cache (`sync`, then `3` written to `/proc/sys/vm/drop_caches`).
///
/// Errors: why it could not (writing the file failed: not root, or a read-only `/proc`).
pub fn drop_page_cache() -> std::result::Result<(), String> {
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").map_err(|e| {
        // SAFETY: geteuid(2) has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        format!(
            "writing /proc/sys/vm/drop_caches failed: {e}{}",
            if root { "" } else { " (not root)" }
        )
    })
}

/// Whether scenario `name` drops the page cache first, and if not why: `Ok(true)` dropped,
/// `Ok(false)` not a cold scenario, `Err(reason)` a cold one that did not.
fn page_cache(a: &BenchArgs, name: &str) -> std::result::Result<bool, String> {
    match (name.starts_with("cold-"), a.keep_page_cache) {
        (false, _) => Ok(false),
        (true, true) => Err("--keep-page-cache".into()),
        (true, false) => drop_page_cache().map(|_| true),
    }
}

/// Whether scenario `name` is a prefill (one prompt, one token).
fn is_prefill(name: &str) -> bool {
    name == "prefill" || name == "cold-prefill"
}

fn prompt(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((37 * i + 11) % vocab) as u32).collect()
}

/// One scenario's run: statistics and placement.
fn scenario(
    a: &BenchArgs,
    name: &str,
) -> Result<(GenStats, Placement, std::result::Result<bool, String>, f64)> {
    let dropped = page_cache(a, name);
    let t = std::time::Instant::now();
    let opened = open_any(Some(a.model.as_path()))?;
    let (limit, budget) = super::engine_args::checked_budget(a.ram_budget, &opened)?;
    // token ids only (a draft model's vocabulary check and --prompt need the tokenizer), no
    // sampling defaults
    let tok = match a.spec.enabled() || a.prompt.is_some() {
        true => Some(opened.tokenizer()?),
        false => None,
    };
    let text = match (&a.prompt, &tok) {
        (Some(p), Some(t)) if !is_prefill(name) => Some(t.encode_prompt(p, true)?),
        _ => None,
    };
    if text.as_ref().is_some_and(|t| t.is_empty()) {
        bail!("--prompt gives no tokens");
    }
    let decode_tokens = text.as_ref().map_or(a.decode_prompt_tokens, |t| t.len());
    let (decode_p, warm) = match name {
        "cold-decode" => (decode_tokens, false),
        "warm-decode" => (decode_tokens, true),
        "prefill" | "cold-prefill" => (a.prompt_tokens, false),
        other => bail!(
            "unknown scenario '{other}' (expected cold-decode, warm-decode, prefill or cold-prefill)"
        ),
    };
    let n_gen = if is_prefill(name) { 1 } else { a.tokens };
    let n_ctx = decode_p + n_gen * if warm { 2 } else { 1 } + 1;
    let draft = match name {
        _ if is_prefill(name) => None,
        _ => a.spec.load_draft(n_ctx, decode_p.max(1), true)?,
    };
    let flag = a.ram_budget.is_some();
    let weights = crate::models::LoadOptions {
        ram_budget: super::spec_args::target_budget(budget, flag, draft.as_ref())?,
        n_ctx,
        n_batch: decode_p.max(1),
        direct_io: true,
        experts: a.store.options(Some(&a.model)),
        mtp: a.spec.mtp(),
        numerics: a.numerics,
        device: a.device,
    };
    let loaded = opened
        .load(&Options {
            weights,
            ..Default::default()
        })
        .map_err(|e| super::spec_args::explain_budget(e, budget, flag, draft.as_ref()))
        .map_err(|e| match (a.ram_budget, &limit) {
            (None, Some(l)) => crate::models::BudgetTooSmall::under_limit(e, l),
            _ => e,
        })?;
    let load_s = t.elapsed().as_secs_f64();
    let placement = loaded.model.placement().clone();
    let vocab = loaded.model.vocab_size();
    let mut session = Session::new(loaded.model, loaded.store, n_ctx, decode_p.max(1));
    let sampling = SamplerConfig {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        repeat_last_n: 0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        seed: 0,
        order: crate::engine::SamplerOrder::LlamaCpp,
    };
    let mut spec = match &tok {
        Some(t) if !is_prefill(name) && a.spec.enabled() => {
            a.spec.speculator(&session, t, &sampling, draft)?
        }
        _ => None,
    };
    let mut sampler = Sampler::new(sampling.clone());
    let never = |_: u32| false;
    let gen = GenerateOptions {
        max_tokens: n_gen,
        stop: &[],
        is_eog: &never,
        cancel: None,
    };
    let ids = text.unwrap_or_else(|| prompt(decode_p, vocab));
    let mut go = |s: &mut Session, ids: &[u32]| {
        if let Some(sp) = spec.as_mut() {
            sp.begin(&sampling);
        }
        s.generate_with(
            ids,
            &mut sampler,
            &gen,
            spec.as_mut(),
            &mut |_| String::new(),
            &mut |_| {},
        )
    };
    if warm {
        let (out, _, _) = go(&mut session, &ids).context("warm-up generation")?;
        let (_, _, st) = go(&mut session, &out[out.len() - 1..])?;
        return Ok((st, placement, dropped, load_s));
    }
    let (_, _, st) = go(&mut session, &ids)?;
    Ok((st, placement, dropped, load_s))
}

/// A prefill scenario's time split, as JSON and one line of text: compute (the layers' spines
/// and experts, summed), expert read wait, the I/O floor (expert bytes read / `bandwidth`
/// bytes/s, when given), experts touched (distinct, of all the store's) and read amplification
/// (bytes read / bytes of the distinct experts touched).
fn prefill_summary(
    name: &str,
    e: &crate::store::telemetry::ExpertRunStats,
    bandwidth: Option<u64>,
) -> (serde_json::Value, String) {
    let ls = &e.prefill_layers;
    let spine: f64 = ls.iter().map(|l| l.spine_s).sum();
    let experts: f64 = ls.iter().map(|l| l.compute_s).sum();
    let wait: f64 = ls.iter().map(|l| l.io_wait_s).sum();
    let touched: u64 = ls.iter().map(|l| l.experts_touched).sum();
    let tb: u64 = ls.iter().map(|l| l.touched_bytes).sum();
    let bytes = e.prefill.bytes;
    let amp = if tb > 0 {
        bytes as f64 / tb as f64
    } else {
        0.0
    };
    let floor = bandwidth.map(|b| bytes as f64 / b.max(1) as f64);
    let j = serde_json::json!({
        "compute_s": spine + experts, "spine_s": spine, "experts_compute_s": experts,
        "expert_io_wait_s": wait, "io_floor_s": floor, "bytes": bytes,
        "experts_touched": touched, "experts_total": e.experts_total,
        "read_amplification": amp, "read_ahead": e.read_ahead,
    });
    let line = format!(
        "{name}: compute {:.3} s (spines {spine:.3}, experts {experts:.3}), expert read wait {wait:.3} s, I/O floor {}, {touched} of {} experts touched, read amplification {amp:.3}\n",
        spine + experts,
        floor.map_or("- (no --drive-bandwidth)".to_string(), |f| format!("{f:.3} s")),
        e.experts_total,
    );
    (j, line)
}

/// One run's [`Metrics`] and the `weights` text of the table (what was streamed).
fn metrics(
    name: &str,
    st: &GenStats,
    placement: &Placement,
    v: &serde_json::Value,
) -> (Metrics, String) {
    let pre = is_prefill(name);
    let tokens = match pre {
        true => st.prompt_tokens.max(1) as f64,
        false => st.generated_tokens.saturating_sub(1).max(1) as f64,
    };
    let (bytes, run_s) = match pre {
        true => (st.prefill_bytes, st.ttft_s),
        false => (st.decode_bytes, st.decode_s),
    };
    let c = st.experts.as_ref().map(|e| match pre {
        true => &e.prefill,
        false => &e.decode,
    });
    let expert_bytes = c.map_or(0, |c| c.bytes);
    let weights = match (&st.experts, placement.streamed_bytes) {
        (Some(e), _) => format!("experts: {}", e.engine),
        (None, 0) => "all resident".to_string(),
        (None, _) => format!("dense: {}", placement.summary),
    };
    let mib = |b: u64| b as f64 / tokens / 1048576.0;
    let m = Metrics {
        tok_s: match pre {
            true => st.prompt_tokens as f64 / st.ttft_s.max(1e-12),
            false => st.decode_tok_s(),
        },
        ttft_s: st.ttft_s,
        mib_per_token: mib(bytes),
        dense_mib_per_token: mib(bytes.saturating_sub(expert_bytes)),
        expert_mib_per_token: mib(expert_bytes),
        hit_pct: c.map_or(0.0, |c| 100.0 * c.hit_rate),
        prefetch_recall_pct: st.experts.as_ref().and_then(|e| {
            (e.prefetch || e.read_ahead && pre).then_some(100.0 * c?.prefetch_recall)
        }),
        read_mb_s: bytes as f64 / run_s.max(1e-12) / 1e6,
        io_wait_pct: 100.0 * st.io_wait_s / (st.ttft_s + st.decode_s).max(1e-12),
        limit_pct: match pre {
            true => None,
            false => v["physical_limit"]["fraction"].as_f64().map(|f| 100.0 * f),
        },
    };
    (m, weights)
}

/// Runs `deltafin bench`.
///
/// Errors: an unknown scenario; the model cannot be loaded under the budget; a generation
/// fails; an output file cannot be written.
pub fn run(mut a: BenchArgs) -> Result<()> {
    if a.model.as_os_str().is_empty() {
        // the demo model, as every other command defaults to (fetched when absent)
        use crate::pull::{home_dir, pull, PullOptions, DEMO_MODEL};
        a.model = pull(DEMO_MODEL, &home_dir(), &PullOptions::default())?;
    } else if let Some(p) = a.store.s3.model_path(Some(&a.model))? {
        a.model = p;
    }
    super::init_threads(a.threads);
    let mut rows = Vec::new();
    let mut table_rows = Vec::new();
    let mut notes = String::new();
    for name in &a.scenarios {
        let mut runs = Vec::new();
        let mut last = (serde_json::Value::Null, String::new());
        let mut cache_note = String::new();
        let mut weights = String::new();
        for rep in 0..a.repetitions {
            let (st, placement, dropped, load_s) = scenario(&a, name)?;
            let mut v = stats_json(
                &st,
                &placement,
                &crate::engine::Finish::Length,
                0,
                load_s,
                a.store.drive_bandwidth,
            );
            v["scenario"] = name.as_str().into();
            v["page_cache_dropped"] = matches!(dropped, Ok(true)).into();
            v["page_cache"] = match &dropped {
                Ok(d) => serde_json::json!({"dropped": d, "reason": null}),
                Err(r) => serde_json::json!({"dropped": false, "reason": r}),
            };
            if rep == 0 {
                cache_note = match &dropped {
                    Ok(true) => format!("{name}: page cache dropped before each run\n"),
                    Ok(false) => String::new(),
                    Err(r) => format!("{name}: page cache not dropped: {r}\n"),
                };
            }
            let (m, w) = metrics(name, &st, &placement, &v);
            weights = w;
            let mut line = String::new();
            if let (false, Some(sp)) = (is_prefill(name), &st.speculative) {
                line += &format!(
                    "{name}: speculative ({}): {} / {} drafts accepted, {} target passes \
                     ({} verification, {} plain; {} fallbacks)\n",
                    sp.source,
                    sp.accepted,
                    sp.drafted,
                    sp.target_passes(),
                    sp.verify_passes,
                    sp.plain_passes,
                    sp.fallbacks
                );
            }
            if !is_prefill(name) {
                line += &format!(
                    "{name}: parallel loops {}\n",
                    crate::engine::report::pool_note(&st)
                );
            }
            if let (true, Some(e)) = (is_prefill(name), &st.experts) {
                let (j, l) = prefill_summary(name, e, a.store.drive_bandwidth);
                v["prefill_summary"] = j;
                line += &l;
            }
            runs.push(m);
            last = (v, line);
        }
        let (mut v, line) = last;
        notes += &cache_note;
        notes += &line;
        v["repetitions"] = a.repetitions.into();
        v["summary"] = median_json(&runs);
        v["spread"] = spread_json(&runs);
        v["runs"] = runs.iter().map(Metrics::json).collect();
        if let Some(p) = v.get_mut("prefill_summary").map(serde_json::Value::take) {
            v["summary"]["prefill"] = p;
            v.as_object_mut().map(|o| o.remove("prefill_summary"));
        }
        rows.push(v);
        table_rows.push(ScenarioRuns {
            name: name.clone(),
            weights,
            runs,
        });
    }
    let out = serde_json::json!({
        "model": a.model.display().to_string(),
        "ram_budget": crate::store::plan::ram_budget(
            a.ram_budget,
            crate::store::plan::MemoryLimit::of_this_process()
        )
        .ok()
        .flatten(),
        "cache": a.store.cache.to_string(),
        "io_depth": a.store.io_depth,
        "io_request_size": a.store.io_request_size,
        "repetitions": a.repetitions,
        "scenarios": rows,
    });
    match a.output {
        Output::Table => out!("{}{notes}", table(&table_rows, Output::Table)),
        Output::Json => {
            outln!("{}", serde_json::to_string_pretty(&out)?);
            eprint!("{notes}");
        }
        f => {
            out!("{}", table(&table_rows, f));
            eprint!("{notes}");
        }
    }
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&out)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.plot {
        plot(&table_rows, p)?;
    }
    Ok(())
}
