//! `deltafin run`: generate text from a model, streaming weights under a RAM budget.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::engine::sampler::ModelSampling;
use crate::engine::{Finish, GenStats, GenerateOptions, Sampler, SamplerConfig, Session};
use crate::models::{load_gguf, load_hf_model, LoadOptions, Placement};
use crate::source::gguf::GgufModel;
use crate::source::hf::{is_hf_folder, HfModel};
use crate::store::plan::{default_ram_budget, parse_size};
use crate::tokenizer::chat::{ChatTemplate, Message};
use crate::tokenizer::hf::{HfStreamDecoder, HfTokenizer};
use crate::tokenizer::stream::StreamDecoder;
use crate::tokenizer::Tokenizer;

/// Arguments of `deltafin run`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Model: a .gguf file (the first part of a split model), a folder holding one GGUF model,
    /// a Hugging Face checkpoint folder (one with a config.json), or a pack folder written by
    /// `deltafin pack`. Default: the demo model (Gemma 3 270M Q4_K_M), fetched on first use.
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// Prompt text; read from standard input when absent.
    #[arg(short, long)]
    pub prompt: Option<String>,
    /// Treat the prompt as a user message and render the model's chat template around it.
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat.
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Maximum number of tokens to generate.
    #[arg(short = 'n', long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy. Default: the model's generation_config.json, else 0.8.
    #[arg(long = "temp", allow_hyphen_values = true, value_parser = non_negative)]
    pub temperature: Option<f32>,
    /// Top-k filter (0: off). Default: the model's generation_config.json, else 40.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Top-p (nucleus) filter (1: off). Default: the model's generation_config.json, else 0.95.
    #[arg(long, allow_hyphen_values = true, value_parser = probability_above_zero)]
    pub top_p: Option<f32>,
    /// Min-p filter (0: off). Default: the model's generation_config.json, else 0.05.
    #[arg(long, allow_hyphen_values = true, value_parser = probability)]
    pub min_p: Option<f32>,
    /// Repetition penalty (1: off). Default: the model's generation_config.json
    /// (`repetition_penalty`), else 1.
    #[arg(long, allow_hyphen_values = true, value_parser = positive)]
    pub repeat_penalty: Option<f32>,
    /// Tokens the repetition penalty looks back over.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Seed of the sampler's random numbers (default: from the clock; printed with --stats).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when this text appears (repeatable); it is not printed.
    #[arg(long, value_parser = non_empty)]
    pub stop: Vec<String>,
    /// RAM for resident weights, KV cache, activations and I/O buffers together, e.g. 64M or
    /// 2G; weights that do not fit are read from disk on every forward pass. Default: 90% of
    /// the memory this process may use (`MemAvailable`, or the cgroup limit when lower) less
    /// 256 MiB, so a model that fits is loaded whole and a larger one is streamed.
    #[arg(long, value_parser = parse_size)]
    pub ram_budget: Option<u64>,
    /// KV cache size in tokens (default: prompt + max tokens, capped by the model's context).
    #[arg(short = 'c', long)]
    pub ctx_size: Option<usize>,
    /// Largest number of prompt tokens in one forward pass.
    #[arg(short = 'b', long, default_value_t = 512, value_parser = at_least_one)]
    pub batch_size: usize,
    /// Worker threads (default: all cores).
    #[arg(short = 't', long, value_parser = thread_count)]
    pub threads: Option<usize>,
    /// Read weights through the page cache instead of O_DIRECT.
    #[arg(long)]
    pub no_direct_io: bool,
    #[command(flatten)]
    pub store: super::store_args::StoreArgs,
    /// Print statistics to standard error when done.
    #[arg(long)]
    pub stats: bool,
    /// Write the statistics as JSON to this file.
    #[arg(long)]
    pub stats_json: Option<PathBuf>,
}

fn float(s: &str) -> Result<f32, String> {
    let v: f32 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(format!("'{s}' is not a finite number"))
    }
}

fn non_negative(s: &str) -> Result<f32, String> {
    float(s).and_then(|v| {
        if v >= 0.0 {
            Ok(v)
        } else {
            Err(format!("{v} is negative; use 0 for greedy"))
        }
    })
}

fn positive(s: &str) -> Result<f32, String> {
    float(s).and_then(|v| {
        if v > 0.0 {
            Ok(v)
        } else {
            Err(format!("{v} must be above 0 (1 turns it off)"))
        }
    })
}

fn probability(s: &str) -> Result<f32, String> {
    float(s).and_then(|v| {
        if (0.0..=1.0).contains(&v) {
            Ok(v)
        } else {
            Err(format!("{v} is not between 0 and 1"))
        }
    })
}

fn probability_above_zero(s: &str) -> Result<f32, String> {
    probability(s).and_then(|v| {
        if v > 0.0 {
            Ok(v)
        } else {
            Err("0 would keep no token; use 1 to turn it off".into())
        }
    })
}

fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if v >= 1 => Ok(v),
        _ => Err(format!("'{s}' is not a whole number of at least 1")),
    }
}

fn thread_count(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if (1..=1024).contains(&v) => Ok(v),
        _ => Err(format!("'{s}' is not a thread count from 1 to 1024")),
    }
}

fn non_empty(s: &str) -> Result<String, String> {
    if s.is_empty() {
        Err("an empty stop string would stop at once".into())
    } else {
        Ok(s.to_string())
    }
}

/// Opens the model at `path`, or the demo model when `None` (fetching it if absent).
pub fn open_model(path: Option<&PathBuf>) -> Result<GgufModel> {
    use crate::pull::{home_dir, pull, PullOptions, DEMO_MODEL};
    match path {
        Some(p) => Ok(GgufModel::open_model_path(p)?),
        None => {
            let p = pull(DEMO_MODEL, &home_dir(), &PullOptions::default())?;
            GgufModel::open_model_path(&p).with_context(|| {
                format!(
                    "the cached demo model {} looks damaged; `deltafin pull {DEMO_MODEL} --force` fetches it again",
                    p.display()
                )
            })
        }
    }
}

/// A model opened from disk, before its weights are loaded.
pub enum OpenedModel {
    Gguf(GgufModel),
    Hf(HfModel),
}

/// Opens `path` as a pack when it holds a `manifest.json` (or refuses an unfinished pack; a
/// pack opens as the kind of model it was made of), as a Hugging Face folder when it is a
/// directory with a `config.json`, else as GGUF (see [`open_model`], which also fetches the
/// demo model when `path` is `None`).
pub fn open_any(path: Option<&PathBuf>) -> Result<OpenedModel> {
    use crate::source::pack;
    match path {
        Some(p) if pack::is_pack(p) || pack::is_incomplete_pack(p) => {
            match pack::Manifest::read(p)?.source.format.as_str() {
                "gguf" => Ok(OpenedModel::Gguf(pack::open_gguf_pack(p)?)),
                _ => Ok(OpenedModel::Hf(pack::open_pack(p)?)),
            }
        }
        Some(p) if is_hf_folder(p) => Ok(OpenedModel::Hf(HfModel::open(p)?)),
        _ => Ok(OpenedModel::Gguf(open_model(path)?)),
    }
}

/// The tokenizer of either kind of model.
enum AnyTokenizer {
    Gguf(Box<Tokenizer>),
    Hf(Box<HfTokenizer>),
}

/// The streaming detokenizer of either kind.
enum AnyDecoder<'t> {
    Gguf(StreamDecoder<'t>),
    Hf(HfStreamDecoder<'t>),
}

impl AnyTokenizer {
    fn is_eog(&self, t: u32) -> bool {
        match self {
            AnyTokenizer::Gguf(k) => k.is_eog(t),
            AnyTokenizer::Hf(k) => k.is_eog(t),
        }
    }

    fn decoder(&self) -> AnyDecoder<'_> {
        match self {
            AnyTokenizer::Gguf(k) => AnyDecoder::Gguf(StreamDecoder::new(k, true)),
            AnyTokenizer::Hf(k) => AnyDecoder::Hf(HfStreamDecoder::new(k, true)),
        }
    }
}

impl AnyDecoder<'_> {
    fn push(&mut self, t: u32) -> String {
        match self {
            AnyDecoder::Gguf(d) => d.push(t),
            AnyDecoder::Hf(d) => d.push(t),
        }
    }

    fn finish(&mut self) -> String {
        match self {
            AnyDecoder::Gguf(d) => d.finish(),
            AnyDecoder::Hf(d) => d.finish(),
        }
    }
}

/// Sets the size of the global thread pool once.
pub fn init_threads(threads: Option<usize>) {
    if let Some(n) = threads {
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .build_global();
    }
}

/// Runs `deltafin run`.
pub fn run(a: RunArgs) -> Result<()> {
    init_threads(a.threads);
    a.store.init_tracing();
    let t_load = std::time::Instant::now();
    let opened = open_any(a.model.as_ref())?;
    let tok = match &opened {
        OpenedModel::Gguf(g) => AnyTokenizer::Gguf(Box::new(Tokenizer::from_gguf(g)?)),
        OpenedModel::Hf(h) => AnyTokenizer::Hf(Box::new(HfTokenizer::from_folder(&h.dir)?)),
    };
    let model_sampling = match &opened {
        OpenedModel::Hf(h) => generation_config_sampling(&h.dir)?,
        OpenedModel::Gguf(_) => ModelSampling::default(),
    };
    let prompt = match &a.prompt {
        Some(p) => p.clone(),
        None => {
            if std::io::stdin().is_terminal() {
                bail!("no prompt: pass --prompt TEXT or pipe the prompt on standard input");
            }
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading the prompt from standard input")?;
            s
        }
    };
    let ids = if a.chat {
        let tmpl = match (&opened, &tok) {
            (OpenedModel::Gguf(g), _) => ChatTemplate::from_gguf_metadata(&g.metadata)?,
            (_, AnyTokenizer::Hf(t)) => t.chat_template()?,
            _ => unreachable!("tokenizer kind follows the model kind"),
        };
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(Message::new("system", s.clone()));
        }
        msgs.push(Message::new("user", prompt.clone()));
        let text = tmpl.render(&msgs, true)?;
        match &tok {
            AnyTokenizer::Gguf(t) => t.encode(&text, false, true)?,
            AnyTokenizer::Hf(t) => t.encode(&text, false)?,
        }
    } else {
        match &tok {
            AnyTokenizer::Gguf(t) => t.encode(&prompt, true, false)?,
            AnyTokenizer::Hf(t) => t.encode(&prompt, true)?,
        }
    };
    if ids.is_empty() {
        bail!("the prompt is empty");
    }
    let n_ctx = match a.ctx_size {
        Some(c) if c < ids.len() + 1 => bail!(
            "--ctx-size {c} is smaller than the prompt ({} tokens) plus one",
            ids.len()
        ),
        Some(c) => c,
        None => ids.len().saturating_add(a.max_tokens.max(1)),
    };
    let opts = LoadOptions {
        ram_budget: a.ram_budget.or_else(default_ram_budget),
        n_ctx,
        n_batch: a.batch_size.min(ids.len()).max(1),
        direct_io: !a.no_direct_io,
        experts: a.store.options(a.model.as_deref()),
    };
    let (model, store) = match &opened {
        OpenedModel::Gguf(g) => load_gguf(g, &opts)?,
        OpenedModel::Hf(h) => load_hf_model(h, &opts)?,
    };
    let limit = model.context_length();
    if ids.len() + 1 > limit {
        bail!(
            "the prompt has {} tokens but the model's context holds {limit}: shorten the prompt",
            ids.len()
        );
    }
    let n_ctx = n_ctx.min(limit);
    let placement = model.placement().clone();
    drop(opened);
    crate::tokenizer::release_freed_memory();
    let mut session = Session::new(model, store, n_ctx, opts.n_batch);
    let load_s = t_load.elapsed().as_secs_f64();
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let mut sampler = Sampler::new(sampler_config(&a, &model_sampling, seed));
    let mut dec = tok.decoder();
    let is_eog = |t: u32| tok.is_eog(t);
    let gen_opts = GenerateOptions {
        max_tokens: a.max_tokens,
        stop: &a.stop,
        is_eog: &is_eog,
    };
    let mut stdout = std::io::stdout().lock();
    if !a.chat {
        let _ = write!(stdout, "{prompt}");
        let _ = stdout.flush();
    }
    let mut emit = |s: &str| {
        let _ = write!(stdout, "{s}");
        let _ = stdout.flush();
    };
    let (_, finish, stats) = session.generate(
        &ids,
        &mut sampler,
        &gen_opts,
        &mut |t| dec.push(t),
        &mut emit,
    )?;
    emit(&dec.finish());
    let _ = writeln!(stdout);
    drop(stdout);
    if a.stats {
        eprint!("{}", stats_table(&stats, &placement, &finish, seed, load_s));
        eprint!("{}", expert_table(&stats, a.store.drive_bandwidth));
    }
    if let Some(p) = &a.stats_json {
        std::fs::write(
            p,
            stats_json(
                &stats,
                &placement,
                &finish,
                seed,
                load_s,
                a.store.drive_bandwidth,
            )
            .to_string(),
        )
        .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// The sampling settings of a run: each flag given on the command line, else the model's
/// setting ([`ModelSampling`]), else Deltafin's default (temperature 0.8, top-k 40, top-p 0.95,
/// min-p 0.05, no repetition penalty: llama.cpp's defaults).
pub fn sampler_config(a: &RunArgs, model: &ModelSampling, seed: u64) -> SamplerConfig {
    let mut c = SamplerConfig {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        repeat_penalty: 1.0,
        repeat_last_n: a.repeat_last_n,
        seed,
    };
    model.apply(&mut c);
    if let Some(t) = a.temperature {
        c.temperature = t;
    }
    if let Some(k) = a.top_k {
        c.top_k = k;
    }
    if let Some(p) = a.top_p {
        c.top_p = p;
    }
    if let Some(p) = a.min_p {
        c.min_p = p;
    }
    if let Some(r) = a.repeat_penalty {
        c.repeat_penalty = r;
    }
    c
}

/// The sampling settings in `dir/generation_config.json`, none when the file is absent.
///
/// Errors: the file exists but is not valid JSON or has a bad field (named).
fn generation_config_sampling(dir: &std::path::Path) -> Result<ModelSampling> {
    let p = dir.join("generation_config.json");
    if !p.is_file() {
        return Ok(ModelSampling::default());
    }
    let v = crate::source::hf::read_json(&p)?;
    ModelSampling::from_generation_config(&v, &p.display().to_string())
}

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
         resident weights     {}, streamed per pass {}, stream buffers {}, KV cache {}, activations {}\n\
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
        mib(p.resident_bytes as f64),
        mib(p.streamed_bytes as f64),
        mib(p.stream_buffer_bytes as f64),
        mib(p.kv_bytes as f64),
        mib(p.scratch_bytes as f64),
        mib(s.peak_rss as f64),
    )
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
        "resident_bytes": p.resident_bytes,
        "streamed_bytes_per_pass": p.streamed_bytes,
        "stream_buffer_bytes": p.stream_buffer_bytes,
        "kv_bytes": p.kv_bytes,
        "scratch_bytes": p.scratch_bytes,
        "seed": seed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct W {
        #[command(flatten)]
        run: RunArgs,
    }

    fn args(extra: &[&str]) -> RunArgs {
        W::parse_from(["deltafin"].iter().chain(extra)).run
    }

    #[test]
    fn flags_beat_the_model_settings_which_beat_the_defaults() {
        let model = ModelSampling {
            temperature: Some(0.6),
            top_k: Some(20),
            repeat_penalty: Some(1.1),
            ..Default::default()
        };
        let c = sampler_config(&args(&[]), &ModelSampling::default(), 3);
        assert_eq!(
            (
                c.temperature,
                c.top_k,
                c.top_p,
                c.min_p,
                c.repeat_penalty,
                c.seed
            ),
            (0.8, 40, 0.95, 0.05, 1.0, 3)
        );
        let c = sampler_config(&args(&[]), &model, 3);
        assert_eq!(
            (c.temperature, c.top_k, c.top_p, c.repeat_penalty),
            (0.6, 20, 0.95, 1.1)
        );
        let c = sampler_config(&args(&["--temp", "0", "--top-k", "5"]), &model, 3);
        assert_eq!((c.temperature, c.top_k, c.repeat_penalty), (0.0, 5, 1.1));
    }

    #[test]
    fn reads_the_fixture_generation_config() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/qwen3");
        let m = generation_config_sampling(&dir).unwrap();
        assert_eq!(
            m,
            ModelSampling {
                temperature: Some(0.6),
                top_k: Some(20),
                top_p: Some(0.95),
                min_p: None,
                repeat_penalty: None,
            }
        );
        let none = generation_config_sampling(std::path::Path::new("/nonexistent")).unwrap();
        assert_eq!(none, ModelSampling::default());
    }
}
