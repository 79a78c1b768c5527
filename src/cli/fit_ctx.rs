//! The context that fits the RAM budget, for `deltafin chat`: when its default KV cache (4096
//! tokens) does not fit beside the model's buffers, the largest one that does is chosen (and
//! said); a `-c` that does not fit is refused with that size.
//!
//! The size is found by asking the model's own placement: loading with a budget of one byte
//! fails with a [`BudgetTooSmall`] that names what the KV cache, activations and buffers need
//! for a given context, before any weight is read (the need does not depend on the budget).
//! The need grows with the context, so a binary search finds the largest context whose need
//! fits. A model whose every weight would fit beside its KV cache without stream buffers can
//! fit a few tokens more than this finds; the size found always loads.

use crate::load::OpenedModel;
use crate::models::{BudgetTooSmall, LoadOptions};

/// The smallest context considered (a chat turn needs a prompt token and an answer token).
pub const MIN_CTX: usize = 2;

/// What `opts` with a KV cache of `n_ctx` tokens needs besides the weights, in bytes: the
/// `need` of the [`BudgetTooSmall`] a one-byte budget gets, with that error. `None` when
/// loading gives no such error (a family that places weights otherwise).
fn need(opened: &OpenedModel, opts: &LoadOptions, n_ctx: usize) -> Option<BudgetTooSmall> {
    let probe = LoadOptions {
        ram_budget: Some(1),
        n_ctx,
        ..opts.clone()
    };
    let e = opened.load_weights(&probe).err()?;
    e.chain()
        .find_map(|c| c.downcast_ref::<BudgetTooSmall>())
        .cloned()
}

/// The budget's name in messages: `--ram-budget 64.0 MiB`, `the default RAM budget of
/// 1.5 GiB`, or with a draft model `the 40.0 MiB --ram-budget leaves beside the draft model`.
pub fn budget_name(budget: u64, flag: bool, draft: bool) -> String {
    let mib = format!("{:.1} MiB", budget as f64 / 1048576.0);
    match (flag, draft) {
        (true, false) => format!("--ram-budget {mib}"),
        (false, false) => format!("the default RAM budget of {mib}"),
        (true, true) => format!("the {mib} --ram-budget leaves beside the draft model"),
        (false, true) => format!("the {mib} the default RAM budget leaves beside the draft model"),
    }
}

/// When `e`, the error of loading under `opts`, is a [`BudgetTooSmall`]: the largest context
/// below `opts.n_ctx` (at least [`MIN_CTX`]) whose KV cache, activations and buffers fit the
/// budget it names, with that error. `None` when `e` is another error or no smaller context
/// fits.
pub fn largest_fitting(
    opened: &OpenedModel,
    opts: &LoadOptions,
    e: &anyhow::Error,
) -> Option<(usize, BudgetTooSmall)> {
    let t = e
        .chain()
        .find_map(|c| c.downcast_ref::<BudgetTooSmall>())?
        .clone();
    let fits = |n: usize| need(opened, opts, n).is_some_and(|x| x.need <= t.budget);
    if opts.n_ctx <= MIN_CTX || !fits(MIN_CTX) {
        return None;
    }
    // fits(lo), !fits(hi) (the load at opts.n_ctx failed)
    let (mut lo, mut hi) = (MIN_CTX, opts.n_ctx);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some((lo, t))
}

/// `need` bytes in MiB with one decimal, or with as many more (up to 3) as it takes to read
/// above `budget` bytes (`64.02 MiB` against a budget of 64.0 MiB); else in bytes.
fn mib_above(need: u64, budget: u64) -> String {
    let mib = |b: u64| b as f64 / 1048576.0;
    for d in 1..=3 {
        let (n, b) = (format!("{:.d$}", mib(need)), format!("{:.d$}", mib(budget)));
        if n != b {
            return format!("{n} MiB");
        }
    }
    format!("{need} bytes")
}

/// The line `deltafin chat` prints when it chose a smaller context than its default `asked`.
pub fn chosen_line(n: usize, asked: usize, t: &BudgetTooSmall, budget: &str) -> String {
    format!(
        "context {n} tokens: the largest that fits {budget} ({asked} need {} besides the weights; -c sets it)",
        mib_above(t.need, t.budget)
    )
}

/// The error for `-c asked` that does not fit, naming the largest context `n` that does.
pub fn too_large(n: usize, asked: usize, t: &BudgetTooSmall, budget: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "-c {asked} does not fit {budget}: {} need at least {}; the largest context that fits is -c {n}",
        t.parts,
        mib_above(t.need, t.budget)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_budget_and_both_sizes() {
        let t = BudgetTooSmall {
            budget: 64 << 20,
            need: 100 << 20,
            parts: "the KV cache for 4096 tokens (72.0 MiB) and activations (28.0 MiB)".into(),
        };
        let b = budget_name(64 << 20, true, false);
        assert_eq!(
            chosen_line(1500, 4096, &t, &b),
            "context 1500 tokens: the largest that fits --ram-budget 64.0 MiB (4096 need 100.0 MiB besides the weights; -c sets it)"
        );
        assert_eq!(
            too_large(1500, 4096, &t, &b).to_string(),
            "-c 4096 does not fit --ram-budget 64.0 MiB: the KV cache for 4096 tokens (72.0 MiB) and activations (28.0 MiB) need at least 100.0 MiB; the largest context that fits is -c 1500"
        );
        // a need that rounds to the budget gets the decimals that tell them apart
        assert_eq!(mib_above((64 << 20) + 20_000, 64 << 20), "64.02 MiB");
        assert_eq!(mib_above((64 << 20) + 2, 64 << 20), "67108866 bytes");
        assert_eq!(mib_above(100 << 20, 64 << 20), "100.0 MiB");
        assert_eq!(
            budget_name(1 << 30, false, false),
            "the default RAM budget of 1024.0 MiB"
        );
        assert_eq!(
            budget_name(40 << 20, true, true),
            "the 40.0 MiB --ram-budget leaves beside the draft model"
        );
    }
}
