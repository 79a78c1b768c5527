//! The Gemma 3 tokenizer built from the demo GGUF against llama.cpp's own tokenization
//! (`tests/fixtures/tokenizer_gemma3.json`, written by `tools/reference/tokenizer_reference.py`
//! with llama-cpp-python 0.3.36).

mod common;

use std::sync::OnceLock;

use deltafin::source::gguf::GgufModel;
use deltafin::tokenizer::{ChatTemplate, Message, StreamDecoder, Tokenizer};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    n_vocab: usize,
    bos: u32,
    eos: u32,
    eog: Vec<u32>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    text: String,
    parse_special: bool,
    ids: Vec<u32>,
    decoded_skip: String,
    decoded_all: String,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/tokenizer_gemma3.json"
        );
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    })
}

fn model() -> &'static GgufModel {
    static M: OnceLock<GgufModel> = OnceLock::new();
    M.get_or_init(|| GgufModel::open(&common::demo_gguf()).unwrap())
}

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::from_gguf(model()).unwrap())
}

fn case(name: &str) -> &'static Case {
    fixture().cases.iter().find(|c| c.name == name).unwrap()
}

#[test]
fn tokenizer_can_be_shared_between_threads() {
    fn shareable<T: Send + Sync>(_: &T) {}
    shareable(tokenizer());
}

#[test]
fn special_ids_match_llama_cpp() {
    let (t, f) = (tokenizer(), fixture());
    assert_eq!(t.vocab_size(), f.n_vocab);
    assert_eq!(t.vocab_size(), 262_144);
    assert_eq!(t.bos_id(), Some(f.bos));
    assert_eq!(t.eos_id(), Some(f.eos));
    // <eos>, <end_of_turn>, and the user-defined "</s>" that llama.cpp also treats as EOG.
    assert_eq!(t.eog_ids(), &f.eog[..]);
    assert_eq!(t.eog_ids(), &[1, 106, 212]);
    assert!(t.is_eog(106) && !t.is_eog(105));
    assert_eq!(t.token_text(106), Some("<end_of_turn>"));
    assert_eq!(t.token_id("<start_of_turn>"), Some(105));
}

#[test]
fn every_case_encodes_to_llama_cpp_ids() {
    let t = tokenizer();
    let mut failed = Vec::new();
    for c in &fixture().cases {
        let got = t.encode(&c.text, true, c.parse_special).unwrap();
        if got != c.ids {
            failed.push(format!("{}: got {got:?}, want {:?}", c.name, c.ids));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert_eq!(fixture().cases.len(), 34);
}

#[test]
fn every_case_decodes_to_llama_cpp_text() {
    let t = tokenizer();
    for c in &fixture().cases {
        assert_eq!(
            t.decode(&c.ids, true),
            c.decoded_skip,
            "{} (skip special)",
            c.name
        );
        assert_eq!(
            t.decode(&c.ids, false),
            c.decoded_all,
            "{} (all tokens)",
            c.name
        );
    }
}

#[test]
fn without_add_special_there_is_no_bos() {
    let t = tokenizer();
    let c = case("ascii_sentence");
    assert_eq!(t.encode(&c.text, false, false).unwrap(), &c.ids[1..]);
    assert_eq!(t.encode("", false, true).unwrap(), Vec::<u32>::new());
}

#[test]
fn pieces_follow_llama_cpp() {
    let t = tokenizer();
    assert_eq!(t.token_to_piece(2, true), b"<bos>");
    assert_eq!(t.token_to_piece(2, false), b"");
    assert_eq!(t.token_to_piece(138, false), b"  "); // user-defined, always rendered
    assert_eq!(t.token_to_piece(212, false), b""); // "</s>" became control as an EOG token
    assert_eq!(t.token_to_piece(26352, false), b" Hello");
    assert_eq!(t.token_to_piece(238, false), &[0x00]); // <0x00>
    assert_eq!(t.token_to_piece(u32::MAX, true), b"");
}

/// Streams each id and checks the pieces: none splits a character, and together they are
/// the full decode.
fn stream_pieces(ids: &[u32], skip_special: bool) -> Vec<String> {
    let mut d = StreamDecoder::new(tokenizer(), skip_special);
    let mut out: Vec<String> = ids.iter().map(|&id| d.push(id)).collect();
    out.push(d.finish());
    out
}

#[test]
fn stream_decoder_holds_partial_characters() {
    for name in [
        "emoji",
        "emoji_zwj",
        "cjk",
        "byte_fallback",
        "combining",
        "special_parsed",
    ] {
        let c = case(name);
        for (skip, want) in [(true, &c.decoded_skip), (false, &c.decoded_all)] {
            let pieces = stream_pieces(&c.ids, skip);
            assert_eq!(pieces.concat(), *want, "{name}");
            assert!(
                pieces.iter().all(|p| !p.contains('\u{FFFD}')),
                "{name}: {pieces:?}"
            );
        }
    }
    // 🦀 is 248714 = one token; 🏳️ (U+1F3F3 U+FE0F) comes as 248177 238178. The byte-fallback
    // case spells U+10348 as four byte tokens: the first three yield nothing.
    let c = case("byte_fallback");
    let at = c.ids.iter().position(|&i| i == 478).unwrap();
    assert_eq!(&c.ids[at..at + 4], &[478, 382, 379, 374]);
    let pieces = stream_pieces(&c.ids, true);
    assert_eq!(&pieces[at..at + 4], &["", "", "", "\u{10348}"]);
}

#[test]
fn stream_decoder_replaces_invalid_bytes_like_decode() {
    let t = tokenizer();
    // <0xF0> <0x9F> then "a": an unfinished 4-byte sequence cut by ASCII; then a lone <0xF0>.
    let ids = [2, 478, 397, 236746, 478];
    let whole = t.decode(&ids, true);
    assert_eq!(whole, "\u{FFFD}a\u{FFFD}");
    assert_eq!(
        stream_pieces(&ids, true),
        ["", "", "", "\u{FFFD}a", "", "\u{FFFD}"]
    );
}

#[test]
fn gemma_template_from_the_demo_gguf_round_trips_through_the_tokenizer() {
    let t = tokenizer();
    let tmpl = ChatTemplate::from_gguf_metadata(&model().metadata).unwrap();
    let text = tmpl.render(&[Message::new("user", "Hi")], true).unwrap();
    assert_eq!(
        text,
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    );
    // The template writes <bos> itself: no add_special, but parse special tokens.
    let ids = t.encode(&text, false, true).unwrap();
    assert_eq!(ids, case("special_parsed").ids);
}
