//! Every `tokenizer.ggml.pre` llama.cpp (llama-cpp-python 0.3.36) knows for a byte-level BPE
//! vocabulary, against llama.cpp's own ids for a shared set of strings (code, digits, CJK,
//! emoji, whitespace runs, contractions, marks), including a GGUF with no `tokenizer.ggml.pre`.
//! Fixture: `tests/fixtures/pretokenizers.json`, written by
//! `tools/reference/pretokenizer_reference.py`.

use std::collections::BTreeMap;

use deltafin::source::gguf::Value;
use deltafin::tokenizer::Tokenizer;

fn fixture() -> serde_json::Value {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/pretokenizers.json"
    );
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn strs(v: &serde_json::Value) -> Value {
    Value::Array(
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| Value::String(s.as_str().unwrap().into()))
            .collect(),
    )
}

/// A vocabulary-only GGUF's metadata, as the generator writes it.
fn meta(vocab: &serde_json::Value, pre: Option<&str>) -> BTreeMap<String, Value> {
    let mut m = BTreeMap::new();
    m.insert("tokenizer.ggml.model".into(), Value::String("gpt2".into()));
    if let Some(p) = pre {
        m.insert("tokenizer.ggml.pre".into(), Value::String(p.into()));
    }
    m.insert("tokenizer.ggml.tokens".into(), strs(&vocab["tokens"]));
    m.insert("tokenizer.ggml.merges".into(), strs(&vocab["merges"]));
    let types = vocab["types"].as_array().unwrap();
    m.insert(
        "tokenizer.ggml.token_type".into(),
        Value::Array(
            types
                .iter()
                .map(|t| Value::I32(t.as_i64().unwrap() as i32))
                .collect(),
        ),
    );
    let eot = vocab["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .position(|t| t == "<|endoftext|>")
        .unwrap() as u32;
    m.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(eot));
    m.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(eot));
    m
}

#[test]
fn every_pre_tokenizer_matches_llama_cpp() {
    let f = fixture();
    let strings: Vec<&str> = f["strings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let cases = f["cases"].as_object().unwrap();
    assert!(cases.len() >= 90, "{} names", cases.len());
    let mut failures = Vec::new();
    for (name, idx) in cases {
        let r = &f["results"][idx.as_u64().unwrap() as usize];
        let vocab = &f["vocabs"][r["vocab"].as_str().unwrap()];
        let pre = (name != "(none)").then_some(name.as_str());
        let t = Tokenizer::from_gguf_metadata(&meta(vocab, pre))
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        for (i, s) in strings.iter().enumerate() {
            // null: llama.cpp aborts on this string (`whitespace` with a space)
            let Some(want) = r["ids"][i].as_str() else {
                continue;
            };
            let want: Vec<u32> = want
                .split_whitespace()
                .map(|x| x.parse().unwrap())
                .collect();
            let got = t.encode(s, false, false).unwrap();
            if got != want {
                failures.push(format!("{name} {s:?}: got {got:?} want {want:?}"));
            }
        }
        let want_bos: Vec<u32> = serde_json::from_value(r["a_with_special"].clone()).unwrap();
        let got = t.encode("a", true, false).unwrap();
        if got != want_bos {
            failures.push(format!("{name} BOS: got {got:?} want {want_bos:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn unknown_pre_tokenizer_is_named() {
    let f = fixture();
    let e = Tokenizer::from_gguf_metadata(&meta(&f["vocabs"]["bytes"], Some("no-such-pre")))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(
            "tokenizer.ggml.pre 'no-such-pre' is not supported (supported: default, llama3,"
        ),
        "{e}"
    );
}
