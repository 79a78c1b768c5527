//! The llama.cpp rules that the Gemma fixture does not reach, on a hand-made SentencePiece
//! vocabulary: the space prefix and its removal on decode, longest-first special matching,
//! byte fallback, EOG detection by text, and errors.

use std::collections::BTreeMap;

use deltafin::source::gguf::Value;
use deltafin::tokenizer::{StreamDecoder, Tokenizer};

/// (text, score, type): 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte.
const VOCAB: &[(&str, f32, i32)] = &[
    ("<unk>", 0.0, 2),          // 0
    ("<s>", 0.0, 3),            // 1
    ("</s>", 0.0, 3),           // 2
    ("<0xC3>", 0.0, 6),         // 3
    ("<0xA9>", 0.0, 6),         // 4
    ("\u{2581}", -10.0, 1),     // 5
    ("h", -11.0, 1),            // 6
    ("e", -12.0, 1),            // 7
    ("l", -13.0, 1),            // 8
    ("o", -14.0, 1),            // 9
    ("a", -15.0, 1),            // 10
    ("he", -1.0, 1),            // 11
    ("ll", -2.0, 1),            // 12
    ("hell", -3.0, 1),          // 13
    ("hello", -4.0, 1),         // 14
    ("\u{2581}hello", -5.0, 1), // 15
    ("ab", 0.0, 4),             // 16
    ("bcd", 0.0, 4),            // 17
    ("<|im_end|>", -20.0, 1),   // 18: normal in the file, EOG and control by its text
    ("<x>", 0.0, 3),            // 19
];

fn meta(model: &str, add_space_prefix: bool) -> BTreeMap<String, Value> {
    let mut m = BTreeMap::new();
    m.insert("tokenizer.ggml.model".into(), Value::String(model.into()));
    let col = |f: fn(&(&str, f32, i32)) -> Value| Value::Array(VOCAB.iter().map(f).collect());
    m.insert(
        "tokenizer.ggml.tokens".into(),
        col(|t| Value::String(t.0.into())),
    );
    m.insert("tokenizer.ggml.scores".into(), col(|t| Value::F32(t.1)));
    m.insert("tokenizer.ggml.token_type".into(), col(|t| Value::I32(t.2)));
    m.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(1));
    m.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(2));
    m.insert(
        "tokenizer.ggml.add_space_prefix".into(),
        Value::Bool(add_space_prefix),
    );
    m
}

fn tok() -> Tokenizer {
    Tokenizer::from_gguf_metadata(&meta("llama", true)).unwrap()
}

#[test]
fn merges_follow_scores_and_space_prefix_applies_after_specials() {
    let t = tok();
    // add_bos_token defaults to true for "llama" vocabularies.
    assert_eq!(t.encode("hello", true, false).unwrap(), [1, 15]);
    assert_eq!(t.encode("hello", false, false).unwrap(), [15]);
    // After a special token the next fragment gets the prefix again.
    assert_eq!(
        t.encode("hello<x>hello", false, true).unwrap(),
        [15, 19, 15]
    );
    // Without the prefix setting "hello" has no ▁.
    let t2 = Tokenizer::from_gguf_metadata(&meta("llama", false)).unwrap();
    assert_eq!(t2.encode("hello", false, false).unwrap(), [14]);
}

#[test]
fn decode_strips_the_prefix_space_only_without_a_removed_bos() {
    let t = tok();
    assert_eq!(t.decode(&[15], true), "hello");
    assert_eq!(t.decode(&[1, 15], true), " hello");
    assert_eq!(t.decode(&[1, 15], false), "<s> hello");
    let mut d = StreamDecoder::new(&t, true);
    assert_eq!([d.push(15), d.push(15), d.finish()].concat(), "hello hello");
    let mut d = StreamDecoder::new(&t, true);
    assert_eq!([d.push(1), d.push(15), d.finish()].concat(), " hello");
}

#[test]
fn longest_special_text_is_taken_first_not_leftmost() {
    // "bcd" (3 bytes) is cut out before "ab" is tried, as in llama.cpp; a leftmost-longest
    // matcher would take "ab" first.
    assert_eq!(tok().encode("abcd", false, false).unwrap(), [5, 10, 17]);
}

#[test]
fn byte_fallback_for_unknown_characters() {
    let t = tok();
    assert_eq!(t.encode("é", false, false).unwrap(), [5, 3, 4]);
    assert_eq!(t.decode(&[5, 3, 4], true), "é");
    assert_eq!(t.decode(&[3], true), "\u{FFFD}");
}

#[test]
fn eog_tokens_are_found_by_text_and_become_control() {
    let t = tok();
    assert_eq!(t.eog_ids(), &[2, 18]);
    assert_eq!(t.token_to_piece(18, false), b"");
    assert_eq!(t.token_to_piece(18, true), b"<|im_end|>");
    assert_eq!(t.token_to_piece(17, false), b"bcd");
    assert_eq!(t.token_to_piece(15, false), b" hello");
}

#[test]
fn unsupported_model_types_are_named() {
    let err = Tokenizer::from_gguf_metadata(&meta("bert", false)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "unsupported tokenizer model type \"bert\" (tokenizer.ggml.model); only \"llama\" \
         (SentencePiece BPE) and \"gpt2\" (byte-level BPE) are implemented"
    );
    // a byte-level vocabulary needs its merges
    let err = Tokenizer::from_gguf_metadata(&meta("gpt2", false)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "GGUF metadata has no tokenizer.ggml.merges (needed by a gpt2 vocabulary)"
    );
}

#[test]
fn malformed_metadata_is_rejected() {
    let mut m = meta("llama", true);
    m.remove("tokenizer.ggml.tokens");
    let err = Tokenizer::from_gguf_metadata(&m).unwrap_err();
    assert_eq!(
        err.to_string(),
        "GGUF metadata has no tokenizer.ggml.tokens"
    );

    let mut m = meta("llama", true);
    m.insert(
        "tokenizer.ggml.scores".into(),
        Value::Array(vec![Value::F32(0.0)]),
    );
    let err = Tokenizer::from_gguf_metadata(&m).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tokenizer.ggml.scores has 1 entries, tokens has 20"
    );

    let mut m = meta("llama", true);
    m.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(20));
    let err = Tokenizer::from_gguf_metadata(&m).unwrap_err();
    assert_eq!(
        err.to_string(),
        "GGUF key tokenizer.ggml.bos_token_id = 20 is outside the vocabulary of 20 tokens"
    );
}
