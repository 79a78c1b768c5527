//! Token sampling: repetition penalty, top-k, top-p, min-p, temperature, and a seeded PRNG so
//! sampled runs repeat exactly. Two orders of the filters ([`SamplerOrder`]):
//! llama.cpp's default chain (`common/sampling.cpp`): penalty → top-k → top-p → min-p →
//! temperature → draw, with top-p and min-p on the unscaled probabilities; and transformers'
//! `generate` (`_get_logits_processor`): penalty → temperature → top-k → top-p → min-p → draw,
//! with top-p and min-p on the temperature-scaled probabilities.
//!
//! A request's [`Steering`] (logit bias, `ignore_eos`, a grammar) comes before all of them
//! ([`Sampler::steered`]).

pub use super::constrain::Steering;
use super::sampler_select::{candidate_order, sort_candidates, top_k_candidates, RADIX_MIN};

/// Sampling settings. `temperature <= 0` means greedy (argmax; ties go to the lowest id).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0: off).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `top_p` (1: off).
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` × the top probability (0: off).
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of recently seen tokens by this (1: off),
    /// as in the CTRL paper (Keskar et al. 2019) and llama.cpp.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties (repetition, presence, frequency) look at
    /// ([`WHOLE_SEQUENCE`]: all of them, prompt included, as transformers'
    /// `RepetitionPenaltyLogitsProcessor`; 0: none).
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every token seen in the window (0: off); OpenAI's
    /// `presence_penalty`.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it appears in the window (0: off);
    /// OpenAI's `frequency_penalty`.
    pub frequency_penalty: f32,
    /// PRNG seed.
    pub seed: u64,
    /// The order of temperature and the filters.
    pub order: SamplerOrder,
}

/// [`SamplerConfig::repeat_last_n`] that makes the repetition penalty look at every token of
/// the sequence.
pub const WHOLE_SEQUENCE: usize = usize::MAX;

/// In which order [`Sampler`] applies temperature and the top-k, top-p and min-p filters (the
/// repetition penalty always comes first, on the raw logits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SamplerOrder {
    /// llama.cpp's chain: top-k, top-p, min-p on the probabilities at temperature 1, then the
    /// temperature scales what is left.
    #[default]
    LlamaCpp,
    /// transformers' `generate`: the logits are divided by the temperature first, then top-k,
    /// top-p and min-p act on the scaled probabilities.
    Transformers,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
            order: SamplerOrder::LlamaCpp,
        }
    }
}

/// Sampling settings a model ships with, each `None` when the model does not set it. Read from
/// Hugging Face `generation_config.json` (`temperature`, `top_k`, `top_p`, `min_p`,
/// `repetition_penalty`, and `do_sample: false`, which transformers treats as greedy). As in
/// vLLM's `--generation-config auto`, only the fields the file sets replace Deltafin's
/// defaults, and a command-line flag replaces both.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelSampling {
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
}

impl ModelSampling {
    /// Parses a `generation_config.json` object; `label` names the file in errors.
    ///
    /// Errors: a field of the wrong type or out of range (`temperature < 0`, `top_k < 0`,
    /// `top_p` outside (0, 1], `min_p` outside [0, 1], `repetition_penalty <= 0`), named with
    /// the file.
    pub fn from_generation_config(v: &serde_json::Value, label: &str) -> anyhow::Result<Self> {
        let num = |key: &str, ok: fn(f64) -> bool, want: &str| -> anyhow::Result<Option<f32>> {
            match v.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(x) => match x.as_f64() {
                    Some(f) if ok(f) => Ok(Some(f as f32)),
                    _ => anyhow::bail!("{label}: '{key}' is {x}, expected {want}"),
                },
            }
        };
        let mut m = ModelSampling {
            temperature: num("temperature", |f| f >= 0.0, "a number >= 0")?,
            top_k: num("top_k", |f| f >= 0.0 && f.fract() == 0.0, "an integer >= 0")?
                .map(|f| f as usize),
            top_p: num("top_p", |f| f > 0.0 && f <= 1.0, "a number in (0, 1]")?,
            min_p: num("min_p", |f| (0.0..=1.0).contains(&f), "a number in [0, 1]")?,
            repeat_penalty: num("repetition_penalty", |f| f > 0.0, "a number > 0")?,
        };
        match v.get("do_sample") {
            None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(true)) => {}
            Some(serde_json::Value::Bool(false)) => m.temperature = Some(0.0),
            Some(x) => anyhow::bail!("{label}: 'do_sample' is {x}, expected true or false"),
        }
        Ok(m)
    }

    /// Replaces the fields of `c` the model sets.
    pub fn apply(&self, c: &mut SamplerConfig) {
        if let Some(t) = self.temperature {
            c.temperature = t;
        }
        if let Some(k) = self.top_k {
            c.top_k = k;
        }
        if let Some(p) = self.top_p {
            c.top_p = p;
        }
        if let Some(p) = self.min_p {
            c.min_p = p;
        }
        if let Some(r) = self.repeat_penalty {
            c.repeat_penalty = r;
        }
    }
}

/// xoshiro256** (Blackman & Vigna 2018), seeded through SplitMix64.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator whose sequence depends only on `seed`.
    pub fn new(seed: u64) -> Self {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Self {
            s: [next(), next(), next(), next()],
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }

    /// A uniform float in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Picks next tokens from logits.
#[derive(Clone, Debug)]
pub struct Sampler {
    pub config: SamplerConfig,
    rng: Rng,
    /// The request's bias, `ignore_eos` and grammar (none by default).
    steering: Steering,
}

/// Index of the largest value; the lowest index among equals. NaNs are never chosen unless
/// the first value is one (then 0, as a scan keeping the first strictly larger value gives).
///
/// One pass in 16 lanes (a greedy step over a 262k-entry vocabulary is one per sequence):
/// each lane keeps its first strictly larger value and that value's index, then the lanes
/// and the tail are reduced to the largest value's lowest index, which is the scan's answer
/// (±0 compare equal, as they do there; all −∞ gives 0). Compiled for AVX-512 where the CPU
/// has it (for 262k logits about 0.1 ms → 0.02 ms in a standalone copy built for this
/// machine's AVX-512), for the base level elsewhere.
pub fn argmax(x: &[f32]) -> usize {
    match x.first() {
        None => return 0,
        Some(v) if v.is_nan() => return 0,
        _ => {}
    }
    if x.len() >= u32::MAX as usize {
        // indices past u32: the plain scan
        let mut best = 0;
        for (i, &v) in x.iter().enumerate() {
            if v > x[best] {
                best = i;
            }
        }
        return best;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F (checked above)
        return unsafe { argmax_avx512(x) };
    }
    argmax_lanes(x)
}

/// [`argmax_lanes`] compiled with AVX-512F.
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn argmax_avx512(x: &[f32]) -> usize {
    argmax_lanes(x)
}

/// [`argmax`]'s pass over `x` (fewer than 2³² values, the first not NaN).
#[inline(always)]
fn argmax_lanes(x: &[f32]) -> usize {
    const L: usize = 16;
    let mut m = [f32::NEG_INFINITY; L];
    let mut at = [u32::MAX; L];
    let mut chunks = x.chunks_exact(L);
    let mut base = 0u32;
    for c in &mut chunks {
        for j in 0..L {
            // a select, not a branch, so that the loop runs in vector registers
            let gt = c[j] > m[j];
            m[j] = if gt { c[j] } else { m[j] };
            at[j] = if gt { base + j as u32 } else { at[j] };
        }
        base += L as u32;
    }
    let tail = chunks
        .remainder()
        .iter()
        .enumerate()
        .map(|(k, &v)| (v, base + k as u32));
    let mut best: Option<(f32, u32)> = None;
    for (v, i) in m.into_iter().zip(at).chain(tail) {
        // −∞ and NaN are never a lane's or the scan's pick past index 0
        if v.is_nan() || v == f32::NEG_INFINITY {
            continue;
        }
        best = match best {
            Some((bv, bi)) if bv > v || (bv == v && bi < i) => Some((bv, bi)),
            _ => Some((v, i)),
        };
    }
    best.map_or(0, |b| b.1 as usize)
}

impl Sampler {
    /// A sampler with its PRNG seeded from `config.seed`.
    pub fn new(config: SamplerConfig) -> Self {
        Self::steered(config, Steering::default())
    }

    /// A sampler that applies `steering` before the penalties: the bias and `ignore_eos` in
    /// [`Sampler::penalize`], the grammar's mask in [`Sampler::sample`], which also advances
    /// the grammar over the token it returns. With a grammar, call `sample` once per token
    /// handed out, and only then (no speculative verification: it cannot take tokens back).
    pub fn steered(config: SamplerConfig, steering: Steering) -> Self {
        let rng = Rng::new(config.seed);
        Self {
            config,
            rng,
            steering,
        }
    }

    /// The request's steering.
    pub fn steering(&self) -> &Steering {
        &self.steering
    }

    /// Chooses the next token from `logits` (one per vocabulary entry; modified in place by the
    /// steering and the penalty) given the tokens so far (`history`, prompt included). Under
    /// a grammar, the token is one the grammar allows (an end-of-generation token once it is
    /// complete), and the grammar moves past it.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.penalize(logits, history);
        self.steering.mask(logits);
        let t = if self.config.temperature <= 0.0 {
            argmax(logits) as u32
        } else {
            let cand = self.distribution(logits);
            self.draw(&cand)
        };
        self.steering.commit(t);
        t
    }

    /// Draws one token from `cand` (`(id, probability)` pairs summing to 1, as
    /// [`Sampler::distribution`] returns them) with one uniform number of the PRNG: the first
    /// token whose cumulative probability exceeds it (the last one on rounding).
    pub fn draw(&mut self, cand: &[(u32, f64)]) -> u32 {
        let r = self.rng.next_f64();
        let mut acc = 0.0;
        for &(id, p) in cand {
            acc += p;
            if r < acc {
                return id;
            }
        }
        cand[cand.len() - 1].0
    }

    /// A uniform number in [0, 1) from the sampler's PRNG (speculative sampling's acceptance
    /// test draws from the same stream, so a seeded run repeats).
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }

    /// Applies the steering's bias and `ignore_eos` ban ([`Steering::bias`]), then the
    /// repetition penalty to `logits` in place: each distinct token among the last
    /// [`SamplerConfig::repeat_last_n`] of `history` has a positive logit divided by the
    /// penalty and a negative one multiplied by it (CTRL, Keskar et al. 2019; the same formula
    /// in llama.cpp and transformers).
    ///
    /// Then the presence and frequency penalties over the same window, with OpenAI's formula:
    /// `logit -= count × frequency_penalty + (count > 0) × presence_penalty`.
    pub fn penalize(&self, logits: &mut [f32], history: &[u32]) {
        self.steering.bias(logits);
        let c = &self.config;
        if c.repeat_last_n == 0 {
            return;
        }
        let start = history.len().saturating_sub(c.repeat_last_n);
        let mut seen: Vec<u32> = history[start..].to_vec();
        seen.sort_unstable();
        if c.repeat_penalty != 1.0 {
            for run in seen.chunk_by(|a, b| a == b) {
                if let Some(l) = logits.get_mut(run[0] as usize) {
                    *l = if *l > 0.0 {
                        *l / c.repeat_penalty
                    } else {
                        *l * c.repeat_penalty
                    };
                }
            }
        }
        if c.presence_penalty != 0.0 || c.frequency_penalty != 0.0 {
            for run in seen.chunk_by(|a, b| a == b) {
                if let Some(l) = logits.get_mut(run[0] as usize) {
                    *l -= run.len() as f32 * c.frequency_penalty + c.presence_penalty;
                }
            }
        }
    }

    /// The tokens left after the filters, with the probabilities the draw uses (summing to 1),
    /// most likely first (ties by id), in [`SamplerConfig::order`]. `logits` are taken as they
    /// are (penalize first); the temperature must be above 0. Tokens whose logit is −∞
    /// (banned, or refused by a grammar) are never among them.
    pub fn distribution(&self, logits: &[f32]) -> Vec<(u32, f64)> {
        let c = &self.config;
        // Under transformers' order every filter sees the temperature-scaled logits.
        let t_filter = match c.order {
            SamplerOrder::LlamaCpp => 1.0,
            SamplerOrder::Transformers => c.temperature,
        };
        // NaN and −∞ are not candidates (`l > −∞` is false for both). The candidates are
        // sorted most likely first, ties by id (a total order: any sort gives the same);
        // under top-k only the best k are gathered, in one pass over the vocabulary.
        let mut cand = if c.top_k > 0 {
            top_k_candidates(logits, c.top_k)
        } else {
            logits
                .iter()
                .enumerate()
                .filter(|&(_, &l)| l > f32::NEG_INFINITY)
                .map(|(i, &l)| (i as u32, l))
                .collect()
        };
        if cand.is_empty() {
            // everything banned: the first token, as greedy picks it
            return vec![(0, 1.0)];
        }
        if c.top_k == 0 && cand.len() >= RADIX_MIN {
            sort_candidates(&mut cand);
        } else {
            cand.sort_by(candidate_order);
        }
        top_p_min_p(cand, c, t_filter)
    }
}

/// The filters after top-k over `cand` (at least one candidate, sorted most likely first,
/// ties by id): top-p, then min-p, each on the probabilities at temperature `t_filter` (1
/// under llama.cpp's order, the temperature under transformers'), then the probabilities at
/// the temperature, as [`Sampler::distribution`] returns them.
fn top_p_min_p(mut cand: Vec<(u32, f32)>, c: &SamplerConfig, t_filter: f32) -> Vec<(u32, f64)> {
    let probs = |cand: &[(u32, f32)], temp: f32| -> Vec<f64> {
        let m = cand[0].1 as f64;
        let e: Vec<f64> = cand
            .iter()
            .map(|&(_, l)| ((l as f64 - m) / temp as f64).exp())
            .collect();
        let s: f64 = e.iter().sum();
        e.into_iter().map(|v| v / s).collect()
    };
    if c.top_p < 1.0 {
        let p = probs(&cand, t_filter);
        let mut acc = 0.0;
        let mut keep = cand.len();
        for (i, pi) in p.iter().enumerate() {
            acc += pi;
            if acc >= c.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        cand.truncate(keep.max(1));
    }
    if c.min_p > 0.0 {
        let p = probs(&cand, t_filter);
        let thr = p[0] * c.min_p as f64;
        let keep = p.iter().take_while(|&&pi| pi >= thr).count().max(1);
        cand.truncate(keep);
    }
    let p = probs(&cand, c.temperature);
    cand.iter().zip(p).map(|(&(id, _), p)| (id, p)).collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn generation_config_sets_only_the_fields_it_has() {
        let v = serde_json::json!({"do_sample": true, "temperature": 0.6, "top_k": 20,
            "top_p": 0.95, "eos_token_id": [1]});
        let m = ModelSampling::from_generation_config(&v, "g.json").unwrap();
        let mut c = SamplerConfig {
            temperature: 0.8,
            min_p: 0.05,
            ..Default::default()
        };
        m.apply(&mut c);
        assert_eq!(
            (c.temperature, c.top_k, c.top_p, c.min_p),
            (0.6, 20, 0.95, 0.05)
        );
        assert_eq!(c.repeat_penalty, 1.0);
        // do_sample false is greedy whatever the temperature says
        let v =
            serde_json::json!({"do_sample": false, "temperature": 0.7, "repetition_penalty": 1.1});
        let m = ModelSampling::from_generation_config(&v, "g.json").unwrap();
        assert_eq!(m.temperature, Some(0.0));
        assert_eq!(m.repeat_penalty, Some(1.1));
        for (v, msg) in [
            (
                serde_json::json!({"top_p": 0}),
                "g.json: 'top_p' is 0, expected a number in (0, 1]",
            ),
            (
                serde_json::json!({"top_k": 2.5}),
                "g.json: 'top_k' is 2.5, expected an integer >= 0",
            ),
            (
                serde_json::json!({"temperature": "hot"}),
                "g.json: 'temperature' is \"hot\", expected a number >= 0",
            ),
            (
                serde_json::json!({"do_sample": 1}),
                "g.json: 'do_sample' is 1, expected true or false",
            ),
        ] {
            let e = ModelSampling::from_generation_config(&v, "g.json").unwrap_err();
            assert_eq!(e.to_string(), msg);
        }
    }

    pub(crate) fn cfg(t: f32) -> SamplerConfig {
        SamplerConfig {
            temperature: t,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 7,
            order: SamplerOrder::LlamaCpp,
        }
    }

    #[test]
    fn argmax_equals_the_first_strictly_larger_scan() {
        let scan = |x: &[f32]| {
            let mut best = 0;
            for (i, &v) in x.iter().enumerate() {
                if v > x[best] {
                    best = i;
                }
            }
            best
        };
        let mut rng = Rng::new(7);
        let cases: Vec<Vec<f32>> = vec![
            vec![],
            vec![1.0],
            vec![f32::NAN, 5.0, 7.0],
            vec![1.0, f32::NAN, 3.0, 3.0, f32::NAN],
            vec![-0.0, 0.0, -1.0],
            vec![f32::NEG_INFINITY; 40],
            (0..1000).map(|i| (i % 37) as f32).collect(),
            (0..262_147)
                .map(|_| (rng.next_f64() * 64.0).floor() as f32 - 32.0)
                .collect(),
        ];
        for x in &cases {
            assert_eq!(argmax(x), scan(x), "{:?}", &x[..x.len().min(8)]);
        }
        // the maximum late in a long row, and ties across the 16-lane chunks
        let mut x = vec![0.5f32; 100];
        x[77] = 2.0;
        x[93] = 2.0;
        assert_eq!(argmax(&x), 77);
        // every length around the lanes and the tail, with ties, ±0, NaN and −∞ mixed in
        let pick = [3.0, 3.0, -0.0, 0.0, f32::NAN, f32::NEG_INFINITY, 1.0, -2.0];
        for len in 0..80 {
            for _ in 0..40 {
                let x: Vec<f32> = (0..len)
                    .map(|_| pick[(rng.next_f64() * pick.len() as f64) as usize])
                    .collect();
                assert_eq!(argmax(&x), scan(&x), "{x:?}");
            }
        }
    }

    #[test]
    fn top_k_selection_keeps_the_full_sorts_order() {
        // many ties: the selected candidates and their order are the full sort's
        let logits: Vec<f32> = (0..5000).map(|i| ((i * 7919) % 13) as f32 * 0.5).collect();
        for top_k in [1, 2, 40, 385, 4999] {
            let s = Sampler::new(SamplerConfig {
                temperature: 1.0,
                top_k,
                top_p: 1.0,
                min_p: 0.0,
                ..SamplerConfig::default()
            });
            let got = s.distribution(&logits);
            let mut all: Vec<(u32, f32)> = logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, l))
                .collect();
            all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let ids: Vec<u32> = got.iter().map(|c| c.0).collect();
            let want: Vec<u32> = all[..top_k].iter().map(|c| c.0).collect();
            assert_eq!(ids, want, "top_k {top_k}");
        }
    }

    #[test]
    fn greedy_takes_first_max() {
        let mut s = Sampler::new(cfg(0.0));
        assert_eq!(s.sample(&mut [0.1, 3.0, 3.0, -1.0], &[]), 1);
    }

    #[test]
    fn rng_sequence_is_fixed() {
        let mut r = Rng::new(42);
        let a = [r.next_u64(), r.next_u64()];
        let mut r2 = Rng::new(42);
        assert_eq!(a, [r2.next_u64(), r2.next_u64()]);
        assert_ne!(Rng::new(43).next_u64(), a[0]);
    }

    #[test]
    fn seeded_sampling_repeats_and_follows_distribution() {
        let logits = [0.0f32, (3f32).ln(), f32::NEG_INFINITY, 0.0];
        let draw = |seed| {
            let mut s = Sampler::new(SamplerConfig { seed, ..cfg(1.0) });
            (0..2000)
                .map(|_| s.sample(&mut logits.clone(), &[]))
                .collect::<Vec<u32>>()
        };
        let a = draw(5);
        assert_eq!(a, draw(5));
        assert_ne!(a, draw(6));
        let count = |t| a.iter().filter(|&&x| x == t).count();
        assert_eq!(count(2), 0);
        // p = [0.2, 0.6, 0, 0.2]
        assert!((1100..1300).contains(&count(1)), "{}", count(1));
    }

    #[test]
    fn filters_cut_the_tail() {
        let logits = [5.0f32, 4.0, 1.0, 0.5];
        let mut s = Sampler::new(SamplerConfig {
            top_k: 1,
            ..cfg(1.0)
        });
        assert!((0..50).all(|_| s.sample(&mut logits.clone(), &[]) == 0));
        // p ≈ [0.705, 0.259, 0.013, 0.008]; top_p 0.9 keeps two
        let mut s = Sampler::new(SamplerConfig {
            top_p: 0.9,
            ..cfg(1.0)
        });
        assert!((0..300).all(|_| s.sample(&mut logits.clone(), &[]) < 2));
        // min_p 0.5 keeps only the first (0.259 < 0.35)
        let mut s = Sampler::new(SamplerConfig {
            min_p: 0.5,
            ..cfg(1.0)
        });
        assert!((0..50).all(|_| s.sample(&mut logits.clone(), &[]) == 0));
    }

    #[test]
    fn repetition_penalty_flips_greedy_choice() {
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            ..cfg(0.0)
        });
        let mut l = [4.0f32, 3.0, -1.0];
        assert_eq!(s.sample(&mut l, &[0, 2]), 1);
        assert_eq!(l, [2.0, 3.0, -2.0]);
    }

    #[test]
    fn presence_and_frequency_penalties_follow_openai() {
        let mut s = Sampler::new(SamplerConfig {
            presence_penalty: 0.5,
            frequency_penalty: 1.0,
            ..cfg(0.0)
        });
        let mut l = [4.0f32, 3.0, 1.0];
        // token 0 seen twice: 4 - 2×1 - 0.5 = 1.5; token 2 once: 1 - 1 - 0.5 = -0.5
        assert_eq!(s.sample(&mut l, &[0, 2, 0]), 1);
        assert_eq!(l, [1.5, 3.0, -0.5]);
    }

    #[test]
    fn repetition_penalty_window_follows_repeat_last_n() {
        // History [0, 1, 2]: the last 2 tokens are penalized, or all three, or none.
        let run = |n: usize| {
            let s = Sampler::new(SamplerConfig {
                repeat_penalty: 1.25,
                repeat_last_n: n,
                ..cfg(0.0)
            });
            let mut l = [2.5f32, -2.0, 5.0, 1.0];
            s.penalize(&mut l, &[0, 1, 2]);
            l
        };
        assert_eq!(run(2), [2.5, -2.5, 4.0, 1.0]);
        assert_eq!(run(WHOLE_SEQUENCE), [2.0, -2.5, 4.0, 1.0]);
        assert_eq!(run(3), [2.0, -2.5, 4.0, 1.0]);
        assert_eq!(run(0), [2.5, -2.0, 5.0, 1.0]);
    }

    #[test]
    fn the_two_orders_give_their_own_distributions() {
        // Logits ln(4), ln(2), ln(1), ln(1) -> probabilities at T=1: [0.5, 0.25, 0.125, 0.125].
        let logits = [4f32.ln(), 2f32.ln(), 0.0, 0.0];
        let dist = |order, temperature, top_p, min_p| {
            Sampler::new(SamplerConfig {
                temperature,
                top_p,
                min_p,
                order,
                ..cfg(1.0)
            })
            .distribution(&logits)
        };
        let close = |got: Vec<(u32, f64)>, want: &[(u32, f64)]| {
            assert_eq!(got.len(), want.len(), "{got:?}");
            for (g, w) in got.iter().zip(want) {
                assert_eq!(g.0, w.0, "{got:?}");
                assert!((g.1 - w.1).abs() < 1e-6, "{got:?} vs {want:?}");
            }
        };
        // top-p 0.7 at T=2. llama.cpp: on [0.5, 0.25, ...] keeps 2 (0.75 >= 0.7), then T=2
        // gives weights 2:sqrt(2) -> [0.585786, 0.414214].
        close(
            dist(SamplerOrder::LlamaCpp, 2.0, 0.7, 0.0),
            &[(0, 0.585786), (1, 0.414214)],
        );
        // transformers: at T=2 the probabilities are 2:1.414:1:1 / 5.414 = [0.369398,
        // 0.261203, 0.184699, 0.184699]; cumulative 0.369, 0.631, 0.815: keeps 3, renormalized.
        close(
            dist(SamplerOrder::Transformers, 2.0, 0.7, 0.0),
            &[(0, 0.453082), (1, 0.320377), (2, 0.226541)],
        );
        // min-p 0.4 at T=2. llama.cpp: threshold 0.2 on [0.5, 0.25, 0.125, 0.125] keeps 2.
        close(
            dist(SamplerOrder::LlamaCpp, 2.0, 1.0, 0.4),
            &[(0, 0.585786), (1, 0.414214)],
        );
        // transformers: threshold 0.4 * 0.369398 = 0.147759 keeps all four.
        close(
            dist(SamplerOrder::Transformers, 2.0, 1.0, 0.4),
            &[(0, 0.369398), (1, 0.261203), (2, 0.184699), (3, 0.184699)],
        );
    }
}

// the selection's equivalence proptests (they use `tests::cfg`)
#[cfg(test)]
#[path = "sampler_props.rs"]
mod props;
