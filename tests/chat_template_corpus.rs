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
