//! Chat template rendering: the built-in Gemma template against the strings transformers
//! renders with Gemma 3's `chat_template`, and engine features used by real templates.

use std::collections::BTreeMap;

use deltafin::source::gguf::Value;
use deltafin::tokenizer::{ChatTemplate, Message};

fn gemma_meta(template: Option<&str>, arch: &str) -> BTreeMap<String, Value> {
    let mut m = BTreeMap::new();
    m.insert("general.architecture".into(), Value::String(arch.into()));
    let toks = ["<pad>", "<eos>", "<bos>"]
        .iter()
        .map(|t| Value::String(t.to_string()))
        .collect();
    m.insert("tokenizer.ggml.tokens".into(), Value::Array(toks));
    m.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(2));
    m.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(1));
    if let Some(t) = template {
        m.insert("tokenizer.chat_template".into(), Value::String(t.into()));
    }
    m
}

fn gemma() -> ChatTemplate {
    ChatTemplate::from_gguf_metadata(&gemma_meta(None, "gemma3")).unwrap()
}

#[test]
fn gemma_single_user_turn() {
    let out = gemma()
        .render(&[Message::new("user", "Hello")], true)
        .unwrap();
    assert_eq!(
        out,
        "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n"
    );
}

#[test]
fn gemma_system_is_prepended_to_first_user_turn() {
    let msgs = [
        Message::new("system", "You are terse."),
        Message::new("user", "Hi there"),
    ];
    let out = gemma().render(&msgs, true).unwrap();
    assert_eq!(
        out,
        "<bos><start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n<start_of_turn>model\n"
    );
}

#[test]
fn gemma_multi_turn_without_generation_prompt_trims_content() {
    let msgs = [
        Message::new("system", "Be kind."),
        Message::new("user", "  What is 2+2?\n"),
        Message::new("assistant", "4"),
        Message::new("user", "And 3+3?"),
    ];
    let out = gemma().render(&msgs, false).unwrap();
    assert_eq!(
        out,
        "<bos><start_of_turn>user\nBe kind.\n\nWhat is 2+2?<end_of_turn>\n\
         <start_of_turn>model\n4<end_of_turn>\n\
         <start_of_turn>user\nAnd 3+3?<end_of_turn>\n"
    );
}

#[test]
fn gemma_rejects_non_alternating_roles() {
    let msgs = [Message::new("user", "a"), Message::new("user", "b")];
    let err = gemma().render(&msgs, true).unwrap_err().to_string();
    assert_eq!(
        err,
        "chat template error: Conversation roles must alternate user/assistant/user/assistant/..."
    );
}

#[test]
fn gemma_names_a_late_system_message_and_an_unknown_role() {
    let late = [Message::new("user", "a"), Message::new("system", "b")];
    assert_eq!(
        gemma().render(&late, true).unwrap_err().to_string(),
        "chat template error: Unsupported role in a Gemma chat: system (a system or developer \
         message must come first)"
    );
    let odd = [Message::new("user", "a"), Message::new("critic", "b")];
    assert_eq!(
        gemma().render(&odd, true).unwrap_err().to_string(),
        "chat template error: Unsupported role in a Gemma chat: critic"
    );
}

#[test]
fn gemma_template_only_for_gemma_architectures() {
    for arch in ["gemma", "gemma2", "gemma3"] {
        assert!(
            ChatTemplate::from_gguf_metadata(&gemma_meta(None, arch)).is_ok(),
            "{arch}"
        );
    }
    let err = ChatTemplate::from_gguf_metadata(&gemma_meta(None, "llama")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the GGUF has no tokenizer.chat_template and there is no built-in template for \
         architecture \"llama\""
    );
}

/// A ChatML template in the style of Qwen's: namespaces, reversed loops with `break`,
/// Python string methods, `tojson`, tool messages. The expected string is Python jinja2's
/// rendering (trim_blocks, lstrip_blocks, transformers' `tojson`). Map literals are written
/// with sorted keys: minijinja without its `preserve_order` feature iterates maps sorted.
const CHATML: &str = r#"{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages[::-1] %}
    {%- if m.role == "user" %}{% set ns.last_user = messages|length - 1 - loop.index0 %}{% break %}{% endif %}
{%- endfor %}
{%- for m in messages %}
    {%- if m.role == "tool" %}
<|im_start|>user
<tool_response>{{ {"id": m.tool_call_id, "n": [1, 2.5, true, none], "name": m.name} | tojson }}
{{ m.content.strip() }}</tool_response><|im_end|>
    {%- else %}
<|im_start|>{{ m.role }}
{{ m.content.strip() }}{% if loop.index0 == ns.last_user %} [last user]{% endif %}<|im_end|>
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"#;

#[test]
fn chatml_with_namespace_loop_controls_tojson_and_tools() {
    let tmpl = ChatTemplate::from_gguf_metadata(&gemma_meta(Some(CHATML), "qwen2")).unwrap();
    let mut tool = Message::new("tool", " 22 C ");
    tool.name = Some("weather".into());
    tool.tool_call_id = Some("call<1>".into());
    let msgs = [
        Message::new("system", "sys"),
        Message::new("user", " Weather? "),
        Message::new("assistant", "Calling."),
        tool,
    ];
    let out = tmpl.render(&msgs, true).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nsys<|im_end|><|im_start|>user\nWeather? [last user]<|im_end|>\
         <|im_start|>assistant\nCalling.<|im_end|><|im_start|>user\n<tool_response>\
         {\"id\": \"call<1>\", \"n\": [1, 2.5, true, null], \"name\": \"weather\"}\n22 C\
         </tool_response><|im_end|><|im_start|>assistant\n"
    );
}

#[test]
fn tojson_indent_and_bos_eos_and_strftime() {
    let src = "{{ bos_token }}|{{ eos_token }}|{{ {'a': [1, {'b': 'é'}], 'c': {}} | tojson(indent=2) }}|{{ strftime_now('%Y') | length }}";
    let tmpl = ChatTemplate::new(src, "<s>", "</s>").unwrap();
    let out = tmpl.render(&[], false).unwrap();
    assert_eq!(
        out,
        "<s>|</s>|{\n  \"a\": [\n    1,\n    {\n      \"b\": \"é\"\n    }\n  ],\n  \"c\": {}\n}|4"
    );
}

#[test]
fn raise_exception_message_is_reported() {
    let tmpl = ChatTemplate::new("{{ raise_exception('no tools here') }}", "", "").unwrap();
    let err = tmpl.render(&[], false).unwrap_err();
    assert_eq!(err.to_string(), "chat template error: no tools here");
}

#[test]
fn syntax_error_is_reported_at_construction() {
    let err = ChatTemplate::new("{% if %}", "", "")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("chat template does not compile: "), "{err}");
}

#[test]
fn a_template_that_never_ends_runs_out_of_fuel() {
    let t = deltafin::tokenizer::chat::ChatTemplate::new(
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
        "",
        "",
    )
    .unwrap();
    let e = t.render(&[], true).unwrap_err().to_string();
    assert!(e.contains("fuel"), "{e}");
}

/// The tools guard of Qwen3-Coder's and NVIDIA Nemotron 3 Nano's templates: Jinja2's `none is
/// iterable` is false, so `tools | length` is never reached without tools (minijinja's own
/// test answered true and the render failed with "cannot calculate length of value of type
/// none"); an undefined variable is iterable and empty. Outputs as transformers renders them.
#[test]
fn tools_guard_skips_none_and_undefined_tools() {
    let t = ChatTemplate::new(
        "{%- if tools is iterable and tools | length > 0 %}\n\
         {{- '<tools>' }}{% for t in tools %}{{ t.function.name }};{% endfor %}{{ '</tools>\\n' }}\n\
         {%- endif %}\n\
         {%- if functions is iterable and functions | length > 0 %}{{ 'functions' }}{% endif %}\n\
         {%- for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
        "",
        "",
    )
    .unwrap();
    let msgs = serde_json::json!([{"role": "user", "content": "hi"}]);
    assert_eq!(t.render_json(&msgs, None, false).unwrap(), "user: hi\n");
    assert_eq!(
        t.render_json(&msgs, Some(&serde_json::json!([])), false)
            .unwrap(),
        "user: hi\n"
    );
    let tools = serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
    assert_eq!(
        t.render_json(&msgs, Some(&tools), false).unwrap(),
        "<tools>f;</tools>\nuser: hi\n"
    );
}
