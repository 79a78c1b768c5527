//! `deltafin bench`'s outputs: the per-scenario metrics of each run, their min/median/max
//! over `--repetitions`, the table in three forms (`--output table|md|csv`) and the SVG plot
//! (`--plot`).

use std::path::Path;

use anyhow::{anyhow, Result};

/// One run's metrics, in the order of the table's columns; `None` where a metric does not
/// apply (prefetch recall without prefetch, the physical limit of a prefill).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    /// Tokens/s: decode tokens after the first for a decode, prompt tokens for a prefill.
    pub tok_s: f64,
    /// Seconds to the first token.
    pub ttft_s: f64,
    /// MiB read from disk per token (everything streamed).
    pub mib_per_token: f64,
    /// The part of it that is not routed experts: streamed spine, dense layers, LM head.
    pub dense_mib_per_token: f64,
    /// The part of it read by the expert store.
    pub expert_mib_per_token: f64,
    /// Expert cache hit rate, percent (0 without an expert store).
    pub hit_pct: f64,
    /// Prefetch recall, percent (with prefetch or read-ahead).
    pub prefetch_recall_pct: Option<f64>,
    /// Bytes read from disk over the phase's seconds, MB/s (10^6 bytes).
    pub read_mb_s: f64,
    /// Seconds compute waited for reads over the run's seconds, percent.
    pub io_wait_pct: f64,
    /// Decode tok/s over the physical limit, percent (at most 100).
    pub limit_pct: Option<f64>,
}

/// Column names: the CSV header and the JSON keys of [`Metrics`].
pub const KEYS: [&str; 10] = [
    "tok_s",
    "ttft_s",
    "mib_per_token",
    "dense_mib_per_token",
    "expert_mib_per_token",
    "hit_pct",
    "prefetch_recall_pct",
    "read_mb_s",
    "io_wait_pct",
    "limit_pct",
];

/// Column titles of the text and Markdown tables, in [`KEYS`] order.
const TITLES: [&str; 10] = [
    "tok/s",
    "TTFT s",
    "MiB/tok",
    "dense MiB/tok",
    "expert MiB/tok",
    "hit %",
    "pf %",
    "read MB/s",
    "wait %",
    "limit %",
];

/// Decimals shown per column, in [`KEYS`] order.
const DECIMALS: [usize; 10] = [2, 3, 1, 1, 1, 1, 1, 1, 0, 0];

impl Metrics {
    /// The values in [`KEYS`] order.
    pub fn values(&self) -> [Option<f64>; 10] {
        [
            Some(self.tok_s),
            Some(self.ttft_s),
            Some(self.mib_per_token),
            Some(self.dense_mib_per_token),
            Some(self.expert_mib_per_token),
            Some(self.hit_pct),
            self.prefetch_recall_pct,
            Some(self.read_mb_s),
            Some(self.io_wait_pct),
            self.limit_pct,
        ]
    }

    /// The metrics as a JSON object keyed by [`KEYS`].
    pub fn json(&self) -> serde_json::Value {
        KEYS.iter()
            .zip(self.values())
            .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

/// One scenario's runs and what its table rows say about the weights read.
#[derive(Clone, Debug)]
pub struct ScenarioRuns {
    pub name: String,
    /// What was streamed: `experts: ENGINE`, `dense: PLACEMENT`, or `all resident`.
    pub weights: String,
    pub runs: Vec<Metrics>,
}

/// Min, median (the mean of the middle two for an even count) and max of each metric over
/// `runs`, in [`KEYS`] order; `None` where a run lacks the metric.
pub fn spread(runs: &[Metrics]) -> [Option<(f64, f64, f64)>; 10] {
    std::array::from_fn(|i| {
        let mut v: Vec<f64> = runs.iter().map(|m| m.values()[i]).collect::<Option<_>>()?;
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let med = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some((v[0], med, v[n - 1]))
    })
}

/// The JSON of a scenario's spread: `{KEY: {"min", "median", "max"}}`.
pub fn spread_json(runs: &[Metrics]) -> serde_json::Value {
    KEYS.iter()
        .zip(spread(runs))
        .map(|(k, s)| {
            let v = s.map(|(lo, med, hi)| serde_json::json!({"min": lo, "median": med, "max": hi}));
            (k.to_string(), v.unwrap_or(serde_json::Value::Null))
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The medians of a scenario's runs as a JSON object keyed by [`KEYS`].
pub fn median_json(runs: &[Metrics]) -> serde_json::Value {
    KEYS.iter()
        .zip(spread(runs))
        .map(|(k, s)| (k.to_string(), serde_json::json!(s.map(|x| x.1))))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// A table format of `--output` (JSON is written whole by the caller).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns for a terminal.
    Table,
    /// A Markdown table.
    Md,
    /// Comma-separated values with a header line.
    Csv,
    /// The `--json` object.
    Json,
}

/// The rows of the table: one per scenario, or with more than one run per scenario three
/// (`min`, `median`, `max`, in a `stat` column).
fn rows(s: &[ScenarioRuns]) -> Vec<(String, Option<&'static str>, Vec<String>, String)> {
    let many = s.iter().any(|r| r.runs.len() > 1);
    let mut out = Vec::new();
    for r in s {
        let sp = spread(&r.runs);
        let stats: &[(&str, usize)] = match many {
            true => &[("min", 0), ("median", 1), ("max", 2)],
            false => &[("median", 1)],
        };
        for &(stat, k) in stats {
            let cells = sp
                .iter()
                .zip(DECIMALS)
                .map(|(v, d)| match v {
                    Some(t) => format!("{:.d$}", [t.0, t.1, t.2][k]),
                    None => "-".to_string(),
                })
                .collect();
            out.push((
                r.name.clone(),
                many.then_some(stat),
                cells,
                r.weights.clone(),
            ));
        }
    }
    out
}

/// The table of `scenarios` in `format` (`Table`, `Md` or `Csv`; `Json` gives the table too).
pub fn table(scenarios: &[ScenarioRuns], format: Output) -> String {
    let rows = rows(scenarios);
    let many = rows.iter().any(|r| r.1.is_some());
    let mut out = String::new();
    match format {
        Output::Csv => {
            let mut h = vec!["scenario"];
            if many {
                h.push("stat");
            }
            h.extend(KEYS);
            h.push("weights");
            out += &(h.join(",") + "\n");
            for (name, stat, cells, w) in &rows {
                let mut c = vec![name.clone()];
                c.extend(stat.map(str::to_string));
                c.extend(
                    cells
                        .iter()
                        .map(|x| if x == "-" { String::new() } else { x.clone() }),
                );
                c.push(format!("\"{}\"", w.replace('"', "\"\"")));
                out += &(c.join(",") + "\n");
            }
        }
        Output::Md => {
            let mut h = vec!["scenario"];
            if many {
                h.push("stat");
            }
            h.extend(TITLES);
            h.push("weights");
            out += &format!("| {} |\n", h.join(" | "));
            let align: Vec<&str> = h
                .iter()
                .map(|t| match *t {
                    "scenario" | "stat" | "weights" => "---",
                    _ => "---:",
                })
                .collect();
            out += &format!("| {} |\n", align.join(" | "));
            for (name, stat, cells, w) in &rows {
                let mut c = vec![name.clone()];
                c.extend(stat.map(str::to_string));
                c.extend(cells.iter().cloned());
                c.push(w.replace('|', "\\|"));
                out += &format!("| {} |\n", c.join(" | "));
            }
        }
        Output::Table | Output::Json => {
            let mut line = |name: &str, stat: Option<&str>, cells: &[String], w: &str| {
                out += &format!("{name:12} ");
                if many {
                    out += &format!("{:6} ", stat.unwrap_or(""));
                }
                for (c, t) in cells.iter().zip(TITLES) {
                    out += &format!("{c:>w$} ", w = t.len().max(6));
                }
                out += &format!(" {w}\n");
            };
            let titles: Vec<String> = TITLES.iter().map(|t| t.to_string()).collect();
            line("scenario", Some("stat"), &titles, "weights");
            for (name, stat, cells, w) in &rows {
                line(name, *stat, cells, w);
            }
        }
    }
    out
}

/// Draws the medians of tok/s and MiB read per token per scenario as two bar charts, with
/// each bar's min-max range as a line when there were several runs, into the SVG file
/// `path`.
///
/// Errors: the file cannot be written.
pub fn plot(scenarios: &[ScenarioRuns], path: &Path) -> Result<()> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());
    let root = SVGBackend::new(path, (1100, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (left, right) = root.split_horizontally(550);
    let names: Vec<String> = scenarios.iter().map(|s| s.name.clone()).collect();
    let n = scenarios.len().max(1);
    let panels = [
        (left, "tokens/s (decode; prompt for prefill)", 0usize, BLUE),
        (right, "MiB read from disk per token", 2usize, RED),
    ];
    for (area, title, key, color) in panels {
        let sp: Vec<(f64, f64, f64)> = scenarios
            .iter()
            .map(|s| spread(&s.runs)[key].unwrap_or_default())
            .collect();
        let top = sp.iter().map(|x| x.2).fold(0.0, f64::max).max(1e-9) * 1.15;
        let mut c = ChartBuilder::on(&area)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d((0..n).into_segmented(), 0f64..top)
            .map_err(|e| err(&e))?;
        c.configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .x_label_formatter(&|x| match x {
                SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .draw()
            .map_err(|e| err(&e))?;
        c.draw_series(sp.iter().enumerate().map(|(i, x)| {
            let mut r = Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), x.1),
                ],
                color.mix(0.7).filled(),
            );
            r.set_margin(0, 0, 12, 12);
            r
        }))
        .map_err(|e| err(&e))?;
        c.draw_series(
            sp.iter()
                .enumerate()
                .filter(|(_, x)| x.2 > x.0)
                .map(|(i, x)| {
                    PathElement::new(
                        vec![
                            (SegmentValue::CenterOf(i), x.0),
                            (SegmentValue::CenterOf(i), x.2),
                        ],
                        BLACK.stroke_width(2),
                    )
                }),
        )
        .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(tok_s: f64, pf: Option<f64>) -> Metrics {
        Metrics {
            tok_s,
            ttft_s: 0.5,
            mib_per_token: 2.0,
            dense_mib_per_token: 1.5,
            expert_mib_per_token: 0.5,
            hit_pct: 50.0,
            prefetch_recall_pct: pf,
            read_mb_s: 100.0,
            io_wait_pct: 20.0,
            limit_pct: None,
        }
    }

    #[test]
    fn spread_is_min_median_max_and_none_where_a_run_lacks_the_metric() {
        let runs = [m(3.0, Some(1.0)), m(1.0, Some(2.0)), m(2.0, None)];
        let s = spread(&runs);
        assert_eq!(s[0], Some((1.0, 2.0, 3.0)));
        assert_eq!(s[6], None);
        assert_eq!(s[9], None);
        assert_eq!(spread(&runs[..2])[0], Some((1.0, 2.0, 3.0)));
        assert_eq!(spread(&runs[..2])[6], Some((1.0, 1.5, 2.0)));
        let j = spread_json(&runs);
        assert_eq!(
            j["tok_s"],
            serde_json::json!({"min": 1.0, "median": 2.0, "max": 3.0})
        );
        assert_eq!(j["limit_pct"], serde_json::Value::Null);
        assert_eq!(median_json(&runs)["tok_s"], 2.0);
    }

    #[test]
    fn tables_have_a_stat_column_only_with_repetitions() {
        let one = [ScenarioRuns {
            name: "cold-decode".into(),
            weights: "dense: x, y".into(),
            runs: vec![m(2.0, None)],
        }];
        assert_eq!(
            table(&one, Output::Csv),
            "scenario,tok_s,ttft_s,mib_per_token,dense_mib_per_token,expert_mib_per_token,hit_pct,prefetch_recall_pct,read_mb_s,io_wait_pct,limit_pct,weights\n\
             cold-decode,2.00,0.500,2.0,1.5,0.5,50.0,,100.0,20,,\"dense: x, y\"\n"
        );
        let three = [ScenarioRuns {
            runs: vec![m(2.0, None), m(4.0, None), m(3.0, None)],
            ..one[0].clone()
        }];
        let md = table(&three, Output::Md);
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines[0], "| scenario | stat | tok/s | TTFT s | MiB/tok | dense MiB/tok | expert MiB/tok | hit % | pf % | read MB/s | wait % | limit % | weights |");
        assert_eq!(lines[1], "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
        assert_eq!(lines[2], "| cold-decode | min | 2.00 | 0.500 | 2.0 | 1.5 | 0.5 | 50.0 | - | 100.0 | 20 | - | dense: x, y |");
        assert_eq!(lines[3].split(" | ").nth(2), Some("3.00"));
        assert_eq!(lines[4].split(" | ").nth(2), Some("4.00"));
        assert_eq!(lines.len(), 5);
    }

    #[test]
    fn the_plot_names_every_scenario() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("b.svg");
        let s = ["cold-decode", "prefill"].map(|n| ScenarioRuns {
            name: n.into(),
            weights: String::new(),
            runs: vec![m(2.0, None), m(3.0, None)],
        });
        plot(&s, &p).unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
        assert!(
            svg.contains("\ncold-decode\n</text>") && svg.contains("\nprefill\n</text>"),
            "{svg}"
        );
        assert!(svg.contains("MiB read from disk per token"), "{svg}");
    }
}
