//! Choosing which weight units stay resident under a RAM budget.

/// One candidate for residency: `bytes` of RAM it would hold; it may cover several units.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    pub bytes: usize,
}

/// Picks resident candidates greedily in the given order (callers order them by preference),
/// taking each one that still fits in `available` bytes. Every byte kept resident saves one byte
/// of disk reads per forward pass, whatever the unit, so filling the budget is what counts.
/// Returns one flag per candidate and the bytes used.
pub fn choose_resident(cands: &[Candidate], available: usize) -> (Vec<bool>, usize) {
    let mut left = available;
    let flags = cands
        .iter()
        .map(|c| {
            let fits = c.bytes <= left;
            if fits {
                left -= c.bytes;
            }
            fits
        })
        .collect();
    (flags, available - left)
}

/// Share of the usable memory [`MemoryLimit::default_budget`] takes.
pub const DEFAULT_BUDGET_SHARE: f64 = 0.9;

/// Bytes [`MemoryLimit::default_budget`] leaves outside the budget besides the share: what the
/// process holds beyond its budget (tokenizer, model header, allocator; ~170 MiB peak measured
/// with the demo model at `--ram-budget 64M`, BENCHMARKS.md).
pub const DEFAULT_BUDGET_RESERVE: u64 = 256 << 20;

/// Where the memory limit of this process comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitSource {
    /// The cgroup's `memory.max` (v2) or `memory.limit_in_bytes` (v1).
    Cgroup,
    /// The kernel's `MemAvailable` (`/proc/meminfo`).
    MemAvailable,
    /// Given by the user (`deltafin plan --ram`), for a machine other than this one.
    Given,
}

impl std::fmt::Display for LimitSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LimitSource::Cgroup => "cgroup",
            LimitSource::MemAvailable => "MemAvailable",
            LimitSource::Given => "--ram",
        })
    }
}

/// The memory this process may use: the smaller of `MemAvailable` and its cgroup's limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryLimit {
    /// Bytes.
    pub bytes: u64,
    /// Which of the two it is.
    pub source: LimitSource,
}

/// `bytes` for messages: in bytes below 1 KiB, else with one decimal: in KiB below 1 MiB, in MiB below 1 GiB, else in
/// GiB (`500.0 KiB`, `64.0 MiB`, `1.5 GiB`). Every size in a budget or placement message is
/// written with it.
pub fn size_text(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        1 => "1 byte".to_string(),
        b0 if b0 < 1 << 10 => format!("{bytes} bytes"),
        b0 if b0 < 1 << 20 => format!("{:.1} KiB", b / 1024.0),
        b0 if b0 < 1 << 30 => format!("{:.1} MiB", b / 1048576.0),
        _ => format!("{:.1} GiB", b / 1073741824.0),
    }
}

impl MemoryLimit {
    /// The limit of this process, from `/proc/meminfo`, `/proc/self/cgroup` and the cgroup's
    /// limit file; `None` when neither can be read.
    pub fn of_this_process() -> Option<Self> {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        Self::from_texts(
            read("/proc/meminfo").as_deref(),
            read("/proc/self/cgroup").as_deref(),
            read,
        )
    }

    /// The limit from the texts of `/proc/meminfo` and `/proc/self/cgroup` (either may be
    /// absent), reading cgroup limit files through `read` (so tests inject any limit); the
    /// cgroup's limit wins a tie. `None` when neither gives one.
    pub fn from_texts(
        meminfo: Option<&str>,
        proc_cgroup: Option<&str>,
        read: impl Fn(&str) -> Option<String>,
    ) -> Option<Self> {
        let avail = meminfo.and_then(mem_available);
        let cgroup = proc_cgroup.and_then(|t| cgroup_limit(t, read));
        match (cgroup, avail) {
            (Some(c), Some(a)) if a < c => Some(Self::available(a)),
            (Some(c), _) => Some(Self {
                bytes: c,
                source: LimitSource::Cgroup,
            }),
            (None, a) => a.map(Self::available),
        }
    }

    fn available(bytes: u64) -> Self {
        Self {
            bytes,
            source: LimitSource::MemAvailable,
        }
    }

    /// The RAM budget used when none is given, in bytes: [`DEFAULT_BUDGET_SHARE`] of the
    /// limit less [`DEFAULT_BUDGET_RESERVE`], but at least half the limit, so that a small
    /// limit (a 256 MiB cgroup: 128 MiB) still leaves the budget most of what it can hold
    /// beside the process's own memory. A model that fits is then loaded whole; one that does
    /// not is streamed instead of running the machine out of memory.
    pub fn default_budget(&self) -> u64 {
        let share = (self.bytes as f64 * DEFAULT_BUDGET_SHARE) as u64;
        share
            .saturating_sub(DEFAULT_BUDGET_RESERVE)
            .max(self.bytes / 2)
    }

    /// The limit in words for messages, e.g. `the memory limit of 256.0 MiB (cgroup)`.
    pub fn describe(&self) -> String {
        format!(
            "the memory limit of {} ({})",
            size_text(self.bytes),
            self.source
        )
    }
}

/// The RAM budget used when none is given ([`MemoryLimit::default_budget`] of this process's
/// limit); `None` when no limit can be read.
pub fn default_ram_budget() -> Option<u64> {
    MemoryLimit::of_this_process().map(|l| l.default_budget())
}

/// The budget to load with: `flag` (`--ram-budget`) when given, else the default under
/// `limit` (`None`: everything resident when no limit is known).
///
/// Errors: `flag` is more than `limit`, which the kernel would end by killing the process, as
/// `--ram-budget 1.0 GiB is more than the memory limit of 512.0 MiB (cgroup) this process
/// may use`.
pub fn ram_budget(flag: Option<u64>, limit: Option<MemoryLimit>) -> Result<Option<u64>, String> {
    match (flag, limit) {
        (Some(b), Some(l)) if b > l.bytes => Err(format!(
            "--ram-budget {} is more than {} this process may use",
            size_text(b),
            l.describe()
        )),
        (Some(b), _) => Ok(Some(b)),
        (None, l) => Ok(l.map(|l| l.default_budget())),
    }
}

/// What a loaded model holds in RAM besides its budget: the program itself, the parsed file
/// headers (GGUF metadata, the tensor index) and the tokenizer. Estimated from the model by
/// [`Allowance::estimate`]; checked with the budget against the memory limit by
/// [`fit_allowance`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allowance {
    /// Bytes held beside the budget while the weights load and run.
    pub held: u64,
    /// Bytes at the allowance's peak, while the tokenizer is built (before any weight is read).
    pub peak: u64,
}

/// The program's own memory in [`Allowance::estimate`] (code, runtime, threads): 12 MiB, the
/// peak RSS of a fixture model of 512 tokens less its weights.
pub const ALLOWANCE_BASE: u64 = 12 << 20;

/// Bytes of the tensor index per tensor in [`Allowance::estimate`] (its `TensorInfo`, name,
/// shape and the unit lists; an estimate, not measured).
pub const ALLOWANCE_PER_TENSOR: u64 = 512;

impl Allowance {
    /// The allowance of a model whose tokenizer data take `tokenizer_bytes` (the GGUF
    /// metadata as stored in the file, or a folder's tokenizer files) and whose tensor index
    /// holds `tensors` tensors:
    ///
    /// - `held = ALLOWANCE_BASE + 16.5 × tokenizer_bytes + ALLOWANCE_PER_TENSOR × tensors`
    /// - `peak = ALLOWANCE_BASE + 25 × tokenizer_bytes + ALLOWANCE_PER_TENSOR × tensors`
    ///
    /// The factors are the demo model's (Gemma 3 270M Q4_K_M, 6.2 MiB of metadata, a
    /// 262,144-token vocabulary): its peak RSS is 114 MiB over its budgeted bytes once the
    /// tokenizer is built (the parsed metadata and the tokenizer's tables), and 167 MiB while
    /// the tokenizer is built, whatever the budget (measured with `/usr/bin/time -v`).
    pub fn estimate(tokenizer_bytes: u64, tensors: u64) -> Self {
        let index = ALLOWANCE_PER_TENSOR.saturating_mul(tensors);
        let fixed = ALLOWANCE_BASE.saturating_add(index);
        Self {
            held: fixed.saturating_add(tokenizer_bytes.saturating_mul(33) / 2),
            peak: fixed.saturating_add(tokenizer_bytes.saturating_mul(25)),
        }
    }

    /// The allowance in words for messages, e.g. `~114.6 MiB: program, file headers,
    /// tokenizer; ~167.5 MiB while the tokenizer is built`.
    fn describe(&self) -> String {
        format!(
            "~{}: program, file headers, tokenizer; ~{} while the tokenizer is built",
            size_text(self.held),
            size_text(self.peak)
        )
    }
}

/// The budget to load with once the model's fixed allowance `a` is counted: `budget` (from
/// [`ram_budget`]; `flag`: given as `--ram-budget`) as it is when `budget + a.held` and
/// `a.peak` fit `limit`, or, when it is the default, lowered to `limit - a.held`; with no
/// limit or no budget, as it is.
///
/// Errors: a given budget plus the allowance exceeds the limit, as `--ram-budget 64.0 MiB plus
/// this model's fixed allowance (~114.6 MiB: ...) exceeds the memory limit of 160.0 MiB
/// (cgroup); at most 45.4 MiB fits`; or the limit cannot hold the allowance itself (its peak
/// or what it holds), whatever the budget: the message says that no budget fits.
pub fn fit_allowance(
    budget: Option<u64>,
    flag: bool,
    limit: Option<MemoryLimit>,
    a: Allowance,
) -> Result<Option<u64>, String> {
    let (Some(b), Some(l)) = (budget, limit) else {
        return Ok(budget);
    };
    let room = l.bytes.checked_sub(a.held).filter(|_| l.bytes >= a.peak);
    match (room, flag) {
        (Some(r), _) if b <= r => Ok(Some(b)),
        (Some(r), false) => Ok(Some(r)),
        (Some(r), true) => Err(format!(
            "--ram-budget {} plus this model's fixed allowance ({}) exceeds {}; at most {} fits",
            size_text(b),
            a.describe(),
            l.describe(),
            size_text(r)
        )),
        (None, true) => Err(format!(
            "--ram-budget {} plus this model's fixed allowance ({}) exceeds {}; no budget fits: \
             the allowance alone needs more",
            size_text(b),
            a.describe(),
            l.describe()
        )),
        (None, false) => Err(format!(
            "{} cannot hold this model's fixed allowance ({}); no RAM budget fits",
            l.describe(),
            a.describe()
        )),
    }
}

/// `MemAvailable` in bytes from the text of `/proc/meminfo`.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// The memory limit of the cgroup named in `proc_cgroup` (the text of `/proc/self/cgroup`),
/// reading limit files through `read`; `None` when there is no limit ("max", or v1's
/// near-`u64::MAX` "unlimited") or no file.
fn cgroup_limit(proc_cgroup: &str, read: impl Fn(&str) -> Option<String>) -> Option<u64> {
    let parse = |s: Option<String>| -> Option<u64> {
        let v: u64 = s?.trim().parse().ok()?;
        (v < 1 << 60).then_some(v)
    };
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
        let path = path.trim_end_matches('/');
        let v = if ctrl.split(',').any(|c| c == "memory") {
            parse(read(&format!(
                "/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"
            )))
        } else if ctrl.is_empty() {
            parse(read(&format!("/sys/fs/cgroup{path}/memory.max")))
        } else {
            None
        };
        if v.is_some() {
            return v;
        }
    }
    None
}

/// Parses a size such as `64M`, `1.5G`, `512k`, `4096` (bytes; K/M/G/T are powers of 1024,
/// an optional trailing `B`/`iB` is accepted).
///
/// Errors: the text is not a number with an optional unit (the message quotes it).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower.trim_end_matches("ib").trim_end_matches('b');
    let (num, mult) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 1u64 << 10),
        Some('m') => (&body[..body.len() - 1], 1 << 20),
        Some('g') => (&body[..body.len() - 1], 1 << 30),
        Some('t') => (&body[..body.len() - 1], 1 << 40),
        _ => (body, 1),
    };
    let v: f64 = num.trim().parse().map_err(|_| {
        format!("invalid size '{s}': expected a number with an optional K, M, G or T suffix")
    })?;
    let bytes = v * mult as f64;
    if !(bytes.is_finite() && bytes >= 0.0 && bytes < (1u64 << 60) as f64) {
        return Err(format!("invalid size '{s}': expected at most 1024P"));
    }
    Ok((v * mult as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_budget_reads_meminfo_and_cgroup_limits() {
        let mi = "MemTotal:       24000000 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(mem_available(mi), Some(2048 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
        let files = |p: &str| -> Option<String> {
            match p {
                "/sys/fs/cgroup/memory/lab/memory.limit_in_bytes" => Some("2147483648\n".into()),
                "/sys/fs/cgroup/memory/free/memory.limit_in_bytes" => {
                    Some("9223372036854771712\n".into())
                }
                "/sys/fs/cgroup/v2/memory.max" => Some("1073741824\n".into()),
                "/sys/fs/cgroup/open/memory.max" => Some("max\n".into()),
                _ => None,
            }
        };
        assert_eq!(cgroup_limit("4:memory:/lab\n0::/\n", files), Some(2 << 30));
        assert_eq!(cgroup_limit("4:memory:/free\n0::/open\n", files), None);
        assert_eq!(cgroup_limit("0::/v2\n", files), Some(1 << 30));
        assert_eq!(cgroup_limit("3:cpu,cpuacct:/x\n", files), None);
        // the lower of the two, and which
        let lim = |mi: Option<&str>, cg: Option<&str>| MemoryLimit::from_texts(mi, cg, files);
        assert_eq!(
            lim(Some(mi), Some("0::/v2\n")),
            Some(MemoryLimit::available(2048 * 1024))
        );
        let big = "MemAvailable:   8388608 kB\n";
        let v2 = MemoryLimit {
            bytes: 1 << 30,
            source: LimitSource::Cgroup,
        };
        assert_eq!(lim(Some(big), Some("0::/v2\n")), Some(v2));
        assert_eq!(lim(None, Some("0::/v2\n")), Some(v2));
        assert_eq!(
            lim(Some(big), Some("0::/open\n")),
            Some(MemoryLimit::available(8 << 30))
        );
        assert_eq!(lim(None, None), None);
    }

    fn cgroup(mib: u64) -> MemoryLimit {
        MemoryLimit {
            bytes: mib << 20,
            source: LimitSource::Cgroup,
        }
    }

    #[test]
    fn the_default_budget_degrades_with_small_limits() {
        // a 256 MiB cgroup: half of it (90% less 256 MiB would leave nothing)
        assert_eq!(cgroup(256).default_budget(), 128 << 20);
        assert_eq!(cgroup(512).default_budget(), 256 << 20);
        assert_eq!(cgroup(64).default_budget(), 32 << 20);
        // large limits: 90% less 256 MiB
        assert_eq!(cgroup(10240).default_budget(), (9216 - 256) << 20);
        assert_eq!(ram_budget(None, Some(cgroup(256))), Ok(Some(128 << 20)));
        assert_eq!(ram_budget(None, None), Ok(None));
    }

    #[test]
    fn a_budget_over_the_limit_is_refused() {
        assert_eq!(
            ram_budget(Some(1 << 30), Some(cgroup(512))),
            Err("--ram-budget 1.0 GiB is more than the memory limit of 512.0 MiB (cgroup) this process may use".into())
        );
        assert_eq!(
            ram_budget(Some(512 << 20), Some(cgroup(512))),
            Ok(Some(512 << 20))
        );
        assert_eq!(ram_budget(Some(1 << 40), None), Ok(Some(1 << 40)));
        let avail = MemoryLimit::available(100 << 20);
        assert_eq!(
            ram_budget(Some(200 << 20), Some(avail)),
            Err("--ram-budget 200.0 MiB is more than the memory limit of 100.0 MiB (MemAvailable) this process may use".into())
        );
    }

    #[test]
    fn the_fixed_allowance_is_counted_against_the_limit() {
        // the demo model: 6.2 MiB of metadata, 236 tensors
        let a = Allowance::estimate(6_525_000, 236);
        assert_eq!(a.held, (12 << 20) + 107_662_500 + 120_832);
        assert_eq!(a.peak, (12 << 20) + 163_125_000 + 120_832);
        let fit =
            |b: u64, flag: bool, l: u64| fit_allowance(Some(b << 20), flag, Some(cgroup(l)), a);
        assert_eq!(fit(64, true, 200), Ok(Some(64 << 20)));
        assert_eq!(
            fit(100, true, 180),
            Err(
                "--ram-budget 100.0 MiB plus this model's fixed allowance (~114.8 MiB: program, \
                 file headers, tokenizer; ~167.7 MiB while the tokenizer is built) exceeds the \
                 memory limit of 180.0 MiB (cgroup); at most 65.2 MiB fits"
                    .into()
            )
        );
        assert_eq!(
            fit(64, true, 160),
            Err(
                "--ram-budget 64.0 MiB plus this model's fixed allowance (~114.8 MiB: program, \
                 file headers, tokenizer; ~167.7 MiB while the tokenizer is built) exceeds the \
                 memory limit of 160.0 MiB (cgroup); no budget fits: the allowance alone needs \
                 more"
                    .into()
            )
        );
        // a default budget is lowered to what fits, or refused with the limit named
        assert_eq!(fit(128, false, 200), Ok(Some((200 << 20) - a.held)));
        assert_eq!(fit(64, false, 200), Ok(Some(64 << 20)));
        assert_eq!(
            fit(80, false, 160),
            Err(
                "the memory limit of 160.0 MiB (cgroup) cannot hold this model's fixed \
                 allowance (~114.8 MiB: program, file headers, tokenizer; ~167.7 MiB while the \
                 tokenizer is built); no RAM budget fits"
                    .into()
            )
        );
        // nothing to check without a limit or a budget
        assert_eq!(
            fit_allowance(Some(1 << 40), true, None, a),
            Ok(Some(1 << 40))
        );
        assert_eq!(fit_allowance(None, false, Some(cgroup(100)), a), Ok(None));
    }

    #[test]
    fn greedy_in_order() {
        let c = |n: &str, b| Candidate {
            name: n.into(),
            bytes: b,
        };
        let cands = [c("head", 100), c("l0", 40), c("l1", 40), c("l2", 10)];
        assert_eq!(
            choose_resident(&cands, 95),
            (vec![false, true, true, true], 90)
        );
        assert_eq!(
            choose_resident(&cands, 200),
            (vec![true, true, true, true], 190)
        );
        assert_eq!(choose_resident(&cands, 5), (vec![false; 4], 0));
    }

    #[test]
    fn sizes_in_messages_take_the_largest_unit_below_them() {
        assert_eq!(size_text(0), "0 bytes");
        assert_eq!(size_text(1), "1 byte");
        assert_eq!(size_text(1 << 10), "1.0 KiB");
        assert_eq!(size_text(512 << 10), "512.0 KiB");
        assert_eq!(size_text((1 << 20) - 1), "1024.0 KiB");
        assert_eq!(size_text(1 << 20), "1.0 MiB");
        assert_eq!(size_text(1_500_000), "1.4 MiB");
        assert_eq!(size_text(3 << 29), "1.5 GiB");
        assert_eq!(size_text(64 << 30), "64.0 GiB");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(
            parse_size("16777216T"),
            Err("invalid size '16777216T': expected at most 1024P".into())
        );
        assert_eq!(
            parse_size("lots"),
            Err(
                "invalid size 'lots': expected a number with an optional K, M, G or T suffix"
                    .into()
            )
        );
    }
}
