//! Constrained output and logit steering in the sampler (`engine::constrain`): the token
//! environment of each kind of tokenizer (a Hugging Face byte-level one, a GGUF SentencePiece
//! one and a GGUF byte-level one), a JSON schema that makes random logits produce text that
//! parses and follows the schema, a Lark grammar, and the bias, ban and `ignore_eos` rules.

use std::path::Path;

use deltafin::engine::sampler::Rng;
use deltafin::engine::{GrammarSpec, Guide, Sampler, SamplerConfig, Steering};
use deltafin::load::open_any;
use deltafin::tokenizer::ModelTokenizer;
use serde_json::{json, Value};

fn tokenizer(rel: &str) -> ModelTokenizer {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    open_any(Some(&p)).unwrap().tokenizer().unwrap()
}

fn fixtures() -> Vec<(&'static str, ModelTokenizer)> {
    [
        "tests/fixtures/hf/qwen3_moe",
        "tests/fixtures/gguf/llama/llama-f32.gguf",
        "tests/fixtures/gguf/qwen3/qwen3-f32.gguf",
    ]
    .into_iter()
    .map(|p| (p, tokenizer(p)))
    .collect()
}

/// Samples from random logits (temperature 1, no filters) under `steering` until an
/// end-of-generation token or `limit` tokens; returns the tokens, the ending one included.
fn run(tok: &ModelTokenizer, steering: Steering, seed: u64, limit: usize) -> Vec<u32> {
    let cfg = SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed,
        ..Default::default()
    };
    let mut s = Sampler::steered(cfg, steering);
    let mut rng = Rng::new(seed ^ 0x5eed);
    let mut out = Vec::new();
    while out.len() < limit {
        let mut logits: Vec<f32> = (0..tok.vocab_size())
            .map(|_| (rng.next_f64() * 8.0) as f32)
            .collect();
        let t = s.sample(&mut logits, &out);
        out.push(t);
        if tok.is_eog(t) {
            break;
        }
    }
    out
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
            "ok": {"type": "boolean"}
        },
        "required": ["name", "age", "tags", "ok"],
        "additionalProperties": false
    })
}

/// Checks `v` against [`schema`] field by field.
fn follows_schema(v: &Value) -> Result<(), String> {
    let o = v.as_object().ok_or("not an object")?;
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    if keys != ["age", "name", "ok", "tags"] {
        return Err(format!("keys {keys:?}"));
    }
    let name = o["name"].as_str().ok_or("name is not a string")?;
    if name.chars().count() > 8 {
        return Err(format!("name {name:?} is longer than 8"));
    }
    match o["age"].as_i64() {
        Some(a) if (0..=120).contains(&a) => {}
        _ => return Err(format!("age {}", o["age"])),
    }
    let tags = o["tags"].as_array().ok_or("tags is not an array")?;
    if tags.len() > 3
        || tags
            .iter()
            .any(|t| !["a", "b", "c"].contains(&t.as_str().unwrap_or("")))
    {
        return Err(format!("tags {tags:?}"));
    }
    o["ok"].as_bool().ok_or("ok is not a boolean")?;
    Ok(())
}

/// Random logits under the schema give, for every seed and every kind of tokenizer, a text
/// that parses as JSON and follows the schema, ended by an end-of-generation token.
#[test]
fn a_json_schema_makes_random_logits_valid_json() {
    for (name, tok) in fixtures() {
        let guide = Guide::new(&tok).unwrap();
        assert_eq!(guide.eog(), tok.eog_ids(), "{name}");
        let g = guide.compile(&GrammarSpec::JsonSchema(schema())).unwrap();
        for seed in 0..12 {
            let st = Steering {
                eog: tok.eog_ids().to_vec(),
                grammar: Some(g.clone()),
                ..Default::default()
            };
            let ids = run(&tok, st, seed, 1000);
            let (&last, body) = ids.split_last().unwrap();
            assert!(tok.is_eog(last), "{name} seed {seed}: no end after {ids:?}");
            let text = tok.decode(body, true);
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{name} seed {seed}: {e}: {text:?}"));
            follows_schema(&v).unwrap_or_else(|e| panic!("{name} seed {seed}: {e}: {text}"));
        }
    }
}

/// `json_object` gives a JSON object; a Lark grammar gives one of its strings; a finished
/// grammar ends the generation even under `ignore_eos`.
#[test]
fn json_object_and_lark_grammars_end_where_they_are_complete() {
    let tok = tokenizer("tests/fixtures/hf/qwen3_moe");
    let guide = Guide::new(&tok).unwrap();
    let obj = guide.compile(&GrammarSpec::JsonObject).unwrap();
    let mut parsed = 0;
    for seed in 0..8 {
        let st = Steering {
            eog: tok.eog_ids().to_vec(),
            grammar: Some(obj.clone()),
            ..Default::default()
        };
        let ids = run(&tok, st, seed, 400);
        // an object may be cut at the limit; a finished one parses as an object
        if tok.is_eog(*ids.last().unwrap()) {
            let text = tok.decode(&ids[..ids.len() - 1], true);
            match serde_json::from_str::<Value>(&text) {
                Ok(v) => assert!(v.is_object(), "{text}"),
                // valid JSON, but a number beyond f64 (`3E1019`): serde_json refuses it
                Err(e) if e.to_string().starts_with("number out of range") => {
                    assert!(text.starts_with('{') && text.ends_with('}'), "{text}")
                }
                Err(e) => panic!("{e}: {text}"),
            }
            parsed += 1;
        } else {
            assert!(tok.decode(&ids, true).starts_with('{'));
        }
    }
    assert!(parsed > 0);
    let yn = guide
        .compile(&GrammarSpec::Lark(
            r#"start: "yes" | "no" | "maybe so""#.into(),
        ))
        .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..16 {
        let st = Steering {
            eog: tok.eog_ids().to_vec(),
            ignore_eos: true,
            grammar: Some(yn.clone()),
            ..Default::default()
        };
        let ids = run(&tok, st, seed, 50);
        let (&last, body) = ids.split_last().unwrap();
        assert!(tok.is_eog(last), "{ids:?}");
        seen.insert(tok.decode(body, true));
    }
    let seen: Vec<String> = seen.into_iter().collect();
    assert_eq!(seen, ["maybe so", "no", "yes"]);
}

/// Bad schemas and grammars are refused with llguidance's message.
#[test]
fn bad_grammars_are_refused() {
    let tok = tokenizer("tests/fixtures/hf/qwen3_moe");
    let guide = Guide::new(&tok).unwrap();
    let e = guide
        .compile(&GrammarSpec::Lark("start: missing_rule".into()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing_rule"), "{e}");
    let e = guide
        .compile(&GrammarSpec::JsonSchema(json!({"type": "frobnicate"})))
        .unwrap_err()
        .to_string();
    assert!(e.contains("frobnicate"), "{e}");
}

fn greedy() -> SamplerConfig {
    SamplerConfig {
        temperature: 0.0,
        ..Default::default()
    }
}

/// A bias moves the greedy choice; −∞ bans a token; `ignore_eos` bans every
/// end-of-generation id, and the same rules hold for the distribution speculative
/// verification draws from (`penalize`).
#[test]
fn bias_ban_and_ignore_eos() {
    let logits = [1.0f32, 5.0, 4.0, 4.5];
    let pick = |st: Steering| Sampler::steered(greedy(), st).sample(&mut logits.clone(), &[]);
    assert_eq!(pick(Steering::default()), 1);
    let boost = Steering {
        bias: vec![(0, 4.5)],
        ..Default::default()
    };
    assert_eq!(pick(boost), 0);
    let ban = Steering {
        bias: vec![(1, f32::NEG_INFINITY)],
        ..Default::default()
    };
    assert_eq!(pick(ban.clone()), 3);
    let no_eos = Steering {
        ignore_eos: true,
        eog: vec![1, 3],
        ..Default::default()
    };
    assert_eq!(pick(no_eos.clone()), 2);
    let mut l = logits;
    Sampler::steered(greedy(), no_eos).penalize(&mut l, &[]);
    assert_eq!(l, [1.0, f32::NEG_INFINITY, 4.0, f32::NEG_INFINITY]);
    // sampling never draws a banned token
    let mut s = Sampler::steered(
        SamplerConfig {
            temperature: 5.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        },
        ban,
    );
    for _ in 0..500 {
        assert_ne!(s.sample(&mut logits.clone(), &[]), 1);
    }
}
