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
