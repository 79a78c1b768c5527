//! Token log-probabilities for a reply ([`TokenLogprob`]): the natural-log softmax of a
//! token's logits row and the most likely alternatives, with their texts.

use crate::tokenizer::ModelTokenizer;

/// One token's log-probability (natural log, over the model's distribution before sampling
/// filters and temperature) with its text and UTF-8 bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token's text (special tokens as their text; part of a character as U+FFFD).
    pub token: String,
    /// Its bytes (what the model's vocabulary holds for it when it is a whole piece).
    pub bytes: Vec<u8>,
    /// log p(token).
    pub logprob: f32,
    /// The most likely tokens at this step, most likely first (ties by id).
    pub top: Vec<(String, Vec<u8>, f32)>,
}

/// Natural-log softmax of `x` (f64 accumulation).
pub fn log_softmax(x: &[f32]) -> Vec<f32> {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = x.iter().map(|&v| (v as f64 - m).exp()).sum();
    let ls = m + s.ln();
    x.iter().map(|&v| (v as f64 - ls) as f32).collect()
}

impl TokenLogprob {
    /// The entry of token `id` given the log-probabilities `lp` of its step (one per
    /// vocabulary id), with the `top` most likely tokens of the step.
    pub fn new(tok: &ModelTokenizer, lp: &[f32], id: u32, top: usize) -> Self {
        let text = |t: u32| {
            let s = tok.token_text(t);
            let b = s.as_bytes().to_vec();
            (s, b)
        };
        let mut order: Vec<u32> = Vec::new();
        if top > 0 {
            let mut idx: Vec<u32> = (0..lp.len() as u32).collect();
            let k = top.min(idx.len());
            idx.select_nth_unstable_by(k - 1, |a, b| {
                lp[*b as usize].total_cmp(&lp[*a as usize]).then(a.cmp(b))
            });
            idx.truncate(k);
            idx.sort_by(|a, b| lp[*b as usize].total_cmp(&lp[*a as usize]).then(a.cmp(b)));
            order = idx;
        }
        let (token, bytes) = text(id);
        TokenLogprob {
            token,
            bytes,
            logprob: lp[id as usize],
            top: order
                .into_iter()
                .map(|t| {
                    let (s, b) = text(t);
                    (s, b, lp[t as usize])
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_is_normalized_and_shift_free() {
        let lp = log_softmax(&[1.0, 2.0, 3.0]);
        let total: f64 = lp.iter().map(|&v| (v as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        assert!((lp[2] - lp[1] - 1.0).abs() < 1e-6 && (lp[1] - lp[0] - 1.0).abs() < 1e-6);
        let shifted = log_softmax(&[101.0, 102.0, 103.0]);
        assert!(shifted.iter().zip(&lp).all(|(a, b)| (a - b).abs() < 1e-6));
        assert!((lp[2] + 0.407_606).abs() < 1e-6, "{}", lp[2]);
    }
}
