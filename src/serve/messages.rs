//! Chat messages as clients send them, made ready for the chat template: content given as a
//! list of parts, the `developer` role, and the fields a message must have.
//!
//! - `content` as a list of parts (`[{"type": "text", "text": "…"}, …]`, sent by the OpenAI
//!   SDK, LangChain, Open WebUI): a template that iterates a message's parts itself (Gemma 3's
//!   and Kimi K2's Hugging Face templates, recognised from the template text:
//!   [`iterates_content_parts`]) gets the list; any other template gets the text parts joined
//!   with one space, as `transformers serve` joins them for a text-only model.
//! - Parts other than `text` (`image_url`, `input_audio`, `file`, …) are refused: the models
//!   served read text only.
//! - `developer` (OpenAI's newer name for the system role) becomes `system`, unless the
//!   template itself names the `developer` role (GPT-OSS's harmony template does).
//! - `content` `null` or missing is refused, except in an assistant message that carries
//!   `tool_calls`; a `tool` message needs `tool_call_id`.

use serde_json::Value;

use super::error::ApiError;
use super::types::known_keys;
use crate::tokenizer::chat::ChatTemplate;

/// The keys a message may have: OpenAI's (`refusal` and `audio` aside) and the reasoning
/// fields transformers passes to templates.
pub const MESSAGE_KEYS: &[&str] = &[
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "reasoning_content",
    "reasoning",
    "thinking",
];

/// Whether a template source loops over a message's `content` (`{% for x in m['content'] %}`
/// or `m.content`), i.e. renders a list of parts itself.
pub fn iterates_content_parts(source: &str) -> bool {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        regex::Regex::new(r#"for\s+\w+\s+in\s+\w+\s*(?:\.\s*content\b|\[\s*['"]content['"]\s*\])"#)
            .expect("valid regex")
    })
    .is_match(source)
}

/// Whether a template source takes the `developer` role itself: compares a role with the
/// string `developer` (`role == "developer"`, `'developer' != m.role`) or lists it among
/// roles (`m.role in ["system", "developer"]`), as GPT-OSS's harmony template does. The word
/// elsewhere (a header it writes for the system message, an error text) does not count.
pub fn names_developer_role(source: &str) -> bool {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        regex::Regex::new(
            r#"(?:==|!=)\s*['"]developer['"]|['"]developer['"]\s*(?:==|!=)|\bin\s*[\[(][^\])]*['"]developer['"]"#,
        )
        .expect("valid regex")
    })
    .is_match(source)
}

/// How a template takes messages (from its source, once at start).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TemplateTraits {
    /// The template iterates content parts ([`iterates_content_parts`]).
    pub parts: bool,
    /// The template names the `developer` role.
    pub developer: bool,
}

impl TemplateTraits {
    /// The traits of a template source.
    pub fn of(source: &str) -> TemplateTraits {
        TemplateTraits {
            parts: iterates_content_parts(source),
            developer: names_developer_role(source),
        }
    }
}

/// The roles a message may have (OpenAI's, less the deprecated `function`): a template may
/// drop a message of any other role without a word (Qwen3's does), so it is refused.
pub const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

fn bad(param: String, message: String) -> ApiError {
    ApiError::invalid(Some(&param), message)
}

/// What a part that is not text is, in words, for the error.
fn media(kind: &str) -> Option<&'static str> {
    match kind {
        "image_url" | "image" | "input_image" => Some("an image"),
        "input_audio" | "audio" | "audio_url" => Some("audio"),
        "video_url" | "video" => Some("a video"),
        "file" | "input_file" => Some("a file"),
        _ => None,
    }
}

/// The text parts of `parts` (message `i`), or the error naming the first part that is not
/// text.
fn text_parts(i: usize, parts: &[Value]) -> Result<Vec<String>, ApiError> {
    let mut texts = Vec::with_capacity(parts.len());
    for (j, p) in parts.iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        let kind = p.get("type").and_then(Value::as_str).ok_or_else(|| {
            bad(
                at.clone(),
                format!("{at} is not a content part (an object with a string \"type\")"),
            )
        })?;
        if kind != "text" {
            return Err(match media(kind) {
                Some(what) => bad(
                    at.clone(),
                    format!(
                        "{at} is {what} (type '{kind}'), but this model reads text only; send \
                         text parts"
                    ),
                ),
                None => bad(
                    at.clone(),
                    format!("{at} has type '{kind}'; only 'text' parts are accepted"),
                ),
            });
        }
        if let Some(k) = p
            .as_object()
            .and_then(|o| o.keys().find(|k| *k != "type" && *k != "text"))
        {
            let q = format!("{at}.{k}");
            return Err(bad(
                q.clone(),
                format!("{q} is not supported: a text part has only \"type\" and \"text\""),
            ));
        }
        match p.get("text").and_then(Value::as_str) {
            Some(t) => texts.push(t.to_string()),
            None => {
                return Err(bad(
                    format!("{at}.text"),
                    format!("{at} is a text part without a string \"text\""),
                ))
            }
        }
    }
    Ok(texts)
}

/// Checks `messages` and rewrites them for a template of `traits` (see the module header).
/// Errors: a 400 naming the message (`messages[1].content`) or part (`messages[1].content[0]`)
/// at fault.
pub fn prepare(messages: &[Value], traits: TemplateTraits) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(Some("messages"), "messages is empty"));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        let Some(obj) = m.as_object() else {
            return Err(bad(at.clone(), format!("{at} is not an object")));
        };
        let mut obj = obj.clone();
        let role = match obj.get("role").and_then(Value::as_str) {
            Some(r) => r.to_string(),
            None => {
                return Err(bad(
                    format!("{at}.role"),
                    format!("{at} has no string \"role\""),
                ))
            }
        };
        if !ROLES.contains(&role.as_str()) {
            let p = format!("{at}.role");
            return Err(bad(
                p.clone(),
                format!("{p} is '{role}'; expected one of {}", ROLES.join(", ")),
            ));
        }
        if role == "developer" && !traits.developer {
            obj.insert("role".into(), Value::from("system"));
        }
        let calls = obj
            .get("tool_calls")
            .and_then(Value::as_array)
            .is_some_and(|c| !c.is_empty());
        match obj.get("content") {
            None | Some(Value::Null) if role == "assistant" && calls => {}
            None | Some(Value::Null) => {
                return Err(bad(
                    format!("{at}.content"),
                    format!("{at}.content is null or missing; a {role} message needs content"),
                ))
            }
            Some(Value::String(_)) => {}
            Some(Value::Array(parts)) => {
                let texts = text_parts(i, parts)?;
                if !traits.parts {
                    obj.insert("content".into(), Value::from(texts.join(" ")));
                }
            }
            Some(_) => {
                return Err(bad(
                    format!("{at}.content"),
                    format!("{at}.content must be a string or a list of content parts"),
                ))
            }
        }
        if let Some(k) = obj.keys().find(|k| !MESSAGE_KEYS.contains(&k.as_str())) {
            let p = format!("{at}.{k}");
            return Err(bad(
                p.clone(),
                format!(
                    "{p} is not a message field this server supports (known: {})",
                    MESSAGE_KEYS.join(", ")
                ),
            ));
        }
        if obj.contains_key("tool_calls") && role != "assistant" {
            let p = format!("{at}.tool_calls");
            return Err(bad(
                p.clone(),
                format!("{p} is only allowed in an assistant message, not a {role} message"),
            ));
        }
        if obj.contains_key("tool_call_id") && role != "tool" {
            let p = format!("{at}.tool_call_id");
            return Err(bad(
                p.clone(),
                format!("{p} is only allowed in a tool message, not a {role} message"),
            ));
        }
        if let Some(calls) = obj.get("tool_calls") {
            let Some(calls) = calls.as_array() else {
                let p = format!("{at}.tool_calls");
                return Err(bad(p.clone(), format!("{p} must be a list of tool calls")));
            };
            for (j, c) in calls.iter().enumerate() {
                let p = format!("{at}.tool_calls[{j}]");
                if !c.is_object() {
                    return Err(bad(p.clone(), format!("{p} is not an object")));
                }
                known_keys(c, &p, &["id", "type", "function"])?;
                if let Some(f) = c.get("function") {
                    known_keys(f, &format!("{p}.function"), &["name", "arguments"])?;
                }
            }
        }
        if role == "tool" && !obj.get("tool_call_id").is_some_and(Value::is_string) {
            return Err(bad(
                format!("{at}.tool_call_id"),
                format!("{at} is a tool message without a string \"tool_call_id\""),
            ));
        }
        out.push(Value::Object(obj));
    }
    Ok(out)
}

/// Refuses what the template would drop without a trace: `tools` when the prompt renders the
/// same without them, the messages' `tool_calls` or `name` when it renders the same without
/// that field in every message (the first message that has it is named; transformers hands
/// the template the whole message, and a field it never reads would be silently ignored).
/// At most three renderings besides the prompt's. `messages` are [`prepare`]d. A rendering that fails is left for the
/// tokenizing to report. Errors: a 400 naming `tools`, `messages[i].tool_calls` or
/// `messages[i].name`.
pub fn check_rendered(
    tmpl: &ChatTemplate,
    messages: &[Value],
    tools: Option<&Value>,
) -> Result<(), ApiError> {
    let render =
        |m: &[Value], t: Option<&Value>| tmpl.render_json(&Value::Array(m.to_vec()), t, true).ok();
    let Some(full) = render(messages, tools) else {
        return Ok(());
    };
    if tools.is_some() && render(messages, None).as_ref() == Some(&full) {
        return Err(ApiError::invalid(
            Some("tools"),
            "tools is not supported by this model: its chat template does not render tool \
             definitions, so the model would never see them",
        ));
    }
    // one rendering per field, without it in every message that has it (not one per
    // message: an agent's history may hold many tool calls)
    for (field, what) in [("tool_calls", "tool calls"), ("name", "message names")] {
        // null and `[]` are absent
        let has = |m: &Value| {
            m.get(field)
                .is_some_and(|v| !v.is_null() && !v.as_array().is_some_and(Vec::is_empty))
        };
        let Some(first) = messages.iter().position(has) else {
            continue;
        };
        let mut without = messages.to_vec();
        for m in &mut without {
            if let Some(o) = m.as_object_mut() {
                o.remove(field);
            }
        }
        if render(&without, tools).as_ref() == Some(&full) {
            let p = format!("messages[{first}].{field}");
            return Err(bad(
                p.clone(),
                format!(
                    "{p} is not supported by this model: its chat template does not render \
                     {what}, so the model would never see it"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn templates_that_iterate_parts_are_recognised() {
        assert!(iterates_content_parts(
            "{%- for item in message['content'] -%}"
        ));
        assert!(iterates_content_parts("{% for c in m.content %}"));
        assert!(!iterates_content_parts(
            "{{ message.content }}{% for m in messages %}"
        ));
        assert!(!iterates_content_parts(
            crate::tokenizer::chat::GEMMA_TEMPLATE
        ));
    }

    /// The built-in Gemma template mentions "developer" only in an error text, GPT-OSS's
    /// fixture only in the header it writes for the system message: neither takes the role.
    #[test]
    fn only_templates_that_compare_a_role_with_developer_take_it() {
        assert!(names_developer_role(
            "{%- if messages[0].role == \"developer\" or messages[0].role == 'system' %}"
        ));
        assert!(names_developer_role("{% if 'developer' != m['role'] %}"));
        assert!(names_developer_role(
            "{% if m.role in ['system', 'developer'] %}"
        ));
        assert!(!names_developer_role(
            crate::tokenizer::chat::GEMMA_TEMPLATE
        ));
        let fixtures: Value = serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/hf/gpt_oss/tokenizer_config.json"
        )))
        .unwrap();
        let gpt_oss = fixtures["chat_template"].as_str().unwrap();
        assert!(gpt_oss.contains("<|start|>developer"));
        assert!(!names_developer_role(gpt_oss));
        assert_eq!(
            TemplateTraits::of(crate::tokenizer::chat::GEMMA_TEMPLATE),
            TemplateTraits::default()
        );
    }

    #[test]
    fn text_parts_are_joined_with_a_space_unless_the_template_iterates_them() {
        let m = [json!({"role": "developer", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": "b c"}]})];
        let joined = prepare(&m, TemplateTraits::default()).unwrap();
        assert_eq!(joined, [json!({"role": "system", "content": "a b c"})]);
        let kept = prepare(
            &m,
            TemplateTraits {
                parts: true,
                developer: true,
            },
        )
        .unwrap();
        assert_eq!(kept, m);
    }

    #[test]
    fn fields_the_template_drops_are_refused() {
        let gemma =
            ChatTemplate::new(crate::tokenizer::chat::GEMMA_TEMPLATE, "<bos>", "<eos>").unwrap();
        let tools = json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {}}}}]);
        let user = json!({"role": "user", "content": "hi"});
        let err = |t: &ChatTemplate, m: &[Value], tools: Option<&Value>| {
            let e = check_rendered(t, m, tools).unwrap_err();
            (e.param.unwrap(), e.message)
        };
        assert_eq!(
            err(&gemma, std::slice::from_ref(&user), Some(&tools)),
            (
                "tools".into(),
                "tools is not supported by this model: its chat template does not render \
                 tool definitions, so the model would never see them"
                    .into()
            )
        );
        let call = json!({"role": "assistant", "content": "ok", "tool_calls": [{"id": "c",
            "type": "function", "function": {"name": "f", "arguments": "{}"}}]});
        assert_eq!(
            err(&gemma, &[user.clone(), call.clone(), user.clone()], None),
            (
                "messages[1].tool_calls".into(),
                "messages[1].tool_calls is not supported by this model: its chat template does \
                 not render tool calls, so the model would never see it"
                    .into()
            )
        );
        let named = json!({"role": "user", "content": "hi", "name": "ann"});
        assert_eq!(
            err(&gemma, std::slice::from_ref(&named), None).0,
            "messages[0].name"
        );
        // a template that renders them all
        let full = ChatTemplate::new(
            "{{ tools | tojson if tools }}{% for m in messages %}{{ m.name }}:{{ m.content }}\
             {{ m.tool_calls | tojson if m.tool_calls }}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        assert!(check_rendered(&full, &[named, call, user], Some(&tools)).is_ok());
    }

    #[test]
    fn message_keys_are_checked() {
        let err = |m: Value| {
            let e = prepare(&[m], TemplateTraits::default()).unwrap_err();
            (e.param.unwrap(), e.message)
        };
        assert_eq!(
            err(json!({"role": "user", "content": "x", "foo": 1})),
            (
                "messages[0].foo".into(),
                "messages[0].foo is not a message field this server supports (known: role, \
                 content, name, tool_calls, tool_call_id, reasoning_content, reasoning, thinking)"
                    .into()
            )
        );
        assert_eq!(
            err(json!({"role": "user", "content": "x", "tool_calls": []})),
            (
                "messages[0].tool_calls".into(),
                "messages[0].tool_calls is only allowed in an assistant message, not a user \
                 message"
                    .into()
            )
        );
        assert_eq!(
            err(
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c",
                "function": {"name": "f", "arguments": "{}", "x": 1}}]})
            )
            .0,
            "messages[0].tool_calls[0].function.x"
        );
    }

    #[test]
    fn faults_are_named() {
        let err = |m: Value| {
            let e = prepare(
                &[json!({"role": "user", "content": "x"}), m],
                TemplateTraits::default(),
            )
            .unwrap_err();
            (e.param.unwrap(), e.message)
        };
        assert_eq!(
            err(
                json!({"role": "user", "content": [{"type": "text", "text": "x"},
                {"type": "image_url", "image_url": {"url": "data:"}}]})
            ),
            (
                "messages[1].content[1]".into(),
                "messages[1].content[1] is an image (type 'image_url'), but this model reads \
                 text only; send text parts"
                    .into()
            )
        );
        assert_eq!(
            err(json!({"role": "Developer", "content": "x"})),
            (
                "messages[1].role".into(),
                "messages[1].role is 'Developer'; expected one of system, developer, user, \
                 assistant, tool"
                    .into()
            )
        );
        assert_eq!(
            err(
                json!({"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {}}]})
            ),
            (
                "messages[1].content[0].cache_control".into(),
                "messages[1].content[0].cache_control is not supported: a text part has only \
                 \"type\" and \"text\""
                    .into()
            )
        );
        assert_eq!(
            err(json!({"role": "user", "content": null})).1,
            "messages[1].content is null or missing; a user message needs content"
        );
        assert_eq!(
            err(json!({"role": "tool", "content": "42"})),
            (
                "messages[1].tool_call_id".into(),
                "messages[1] is a tool message without a string \"tool_call_id\"".into()
            )
        );
        let call = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c"}]});
        assert!(prepare(&[call], TemplateTraits::default()).is_ok());
    }
}
