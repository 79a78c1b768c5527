//! Rotary position embeddings (RoPE, Su et al. 2021) as the configs describe them: which
//! dimensions rotate together ([`RopeStyle`]), the scaling variants transformers 5.24
//! implements in `modeling_rope_utils.py` ([`RopeScaling`]: default, linear, `llama3`, YaRN
//! with its `truncate` flag), read from either `config.json` dialect ([`HfRope`]), and the
//! inverse frequencies each gives.
//!
//! Dialects: published checkpoints give `rope_theta` at the top level and `rope_scaling`
//! (`null`, or an object with `type` or `rope_type`); transformers 5 writes `rope_parameters`
//! (an object with `rope_type`, `rope_theta` and the scaling numbers). `rope_parameters` wins
//! where both are present.

use serde_json::{Map, Value};

use crate::backend::cpu::ops::rope_inv_freq;

/// Which dimensions RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// `i` with `i + head_dim/2` ([`crate::backend::cpu::ops::rope_neox`]): Hugging Face
    /// checkpoints, llama.cpp's NeoX architectures (`qwen3`, `qwen3moe`, `gemma3`).
    Neox,
    /// `2i` with `2i + 1` ([`crate::backend::cpu::ops::rope_interleaved`]): llama.cpp's `llama`
    /// architecture, whose converter permuted the q/k rows to match.
    Interleaved,
}

/// `llama3` scaling (transformers' `_compute_llama3_parameters`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3 {
    /// Divisor of the low frequencies.
    pub factor: f64,
    /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are scaled.
    pub low_freq_factor: f64,
    /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
    pub high_freq_factor: f64,
    /// The context length the model was pre-trained with, in tokens.
    pub original_max_position_embeddings: f64,
}

/// YaRN scaling (Peng et al. 2023, "YaRN: Efficient Context Window Extension";
/// transformers' `_compute_yarn_parameters`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// Context extension factor (interpolated frequencies are divided by it).
    pub factor: f64,
    /// The context length the model was pre-trained with, in tokens.
    pub original_max_position_embeddings: f64,
    /// Default 32 (also when 0 or null).
    pub beta_fast: f64,
    /// Default 1 (also when 0 or null).
    pub beta_slow: f64,
    /// `mscale` of the attention factor ([`Yarn::attention_factor`]).
    pub mscale: Option<f64>,
    /// `mscale_all_dim` of the attention factor (DeepSeek also scales the softmax by it).
    pub mscale_all_dim: Option<f64>,
    /// Explicit `attention_factor`, if given.
    pub attention_factor: Option<f64>,
    /// Round the correction range outward (default true).
    pub truncate: bool,
}

/// The RoPE scaling a config asks for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// `base^(-2i/d)`.
    Default,
    /// Frequencies divided by `factor`.
    Linear { factor: f64 },
    /// Llama 3's wavelength-dependent scaling.
    Llama3(Llama3),
    /// YaRN.
    Yarn(Yarn),
}

/// Why a config's RoPE parameters were refused; `Display` gives the message (without the
/// file label).
#[derive(Clone, Debug, PartialEq)]
pub enum RopeError {
    /// A `rope_type` the family does not implement (the family's supported list follows).
    Unsupported {
        rope_type: String,
        supported: String,
    },
    /// A required number is missing or not a number.
    Missing(&'static str),
    /// The numbers are out of range.
    OutOfRange(String),
}

impl std::fmt::Display for RopeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RopeError::Unsupported {
                rope_type,
                supported,
            } => write!(
                f,
                "rope type '{rope_type}' is not supported (only {supported})"
            ),
            RopeError::Missing(m) => f.write_str(m),
            RopeError::OutOfRange(m) => f.write_str(m),
        }
    }
}

/// YaRN's `get_mscale`: `0.1 · m · ln(s) + 1` for `s > 1`, else 1.
pub fn get_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

/// Default inverse frequencies `base^(-2i/dim)` (`dim / 2` of them) in f64.
pub fn default_inv_freq_f64(dim: usize, base: f64) -> Vec<f64> {
    (0..dim / 2)
        .map(|i| 1.0 / base.powf((2 * i) as f64 / dim as f64))
        .collect()
}

/// Default inverse frequencies computed in f32 as torch float32 tensors give them:
/// `1 / base^(2i/dim)` with the power taken in f32.
pub fn default_inv_freq_f32(dim: usize, base: f64) -> Vec<f32> {
    (0..dim / 2)
        .map(|i| 1.0 / (base as f32).powf((2 * i) as f32 / dim as f32))
        .collect()
}

/// The RoPE fields of a Hugging Face `config.json`, in either dialect.
#[derive(Clone, Copy, Debug)]
pub struct HfRope<'a> {
    /// transformers 5: `rope_parameters`.
    pub parameters: Option<&'a Value>,
    /// Published: `rope_scaling`.
    pub scaling: Option<&'a Value>,
    /// Published: top-level `rope_theta`.
    pub theta: Option<f64>,
}

impl<'a> HfRope<'a> {
    /// The parameters object: `rope_parameters`, else `rope_scaling`.
    pub fn object(&self) -> Option<&'a Map<String, Value>> {
        self.parameters
            .and_then(|v| v.as_object())
            .or_else(|| self.scaling.and_then(|v| v.as_object()))
    }

    /// RoPE base: `rope_parameters.rope_theta`, else `rope_theta`, else `default` (the
    /// config class's default: 10000 for most, 150000 for GPT-OSS).
    pub fn theta(&self, default: f64) -> f64 {
        self.parameters
            .and_then(|p| p.get("rope_theta"))
            .and_then(|v| v.as_f64())
            .or(self.theta)
            .unwrap_or(default)
    }

    /// RoPE type: `rope_type` (or `type`) of `rope_parameters`, else of `rope_scaling`, else
    /// `default`.
    pub fn rope_type(&self) -> String {
        let of = |v: Option<&Value>| -> Option<String> {
            let o = v?.as_object()?;
            o.get("rope_type")
                .or_else(|| o.get("type"))
                .and_then(|t| t.as_str())
                .map(str::to_string)
        };
        of(self.parameters)
            .or_else(|| of(self.scaling))
            .unwrap_or_else(|| "default".into())
    }

    /// The scaling, checked, among the `supported` RoPE types of a family (e.g.
    /// `["default", "yarn"]`). A YaRN `factor` that is absent is
    /// `max_position_embeddings / original_max_position_embeddings`.
    ///
    /// Errors: a type outside `supported`, a required number missing, numbers out of range
    /// (`llama3`: factor ≥ 1, 0 < low < high, original context > 0; YaRN and linear: factor
    /// and original context > 0).
    pub fn scaling(
        &self,
        max_position_embeddings: usize,
        supported: &[&str],
    ) -> Result<RopeScaling, RopeError> {
        let rt = self.rope_type();
        if !supported.contains(&rt.as_str()) {
            return Err(RopeError::Unsupported {
                rope_type: rt,
                supported: supported.join(", "),
            });
        }
        let o = self.object();
        let g = |k: &str| o.and_then(|o| o.get(k)).and_then(|v| v.as_f64());
        match rt.as_str() {
            "default" => Ok(RopeScaling::Default),
            "linear" => {
                let factor = g("factor")
                    .ok_or(RopeError::Missing("linear RoPE needs a numeric 'factor'"))?;
                if !(factor.is_finite() && factor > 0.0) {
                    return Err(RopeError::OutOfRange(format!(
                        "linear RoPE factor {factor} out of range"
                    )));
                }
                Ok(RopeScaling::Linear { factor })
            }
            "llama3" => {
                let missing = RopeError::Missing(
                    "llama3 RoPE needs numeric factor, low_freq_factor and high_freq_factor",
                );
                // transformers' RoPE standardization: `original_max_position_embeddings`
                // defaults to `max_position_embeddings` (`setdefault`), for llama3 and yarn.
                let p = Llama3 {
                    factor: g("factor").ok_or(missing.clone())?,
                    low_freq_factor: g("low_freq_factor").ok_or(missing.clone())?,
                    high_freq_factor: g("high_freq_factor").ok_or(missing.clone())?,
                    original_max_position_embeddings: g("original_max_position_embeddings")
                        .unwrap_or(max_position_embeddings as f64),
                };
                let (f, lo, hi, old) = (
                    p.factor,
                    p.low_freq_factor,
                    p.high_freq_factor,
                    p.original_max_position_embeddings,
                );
                if !(f >= 1.0 && lo > 0.0 && hi > lo && old > 0.0) {
                    return Err(RopeError::OutOfRange(format!("llama3 RoPE parameters out of range (factor {f}, low_freq_factor {lo}, high_freq_factor {hi}, original_max_position_embeddings {old})")));
                }
                Ok(RopeScaling::Llama3(p))
            }
            "yarn" => {
                let orig =
                    g("original_max_position_embeddings").unwrap_or(max_position_embeddings as f64);
                let factor = g("factor").unwrap_or(max_position_embeddings as f64 / orig);
                let nz = |v: Option<f64>| v.filter(|x| *x != 0.0);
                let y = Yarn {
                    factor,
                    original_max_position_embeddings: orig,
                    beta_fast: nz(g("beta_fast")).unwrap_or(32.0),
                    beta_slow: nz(g("beta_slow")).unwrap_or(1.0),
                    mscale: g("mscale"),
                    mscale_all_dim: g("mscale_all_dim"),
                    attention_factor: g("attention_factor"),
                    truncate: o
                        .and_then(|o| o.get("truncate"))
                        .and_then(|v| v.as_bool())
                        .unwrap_or(true),
                };
                if !(y.factor > 0.0 && y.original_max_position_embeddings > 0.0) {
                    return Err(RopeError::OutOfRange(format!(
                        "yarn RoPE parameters out of range (factor {}, original_max_position_embeddings {})",
                        y.factor, y.original_max_position_embeddings
                    )));
                }
                Ok(RopeScaling::Yarn(y))
            }
            other => Err(RopeError::Unsupported {
                rope_type: other.to_string(),
                supported: supported.join(", "),
            }),
        }
    }
}

impl Llama3 {
    /// Applies the scaling to the default frequencies `base` (radians per token), as
    /// transformers' `_compute_llama3_parameters` does: with wavelength `λ = 2π / f`,
    /// frequencies with `λ > old_ctx / low_freq_factor` are divided by `factor`, those with
    /// `λ < old_ctx / high_freq_factor` kept, and those between interpolated as
    /// `(1 − s) · f / factor + s · f` with `s = (old_ctx / λ − low) / (high − low)`; in f64.
    pub fn apply(&self, base: &[f32]) -> Vec<f32> {
        let (factor, lo, hi, old) = (
            self.factor,
            self.low_freq_factor,
            self.high_freq_factor,
            self.original_max_position_embeddings,
        );
        let (lo_wave, hi_wave) = (old / lo, old / hi);
        base.iter()
            .map(|&f| {
                let f = f as f64;
                let wave = 2.0 * std::f64::consts::PI / f;
                let g = if wave > lo_wave {
                    f / factor
                } else if wave < hi_wave {
                    f
                } else {
                    let s = (old / wave - lo) / (hi - lo);
                    (1.0 - s) * f / factor + s * f
                };
                g as f32
            })
            .collect()
    }
}

impl Yarn {
    /// The factor transformers multiplies cos and sin by: `attention_factor`, else
    /// `mscale(factor, mscale) / mscale(factor, mscale_all_dim)` when both are non-zero, else
    /// `mscale(factor, 1)` ([`get_mscale`]).
    pub fn attention_factor(&self) -> f64 {
        match (self.attention_factor, self.mscale, self.mscale_all_dim) {
            (Some(a), _, _) => a,
            (None, Some(m), Some(ma)) if m != 0.0 && ma != 0.0 => {
                get_mscale(self.factor, m) / get_mscale(self.factor, ma)
            }
            _ => get_mscale(self.factor, 1.0),
        }
    }

    /// The correction range `(low, high)` in dimensions, in f64: where `beta_fast` /
    /// `beta_slow` rotations fit the original context, `dim · ln(L / (2π β)) / (2 ln base)`,
    /// floored / ceiled when `truncate` (not yet clamped).
    fn correction_range(&self, dim: usize, base: f64) -> (f64, f64) {
        let corr = |rot: f64| {
            (dim as f64
                * (self.original_max_position_embeddings / (rot * 2.0 * std::f64::consts::PI)).ln())
                / (2.0 * base.ln())
        };
        let (mut low, mut high) = (corr(self.beta_fast), corr(self.beta_slow));
        if self.truncate {
            low = low.floor();
            high = high.ceil();
        }
        (low, high)
    }

    /// Inverse frequencies (`dim / 2`) computed in f64: with
    /// `f_e = base^(-2i/dim)` and `f_i = f_e / factor`, `f_i (1 − r_i) + f_e r_i` where
    /// `r_i = 1 − clamp((i − low) / (high − low), 0, 1)` over the correction range clamped to
    /// `[0, dim − 1]` (GPT-OSS).
    pub fn inv_freq(&self, dim: usize, base: f64) -> Vec<f64> {
        let fe = default_inv_freq_f64(dim, base);
        let (low, high) = self.correction_range(dim, base);
        let (low, mut high) = (low.max(0.0), high.min(dim as f64 - 1.0));
        if low == high {
            high += 0.001;
        }
        fe.iter()
            .enumerate()
            .map(|(i, &e)| {
                let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                let extra = 1.0 - ramp;
                (e / self.factor) * (1.0 - extra) + e * extra
            })
            .collect()
    }

    /// The same frequencies computed in f32 as transformers computes them with torch
    /// float32 tensors (`pos = base^(2i/dim)`, extrapolated `1/pos`, interpolated
    /// `1/(factor·pos)`, mixed by the ramp), for DeepSeek V3 whose reference is that f32 pass.
    pub fn inv_freq_f32(&self, dim: usize, base: f64) -> Vec<f32> {
        let pos: Vec<f32> = (0..dim / 2)
            .map(|i| (base as f32).powf((2 * i) as f32 / dim as f32))
            .collect();
        let (low, high) = self.correction_range(dim, base);
        let low = low.max(0.0) as f32;
        let mut high = high.min(dim as f64 - 1.0) as f32;
        if low == high {
            high += 0.001;
        }
        let factor = self.factor as f32;
        pos.iter()
            .enumerate()
            .map(|(i, &p)| {
                let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                let e = 1.0 - ramp;
                let extrap = 1.0 / p;
                let interp = 1.0 / (factor * p);
                interp * (1.0 - e) + extrap * e
            })
            .collect()
    }
}

impl RopeScaling {
    /// Inverse frequencies (`dim / 2`, radians per token) for RoPE base `base`: default
    /// `base^(-2i/dim)` (computed in f64, rounded to f32), linear (divided by the factor),
    /// `llama3` ([`Llama3::apply`]) or YaRN in f64 ([`Yarn::inv_freq`]).
    pub fn inv_freq(&self, dim: usize, base: f64) -> Vec<f32> {
        match self {
            RopeScaling::Default => rope_inv_freq(dim, base as f32, 1.0),
            RopeScaling::Linear { factor } => rope_inv_freq(dim, base as f32, 1.0 / *factor as f32),
            RopeScaling::Llama3(p) => p.apply(&rope_inv_freq(dim, base as f32, 1.0)),
            RopeScaling::Yarn(y) => y.inv_freq(dim, base).iter().map(|&f| f as f32).collect(),
        }
    }

    /// The factor multiplying cos and sin: YaRN's [`Yarn::attention_factor`], else 1.
    pub fn attention_factor(&self) -> f64 {
        match self {
            RopeScaling::Yarn(y) => y.attention_factor(),
            _ => 1.0,
        }
    }

    /// The YaRN parameters, if this is YaRN.
    pub fn yarn(&self) -> Option<&Yarn> {
        match self {
            RopeScaling::Yarn(y) => Some(y),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rope(parameters: Value) -> HfRope<'static> {
        HfRope {
            parameters: Some(Box::leak(Box::new(parameters))),
            scaling: None,
            theta: None,
        }
    }

    #[test]
    fn both_dialects_and_defaults() {
        let published =
            json!({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096});
        let r = HfRope {
            parameters: None,
            scaling: Some(&published),
            theta: Some(5e5),
        };
        assert_eq!(r.theta(1e4), 5e5);
        assert_eq!(r.rope_type(), "yarn");
        let Ok(RopeScaling::Yarn(y)) = r.scaling(16384, &["default", "yarn"]) else {
            panic!("yarn expected");
        };
        assert_eq!(
            (y.factor, y.beta_fast, y.beta_slow, y.truncate),
            (4.0, 32.0, 1.0, true)
        );
        // a missing factor is max_position_embeddings / original_max_position_embeddings
        let r = rope(
            json!({"rope_type": "yarn", "rope_theta": 1e4, "original_max_position_embeddings": 1024}),
        );
        assert_eq!(
            r.scaling(4096, &["yarn"]).unwrap().yarn().unwrap().factor,
            4.0
        );
        let none = HfRope {
            parameters: None,
            scaling: None,
            theta: None,
        };
        assert_eq!(none.theta(150000.0), 150000.0);
        assert_eq!(none.scaling(1, &["default"]), Ok(RopeScaling::Default));
    }

    #[test]
    fn refusals_name_the_problem() {
        let r = rope(json!({"rope_type": "longrope"}));
        assert_eq!(
            r.scaling(1, &["default", "yarn"]).unwrap_err().to_string(),
            "rope type 'longrope' is not supported (only default, yarn)"
        );
        let r = rope(json!({"rope_type": "llama3", "factor": 8.0}));
        assert_eq!(
            r.scaling(1, &["default", "llama3"])
                .unwrap_err()
                .to_string(),
            "llama3 RoPE needs numeric factor, low_freq_factor and high_freq_factor"
        );
        // original_max_position_embeddings defaults to max_position_embeddings (transformers'
        // standardization), for llama3 and yarn alike.
        let r = rope(
            json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0}),
        );
        match r.scaling(8192, &["llama3"]).unwrap() {
            RopeScaling::Llama3(p) => assert_eq!(p.original_max_position_embeddings, 8192.0),
            other => panic!("{other:?}"),
        }
        let r = rope(json!({"rope_type": "yarn", "factor": 4.0}));
        let s = r.scaling(2048, &["yarn"]).unwrap();
        let y = s.yarn().unwrap();
        assert_eq!(
            (y.factor, y.original_max_position_embeddings),
            (4.0, 2048.0)
        );
        let r = rope(
            json!({"rope_type": "yarn", "factor": -1.0, "original_max_position_embeddings": 64}),
        );
        assert_eq!(
            r.scaling(1, &["yarn"]).unwrap_err().to_string(),
            "yarn RoPE parameters out of range (factor -1, original_max_position_embeddings 64)"
        );
    }

    #[test]
    fn yarn_in_f64_and_f32_agree_to_f32_rounding() {
        let y = Yarn {
            factor: 32.0,
            original_max_position_embeddings: 4096.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: None,
            mscale_all_dim: None,
            attention_factor: None,
            truncate: false,
        };
        let (a, b) = (y.inv_freq(64, 150000.0), y.inv_freq_f32(64, 150000.0));
        for (x, z) in a.iter().zip(&b) {
            assert!((x - *z as f64).abs() <= 1e-6 * x.abs(), "{x} vs {z}");
        }
        assert!((y.attention_factor() - (0.1 * 32f64.ln() + 1.0)).abs() < 1e-15);
    }
}
