//! Tool calls in model output: which syntax a model's chat template uses, and parsing the
//! calls out of the generated text. Formats (read from the families' templates):
//! - Hermes / Qwen3: `<tool_call>{"name": N, "arguments": {…}}</tool_call>`, repeated;
//! - DeepSeek V3: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\nARGS\n```<｜tool▁call▁end｜>…`
//!   (V3.1 writes `<｜tool▁call▁begin｜>N<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>`);
//! - Kimi K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.N:I<|tool_call_argument_begin|>ARGS<|tool_call_end|>…`;
//! - GPT-OSS harmony: `<|channel|>commentary to=functions.N <|constrain|>json<|message|>ARGS<|call|>`.
//!
//! Generated text streams as content until the format's section marker appears; everything
//! from the marker on is held and parsed when generation ends.

/// A tool-call syntax.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// Qwen3 and other Hermes-style templates.
    Hermes,
    /// DeepSeek V3 / V3.1.
    DeepSeek,
    /// Kimi K2.
    Kimi,
    /// GPT-OSS harmony.
    Harmony,
}

/// One parsed call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// The call's id (the model's own where it writes one, else a fresh one: [`new_call_id`]).
    pub id: String,
    /// Function name.
    pub name: String,
    /// Arguments as JSON text.
    pub arguments: String,
}

/// A fresh call id: `call_` and 24 hex digits, a process-wide counter hashed with a key drawn
/// at random once per process (std's `RandomState`), so ids differ within a response, across
/// responses and across runs.
pub fn new_call_id() -> String {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    static KEY: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    let key = KEY.get_or_init(Default::default);
    let (a, b) = (key.hash_one((n, 0u8)), key.hash_one((n, 1u8)));
    format!("call_{a:016x}{:08x}", b as u32)
}

const DS_CALL: &str = "<｜tool▁call▁begin｜>";
const DS_SEP: &str = "<｜tool▁sep｜>";
const DS_END: &str = "<｜tool▁call▁end｜>";
const KIMI_CALL: &str = "<|tool_call_begin|>";
const KIMI_ARG: &str = "<|tool_call_argument_begin|>";
const KIMI_END: &str = "<|tool_call_end|>";

impl ToolFormat {
    /// The format a chat template's source uses, if any.
    pub fn detect(template: &str) -> Option<ToolFormat> {
        if template.contains("tool▁calls▁begin") {
            Some(ToolFormat::DeepSeek)
        } else if template.contains("tool_calls_section_begin") {
            Some(ToolFormat::Kimi)
        } else if template.contains("<|channel|>") && template.contains("to=functions") {
            Some(ToolFormat::Harmony)
        } else if template.contains("<tool_call>") {
            Some(ToolFormat::Hermes)
        } else {
            None
        }
    }

    /// The text that starts the calls in generated output.
    pub fn marker(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "<tool_call>",
            ToolFormat::DeepSeek => "<｜tool▁calls▁begin｜>",
            ToolFormat::Kimi => "<|tool_calls_section_begin|>",
            ToolFormat::Harmony => "<|channel|>commentary to=functions.",
        }
    }

    /// Parses the held section (starting with [`ToolFormat::marker`]); `None` when it holds
    /// no well-formed call (the text is then returned to the client as content).
    pub fn parse(self, section: &str) -> Option<Vec<ToolCall>> {
        let mut calls = Vec::new();
        let id = |_: usize| new_call_id();
        match self {
            ToolFormat::Hermes => {
                for part in section.split("<tool_call>").skip(1) {
                    let body = part.split("</tool_call>").next()?.trim();
                    let v: serde_json::Value = serde_json::from_str(body).ok()?;
                    let name = v.get("name")?.as_str()?.to_string();
                    let arguments = match v.get("arguments") {
                        Some(serde_json::Value::String(s)) => s.clone(),
                        Some(a) => a.to_string(),
                        None => "{}".into(),
                    };
                    calls.push(ToolCall {
                        id: id(calls.len()),
                        name,
                        arguments,
                    });
                }
            }
            ToolFormat::DeepSeek => {
                for part in section.split(DS_CALL).skip(1) {
                    let body = part.split(DS_END).next()?;
                    let (left, right) = body.split_once(DS_SEP)?;
                    let (name, args) = if left.trim() == "function" {
                        let (name, rest) = right.split_once('\n')?;
                        let args = rest
                            .trim()
                            .trim_start_matches("```json")
                            .trim_end_matches("```");
                        (name.trim(), args.trim())
                    } else {
                        (left.trim(), right.trim())
                    };
                    serde_json::from_str::<serde_json::Value>(args).ok()?;
                    calls.push(ToolCall {
                        id: id(calls.len()),
                        name: name.to_string(),
                        arguments: args.to_string(),
                    });
                }
            }
            ToolFormat::Kimi => {
                for part in section.split(KIMI_CALL).skip(1) {
                    let body = part.split(KIMI_END).next()?;
                    let (head, args) = body.split_once(KIMI_ARG)?;
                    let head = head.trim();
                    let name = head.strip_prefix("functions.").unwrap_or(head);
                    let name = name.rsplit_once(':').map_or(name, |x| x.0);
                    serde_json::from_str::<serde_json::Value>(args.trim()).ok()?;
                    calls.push(ToolCall {
                        id: head.to_string(),
                        name: name.to_string(),
                        arguments: args.trim().to_string(),
                    });
                }
            }
            ToolFormat::Harmony => {
                let rest = section.strip_prefix(self.marker())?;
                let end = rest.find([' ', '<']).unwrap_or(rest.len());
                let name = &rest[..end];
                let args = rest[end..].split_once("<|message|>")?.1;
                let args = args.split("<|call|>").next()?.trim();
                serde_json::from_str::<serde_json::Value>(args).ok()?;
                calls.push(ToolCall {
                    id: id(0),
                    name: name.to_string(),
                    arguments: args.to_string(),
                });
            }
        }
        (!calls.is_empty()).then_some(calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The call's id (`call_ID` for a fresh one), name and arguments.
    fn one(f: ToolFormat, text: &str) -> (String, String, String) {
        let c = f.parse(text).unwrap();
        assert_eq!(c.len(), 1);
        let id = match c[0].id.strip_prefix("call_") {
            Some(hex) if hex.len() == 24 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
                "call_ID".into()
            }
            _ => c[0].id.clone(),
        };
        (id, c[0].name.clone(), c[0].arguments.clone())
    }

    #[test]
    fn fresh_call_ids_differ() {
        let two = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\
                   <tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>";
        let c = ToolFormat::Hermes.parse(two).unwrap();
        let again = ToolFormat::Hermes.parse(two).unwrap();
        let ids = [&c[0].id, &c[1].id, &again[0].id, &again[1].id];
        for (i, a) in ids.iter().enumerate() {
            assert_eq!(a.len(), 29, "{a}");
            assert!(ids[i + 1..].iter().all(|b| b != a), "{ids:?}");
        }
    }

    #[test]
    fn parses_each_family() {
        let args = r#"{"city": "Paris"}"#;
        assert_eq!(
            one(
                ToolFormat::Hermes,
                "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
            ),
            ("call_ID".into(), "w".into(), r#"{"city":"Paris"}"#.into())
        );
        let ds = format!("<｜tool▁calls▁begin｜>{DS_CALL}function{DS_SEP}w\n```json\n{args}\n```{DS_END}<｜tool▁calls▁end｜>");
        assert_eq!(
            one(ToolFormat::DeepSeek, &ds),
            ("call_ID".into(), "w".into(), args.into())
        );
        let ds31 = format!("<｜tool▁calls▁begin｜>{DS_CALL}w{DS_SEP}{args}{DS_END}");
        assert_eq!(one(ToolFormat::DeepSeek, &ds31).1, "w");
        let kimi = format!(
            "<|tool_calls_section_begin|>{KIMI_CALL}functions.w:0{KIMI_ARG}{args}{KIMI_END}"
        );
        assert_eq!(
            one(ToolFormat::Kimi, &kimi),
            ("functions.w:0".into(), "w".into(), args.into())
        );
        let h = format!("<|channel|>commentary to=functions.w <|constrain|>json<|message|>{args}");
        assert_eq!(one(ToolFormat::Harmony, &h).1, "w");
        assert_eq!(
            ToolFormat::Hermes.parse("<tool_call>not json</tool_call>"),
            None
        );
        assert_eq!(
            ToolFormat::detect("x <tool_call> y"),
            Some(ToolFormat::Hermes)
        );
        assert_eq!(ToolFormat::detect("plain"), None);
    }
}
