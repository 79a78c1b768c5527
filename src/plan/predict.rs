//! The arithmetic of `deltafin plan`, from byte counts alone (no model, no file, no clock):
//! where a model's weights go under a RAM budget, the expert cache's expected hit rate, and
//! per drive count the decode speed, its bound and the time to first token.
//!
//! The placement follows `models/budget.rs` (docs/memory.md): the budget pays the KV cache
//! (`-c` tokens) and one expert I/O buffer per expert a token takes, then the spine (every
//! non-expert weight); when the spine does not fit, two stream buffers of the largest spine
//! unit come first and the spine is streamed in part; whatever is left is the expert cache.
//! Activations and the few small vectors a family keeps besides are not counted (a few MiB).
//!
//! A decode step of `L` MoE layers of top-`k` experts of `S` bytes, with the drives together
//! reading `B` bytes per second and a hit rate `h`, takes
//!
//! ```text
//! t = spine compute + spine reads + max(expert reads, expert compute)
//! expert reads    = L · k · (1 − h) · S_read / B       (S_read: S as the drive reads it)
//! expert compute  = L · k · S / expert rate
//! spine compute   = (spine − embeddings) / spine rate   (the embeddings are looked up)
//! spine reads     = streamed spine bytes / B₁            (the spine file is on one drive)
//! ```
//!
//! since a layer's expert reads start after its router and each expert computes as it lands
//! (prefetch off, as `--prefetch auto` leaves it for one drive and for striped packs). The
//! bound is the larger of the reads and the compute: `drives` (expert reads), `RAM` (reads of
//! a spine the budget cannot hold), or `compute`.
//!
//! The hit rate: per MoE layer, expert `e` is used by a pass with probability `p_e`
//! (`Σ p_e = k`): `k/E` each under uniform routing, or the heat file's counts scaled to sum to
//! `k`. A cache of `C` experts holding the most used ones hits `h = Σ_top C p_e / (k·L)` in
//! the steady state; from an empty cache, over the first `n` tokens decoded after a one-pass
//! prompt (as `bench`'s cold-decode), each layer's share `c = C/L` fills as the experts are
//! first met: the expert used by the token after `t` passes is cached with probability
//! `(1 − (1 − p_e)^t) · min(1, c / D(t))`, `D(t) = Σ_e 1 − (1 − p_e)^t` the distinct experts
//! met so far; `h` is the mean over `t = 1..=n`.
//!
//! The time to first token of a `P`-token prompt from a cold cache: each layer reads the
//! experts its `P` rows touch, `D(P)`; the I/O floor is those bytes over `B` (plus the
//! streamed spine once per 512-row batch), the compute `P` rows of every multiplied weight at
//! the batched rate (the LM head once); the next layer's reads run ahead of compute, so the
//! larger of the two is the estimate.

use serde::Serialize;

use crate::store::plan::{fit_allowance, ram_budget, size_text, Allowance, MemoryLimit};

/// Alignment of a direct read, in bytes.
const ALIGN: u64 = 4096;

/// Rows in one prompt pass (`-b`'s default).
const BATCH: u64 = 512;

/// What planning needs to know of a model, in bytes and counts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelShape {
    /// The model as named (`-m`).
    pub name: String,
    /// `gguf`, `safetensors`, `pack` or `preset`.
    pub source: String,
    pub architecture: String,
    /// Decoder layers, dense ones included.
    pub layers: usize,
    /// Layers with routed experts (`L`).
    pub moe_layers: usize,
    /// Routed experts per MoE layer (`E`).
    pub experts: usize,
    /// Experts a token takes in each MoE layer (`k`).
    pub experts_per_token: usize,
    /// Bytes of one routed expert as stored (`S`).
    pub expert_bytes: u64,
    /// Reads one expert takes: 1 for a pack's record, else its tensors (gate, up, down, ...).
    pub reads_per_expert: usize,
    /// Bytes of every weight that is not a routed expert.
    pub spine_bytes: u64,
    /// Bytes of the token embeddings when they are not the LM head (looked up, not multiplied).
    pub embedding_bytes: u64,
    /// Bytes of the LM head.
    pub head_bytes: u64,
    /// Bytes of the largest spine unit (a layer's spine weights, or the LM head).
    pub largest_spine_unit: u64,
    /// KV cache bytes per token of context (f32 rows, as the cache holds them).
    pub kv_bytes_per_token: u64,
    /// Recurrent state bytes per sequence (KDA layers).
    pub state_bytes: u64,
    /// The trained context, when the model states it.
    pub context_length: Option<u64>,
    /// What the process holds besides the budget ([`Allowance::estimate`]).
    #[serde(skip)]
    pub allowance: Allowance,
}

impl ModelShape {
    /// Bytes of every routed expert.
    pub fn all_expert_bytes(&self) -> u64 {
        (self.moe_layers * self.experts) as u64 * self.expert_bytes
    }

    /// Bytes of every weight.
    pub fn weight_bytes(&self) -> u64 {
        self.spine_bytes + self.all_expert_bytes()
    }

    /// Bytes a drive reads for one expert: a pack's record rounded up to 4 KiB, else each of
    /// its tensor slices widened to 4 KiB boundaries (4 KiB more each, on average).
    pub fn expert_read_bytes(&self) -> u64 {
        if self.reads_per_expert <= 1 {
            self.expert_bytes.div_ceil(ALIGN) * ALIGN
        } else {
            self.expert_bytes + self.reads_per_expert as u64 * ALIGN
        }
    }

    /// Bytes of one expert I/O buffer (the largest read, rounded up to 4 KiB).
    fn io_buffer_bytes(&self) -> u64 {
        self.expert_read_bytes().div_ceil(ALIGN) * ALIGN
    }
}

/// How fast this machine computes, in weight bytes per second.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Rates {
    /// Spine weight bytes one decode row multiplies per second.
    pub spine: f64,
    /// Routed-expert bytes one decode row multiplies per second.
    pub expert: f64,
    /// Weight bytes × rows a batched (prompt) product goes through per second.
    pub prefill: f64,
}

/// Where the expert cache's hit rate comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum Routing {
    /// Every expert equally likely.
    Uniform,
    /// Use counts per (layer, expert), as the heat file keeps them (rows of dense layers are
    /// all zero and skipped).
    Heat(Vec<Vec<u64>>),
    /// A stated hit rate (`--hit-rate`), 0 to 1.
    HitRate(f64),
}

/// What a plan is for.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanInputs {
    /// The memory the process may use (`--ram`, or this machine's limit).
    pub limit: Option<MemoryLimit>,
    /// `--ram-budget`, when given.
    pub ram_budget: Option<u64>,
    /// Context in tokens (`-c`): the KV cache the budget pays for.
    pub ctx: u64,
    /// Each drive's read bandwidth in bytes per second, in order: the ladder adds them one by one.
    pub drives: Vec<f64>,
    pub rates: Rates,
    pub routing: Routing,
    /// Prompt lengths for the time to first token.
    pub prompt_tokens: Vec<u64>,
    /// Tokens decoded from an empty cache after a one-pass prompt (`--decode-tokens`, as
    /// `bench`'s cold-decode);
    /// `None`: the steady state.
    pub decode_tokens: Option<u64>,
}

/// Where the weights go.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Placement {
    /// The RAM budget in bytes.
    pub budget: u64,
    pub kv_bytes: u64,
    pub io_buffer_bytes: u64,
    pub stream_buffer_bytes: u64,
    pub resident_spine_bytes: u64,
    pub streamed_spine_bytes: u64,
    pub cache_bytes: u64,
    /// Experts the cache holds.
    pub cache_experts: u64,
    /// Every weight resident: nothing is read from the drives after loading.
    pub all_resident: bool,
    /// Budget over weight bytes, at most 1.
    pub hot_fraction: f64,
    /// Share of the routed experts the cache holds (1 when all resident).
    pub cached_expert_share: f64,
}

/// One rung of the drive ladder.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rung {
    pub drives: usize,
    /// Bytes per second of these drives together.
    pub bandwidth: f64,
    pub decode_tok_s: f64,
    /// `drives`, `RAM` or `compute`.
    pub bound: &'static str,
    /// Seconds per decoded token: reading experts, reading the spine, computing.
    pub expert_read_s: f64,
    pub spine_read_s: f64,
    pub compute_s: f64,
    /// Per prompt length: the time to first token.
    pub ttft: Vec<Ttft>,
}

/// The time to first token of one prompt length.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Ttft {
    pub prompt_tokens: u64,
    /// Share of the routed experts the prompt touches.
    pub touched_fraction: f64,
    pub io_floor_s: f64,
    pub compute_s: f64,
    pub ttft_s: f64,
    /// `drives`, `RAM` or `compute`: the larger part.
    pub bound: &'static str,
}

/// Which resource adds the most decode speed at the largest drive count.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AddFirst {
    /// `a drive`, `RAM` or `compute`.
    pub resource: &'static str,
    /// Decode tok/s with one more drive (the drives' mean bandwidth), twice the RAM, and
    /// twice the compute rates.
    pub one_more_drive_tok_s: f64,
    pub double_ram_tok_s: f64,
    pub double_compute_tok_s: f64,
}

/// What to run with.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recommend {
    /// `--ram-budget` in bytes.
    pub ram_budget: u64,
    /// `-c`: the largest context whose KV cache takes at most half of what the budget has left
    /// beside the resident spine and the I/O buffers (the rest stays expert cache), at most the
    /// trained context; `None` when nothing is left.
    pub ctx_size: Option<u64>,
    /// `--placement` for a pack over several drives (`stripe`), `None` for one drive.
    pub placement: Option<&'static str>,
    /// Whether to `deltafin pack` the model, and why.
    pub pack: bool,
    pub pack_reason: String,
}

/// A whole plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    pub placement: Placement,
    /// The expected hit rate and where it comes from (`uniform`, `heat file`, `--hit-rate`).
    pub hit_rate: f64,
    pub hit_rate_source: &'static str,
    pub ladder: Vec<Rung>,
    pub add_first: AddFirst,
    pub recommend: Recommend,
}

/// The budget `inp` gives: `--ram-budget` checked against the limit and the allowance, or the
/// default budget of the limit as `run` computes it.
///
/// Errors: as [`ram_budget`] and [`fit_allowance`]; no budget given and no limit known.
pub fn budget(shape: &ModelShape, inp: &PlanInputs) -> Result<u64, String> {
    let b = ram_budget(inp.ram_budget, inp.limit)?;
    let b = fit_allowance(b, inp.ram_budget.is_some(), inp.limit, shape.allowance)?;
    b.ok_or_else(|| "no memory limit is known here: give --ram or --ram-budget".to_string())
}

/// Places `shape` under `budget` bytes with a KV cache of `ctx` tokens.
///
/// Errors: the budget cannot hold the KV cache, the stream buffers and the expert I/O
/// buffers (each given).
pub fn place(shape: &ModelShape, budget: u64, ctx: u64) -> Result<Placement, String> {
    let kv = shape.kv_bytes_per_token * ctx + shape.state_bytes;
    let weights = shape.weight_bytes();
    let hot = (budget as f64 / weights.max(1) as f64).min(1.0);
    let mut p = Placement {
        budget,
        kv_bytes: kv,
        io_buffer_bytes: 0,
        stream_buffer_bytes: 0,
        resident_spine_bytes: shape.spine_bytes,
        streamed_spine_bytes: 0,
        cache_bytes: 0,
        cache_experts: 0,
        all_resident: true,
        hot_fraction: hot,
        cached_expert_share: 1.0,
    };
    if kv + weights <= budget {
        return Ok(p);
    }
    p.all_resident = false;
    let n_exp = (shape.moe_layers * shape.experts) as u64;
    if n_exp > 0 {
        p.io_buffer_bytes = shape.experts_per_token.max(1) as u64 * shape.io_buffer_bytes();
    }
    let fixed = kv + p.io_buffer_bytes;
    if n_exp > 0 && fixed + shape.spine_bytes <= budget {
        p.cache_bytes = budget - fixed - shape.spine_bytes;
    } else {
        p.stream_buffer_bytes = 2 * shape.largest_spine_unit.max(4 * ALIGN);
        let need = fixed + p.stream_buffer_bytes;
        if need > budget {
            return Err(format!(
                "--ram-budget {} is too small: the KV cache for {ctx} tokens ({}), stream buffers \
                 ({}) and expert I/O buffers ({}) need at least {}",
                size_text(budget),
                size_text(kv),
                size_text(p.stream_buffer_bytes),
                size_text(p.io_buffer_bytes),
                size_text(need)
            ));
        }
        p.resident_spine_bytes = (budget - need).min(shape.spine_bytes);
        p.streamed_spine_bytes = shape.spine_bytes - p.resident_spine_bytes;
    }
    let cached = match shape.expert_bytes {
        0 => 0,
        s => (p.cache_bytes / s).min(n_exp),
    };
    p.cache_experts = cached;
    p.cached_expert_share = if n_exp == 0 {
        1.0
    } else {
        cached as f64 / n_exp as f64
    };
    Ok(p)
}

/// Per MoE layer, the probability that a pass uses each expert (each row sums to `k`).
fn usage(shape: &ModelShape, routing: &Routing) -> Vec<Vec<f64>> {
    let (l, e, k) = (shape.moe_layers, shape.experts, shape.experts_per_token);
    let uniform = vec![k as f64 / e.max(1) as f64; e];
    let mut rows: Vec<Vec<f64>> = match routing {
        Routing::Heat(c) => c
            .iter()
            .filter(|r| r.iter().any(|&x| x > 0))
            .take(l)
            .map(|r| {
                let sum: u64 = r.iter().sum();
                r.iter()
                    .map(|&x| (k as f64 * x as f64 / sum as f64).min(1.0))
                    .collect()
            })
            .collect(),
        _ => Vec::new(),
    };
    rows.resize(l, uniform);
    rows
}

/// The expected hit rate of a cache of `cached` experts (see the module header), over
/// `decode_tokens` tokens from an empty cache or in the steady state.
pub fn hit_rate(
    shape: &ModelShape,
    routing: &Routing,
    cached: u64,
    decode_tokens: Option<u64>,
) -> f64 {
    if let Routing::HitRate(h) = routing {
        return *h;
    }
    let n_exp = (shape.moe_layers * shape.experts) as u64;
    if n_exp == 0 || cached >= n_exp {
        return 1.0;
    }
    let rows = usage(shape, routing);
    let k_all = (shape.experts_per_token * shape.moe_layers) as f64;
    match decode_tokens {
        None => {
            let mut all: Vec<f64> = rows.iter().flatten().copied().collect();
            all.sort_by(|a, b| b.total_cmp(a));
            all.iter().take(cached as usize).sum::<f64>() / k_all
        }
        Some(n) => {
            let c = cached as f64 / shape.moe_layers as f64;
            let mut sum = 0.0;
            for t in 1..=n {
                for r in &rows {
                    let seen: Vec<f64> = r.iter().map(|p| 1.0 - (1.0 - p).powf(t as f64)).collect();
                    let d: f64 = seen.iter().sum();
                    let keep = if d > c { c / d } else { 1.0 };
                    sum += r.iter().zip(&seen).map(|(p, s)| p * s * keep).sum::<f64>();
                }
            }
            sum / (k_all * n.max(1) as f64)
        }
    }
}

/// Decode seconds per token: (expert reads, spine reads, compute, total).
fn decode_time(
    shape: &ModelShape,
    p: &Placement,
    h: f64,
    bw: f64,
    bw1: f64,
    r: &Rates,
) -> (f64, f64, f64, f64) {
    let lk = (shape.moe_layers * shape.experts_per_token) as f64;
    let multiplied = shape.spine_bytes.saturating_sub(shape.embedding_bytes) as f64;
    let spine_c = multiplied / r.spine;
    let exp_c = lk * shape.expert_bytes as f64 / r.expert;
    if p.all_resident {
        return (0.0, 0.0, spine_c + exp_c, spine_c + exp_c);
    }
    let exp_r = lk * (1.0 - h) * shape.expert_read_bytes() as f64 / bw;
    let spine_r = p.streamed_spine_bytes as f64 / bw1;
    (
        exp_r,
        spine_r,
        spine_c + exp_c,
        spine_c + spine_r + exp_r.max(exp_c),
    )
}

/// The bound of a part that reads `exp_r` and `spine_r` seconds and computes `comp` seconds.
fn bound(exp_r: f64, spine_r: f64, comp: f64) -> &'static str {
    if exp_r + spine_r <= comp {
        "compute"
    } else if spine_r > exp_r {
        "RAM"
    } else {
        "drives"
    }
}

/// The time to first token of a `n`-token prompt from a cold cache at `bw` bytes per second.
fn ttft(
    shape: &ModelShape,
    p: &Placement,
    rows: &[Vec<f64>],
    n: u64,
    bw: f64,
    bw1: f64,
    r: &Rates,
) -> Ttft {
    let distinct: f64 = rows
        .iter()
        .map(|row| {
            row.iter()
                .map(|q| 1.0 - (1.0 - q).powf(n as f64))
                .sum::<f64>()
        })
        .sum();
    let n_exp = (shape.moe_layers * shape.experts) as f64;
    let touched = if n_exp > 0.0 { distinct / n_exp } else { 0.0 };
    let (exp_r, spine_r) = match p.all_resident {
        true => (0.0, 0.0),
        false => (
            distinct * shape.expert_read_bytes() as f64 / bw,
            n.div_ceil(BATCH) as f64 * p.streamed_spine_bytes as f64 / bw1,
        ),
    };
    let lk = (shape.moe_layers * shape.experts_per_token) as f64;
    let rows_bytes = shape
        .spine_bytes
        .saturating_sub(shape.embedding_bytes + shape.head_bytes) as f64
        + lk * shape.expert_bytes as f64;
    let compute = n as f64 * rows_bytes / r.prefill + shape.head_bytes as f64 / r.spine;
    let io = exp_r + spine_r;
    Ttft {
        prompt_tokens: n,
        touched_fraction: touched,
        io_floor_s: io,
        compute_s: compute,
        ttft_s: io.max(compute),
        bound: bound(exp_r, spine_r, compute),
    }
}

/// Decode tok/s with `drives` under `limit`/`budget` (for [`AddFirst`]); 0 when the budget
/// does not fit.
fn tok_s(shape: &ModelShape, inp: &PlanInputs, budget: u64, drives: &[f64], r: &Rates) -> f64 {
    let Ok(p) = place(shape, budget, inp.ctx) else {
        return 0.0;
    };
    // `+ 0.0`: an empty cache's sum is -0.0, shown as "-0.000"
    let h = hit_rate(shape, &inp.routing, p.cache_experts, inp.decode_tokens) + 0.0;
    let bw: f64 = drives.iter().sum();
    1.0 / decode_time(shape, &p, h, bw, drives[0], r).3
}

/// Plans `shape` for `inp` (see the module header).
///
/// Errors: no drive; a bandwidth or rate that is not positive; as [`budget`] and [`place`].
pub fn plan(shape: &ModelShape, inp: &PlanInputs) -> Result<Plan, String> {
    if inp.drives.is_empty() {
        return Err("no drive: give --drives or --drive-bandwidth".into());
    }
    if inp.drives.iter().any(|b| !(b.is_finite() && *b > 0.0)) {
        return Err("a drive bandwidth must be more than 0 bytes per second".into());
    }
    let r = &inp.rates;
    if [r.spine, r.expert, r.prefill]
        .iter()
        .any(|x| !(x.is_finite() && *x > 0.0))
    {
        return Err("a compute rate must be more than 0 bytes per second".into());
    }
    let b = budget(shape, inp)?;
    let p = place(shape, b, inp.ctx)?;
    let h = match p.all_resident {
        true => 1.0,
        false => hit_rate(shape, &inp.routing, p.cache_experts, inp.decode_tokens) + 0.0,
    };
    let source = match (&inp.routing, p.all_resident) {
        (_, true) => "all resident",
        (Routing::Uniform, _) => "uniform routing",
        (Routing::Heat(_), _) => "heat file",
        (Routing::HitRate(_), _) => "--hit-rate",
    };
    let rows = usage(shape, &inp.routing);
    let ladder: Vec<Rung> = (1..=inp.drives.len())
        .map(|n| {
            let bw: f64 = inp.drives[..n].iter().sum();
            let (er, sr, c, t) = decode_time(shape, &p, h, bw, inp.drives[0], r);
            Rung {
                drives: n,
                bandwidth: bw,
                decode_tok_s: 1.0 / t,
                bound: bound(er, sr, c),
                expert_read_s: er,
                spine_read_s: sr,
                compute_s: c,
                ttft: inp
                    .prompt_tokens
                    .iter()
                    .map(|&n| ttft(shape, &p, &rows, n, bw, inp.drives[0], r))
                    .collect(),
            }
        })
        .collect();
    let mean = inp.drives.iter().sum::<f64>() / inp.drives.len() as f64;
    let mut more = inp.drives.clone();
    more.push(mean);
    let base = ladder.last().map_or(0.0, |x| x.decode_tok_s);
    let double = Rates {
        spine: 2.0 * r.spine,
        expert: 2.0 * r.expert,
        prefill: 2.0 * r.prefill,
    };
    // twice the RAM: twice a given budget, else the default budget of twice the limit
    let ram2 = match (inp.ram_budget, inp.limit) {
        (Some(given), _) => given.saturating_mul(2),
        (None, Some(l)) => {
            let l2 = MemoryLimit {
                bytes: l.bytes.saturating_mul(2),
                ..l
            };
            let twice = PlanInputs {
                limit: Some(l2),
                ..inp.clone()
            };
            budget(shape, &twice).unwrap_or(b)
        }
        (None, None) => b.saturating_mul(2),
    };
    let add = AddFirst {
        resource: "",
        one_more_drive_tok_s: tok_s(shape, inp, b, &more, r),
        double_ram_tok_s: tok_s(shape, inp, ram2, &inp.drives, r),
        double_compute_tok_s: tok_s(shape, inp, b, &inp.drives, &double),
    };
    let best = [
        ("a drive", add.one_more_drive_tok_s),
        ("RAM", add.double_ram_tok_s),
        ("compute", add.double_compute_tok_s),
    ]
    .into_iter()
    .fold(
        ("compute", base),
        |a, x| if x.1 > a.1 * 1.0001 { x } else { a },
    );
    let add_first = AddFirst {
        resource: best.0,
        ..add
    };
    Ok(Plan {
        recommend: recommend(shape, &p, inp.drives.len()),
        placement: p,
        hit_rate: h,
        hit_rate_source: source,
        ladder,
        add_first,
    })
}

/// The flags to run with (see [`Recommend`]).
fn recommend(shape: &ModelShape, p: &Placement, drives: usize) -> Recommend {
    let beside =
        p.resident_spine_bytes + p.io_buffer_bytes + p.stream_buffer_bytes + shape.state_bytes;
    let room = p.budget.saturating_sub(beside);
    let half = if p.all_resident {
        p.budget
            .saturating_sub(shape.weight_bytes() + shape.state_bytes)
    } else {
        room / 2
    };
    let ctx = match shape.kv_bytes_per_token {
        0 => shape.context_length,
        per => Some(half / per),
    }
    .map(|c| shape.context_length.map_or(c, |t| c.min(t)))
    .filter(|&c| c > 0);
    let (pack, pack_reason) = if p.all_resident {
        (
            false,
            "every weight is resident: nothing is read after loading".to_string(),
        )
    } else if shape.source == "pack" {
        (false, "already a pack".to_string())
    } else if shape.moe_layers == 0 {
        (false, "no routed experts to lay out".to_string())
    } else {
        (
            true,
            format!(
                "experts are read on demand: a pack reads each in 1 request instead of {}{}",
                shape.reads_per_expert,
                if drives > 1 {
                    " and stripes it over the drives"
                } else {
                    ""
                }
            ),
        )
    };
    Recommend {
        ram_budget: p.budget,
        ctx_size: ctx,
        placement: (drives > 1 && !p.all_resident).then_some("stripe"),
        pack,
        pack_reason,
    }
}

#[cfg(test)]
#[path = "predict_tests.rs"]
mod tests;
