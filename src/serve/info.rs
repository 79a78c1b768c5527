//! The endpoints around generation: `GET /v1/models` and `/v1/models/{id}` (OpenAI), and
//! llama-server's `POST /tokenize`, `POST /detokenize` and `GET /props`; and the reading of
//! `prompt` of `/v1/completions` (a string, a list of strings, token ids, or a list of lists
//! of ids).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::error::ApiError;
use super::state::{parse, AppState};

/// A prompt as the completions endpoint takes it.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Text, tokenized with the model's BOS.
    Text(String),
    /// Token ids, used as they are (nothing added).
    Ids(Vec<u32>),
}

/// Reads `prompt`: a string, a list of strings, a list of token ids, or a list of lists of ids;
/// one [`Prompt`] per prompt, in order. Errors: a 400 naming `prompt` for any other shape (a
/// list mixing strings and lists included), an id that is not in the vocabulary of `vocab`
/// tokens, or an empty prompt.
pub fn read_prompts(v: &Value, vocab: usize) -> Result<Vec<Prompt>, ApiError> {
    const SHAPES: &str = "prompt must be a string, a list of strings, a list of token ids or a \
                          list of lists of token ids";
    let bad = |m: String| ApiError::invalid(Some("prompt"), m);
    let ids = |a: &[Value], at: &str| -> Result<Prompt, ApiError> {
        if a.is_empty() {
            return Err(bad(format!("{at} is empty")));
        }
        let mut out = Vec::with_capacity(a.len());
        for (i, x) in a.iter().enumerate() {
            match x.as_u64() {
                Some(t) if (t as usize) < vocab => out.push(t as u32),
                _ => {
                    return Err(bad(format!(
                        "{at}[{i}] is {x}, expected a token id below {vocab} (the vocabulary)"
                    )))
                }
            }
        }
        Ok(Prompt::Ids(out))
    };
    let text = |s: &str, at: &str| {
        if s.is_empty() {
            Err(bad(format!("{at} is empty")))
        } else {
            Ok(Prompt::Text(s.to_string()))
        }
    };
    match v {
        Value::String(s) if s.is_empty() => Err(bad("the prompt is empty".into())),
        Value::String(s) => Ok(vec![text(s, "prompt")?]),
        Value::Array(a) => match a.first() {
            None => Err(bad("the prompt is empty".into())),
            Some(Value::Number(_)) => Ok(vec![ids(a, "prompt")?]),
            Some(Value::String(_)) => a
                .iter()
                .enumerate()
                .map(|(i, x)| match x {
                    Value::String(s) => text(s, &format!("prompt[{i}]")),
                    _ => Err(bad(format!("prompt[{i}] is {x}; {SHAPES}"))),
                })
                .collect(),
            Some(Value::Array(_)) => a
                .iter()
                .enumerate()
                .map(|(i, x)| match x {
                    Value::Array(inner) => ids(inner, &format!("prompt[{i}]")),
                    _ => Err(bad(format!("prompt[{i}] is {x}; {SHAPES}"))),
                })
                .collect(),
            Some(_) => Err(bad(SHAPES.into())),
        },
        _ => Err(bad(SHAPES.into())),
    }
}

/// One entry of `/v1/models`.
fn model_entry(s: &AppState) -> Value {
    json!({"id": s.model_id, "object": "model", "created": (s.clock)(), "owned_by": "deltafin"})
}

/// `GET /v1/models`: the one model served.
pub async fn models(State(s): State<Arc<AppState>>) -> Response {
    axum::Json(json!({"object": "list", "data": [model_entry(&s)]})).into_response()
}

/// `GET /v1/models/{id}`: the model, or 404 `model_not_found` for another id.
pub async fn model(State(s): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if id != s.model_id {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!(
                "the model '{id}' does not exist; this server serves '{}'",
                s.model_id
            ),
        )
        .code("model_not_found")
        .into_response();
    }
    axum::Json(model_entry(&s)).into_response()
}

/// `POST /tokenize` (llama-server's): `content` (a string), `add_special` (BOS; default
/// false), `parse_special` (special-token texts become their ids; default true),
/// `with_pieces` (default false). Answers `{"tokens": [id, …]}`, or with pieces
/// `{"tokens": [{"id", "piece"}, …]}` (a piece that is part of a character shows U+FFFD).
/// `content` is bounded as a prompt is (400 `context_length_exceeded`, before tokenizing,
/// [`AppState::check_prompt_bytes`]) and tokenized off the async threads within `--timeout`
/// ([`AppState::prepare`]; 503 `queue_full` when too many are being prepared).
pub async fn tokenize(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Req {
        content: String,
        #[serde(default)]
        add_special: bool,
        #[serde(default = "yes")]
        parse_special: bool,
        #[serde(default)]
        with_pieces: bool,
    }
    fn yes() -> bool {
        true
    }
    let r: Req = match parse(body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    // the prompts' bound, then the tokenizer off the async threads, as for a prompt
    if let Err(e) = s.check_prompt_bytes(r.content.len(), "content") {
        return e.into_response();
    }
    let st = Arc::clone(&s);
    let done = s.prepare(move || {
        let ids = st
            .tok
            .encode_text(&r.content, r.add_special, r.parse_special)
            .map_err(|e| ApiError::invalid(Some("content"), format!("{e:#}")))?;
        let tokens: Vec<Value> = if r.with_pieces {
            ids.iter()
                .map(|&t| json!({"id": t, "piece": st.tok.token_text(t)}))
                .collect()
        } else {
            ids.iter().map(|&t| json!(t)).collect()
        };
        Ok::<_, ApiError>(json!({"tokens": tokens}))
    });
    match done.await {
        Ok(Ok(v)) => axum::Json(v).into_response(),
        Ok(Err(e)) | Err(e) => e.into_response(),
    }
}

/// `POST /detokenize` (llama-server's): `tokens` (ids) → `{"content": text}`, special tokens
/// as their text. Errors: 400 for an id outside the vocabulary, 400 `context_length_exceeded`
/// for more ids than the context holds; 503 `queue_full` as for a prompt ([`AppState::prepare`]).
pub async fn detokenize(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Req {
        tokens: Vec<u64>,
    }
    let r: Req = match parse(body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let vocab = s.tok.vocab_size();
    if let Some((i, t)) = r
        .tokens
        .iter()
        .enumerate()
        .find(|(_, &t)| t >= vocab as u64)
    {
        return ApiError::invalid(
            Some("tokens"),
            format!("tokens[{i}] is {t}, expected a token id below {vocab} (the vocabulary)"),
        )
        .into_response();
    }
    if r.tokens.len() > s.n_ctx {
        return ApiError::invalid(
            Some("tokens"),
            format!(
                "tokens holds {} ids, more than the context of {} tokens",
                r.tokens.len(),
                s.n_ctx
            ),
        )
        .code("context_length_exceeded")
        .into_response();
    }
    let ids: Vec<u32> = r.tokens.iter().map(|&t| t as u32).collect();
    let st = Arc::clone(&s);
    match s.prepare(move || st.tok.decode(&ids, false)).await {
        Ok(text) => axum::Json(json!({"content": text})).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `x` as the f64 its shortest decimal names (`0.8f32` as `0.8`, not `0.800000011920929`).
fn shortest(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(x as f64)
}

/// `GET /props` (llama-server's shape, the fields Deltafin has): the defaults of requests,
/// the context, slots, the model's name, chat template and modalities.
pub async fn props(State(s): State<Arc<AppState>>) -> Response {
    let d = &s.defaults;
    axum::Json(json!({
        "default_generation_settings": {
            "n_ctx": s.n_ctx,
            "params": {
                "n_predict": s.default_max_tokens.map_or(-1, |m| m as i64),
                "temperature": shortest(d.temperature),
                "top_k": d.top_k,
                "top_p": shortest(d.top_p),
                "min_p": shortest(d.min_p),
                "repeat_penalty": shortest(d.repeat_penalty),
                "presence_penalty": shortest(d.presence_penalty),
                "frequency_penalty": shortest(d.frequency_penalty),
                "seed": s.seed.map_or(-1, |x| x as i64),
            },
        },
        "total_slots": s.slots,
        "model_alias": s.model_id,
        "chat_template": s.template.as_ref().map(|t| t.source()),
        "modalities": {"vision": false, "audio": false},
        "build_info": concat!("deltafin ", env!("CARGO_PKG_VERSION")),
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_defaults_are_shown_as_their_shortest_decimals() {
        assert_eq!(shortest(0.8), 0.8);
        assert_eq!(shortest(0.95), 0.95);
        assert_eq!(shortest(1.0), 1.0);
    }

    #[test]
    fn prompts_of_every_shape() {
        let r = |v: Value| read_prompts(&v, 10);
        let t = |s: &str| Prompt::Text(s.into());
        assert_eq!(r(json!("hi")), Ok(vec![t("hi")]));
        assert_eq!(r(json!(["hi"])), Ok(vec![t("hi")]));
        assert_eq!(r(json!(["a", "b"])), Ok(vec![t("a"), t("b")]));
        assert_eq!(r(json!([1, 2])), Ok(vec![Prompt::Ids(vec![1, 2])]));
        assert_eq!(
            r(json!([[3], [4, 5]])),
            Ok(vec![Prompt::Ids(vec![3]), Prompt::Ids(vec![4, 5])])
        );
        let msg = |v: Value| r(v).unwrap_err().message;
        assert_eq!(
            msg(json!([1, 10])),
            "prompt[1] is 10, expected a token id below 10 (the vocabulary)"
        );
        assert_eq!(
            msg(json!([[1], [2, 10]])),
            "prompt[1][1] is 10, expected a token id below 10 (the vocabulary)"
        );
        assert_eq!(
            msg(json!(["a", [1]])),
            "prompt[1] is [1]; prompt must be a string, a list of strings, a list of token ids \
             or a list of lists of token ids"
        );
        assert_eq!(msg(json!([])), "the prompt is empty");
        assert_eq!(msg(json!("")), "the prompt is empty");
        assert_eq!(msg(json!(["a", ""])), "prompt[1] is empty");
        assert_eq!(msg(json!([[1], []])), "prompt[1] is empty");
    }
}
