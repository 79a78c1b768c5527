//! `deltafin doctor`: what this machine offers a run (CPU and SIMD level, memory and the
//! largest `--ram-budget`, each drive's kind and random-read bandwidth, the open-file limit,
//! GPUs), and every finding that would slow or stop one, with what to do about it. Exits
//! non-zero when a finding would stop a run.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Result};
use serde::Serialize;
use serde_json::json;

use crate::plan::machine;
use crate::store::drive_probe::{probe_drive, DriveProbe, ProbeOptions};
use crate::store::plan::{parse_size, size_text, Allowance};

/// Arguments of `deltafin doctor`.
#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Drive folders to check and probe (a temporary file is written, read and removed)
    #[arg(long, value_name = "P,...", value_delimiter = ',')]
    pub drives: Vec<PathBuf>,
    /// Size of each drive probe's temporary file
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = parse_size)]
    pub probe_size: u64,
    /// Seconds of random reads per drive probe
    #[arg(long, value_name = "S", default_value_t = 2.0)]
    pub probe_seconds: f64,
    /// Print the facts and findings as one JSON object
    #[arg(long)]
    pub json: bool,
}

/// A finding: `error` (a run would stop) or `warning` (a run would be slower or hold more
/// memory than its budget), what was found and what to do.
#[derive(Clone, Debug, Serialize)]
struct Finding {
    level: &'static str,
    what: String,
    fix: String,
}

/// The smallest soft open-file limit a run works with (a pack opens one file per drive, a
/// split GGUF one per part, the server one per connection), and the one a server wants.
const MIN_OPEN_FILES: u64 = 64;
const GOOD_OPEN_FILES: u64 = 1024;

/// The allowance `doctor` counts against the memory limit: the demo model's (6.2 MiB of
/// tokenizer metadata, 236 tensors); a larger vocabulary or more tensors take more.
fn demo_allowance() -> Allowance {
    Allowance::estimate(6_525_000, 236)
}

/// Runs `deltafin doctor`.
///
/// Errors: a finding of level `error` (after the report is printed); standard output cannot
/// be written.
pub fn run(a: DoctorArgs) -> Result<()> {
    if !(a.probe_seconds > 0.0 && a.probe_seconds <= 60.0) {
        bail!(
            "--probe-seconds {}: expected more than 0 and at most 60",
            a.probe_seconds
        );
    }
    let mut findings: Vec<Finding> = Vec::new();
    let mut add = |level, what: String, fix: &str| {
        findings.push(Finding {
            level,
            what,
            fix: fix.to_string(),
        })
    };
    let cpu = machine::cpu();
    if cpu.simd == "scalar" {
        add(
            "warning",
            "the kernels run without SIMD (no AVX2+FMA+F16C or NEON here)".into(),
            "expect several times slower compute; a CPU with AVX2 or AVX-512 runs the SIMD kernels",
        );
    }
    let mem = machine::memory();
    let al = demo_allowance();
    let largest = mem
        .limit
        .and_then(|l| l.bytes.checked_sub(al.held).filter(|_| l.bytes >= al.peak));
    match (mem.limit, largest) {
        (None, _) => add(
            "warning",
            "no memory limit could be read (/proc/meminfo, cgroup)".into(),
            "give --ram-budget to every run",
        ),
        (Some(l), None) => add(
            "error",
            format!(
                "{} cannot hold the fixed allowance of a model (~{} at its peak)",
                l.describe(),
                size_text(al.peak)
            ),
            "free memory or raise the cgroup's memory limit",
        ),
        _ => {}
    }
    let o = ProbeOptions {
        file_bytes: a.probe_size,
        seconds: a.probe_seconds,
        ..ProbeOptions::default()
    };
    let mut drives = Vec::new();
    for d in &a.drives {
        let dev = machine::device(d);
        let probe: Result<DriveProbe, String> = probe_drive(d, &o).map_err(|e| e.to_string());
        let name = d.display();
        match &probe {
            Err(e) => add(
                "error",
                format!("drive {name}: cannot be probed: {e}"),
                "give an existing folder on the drive, writable by this user, with room for the probe file (--probe-size)",
            ),
            Ok(p) => {
                if !p.direct {
                    add("warning", format!("drive {name}: the file system refuses O_DIRECT"),
                        "expert reads go through the page cache, so --ram-budget no longer bounds memory: use ext4 or xfs");
                }
                if !p.io_uring {
                    add("warning", format!("drive {name}: io_uring is not available"),
                        "reads use the pread thread pool (slower at depth): allow io_uring (Linux 5.6+, not blocked by seccomp or the container)");
                }
            }
        }
        if dev.rotational == Some(true) && !dev.device.as_deref().unwrap_or("").contains("loop") {
            add(
                "warning",
                format!("drive {name}: a rotational disk"),
                "random expert reads are slow on spinning disks: use an SSD, ideally NVMe",
            );
        }
        drives.push((d.clone(), dev, probe));
    }
    let nofile = machine::open_files();
    match nofile {
        Some((soft, _)) if soft < MIN_OPEN_FILES => add(
            "error",
            format!("the open-file limit is {soft}"),
            "raise it (ulimit -n 1024 or more)",
        ),
        Some((soft, _)) if soft < GOOD_OPEN_FILES => add(
            "warning",
            format!("the open-file limit is {soft}"),
            "raise it to 1024 or more for the server (ulimit -n)",
        ),
        _ => {}
    }
    let gpus = machine::gpus();
    let errors = findings.iter().filter(|f| f.level == "error").count();
    if a.json {
        let v = json!({
            "cpu": cpu,
            "memory": {
                "available": mem.available, "cgroup_limit": mem.cgroup,
                "limit": mem.limit.map(|l| l.bytes), "limit_source": mem.limit.map(|l| l.source.to_string()),
                "allowance_held": al.held, "allowance_peak": al.peak,
                "default_ram_budget": mem.limit.map(|l| l.default_budget().min(largest.unwrap_or(0))),
                "largest_ram_budget": largest,
            },
            "drives": drives.iter().map(|(p, d, r)| {
                let mut v = json!({"path": p, "device": d.device, "mount_point": d.mount_point,
                    "file_system": d.file_system, "rotational": d.rotational, "nvme": d.nvme,
                    "free_bytes": d.free_bytes});
                match r {
                    Ok(r) => {
                        v["o_direct"] = r.direct.into();
                        v["io_uring"] = r.io_uring.into();
                        v["engine"] = r.engine.into();
                        v["read_bytes_per_s"] = r.bytes_per_s.into();
                        v["request_bytes"] = r.request_bytes.into();
                        v["depth"] = r.depth.into();
                    }
                    Err(e) => v["error"] = e.clone().into(),
                }
                v
            }).collect::<Vec<_>>(),
            "open_files": nofile.map(|(s, h)| json!({"soft": s, "hard": h})),
            "gpus": gpus.iter().map(|g| json!({"name": g, "used": false})).collect::<Vec<_>>(),
            "findings": findings,
            "ok": errors == 0,
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "cpu:        {} ({} cores); kernels at {} (this CPU runs {}), {} threads",
            cpu.model.as_deref().unwrap_or("?"),
            cpu.cores,
            cpu.simd,
            cpu.simd_available.join(", "),
            cpu.threads
        );
        let opt = |b: Option<u64>| b.map_or("unknown".to_string(), size_text);
        let _ = writeln!(
            o,
            "memory:     MemAvailable {}, cgroup limit {}; the largest --ram-budget that fits: {} (a model's allowance ~{} beside it)",
            opt(mem.available),
            mem.cgroup.map_or("none".to_string(), size_text),
            opt(largest),
            size_text(al.held)
        );
        for (p, d, r) in &drives {
            let _ = write!(
                o,
                "drive:      {}: {} ({}, {}{}), {} free",
                p.display(),
                d.device.as_deref().unwrap_or("?"),
                d.file_system.as_deref().unwrap_or("?"),
                if d.nvme {
                    "NVMe"
                } else {
                    match d.rotational {
                        Some(true) => "rotational",
                        Some(false) => "solid state",
                        None => "kind unknown",
                    }
                },
                d.mount_point
                    .as_deref()
                    .map_or(String::new(), |m| format!(", mounted at {m}")),
                opt(d.free_bytes)
            );
            match r {
                Ok(r) => {
                    let _ = writeln!(
                        o,
                        "; random reads of {} at depth {}: {}/s through {}{}",
                        size_text(r.request_bytes as u64),
                        r.depth,
                        size_text(r.bytes_per_s as u64),
                        r.engine,
                        if r.direct { ", O_DIRECT" } else { ", buffered" }
                    );
                }
                Err(e) => {
                    let _ = writeln!(o, "; not probed: {e}");
                }
            }
        }
        let _ = writeln!(
            o,
            "open files: {}",
            nofile.map_or("unknown".into(), |(s, h)| format!("{s} (hard limit {h})"))
        );
        let _ = writeln!(
            o,
            "gpu:        {}",
            match gpus.is_empty() {
                true => "none found (Deltafin computes on the CPU)".to_string(),
                false => format!(
                    "{} (not used: Deltafin computes on the CPU)",
                    gpus.join(", ")
                ),
            }
        );
        if findings.is_empty() {
            let _ = writeln!(o, "findings:   none");
        }
        for f in &findings {
            let _ = writeln!(o, "{}: {}; {}", f.level, f.what, f.fix);
        }
        out!("{o}");
    }
    if errors > 0 {
        bail!("doctor found {errors} problem(s) that would stop a run");
    }
    Ok(())
}
