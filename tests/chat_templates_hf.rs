//! Chat templates rendered exactly as transformers 5.24's `apply_chat_template` renders them:
//! tests/fixtures/hf/chat_templates.json (tools/reference/hf_fixtures.py) holds five templates
//! (ChatML with tools, Llama 3 with tools, Mistral, DeepSeek V3, gpt-oss style), conversations
//! with system, multi-turn, tool-call and tool messages, and transformers' output for each with
//! and without the generation prompt.

use deltafin::tokenizer::chat::ChatTemplate;
use serde_json::Value;

#[test]
fn every_fixture_conversation_renders_like_transformers() {
    let fx: Value = serde_json::from_str(include_str!("fixtures/hf/chat_templates.json")).unwrap();
    let convs: Vec<&Value> = fx["conversations"].as_array().unwrap().iter().collect();
    let mut checked = 0;
    let mut failures = Vec::new();
    for (name, t) in fx["templates"].as_object().unwrap() {
        let tmpl = ChatTemplate::new(
            t["template"].as_str().unwrap(),
            t["bos_token"].as_str().unwrap_or(""),
            t["eos_token"].as_str().unwrap_or(""),
        )
        .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        for case in t["cases"].as_array().unwrap() {
            let conv = convs
                .iter()
                .find(|c| c["name"] == case["conversation"])
                .expect("conversation");
            let tools = case["with_tools"]
                .as_bool()
                .unwrap_or(false)
                .then(|| &fx["tools"]);
            let agp = case["add_generation_prompt"].as_bool().unwrap();
            let got = tmpl
                .render_json(&conv["messages"], tools, agp)
                .unwrap_or_else(|e| panic!("{name}/{}: {e:#}", case["conversation"]));
            let want = case["output"].as_str().unwrap();
            if got != want {
                failures.push(format!(
                    "{name}/{} agp={agp}:\n got: {got:?}\nwant: {want:?}",
                    case["conversation"]
                ));
            }
            checked += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked >= 40, "{checked} cases");
}
