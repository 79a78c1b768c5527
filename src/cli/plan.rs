//! `deltafin plan`: before buying drives or downloading a model, where its weights would go
//! under a RAM budget and how fast it would decode on 1..N drives (`crate::plan`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use serde_json::json;

use super::store_args::StoreArgs;
use crate::load::open_any;
use crate::plan::predict::{self, ModelShape, Plan, PlanInputs, Rates, Routing};
use crate::plan::{compute, shape};
use crate::store::drive_probe::{probe_drive, ProbeOptions};
use crate::store::heat::Heat;
use crate::store::plan::{parse_size, size_text, LimitSource, MemoryLimit};

/// Arguments of `deltafin plan`.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// Model: GGUF file, model folder, pack, ORG/NAME, or a synth preset name (kimi-k3, ...)
    #[arg(short, long, value_name = "MODEL|PRESET")]
    pub model: String,
    /// Memory to plan for [default: this machine's limit, MemAvailable or cgroup]
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub ram: Option<u64>,
    /// RAM budget [default: as run computes it from the memory]
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub ram_budget: Option<u64>,
    /// Context the KV cache holds, in tokens
    #[arg(short = 'c', long, value_name = "N", default_value_t = 4096)]
    pub ctx_size: u64,
    /// Drive folders to probe (random reads of a temporary file), one ladder rung each
    #[arg(
        long,
        value_name = "P,...",
        value_delimiter = ',',
        conflicts_with = "drive_bandwidth"
    )]
    pub drives: Vec<PathBuf>,
    /// Drive read bandwidths per second instead of probing, e.g. 3G,3G
    #[arg(long, value_name = "B,...", value_delimiter = ',', value_parser = parse_size)]
    pub drive_bandwidth: Vec<u64>,
    /// Prompt lengths for the time to first token
    #[arg(
        long,
        value_name = "N,...",
        value_delimiter = ',',
        default_value = "128,1024"
    )]
    pub prompt_tokens: Vec<u64>,
    /// Expected expert cache hit rate, 0 to 1 [default: from the heat file, else uniform routing]
    #[arg(long, value_name = "F")]
    pub hit_rate: Option<f64>,
    /// Expert use counts for the hit rate, none: uniform [default: the model's heat file]
    #[arg(long, value_name = "FILE")]
    pub heat_file: Option<String>,
    /// Hit rate over N tokens decoded after a 1-pass prompt from an empty cache (bench's cold-decode) [default: steady state]
    #[arg(long, value_name = "N")]
    pub decode_tokens: Option<u64>,
    /// Weight bytes per second a decode step multiplies, instead of measuring
    #[arg(long, value_name = "B", value_parser = parse_size)]
    pub compute_rate: Option<u64>,
    /// Weight bytes × rows per second of a prompt batch, instead of measuring
    #[arg(long, value_name = "B", value_parser = parse_size)]
    pub prefill_rate: Option<u64>,
    /// Worker threads of the compute measurement [default: all cores]
    #[arg(short = 't', long, value_name = "N")]
    pub threads: Option<usize>,
    /// Size of each drive probe's temporary file
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = parse_size)]
    pub probe_size: u64,
    /// Seconds of random reads per drive probe
    #[arg(long, value_name = "S", default_value_t = 2.0)]
    pub probe_seconds: f64,
    /// Print the plan as one JSON object
    #[arg(long)]
    pub json: bool,
    /// Draw the drive ladder (decode tok/s, time to first token) into an SVG file
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// Seconds each compute rate is measured for.
const RATE_SECONDS: f64 = 0.5;

/// One drive of the ladder: its folder (when probed) and bandwidth.
struct Drive {
    path: Option<PathBuf>,
    bytes_per_s: f64,
    direct: Option<bool>,
}

/// The model's shape, the spine and expert encodings, and the file it lives in (none for a
/// preset).
fn read_shape(model: &str) -> Result<(ModelShape, [crate::quant::GgmlType; 2], Option<PathBuf>)> {
    if !Path::new(model).exists() {
        if let Some((s, t)) = shape::of_preset(model)? {
            return Ok((s, t, None));
        }
    }
    let no_preset = |e: anyhow::Error| match Path::new(model).exists() {
        true => e,
        false => anyhow!(
            "{e}; and no synth preset is named {model} (`deltafin synth --preset list` lists them)"
        ),
    };
    let path = super::model_path(Some(Path::new(model))).map_err(no_preset)?;
    let m = open_any(path.as_deref()).map_err(no_preset)?;
    let (s, t) = shape::of_model(&m, model)?;
    Ok((s, t, path))
}

/// Checks the flags that the arithmetic cannot.
fn check(a: &PlanArgs) -> Result<()> {
    if let Some(h) = a.hit_rate {
        if !(0.0..=1.0).contains(&h) {
            bail!("--hit-rate {h}: expected a fraction from 0 to 1");
        }
    }
    if a.prompt_tokens.contains(&0) {
        bail!("--prompt-tokens 0: a prompt has at least 1 token");
    }
    if a.drive_bandwidth.contains(&0) {
        bail!("--drive-bandwidth 0: a drive reads more than 0 bytes per second");
    }
    for (f, v) in [
        ("--compute-rate", a.compute_rate),
        ("--prefill-rate", a.prefill_rate),
    ] {
        if v == Some(0) {
            bail!("{f} 0: expected more than 0 bytes per second");
        }
    }
    if a.ctx_size == 0 {
        bail!("-c 0: the context holds at least 1 token");
    }
    Ok(())
}

/// Runs `deltafin plan`.
///
/// Errors: bad flags (each named); the model cannot be opened and is no preset; a drive that
/// cannot be probed; a budget that does not fit ([`predict::plan`]); the plot cannot be written.
pub fn run(a: PlanArgs) -> Result<()> {
    check(&a)?;
    super::init_threads(a.threads);
    let (shape, types, path) = read_shape(&a.model)?;
    let drives: Vec<Drive> = if !a.drive_bandwidth.is_empty() {
        a.drive_bandwidth
            .iter()
            .map(|&b| Drive {
                path: None,
                bytes_per_s: b as f64,
                direct: None,
            })
            .collect()
    } else {
        let dirs: Vec<PathBuf> = match (&path, a.drives.is_empty()) {
            (_, false) => a.drives.clone(),
            (Some(p), true) => {
                let d = if p.is_dir() {
                    p.clone()
                } else {
                    p.parent().map_or(".".into(), |d| d.to_path_buf())
                };
                vec![if d.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    d
                }]
            }
            // a preset is on no drive yet: the drive of the current folder, where it would be
            // downloaded or packed (--drives or --drive-bandwidth plan others)
            (None, true) => vec![PathBuf::from(".")],
        };
        let o = ProbeOptions {
            file_bytes: a.probe_size,
            seconds: a.probe_seconds,
            ..ProbeOptions::default()
        };
        let mut out = Vec::new();
        for d in dirs {
            let p =
                probe_drive(&d, &o).map_err(|e| anyhow!("probing drive {}: {e}", d.display()))?;
            out.push(Drive {
                path: Some(d),
                bytes_per_s: p.bytes_per_s,
                direct: Some(p.direct),
            });
        }
        out
    };
    let measured = a.compute_rate.is_none() || a.prefill_rate.is_none();
    let m = match measured {
        true => Some(compute::measure(types[0], types[1], RATE_SECONDS)),
        false => None,
    };
    let rates = Rates {
        spine: a
            .compute_rate
            .map_or_else(|| m.unwrap().spine, |r| r as f64),
        expert: a
            .compute_rate
            .map_or_else(|| m.unwrap().expert, |r| r as f64),
        prefill: a
            .prefill_rate
            .map_or_else(|| m.unwrap().prefill, |r| r as f64),
    };
    let routing = match (a.hit_rate, a.heat_file.as_deref()) {
        (Some(h), _) => Routing::HitRate(h),
        (None, flag) => {
            let heat = StoreArgs::heat_path_for(flag, path.as_deref())
                .map(|p| Heat::load(&p, shape.layers, shape.experts));
            match heat {
                Some(h) if h.counts.iter().flatten().any(|&c| c > 0) => Routing::Heat(h.counts),
                _ => Routing::Uniform,
            }
        }
    };
    let limit = match a.ram {
        Some(b) => Some(MemoryLimit {
            bytes: b,
            source: LimitSource::Given,
        }),
        None => MemoryLimit::of_this_process(),
    };
    let inp = PlanInputs {
        limit,
        ram_budget: a.ram_budget,
        ctx: a.ctx_size,
        drives: drives.iter().map(|d| d.bytes_per_s).collect(),
        rates,
        routing,
        prompt_tokens: a.prompt_tokens.clone(),
        decode_tokens: a.decode_tokens,
    };
    let p = predict::plan(&shape, &inp).map_err(|e| anyhow!(e))?;
    if let Some(f) = &a.plot {
        plot(&p, f)?;
    }
    let limit_text = match (a.ram, limit) {
        (Some(b), _) => format!("{} (--ram)", size_text(b)),
        (None, Some(l)) => format!("{} ({})", size_text(l.bytes), l.source),
        (None, None) => "unknown".into(),
    };
    if a.json {
        let v = json!({
            "model": shape,
            "memory": {"limit": limit.map(|l| l.bytes), "limit_text": limit_text,
                       "allowance_held": shape.allowance.held, "allowance_peak": shape.allowance.peak},
            "compute": {"spine_bytes_per_s": rates.spine, "expert_bytes_per_s": rates.expert,
                        "prefill_bytes_per_s": rates.prefill, "measured": measured,
                        "threads": rayon::current_num_threads()},
            "drives": drives.iter().map(|d| json!({"path": d.path, "bytes_per_s": d.bytes_per_s,
                        "o_direct": d.direct})).collect::<Vec<_>>(),
            "placement": p.placement,
            "hit_rate": p.hit_rate,
            "hit_rate_source": p.hit_rate_source,
            "ladder": p.ladder,
            "add_first": p.add_first,
            "recommend": p.recommend,
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        out!(
            "{}",
            text(&shape, &p, &rates, measured, &drives, &limit_text)
        );
    }
    Ok(())
}

/// A budget as a `--ram-budget` value: whole MiB from 1 GiB up, else whole KiB (rounded down).
fn budget_flag(b: u64) -> String {
    match b >= 1 << 30 {
        true => format!("{}M", b >> 20),
        false => format!("{}K", b >> 10),
    }
}

fn rate_text(b: f64) -> String {
    format!("{}/s", size_text(b as u64))
}

/// Seconds as `850 ms` or `12.3 s`.
fn secs(s: f64) -> String {
    match s < 1.0 {
        true => format!("{:.0} ms", s * 1000.0),
        false => format!("{s:.1} s"),
    }
}

/// The plan as text.
fn text(
    s: &ModelShape,
    p: &Plan,
    r: &Rates,
    measured: bool,
    drives: &[Drive],
    limit: &str,
) -> String {
    let mut o = String::new();
    let pl = &p.placement;
    let _ = writeln!(
        o,
        "model:      {} ({}, {}): {} layers, {} MoE layers of {} experts of {} (top-{}, {} read(s) each)",
        s.name,
        s.architecture,
        s.source,
        s.layers,
        s.moe_layers,
        s.experts,
        size_text(s.expert_bytes),
        s.experts_per_token,
        s.reads_per_expert
    );
    let _ = writeln!(
        o,
        "bytes:      spine {}, experts {}, in all {}; KV cache {} per token{}",
        size_text(s.spine_bytes),
        size_text(s.all_expert_bytes()),
        size_text(s.weight_bytes()),
        size_text(s.kv_bytes_per_token),
        match s.state_bytes {
            0 => String::new(),
            b => format!(", recurrent state {}", size_text(b)),
        }
    );
    let _ = writeln!(
        o,
        "memory:     {limit}; --ram-budget {} (hot fraction {:.3} of the weights)",
        size_text(pl.budget),
        pl.hot_fraction
    );
    let spine = match (pl.all_resident, pl.streamed_spine_bytes) {
        (true, _) => "every weight resident, nothing read after loading".to_string(),
        (false, 0) => "spine resident".to_string(),
        (false, b) => format!(
            "spine {} resident, {} streamed every token",
            size_text(pl.resident_spine_bytes),
            size_text(b)
        ),
    };
    let _ = writeln!(
        o,
        "placement:  {spine}; KV cache {}, I/O buffers {}, stream buffers {}; expert cache {} ({} experts, {:.1}% of them)",
        size_text(pl.kv_bytes),
        size_text(pl.io_buffer_bytes),
        size_text(pl.stream_buffer_bytes),
        size_text(pl.cache_bytes),
        pl.cache_experts,
        pl.cached_expert_share * 100.0
    );
    let _ = writeln!(o, "hit rate:   {:.3} ({})", p.hit_rate, p.hit_rate_source);
    let _ = writeln!(
        o,
        "compute:    spine {}, experts {}, prompt batches {} ({})",
        rate_text(r.spine),
        rate_text(r.expert),
        rate_text(r.prefill),
        if measured { "measured" } else { "given" }
    );
    for (i, d) in drives.iter().enumerate() {
        let _ = writeln!(
            o,
            "drive {}:    {}{}",
            i + 1,
            rate_text(d.bytes_per_s),
            match (&d.path, d.direct) {
                (Some(p), Some(false)) => format!(" ({}, buffered: O_DIRECT refused)", p.display()),
                (Some(p), _) => format!(" ({}, measured)", p.display()),
                _ => " (given)".into(),
            }
        );
    }
    let _ = write!(o, "\n| drives | read/s | decode tok/s | bound |");
    let prompts: Vec<u64> = p
        .ladder
        .first()
        .map(|r| r.ttft.iter().map(|t| t.prompt_tokens).collect())
        .unwrap_or_default();
    for n in &prompts {
        let _ = write!(o, " TTFT {n} |");
    }
    let _ = write!(o, "\n| ---: | ---: | ---: | --- |");
    for _ in &prompts {
        let _ = write!(o, " ---: |");
    }
    o.push('\n');
    for r in &p.ladder {
        let _ = write!(
            o,
            "| {} | {} | {:.3} | {} |",
            r.drives,
            rate_text(r.bandwidth),
            r.decode_tok_s,
            r.bound
        );
        for t in &r.ttft {
            let _ = write!(o, " {} ({}) |", secs(t.ttft_s), t.bound);
        }
        o.push('\n');
    }
    let af = &p.add_first;
    let _ = writeln!(
        o,
        "\nadd first:  {} (decode tok/s with one more drive {:.3}, twice the RAM {:.3}, twice the compute {:.3})",
        af.resource, af.one_more_drive_tok_s, af.double_ram_tok_s, af.double_compute_tok_s
    );
    let rc = &p.recommend;
    let _ = writeln!(
        o,
        "recommend:  run with --ram-budget {}{}; pack: {}{} ({})",
        budget_flag(rc.ram_budget),
        rc.ctx_size.map_or(String::new(), |c| format!(" -c {c}")),
        if rc.pack { "yes" } else { "no" },
        match (rc.pack, rc.placement) {
            (true, Some(pl)) => format!(", `deltafin pack --placement {pl}`"),
            _ => String::new(),
        },
        rc.pack_reason
    );
    o
}

/// Draws the ladder: decode tok/s per drive count, and the time to first token of each prompt
/// length, into the SVG file `path`.
///
/// Errors: the file cannot be written.
fn plot(p: &Plan, path: &Path) -> Result<()> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());
    let root = SVGBackend::new(path, (1100, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (left, right) = root.split_horizontally(550);
    let n = p.ladder.len();
    let tok: Vec<f64> = p.ladder.iter().map(|r| r.decode_tok_s).collect();
    let top = tok.iter().copied().fold(0.0, f64::max).max(1e-9) * 1.15;
    let mut c = ChartBuilder::on(&left)
        .caption("predicted decode tokens/s", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d((1..n + 1).into_segmented(), 0f64..top)
        .map_err(|e| err(&e))?;
    c.configure_mesh()
        .disable_x_mesh()
        .x_desc("drives")
        .draw()
        .map_err(|e| err(&e))?;
    c.draw_series(tok.iter().enumerate().map(|(i, &v)| {
        let mut r = Rectangle::new(
            [
                (SegmentValue::Exact(i + 1), 0.0),
                (SegmentValue::Exact(i + 2), v),
            ],
            BLUE.mix(0.7).filled(),
        );
        r.set_margin(0, 0, 12, 12);
        r
    }))
    .map_err(|e| err(&e))?;
    let ttft_top = p
        .ladder
        .iter()
        .flat_map(|r| r.ttft.iter().map(|t| t.ttft_s))
        .fold(0.0, f64::max)
        .max(1e-9)
        * 1.15;
    let mut c = ChartBuilder::on(&right)
        .caption("predicted time to first token, s", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(1f64..n.max(2) as f64, 0f64..ttft_top)
        .map_err(|e| err(&e))?;
    c.configure_mesh()
        .x_desc("drives")
        .draw()
        .map_err(|e| err(&e))?;
    let prompts = p.ladder.first().map_or(0, |r| r.ttft.len());
    for j in 0..prompts {
        let color = Palette99::pick(j).to_rgba();
        let pts: Vec<(f64, f64)> = p
            .ladder
            .iter()
            .map(|r| (r.drives as f64, r.ttft[j].ttft_s))
            .collect();
        let label = format!("{} prompt tokens", p.ladder[0].ttft[j].prompt_tokens);
        c.draw_series(std::iter::once(PathElement::new(
            pts,
            color.stroke_width(2),
        )))
        .map_err(|e| err(&e))?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
    }
    c.configure_series_labels()
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
