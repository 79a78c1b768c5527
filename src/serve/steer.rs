//! The request fields that steer the logits ([`steering`]): `logit_bias`, `ignore_eos`, and
//! constrained output: `response_format` (`json_object`, `json_schema`), llama-server's
//! `grammar` and `json_schema`. A `grammar` with a line that starts a rule `name ::=` is
//! GBNF, read into Lark by [`super::gbnf`]; any other is llguidance's Lark syntax. Everything
//! is checked, and a grammar compiled, before the request is queued: a bad one is a 400
//! naming the field, with llguidance's message.

use std::sync::Arc;

use serde_json::Value;

use super::error::ApiError;
use super::gbnf;
use super::state::AppState;
use super::types::Common;
use crate::engine::{GrammarSpec, Guide, Steering};

/// The most a `logit_bias` value may be away from 0 (OpenAI's range).
const MAX_BIAS: f64 = 100.0;

/// The steering a request asks for, its grammar compiled (on a blocking thread, counted as
/// prompt preparation).
///
/// Errors (400 naming the field): a `logit_bias` key that is not a token id of the
/// vocabulary or a value outside [-100, 100]; a `response_format` of another type or
/// shape; two ways of constraining the output at once; a GBNF `grammar` that does not read
/// (the line, column and fault); a schema or
/// grammar llguidance cannot compile (its message). 400 too when the model's vocabulary
/// cannot be matched by a grammar (no end-of-generation token, an unknown decoder).
pub async fn steering(s: &Arc<AppState>, c: &Common<'_>) -> Result<Steering, ApiError> {
    let mut st = Steering {
        bias: match c.logit_bias {
            Some(b) => bias(b, s.tok.vocab_size())?,
            None => Vec::new(),
        },
        ignore_eos: c.ignore_eos,
        eog: s.tok.eog_ids().to_vec(),
        grammar: None,
    };
    let Some((field, spec)) = grammar_spec(c)? else {
        return Ok(st);
    };
    super::admit::check_grammar_size(field, &spec)?;
    let state = Arc::clone(s);
    let g = s
        .prepare(move || {
            let guide = state
                .guide
                .get_or_init(|| {
                    Guide::new(&state.tok)
                        .map(Arc::new)
                        .map_err(|e| format!("{e:#}"))
                })
                .clone()
                .map_err(|e| {
                    ApiError::invalid(
                        Some(field),
                        format!("{field}: this model's output cannot be constrained: {e}"),
                    )
                })?;
            guide
                .compile(&spec)
                .map_err(|e| ApiError::invalid(Some(field), format!("{field}: {e:#}")))
        })
        .await??;
    st.grammar = Some(g);
    Ok(st)
}

/// `logit_bias` as (id, bias) pairs; −100 bans (−∞).
fn bias(v: &Value, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |m: String| ApiError::invalid(Some("logit_bias"), m);
    let Value::Object(o) = v else {
        return Err(bad(format!(
            "logit_bias is {v}, expected an object of token ids to numbers"
        )));
    };
    let mut out = Vec::with_capacity(o.len());
    for (k, x) in o {
        let id = match k.parse::<u32>() {
            Ok(id) if (id as usize) < vocab => id,
            _ => {
                return Err(bad(format!(
                    "logit_bias key {k:?} is not a token id below {vocab} (the vocabulary)"
                )))
            }
        };
        let b = match x.as_f64() {
            Some(b) if (-MAX_BIAS..=MAX_BIAS).contains(&b) => b,
            _ => {
                return Err(bad(format!(
                    "logit_bias[{k:?}] is {x}, expected a number from -100 to 100"
                )))
            }
        };
        let b = if b <= -MAX_BIAS {
            f32::NEG_INFINITY
        } else {
            b as f32
        };
        out.push((id, b));
    }
    Ok(out)
}

/// The one constraint the request sets, with the field that set it.
fn grammar_spec(c: &Common) -> Result<Option<(&'static str, GrammarSpec)>, ApiError> {
    let mut found: Vec<(&'static str, GrammarSpec)> = Vec::new();
    if let Some(f) = c.response_format {
        if let Some(g) = response_format(f)? {
            found.push(("response_format", g));
        }
    }
    if let Some(g) = c.grammar {
        found.push(("grammar", lark(g)?));
    }
    if let Some(s) = c.json_schema {
        if !s.is_object() && !s.is_boolean() {
            return Err(ApiError::invalid(
                Some("json_schema"),
                format!("json_schema is {s}, expected a JSON schema (an object)"),
            ));
        }
        found.push(("json_schema", GrammarSpec::JsonSchema(s.clone())));
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|f| f.0).collect();
        return Err(ApiError::invalid(
            Some(found[1].0),
            format!(
                "{} each constrain the output; send only one",
                names.join(" and ")
            ),
        ));
    }
    Ok(found.pop())
}

/// OpenAI's `response_format`: `text` (no constraint), `json_object`, `json_schema` with
/// `json_schema.schema` (absent: any JSON object; `strict` is accepted and the schema is
/// always enforced).
fn response_format(f: &Value) -> Result<Option<GrammarSpec>, ApiError> {
    let bad = |m: String| ApiError::invalid(Some("response_format"), m);
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(GrammarSpec::JsonObject)),
        Some("json_schema") => {
            let Some(js) = f.get("json_schema").filter(|j| j.is_object()) else {
                return Err(bad(
                    "response_format type 'json_schema' needs a json_schema object \
                     ({\"name\": ..., \"schema\": {...}})"
                        .into(),
                ));
            };
            if let Some(st) = js.get("strict").filter(|s| !s.is_null() && !s.is_boolean()) {
                return Err(bad(format!(
                    "response_format.json_schema.strict is {st}, expected true or false"
                )));
            }
            match js.get("schema") {
                None | Some(Value::Null) => Ok(Some(GrammarSpec::JsonObject)),
                Some(s) if s.is_object() || s.is_boolean() => {
                    Ok(Some(GrammarSpec::JsonSchema(s.clone())))
                }
                Some(s) => Err(bad(format!(
                    "response_format.json_schema.schema is {s}, expected a JSON schema (an \
                     object)"
                ))),
            }
        }
        Some(t) => Err(bad(format!(
            "response_format type '{t}' is not supported (text, json_object, json_schema)"
        ))),
        None => Err(bad(
            "response_format needs a \"type\" (text, json_object, json_schema)".into(),
        )),
    }
}

/// A `grammar`: GBNF when a line starts with a rule `name ::=` ([`gbnf::is_gbnf`]),
/// translated to Lark ([`gbnf::to_lark`]); otherwise llguidance's Lark syntax as it is.
fn lark(g: &str) -> Result<GrammarSpec, ApiError> {
    if gbnf::is_gbnf(g) {
        return gbnf::to_lark(g)
            .map(GrammarSpec::Lark)
            .map_err(|e| ApiError::invalid(Some("grammar"), format!("grammar (GBNF) at {e}")));
    }
    if g.trim().is_empty() {
        return Err(ApiError::invalid(Some("grammar"), "grammar is empty"));
    }
    Ok(GrammarSpec::Lark(g.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_reads_ids_and_bans_at_minus_100() {
        let b = bias(&serde_json::json!({"3": -100, "7": 2.5, "0": 100}), 10).unwrap();
        assert_eq!(b, [(3, f32::NEG_INFINITY), (7, 2.5), (0, 100.0)]);
        let e = bias(&serde_json::json!({"10": 1}), 10).unwrap_err();
        assert_eq!(
            e.message,
            "logit_bias key \"10\" is not a token id below 10 (the vocabulary)"
        );
        let e = bias(&serde_json::json!({"1": 101}), 10).unwrap_err();
        assert_eq!(
            e.message,
            "logit_bias[\"1\"] is 101, expected a number from -100 to 100"
        );
        let e = bias(&serde_json::json!([1]), 10).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logit_bias"));
    }

    #[test]
    fn gbnf_is_read_into_lark_and_lark_passes() {
        assert_eq!(
            lark("root ::= \"yes\" | \"no\"").unwrap(),
            GrammarSpec::Lark("start: \"yes\" | \"no\"\n".into())
        );
        let e = lark("x ::= \"a\"\n  list-item::= \"b").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("grammar"));
        assert_eq!(
            e.message,
            "grammar (GBNF) at line 2, column 16: unterminated string literal"
        );
        assert_eq!(
            lark("start: \"a ::= b\"").unwrap(),
            GrammarSpec::Lark("start: \"a ::= b\"".into())
        );
    }
}
