//! Response bodies in the OpenAI shapes: chat completions and their stream chunks, text
//! completions and theirs, usage, logprobs; and the server-sent-events framing (`data: JSON`
//! lines, ended by `data: [DONE]`).

use serde_json::{json, Value};

use crate::engine::tools::ToolCall;
use crate::engine::{Outcome, TokenLogprob};

/// Which endpoint a body belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// What every body of one response repeats.
#[derive(Clone, Debug)]
pub struct Head {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub model: String,
    /// `stream_options.include_usage`: chunks carry `"usage": null` and a last chunk the usage.
    pub include_usage: bool,
}

/// `usage` of an outcome. When the server speculates, `completion_tokens_details` carries
/// OpenAI's `accepted_prediction_tokens` and `rejected_prediction_tokens` (the drafted tokens
/// the target accepted and rejected; OpenAI's names for its Predicted Outputs) and
/// `speculative`, Deltafin's counters ([`crate::engine::SpecStats::json`]).
pub fn usage(o: &Outcome) -> Value {
    let mut u = json!({
        "prompt_tokens": o.prompt_tokens,
        "completion_tokens": o.completion_tokens,
        "total_tokens": o.prompt_tokens + o.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": o.cached_tokens},
    });
    if let Some(sp) = &o.speculative {
        u["completion_tokens_details"] = json!({
            "accepted_prediction_tokens": sp.accepted,
            "rejected_prediction_tokens": sp.drafted - sp.accepted,
        });
        u["speculative"] = sp.json();
    }
    u
}

fn lp_entry(t: &TokenLogprob) -> Value {
    json!({
        "token": t.token,
        "logprob": t.logprob,
        "bytes": t.bytes,
        "top_logprobs": t.top.iter().map(|(s, b, l)| json!({
            "token": s, "logprob": l, "bytes": b,
        })).collect::<Vec<_>>(),
    })
}

/// Logprobs in the chat shape (`{"content": [...]}`), or in the legacy completions shape
/// (`tokens`, `token_logprobs`, `top_logprobs` as maps, `text_offset` from `offset`).
pub fn logprobs(kind: Kind, lps: &[TokenLogprob], offset: usize) -> Value {
    match kind {
        Kind::Chat => json!({"content": lps.iter().map(lp_entry).collect::<Vec<_>>()}),
        Kind::Completion => {
            let mut off = offset;
            let mut offsets = Vec::new();
            for t in lps {
                offsets.push(off);
                off += t.token.len();
            }
            json!({
                "tokens": lps.iter().map(|t| &t.token).collect::<Vec<_>>(),
                "token_logprobs": lps.iter().map(|t| t.logprob).collect::<Vec<_>>(),
                "top_logprobs": lps.iter().map(|t| {
                    let m: serde_json::Map<String, Value> =
                        t.top.iter().map(|(s, _, l)| (s.clone(), json!(l))).collect();
                    Value::Object(m)
                }).collect::<Vec<_>>(),
                "text_offset": offsets,
            })
        }
    }
}

/// `tool_calls` entries (with `index` when streamed).
pub fn tool_calls(calls: &[ToolCall], indexed: bool) -> Value {
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut v = json!({
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                });
                if indexed {
                    v["index"] = json!(i);
                }
                v
            })
            .collect(),
    )
}

impl Head {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn wrap(&self, choices: Value, chunk: bool) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": choices,
        });
        if chunk && self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    /// A stream chunk of choice 0: `delta` for chat (or `text` for completions), logprobs,
    /// finish reason.
    pub fn chunk(&self, delta: Value, lps: Option<Value>, finish: Option<&str>) -> Value {
        self.chunk_of(0, delta, lps, finish)
    }

    /// [`Head::chunk`] of choice `index` (a request with `n` > 1).
    pub fn chunk_of(
        &self,
        index: usize,
        delta: Value,
        lps: Option<Value>,
        finish: Option<&str>,
    ) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                json!({"index": index, "delta": delta, "logprobs": lps, "finish_reason": finish})
            }
            Kind::Completion => json!({
                "index": index,
                "text": delta.get("content").cloned().unwrap_or(json!("")),
                "logprobs": lps,
                "finish_reason": finish,
            }),
        };
        self.wrap(json!([choice]), true)
    }

    /// The last chunk of a stream with `include_usage`: empty `choices` and the usage.
    pub fn usage_chunk(&self, o: &Outcome) -> Value {
        let mut v = self.wrap(json!([]), true);
        v["usage"] = usage(o);
        v
    }

    /// A whole (non-streamed) response of one choice.
    pub fn complete(&self, text: &str, lps: Option<Value>, o: &Outcome) -> Value {
        self.complete_all(&[(text.to_string(), lps, o.clone())], 1)
    }

    /// A whole response of `choices` (text, logprobs, outcome), indexed in order, `n` per
    /// prompt; the usage counts each prompt once and every choice's tokens ([`total_usage`]).
    pub fn complete_all(&self, choices: &[(String, Option<Value>, Outcome)], n: usize) -> Value {
        let list: Vec<Value> = choices
            .iter()
            .enumerate()
            .map(|(i, (text, lps, o))| self.choice(i, text, lps.clone(), o))
            .collect();
        let mut v = self.wrap(Value::Array(list), false);
        let outcomes: Vec<&Outcome> = choices.iter().map(|c| &c.2).collect();
        v["usage"] = usage(&total_usage(&outcomes, n));
        v
    }

    fn choice(&self, index: usize, text: &str, lps: Option<Value>, o: &Outcome) -> Value {
        let mut choice = match self.kind {
            Kind::Chat => {
                let mut msg = json!({"role": "assistant", "content": text});
                if !o.tool_calls.is_empty() {
                    msg["tool_calls"] = tool_calls(&o.tool_calls, false);
                    if text.is_empty() {
                        msg["content"] = Value::Null;
                    }
                }
                json!({"index": 0, "message": msg, "logprobs": lps,
                       "finish_reason": o.finish.as_str()})
            }
            Kind::Completion => json!({"index": 0, "text": text, "logprobs": lps,
                                       "finish_reason": o.finish.as_str()}),
        };
        choice["index"] = json!(index);
        choice
    }
}

/// The usage of a request whose choices ended as `outcomes` (at least one), `n` choices per
/// prompt in order of prompt: each prompt counted once (its tokens and cached tokens as its
/// first choice's), completion tokens summed over the choices.
pub fn total_usage(outcomes: &[&Outcome], n: usize) -> Outcome {
    let mut o = outcomes[0].clone();
    let firsts = || outcomes.iter().step_by(n.max(1));
    o.prompt_tokens = firsts().map(|x| x.prompt_tokens).sum();
    o.cached_tokens = firsts().map(|x| x.cached_tokens).sum();
    o.completion_tokens = outcomes.iter().map(|x| x.completion_tokens).sum();
    o
}

/// One server-sent event carrying `v`.
pub fn event(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// The event that ends a stream.
pub const DONE: &str = "data: [DONE]\n\n";
