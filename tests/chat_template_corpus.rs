//! Chat templates rendered byte for byte as transformers 5.24 renders them: the corpus of
//! tests/fixtures/chat_templates/ (the published templates of every supported family and
//! templates exercising each construct transformers' renderer supports, over conversations
//! with a system message, tools, tool calls, tool results, reasoning and content parts), with
//! the expected outputs written by tools/reference/chat_templates.py through transformers'
//! `render_jinja_template`. A case transformers refuses must be refused too; a
//! `raise_exception` message must come back word for word.

use std::collections::BTreeMap;

use deltafin::tokenizer::chat::{ChatTemplate, RenderOptions};
use serde_json::Value;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat_templates");

fn read(name: &str) -> String {
    std::fs::read_to_string(format!("{DIR}/{name}")).unwrap()
}

#[test]
fn every_corpus_case_renders_like_transformers() {
    let inputs: Value = serde_json::from_str(&read("conversations.json")).unwrap();
    let expected: Value = serde_json::from_str(&read("expected.json")).unwrap();
    assert_eq!(expected["transformers_version"], "5.24.0");
    let mut compiled: BTreeMap<String, ChatTemplate> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut per_template: BTreeMap<String, usize> = BTreeMap::new();
    let cases = expected["cases"].as_array().unwrap();
    for case in cases {
        let name = case["template"].as_str().unwrap();
        let tmpl = compiled.entry(name.to_string()).or_insert_with(|| {
            let src = read(&format!("templates/{}", case["file"].as_str().unwrap()));
            let special: Vec<(&str, &str)> = case["special_tokens"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str().unwrap()))
                .collect();
            ChatTemplate::with_special_tokens(&src, &special)
                .unwrap_or_else(|e| panic!("{name}: {e:#}"))
        });
        let conv = case["conversation"].as_str().unwrap();
        let opts = RenderOptions {
            tools: case["tools"].as_bool().unwrap().then(|| &inputs["tools"]),
            documents: case["documents"]
                .as_bool()
                .unwrap()
                .then(|| &inputs["documents"]),
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            extra: case["extra"].as_object(),
        };
        let label = format!(
            "{name}/{conv} tools={} extra={} agp={}",
            case["tools"], case["extra"], case["add_generation_prompt"]
        );
        let got = tmpl.render_with(&inputs["conversations"][conv], &opts);
        *per_template.entry(name.to_string()).or_default() += 1;
        match (got, case.get("output"), case["error_type"].as_str()) {
            (Ok(g), Some(want), _) if g == want.as_str().unwrap() => {}
            (Ok(g), Some(want), _) => failures.push(format!(
                "{label}:\n got: {g:?}\nwant: {:?}",
                want.as_str().unwrap()
            )),
            (Err(e), Some(_), _) => failures.push(format!("{label}: failed: {e:#}")),
            (Ok(g), None, _) => {
                failures.push(format!("{label}: rendered {g:?}, expected a refusal"))
            }
            (Err(e), None, Some("TemplateError")) => {
                let want = format!("chat template error: {}", case["error"].as_str().unwrap());
                if e.to_string() != want {
                    failures.push(format!("{label}: error {e} != {want}"));
                }
            }
            (Err(_), None, _) => {}
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    // Every family and construct template is in the corpus.
    for name in [
        "qwen3",
        "qwen3_moe",
        "llama3",
        "mixtral",
        "deepseek_v3",
        "kimi_k2",
        "gpt_oss",
        "gemma3",
        "construct_tojson",
        "construct_print",
        "construct_loops",
        "construct_strings",
        "construct_vars",
    ] {
        assert!(per_template.get(name).copied().unwrap_or(0) >= 4, "{name}");
    }
    assert_eq!(cases.len(), 264);
}

/// Jinja2 3.1's answers (tools/reference/jinja2_semantics.py, through transformers'
/// `render_jinja_template`) for each test, filter, method and operator chat templates use, on
/// None, on undefined values and on ordinary values: every row renders the same text, or fails
/// where Jinja2 raises. Known exceptions, all in minijinja's VM rather than a test or filter:
/// where Jinja2 raises, `for` over None iterates nothing, `>` answers for values Python cannot
/// order, and slicing None or an undefined value gives `[]`; those rows must still render
/// (so the list stays exact).
#[test]
fn tests_and_filters_answer_as_jinja2_does() {
    let fx: Value = serde_json::from_str(&read("jinja2_semantics.json")).unwrap();
    assert_eq!(fx["jinja2_version"], "3.1.6");
    let extra = fx["variables"].as_object().unwrap();
    let rows = fx["rows"].as_array().unwrap();
    let vm_operation = |src: &str| {
        src.starts_with("{% for i in ") || src.ends_with(" > 0 }}") || src.ends_with("[1:] }}")
    };
    let mut failures = Vec::new();
    let mut lenient = 0;
    for row in rows {
        let src = row[0].as_str().unwrap();
        let got = ChatTemplate::with_special_tokens(src, &[]).and_then(|t| {
            t.render_with(
                &serde_json::json!([]),
                &RenderOptions {
                    extra: Some(extra),
                    ..Default::default()
                },
            )
        });
        match (got, row[1].as_str(), row[2].as_str()) {
            (Ok(g), Some(want), _) if g == want => {}
            (Ok(g), Some(want), _) => failures.push(format!("{src}\n got: {g:?}\nwant: {want:?}")),
            (Err(e), Some(want), _) => {
                failures.push(format!("{src}\n failed: {e:#}\n want: {want:?}"))
            }
            (Ok(_), None, _) if vm_operation(src) => lenient += 1,
            (Ok(g), None, err) => failures.push(format!("{src}\n got: {g:?}\nwant: {err:?}")),
            (Err(_), None, _) => {}
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} rows differ:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
    assert_eq!(rows.len(), 2715);
    // 3 None values x (2 `for` loops + `>` + slice), 4 undefined x (`>` + slice), 9 strings,
    // lists and mappings `> 0`.
    assert_eq!(lenient, 29);
}
