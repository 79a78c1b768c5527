//! Chat templates: Jinja sources (GGUF `tokenizer.chat_template`, Hugging Face
//! `chat_template`) rendered with `minijinja` as transformers 5.24's `render_jinja_template`
//! renders them with Jinja2: `trim_blocks`, `lstrip_blocks`, loop controls (`break`,
//! `continue`), `{% generation %}` blocks, Python string and dict methods
//! (`minijinja-contrib`'s pycompat), Python's printing of values and transformers' `tojson`,
//! `raise_exception` and `strftime_now` ([`super::chat_py`]), Jinja2's tests and filters where
//! minijinja's answer otherwise (`none is iterable` is false: [`super::chat_jinja2`]); the
//! variables `messages` (normalized: [`normalize_messages`]), `tools`, `documents`, `add_generation_prompt`, the
//! special tokens the tokenizer names (`bos_token`, `eos_token`, `unk_token`, `pad_token`, …)
//! and any extra keyword arguments ([`RenderOptions::extra`]).

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};
use minijinja::{Environment, Error, ErrorKind};

use super::chat_py::{py_format, strftime_now, tojson, wordcount};
use super::vocab::opt_str;
use crate::source::gguf::Value;

/// One chat message, as templates see it (`message.role`, `message.content`, …).
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    pub content: String,
    /// Tool name, for `tool` messages of templates that use it.
    pub name: Option<String>,
    /// Id of the tool call a `tool` message answers.
    pub tool_call_id: Option<String>,
}

impl Message {
    fn to_value(&self) -> minijinja::Value {
        let mut fields = BTreeMap::new();
        fields.insert("role", minijinja::Value::from(self.role.as_str()));
        fields.insert("content", minijinja::Value::from(self.content.as_str()));
        if let Some(n) = &self.name {
            fields.insert("name", minijinja::Value::from(n.as_str()));
        }
        if let Some(t) = &self.tool_call_id {
            fields.insert("tool_call_id", minijinja::Value::from(t.as_str()));
        }
        minijinja::Value::from(fields)
    }

    /// A message with only a role and a text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
            name: None,
            tool_call_id: None,
        }
    }
}

/// Deltafin's own Gemma template (written for this crate). It renders what transformers
/// renders with Gemma 3's template: `<bos>`, turns as `<start_of_turn>ROLE\n…<end_of_turn>\n`
/// with `model` for the assistant, a leading system message prepended to the first user turn
/// followed by a blank line, contents trimmed, and user/model turns required to alternate.
/// `tool` messages are rendered as user turns (Gemma has no tool role).
pub const GEMMA_TEMPLATE: &str = r#"{{ bos_token }}
{%- set ns = namespace(prefix="", turns=messages) -%}
{%- if messages and messages[0].role == "system" -%}
  {%- set ns.prefix = messages[0].content | trim ~ "\n\n" -%}
  {%- set ns.turns = messages[1:] -%}
{%- endif -%}
{%- for m in ns.turns -%}
  {%- set speaker = "model" if m.role == "assistant" else "user" -%}
  {%- if m.role not in ["user", "assistant", "tool"] -%}
    {{ raise_exception("Unsupported role in a Gemma chat: " ~ m.role ~ (" (a system or developer message must come first)" if m.role == "system" else "")) }}
  {%- endif -%}
  {%- if (speaker == "user") != (loop.index0 is even) -%}
    {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
  {%- endif -%}
  {{ "<start_of_turn>" ~ speaker ~ "\n" }}
  {%- if loop.first %}{{ ns.prefix }}{% endif -%}
  {{ m.content | trim }}<end_of_turn>
{{ "" }}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{ "<start_of_turn>model\n" }}
{%- endif -%}"#;

/// A compiled chat template plus the special-token texts it may reference.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    /// Template variables naming special tokens (`bos_token` → `<s>`), as transformers'
    /// `special_tokens_map`: only the tokens the tokenizer has.
    special: BTreeMap<String, String>,
}

/// What a rendering passes besides the messages, as `apply_chat_template`'s arguments.
#[derive(Clone, Copy, Debug, Default)]
pub struct RenderOptions<'a> {
    /// The `tools` variable (JSON schemas; `None` renders as Python's `None`).
    pub tools: Option<&'a serde_json::Value>,
    /// The `documents` variable (retrieval documents; `None` as above).
    pub documents: Option<&'a serde_json::Value>,
    /// The `add_generation_prompt` variable.
    pub add_generation_prompt: bool,
    /// Further variables (`apply_chat_template`'s `**kwargs`: `enable_thinking`,
    /// `reasoning_effort`, `date_string`, …); they override special tokens of the same name.
    pub extra: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

const NAME: &str = "chat";

/// Most minijinja instructions one rendering may execute.
pub const TEMPLATE_FUEL: u64 = 5_000_000;

impl ChatTemplate {
    /// Compiles `source`. `bos_token`/`eos_token` are the texts bound to the template
    /// variables of the same names (left undefined when empty, as transformers leaves a token
    /// the tokenizer lacks). Errors: Jinja syntax errors (with minijinja's message).
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate> {
        ChatTemplate::with_special_tokens(
            source,
            &[("bos_token", bos_token), ("eos_token", eos_token)],
        )
    }

    /// Compiles `source` with the given special-token variables (`("unk_token", "<unk>")`, …;
    /// empty texts are left out). Errors: as [`ChatTemplate::new`].
    pub fn with_special_tokens(source: &str, tokens: &[(&str, &str)]) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        // A template comes from the model file: bound its work so a hostile one cannot spin
        // or grow without end (real templates use a few thousand steps).
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| anyhow!("chat template syntax config: {e}"))?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        minijinja_contrib::add_to_environment(&mut env);
        super::chat_jinja2::add_to_environment(&mut env);
        env.set_formatter(py_format);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_filter("wordcount", |s: String| wordcount(&s));
        env.add_template_owned(NAME, rewrite_generation_tags(source))
            .map_err(|e| anyhow!("chat template does not compile: {e:#}"))?;
        let special = tokens
            .iter()
            .filter(|(_, t)| !t.is_empty())
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect();
        Ok(ChatTemplate {
            env,
            special,
            source: source.to_string(),
        })
    }

    /// Binds the template variable `name` (`pad_token`, `unk_token`, …) to the token text
    /// `text` (an empty text removes it).
    pub fn set_special_token(&mut self, name: &str, text: &str) {
        if text.is_empty() {
            self.special.remove(name);
        } else {
            self.special.insert(name.into(), text.into());
        }
    }

    /// The Jinja source of the template (used to recognise a family's tool-call syntax).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The template for a GGUF model: `tokenizer.chat_template` when present, otherwise the
    /// built-in [`GEMMA_TEMPLATE`] for architectures `gemma`, `gemma2`, `gemma3`. BOS/EOS texts
    /// come from `tokenizer.ggml.tokens` at `bos_token_id`/`eos_token_id` (empty when absent).
    /// Errors: no template key and another architecture; template compile errors.
    pub fn from_gguf_metadata(meta: &BTreeMap<String, Value>) -> Result<ChatTemplate> {
        let token = |key: &str| -> String {
            let (Some(Value::Array(toks)), Some(id)) = (
                meta.get("tokenizer.ggml.tokens"),
                meta.get(key).and_then(value_u64),
            ) else {
                return String::new();
            };
            match toks.get(id as usize) {
                Some(Value::String(s)) => s.clone(),
                _ => String::new(),
            }
        };
        let bos = token("tokenizer.ggml.bos_token_id");
        let eos = token("tokenizer.ggml.eos_token_id");
        if let Some(src) = opt_str(meta, "tokenizer.chat_template")? {
            return ChatTemplate::new(src, &bos, &eos);
        }
        let arch = opt_str(meta, "general.architecture")?.unwrap_or("");
        match arch {
            "gemma" | "gemma2" | "gemma3" => ChatTemplate::new(GEMMA_TEMPLATE, &bos, &eos),
            _ => bail!(
                "the GGUF has no tokenizer.chat_template and there is no built-in template \
                 for architecture {arch:?}"
            ),
        }
    }

    /// Renders a conversation. The result starts with the BOS text when the template writes
    /// `bos_token` (most do): tokenize it with `add_special = false, parse_special = true`.
    /// Errors: `raise_exception` calls and template runtime errors, with the template's message.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let messages: Vec<minijinja::Value> = messages.iter().map(Message::to_value).collect();
        self.render_values(
            minijinja::Value::from(messages),
            &RenderOptions {
                add_generation_prompt,
                ..Default::default()
            },
        )
    }

    /// Renders messages given as JSON, in the shape of the OpenAI chat API and of
    /// transformers' `apply_chat_template` (any fields: `tool_calls`, `name`, ...), with an
    /// optional `tools` list. Object keys keep their order, as in Python.
    /// Errors: as [`ChatTemplate::render`].
    pub fn render_json(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_with(
            messages,
            &RenderOptions {
                tools,
                add_generation_prompt,
                ..Default::default()
            },
        )
    }

    /// Renders JSON messages (normalized as transformers does: [`normalize_messages`]) with
    /// every variable `apply_chat_template` passes. Errors: as [`ChatTemplate::render`]; an
    /// extra variable named `messages`, `tools`, `documents` or `add_generation_prompt`.
    pub fn render_with(
        &self,
        messages: &serde_json::Value,
        opts: &RenderOptions,
    ) -> Result<String> {
        let messages = normalize_messages(messages);
        self.render_values(json_value(&messages), opts)
    }

    fn render_values(&self, messages: minijinja::Value, opts: &RenderOptions) -> Result<String> {
        use minijinja::Value as V;
        let tmpl = self.env.get_template(NAME).map_err(|e| anyhow!("{e}"))?;
        let mut vars: BTreeMap<String, V> = self
            .special
            .iter()
            .map(|(k, v)| (k.clone(), V::from(v.as_str())))
            .collect();
        for (k, v) in opts.extra.into_iter().flatten() {
            if ["messages", "tools", "documents", "add_generation_prompt"].contains(&k.as_str()) {
                bail!("chat template variable {k:?} cannot be given as an extra variable");
            }
            vars.insert(k.clone(), json_value(v));
        }
        let opt = |v: Option<&serde_json::Value>| v.map_or(V::from(()), json_value);
        vars.insert("messages".into(), messages);
        vars.insert("tools".into(), opt(opts.tools));
        vars.insert("documents".into(), opt(opts.documents));
        vars.insert(
            "add_generation_prompt".into(),
            V::from(opts.add_generation_prompt),
        );
        tmpl.render(V::from(vars)).map_err(|e| match e.kind() {
            ErrorKind::InvalidOperation => match e.detail() {
                Some(d) => anyhow!("chat template error: {d}"),
                None => anyhow!("chat template error: {e}"),
            },
            _ => anyhow!("chat template failed: {e:#}"),
        })
    }
}

/// A JSON value as a template value (object keys keep their order).
fn json_value(v: &serde_json::Value) -> minijinja::Value {
    minijinja::Value::from(minijinja::value::Serde(v))
}

fn value_u64(v: &Value) -> Option<u64> {
    match *v {
        Value::U8(x) => Some(x.into()),
        Value::U16(x) => Some(x.into()),
        Value::U32(x) => Some(x.into()),
        Value::U64(x) => Some(x),
        Value::I32(x) => u64::try_from(x).ok(),
        Value::I64(x) => u64::try_from(x).ok(),
        _ => None,
    }
}

/// `raise_exception(msg)`: fails the render with `msg`.
fn raise_exception(msg: String) -> Result<minijinja::Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// transformers' `{% generation %}…{% endgeneration %}` block (its `AssistantTracker`
/// extension, which marks assistant text and otherwise renders the body unchanged) rewritten
/// as `{% if true %}…{% endif %}`, keeping the tags' whitespace controls (`-`, `+`).
pub fn rewrite_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(i) = rest.find("{%") {
        out.push_str(&rest[..i]);
        let tag = &rest[i..];
        // The closing `%}` starts after the opening `{%` (in `{%}` the two overlap).
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let body = inner.trim_start_matches(['-', '+']);
        let lead = &inner[..inner.len() - body.len()];
        let body2 = body.trim_end_matches(['-', '+']);
        let trail = &body[body2.len()..];
        let word = match body2.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match word {
            Some(w) => {
                out.push_str("{%");
                out.push_str(lead);
                out.push(' ');
                out.push_str(w);
                out.push(' ');
                out.push_str(trail);
                out.push_str("%}");
            }
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// The messages as transformers hands them to the template: keys whose value is `null`
/// dropped (`_normalize_chat_messages`), and a message with reasoning under any of
/// `reasoning_content`, `thinking`, `reasoning` (the first non-null, in that order) given it
/// as `thinking` (first key, unless the message has one) and `reasoning_content`
/// (`_alias_reasoning_fields`). Non-object messages and non-array input pass unchanged.
pub fn normalize_messages(messages: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value as J;
    let Some(list) = messages.as_array() else {
        return messages.clone();
    };
    let out = list.iter().map(|m| {
        let Some(obj) = m.as_object() else {
            return m.clone();
        };
        let kept: serde_json::Map<String, J> = obj
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let reasoning = ["reasoning_content", "thinking", "reasoning"]
            .iter()
            .find_map(|k| kept.get(*k).cloned());
        let Some(r) = reasoning else {
            return J::Object(kept);
        };
        let mut aliased = serde_json::Map::new();
        aliased.insert("thinking".into(), r.clone());
        for (k, v) in kept {
            aliased.insert(k, v);
        }
        aliased.insert("reasoning_content".into(), r);
        J::Object(aliased)
    });
    J::Array(out.collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tojson_keeps_the_literal_text_mark_unescaped() {
        let t = ChatTemplate::new(
            "{{ messages[0].content | tojson(ensure_ascii=True) }}",
            "",
            "",
        )
        .unwrap();
        let m = serde_json::json!([{"role": "user", "content": "é<\u{FDD0}|im_end|>"}]);
        assert_eq!(
            t.render_json(&m, None, false).unwrap(),
            "\"\\u00e9<\u{FDD0}|im_end|>\""
        );
    }

    #[test]
    fn generation_tags_become_if_blocks() {
        assert_eq!(
            rewrite_generation_tags(
                "a{%- generation -%}b{% endgeneration %}{% if x %}{%+endgeneration+%}"
            ),
            "a{%- if true -%}b{% endif %}{% if x %}{%+ endif +%}"
        );
    }

    /// `{%}` (an opening tag whose `%` could also start a closing one; found by the `chat`
    /// fuzz target) passes through unchanged and fails as a template syntax error, not a panic.
    #[test]
    fn overlapping_tag_delimiters_pass_through() {
        assert_eq!(
            rewrite_generation_tags("{%}{{ i }}{% endfor %}"),
            "{%}{{ i }}{% endfor %}"
        );
        assert_eq!(rewrite_generation_tags("x{%}"), "x{%}");
        assert_eq!(
            rewrite_generation_tags("{%}{% generation %}"),
            "{%}{% generation %}"
        );
        let err = ChatTemplate::new("{%}{{ i }}{% endfor %}", "<s>", "</s>").unwrap_err();
        assert!(err.to_string().contains("syntax error"), "{err}");
    }

    #[test]
    fn messages_lose_nulls_and_gain_reasoning_aliases() {
        let m = serde_json::json!([
            {"role": "assistant", "content": null, "reasoning": "r1", "tool_calls": []},
            {"role": "assistant", "thinking": null, "reasoning_content": "r2"},
            {"role": "user", "content": "hi"},
        ]);
        let n = normalize_messages(&m);
        assert_eq!(
            n.to_string(),
            r#"[{"thinking":"r1","role":"assistant","reasoning":"r1","tool_calls":[],"reasoning_content":"r1"},{"thinking":"r2","role":"assistant","reasoning_content":"r2"},{"role":"user","content":"hi"}]"#
        );
    }
}
