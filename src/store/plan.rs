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

/// Share of the usable memory [`default_ram_budget`] takes.
pub const DEFAULT_BUDGET_SHARE: f64 = 0.9;

/// Bytes [`default_ram_budget`] leaves outside the budget besides the share: what the process
/// holds beyond its budget (tokenizer, model header, allocator; ~170 MiB peak measured with the
/// demo model at `--ram-budget 64M`, BENCHMARKS.md).
pub const DEFAULT_BUDGET_RESERVE: u64 = 256 << 20;

/// The smallest budget [`default_ram_budget`] returns.
pub const DEFAULT_BUDGET_FLOOR: u64 = 32 << 20;

/// The RAM budget used when none is given, in bytes: [`DEFAULT_BUDGET_SHARE`] of the smaller
/// of the kernel's `MemAvailable` (`/proc/meminfo`) and this process's cgroup memory limit (v2
/// `memory.max`, v1 `memory.limit_in_bytes`), less [`DEFAULT_BUDGET_RESERVE`], at least
/// [`DEFAULT_BUDGET_FLOOR`]; `None` when neither can be read.
/// A model that fits is then loaded whole as before; one that does not is streamed instead of
/// running the machine out of memory.
pub fn default_ram_budget() -> Option<u64> {
    let avail = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| mem_available(&t));
    let limit = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| cgroup_limit(&t, |p| std::fs::read_to_string(p).ok()));
    let usable = match (avail, limit) {
        (Some(a), Some(l)) => a.min(l),
        (a, l) => a.or(l)?,
    };
    let share = (usable as f64 * DEFAULT_BUDGET_SHARE) as u64;
    Some(
        share
            .saturating_sub(DEFAULT_BUDGET_RESERVE)
            .max(DEFAULT_BUDGET_FLOOR),
    )
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
