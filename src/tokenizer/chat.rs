//! Chat templates: Jinja sources (GGUF `tokenizer.chat_template`, Hugging Face
//! `chat_template`) rendered with `minijinja`, configured like transformers'
//! `apply_chat_template` (`trim_blocks`, `lstrip_blocks`, Python string methods, `tojson`,
//! `raise_exception`, `strftime_now`).

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};
use minijinja::{context, Environment, Error, ErrorKind};

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
    {{ raise_exception("Unsupported role in a Gemma chat: " ~ m.role) }}
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
    bos_token: String,
    eos_token: String,
    source: String,
}

const NAME: &str = "chat";

/// Most minijinja instructions one rendering may execute.
pub const TEMPLATE_FUEL: u64 = 5_000_000;

impl ChatTemplate {
    /// Compiles `source`. `bos_token`/`eos_token` are the texts bound to the template
    /// variables of the same names. Errors: Jinja syntax errors (with minijinja's message).
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate> {
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
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| anyhow!("chat template does not compile: {e:#}"))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
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
            None,
            add_generation_prompt,
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
        self.render_values(
            minijinja::Value::from(minijinja::value::Serde(messages)),
            tools.map(|t| minijinja::Value::from(minijinja::value::Serde(t))),
            add_generation_prompt,
        )
    }

    fn render_values(
        &self,
        messages: minijinja::Value,
        tools: Option<minijinja::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let tmpl = self.env.get_template(NAME).map_err(|e| anyhow!("{e}"))?;
        tmpl.render(context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })
        .map_err(|e| match e.kind() {
            ErrorKind::InvalidOperation => match e.detail() {
                Some(d) => anyhow!("chat template error: {d}"),
                None => anyhow!("chat template error: {e}"),
            },
            _ => anyhow!("chat template failed: {e:#}"),
        })
    }
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

/// `strftime_now(format)`: the current UTC time formatted with C `strftime` codes
/// (`%Y %m %d %e %H %M %S %y %j %B %b %A %a %p %I %%` and glibc's `%-d`, `%-m`, `%-H`,
/// `%-I`). Unknown codes are kept literally.
fn strftime_now(format: String) -> Result<String, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?
        .as_secs() as i64;
    Ok(format_time(secs, &format))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Formats Unix time `secs` (UTC). Civil date from days: H. Hinnant, "chrono-Compatible
/// Low-Level Date Algorithms" (`civil_from_days`).
pub(crate) fn format_time(secs: i64, format: &str) -> String {
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (h, mi, s) = (sod / 3600, sod % 3600 / 60, sod % 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let d = doy_mar - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let wday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let h12 = if h % 12 == 0 { 12 } else { h % 12 };

    let mut out = String::new();
    let mut it = format.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut code = it.next();
        let no_pad = code == Some('-');
        if no_pad {
            code = it.next();
        }
        let num = |v: i64, w: usize| {
            if no_pad {
                v.to_string()
            } else {
                format!("{v:0w$}")
            }
        };
        match code {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&num(y.rem_euclid(100), 2)),
            Some('m') => out.push_str(&num(m, 2)),
            Some('d') => out.push_str(&num(d, 2)),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('H') => out.push_str(&num(h, 2)),
            Some('I') => out.push_str(&num(h12, 2)),
            Some('M') => out.push_str(&num(mi, 2)),
            Some('S') => out.push_str(&num(s, 2)),
            Some('j') => out.push_str(&num(yday, 3)),
            Some('p') => out.push_str(if h < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(MONTHS[(m - 1) as usize]),
            Some('b') => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            Some('A') => out.push_str(DAYS[wday]),
            Some('a') => out.push_str(&DAYS[wday][..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if no_pad {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// `tojson(indent=None)` as transformers defines it: Python `json.dumps` with
/// `ensure_ascii=False`, separators `", "`/`": "` (`","` between items when indented), keys
/// in insertion order, no HTML escaping (minijinja's own `tojson` escapes `<>&'`).
fn tojson(
    value: &minijinja::Value,
    indent: Option<usize>,
    kwargs: minijinja::value::Kwargs,
) -> Result<minijinja::Value, Error> {
    let indent = match kwargs.get::<Option<usize>>("indent")? {
        Some(i) => Some(i),
        None => indent,
    };
    // Accepted and ignored: output is always `ensure_ascii=False`, unsorted, default separators.
    for key in ["ensure_ascii", "sort_keys", "separators"] {
        let _: Option<minijinja::Value> = kwargs.get(key)?;
    }
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(value, indent, 0, &mut out)?;
    Ok(minijinja::Value::from_safe_string(out))
}

fn write_json(
    v: &minijinja::Value,
    indent: Option<usize>,
    depth: usize,
    out: &mut String,
) -> Result<(), Error> {
    use minijinja::value::ValueKind as K;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        K::Undefined | K::None => out.push_str("null"),
        K::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        K::Number => match v.as_i64() {
            Some(i) if v.is_integer() => out.push_str(&i.to_string()),
            _ => {
                let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                out.push_str(&if f.is_finite() {
                    format!("{f:?}")
                } else {
                    "NaN".into()
                });
            }
        },
        K::String => out.push_str(&serde_json::Value::String(v.to_string()).to_string()),
        K::Seq | K::Iterable => {
            let items: Vec<minijinja::Value> = v.try_iter()?.collect();
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json(x, indent, depth + 1, out)?;
            }
            if !items.is_empty() {
                newline(out, depth);
            }
            out.push(']');
        }
        K::Map => {
            let keys: Vec<minijinja::Value> = v.try_iter()?.collect();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                out.push_str(&serde_json::Value::String(k.to_string()).to_string());
                out.push_str(": ");
                write_json(&v.get_item(k)?, indent, depth + 1, out)?;
            }
            if !keys.is_empty() {
                newline(out, depth);
            }
            out.push('}');
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: cannot serialize a {} value", v.kind()),
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::format_time;

    #[test]
    fn format_time_known_instants() {
        // 2024-02-29 13:05:09 UTC, a Thursday, day 60 of a leap year.
        let t = 1_709_211_909;
        assert_eq!(format_time(t, "%Y-%m-%d %H:%M:%S"), "2024-02-29 13:05:09");
        assert_eq!(format_time(t, "%d %b %Y"), "29 Feb 2024");
        assert_eq!(
            format_time(t, "%A %B %-d, %j %I%p %y %e %% %q"),
            "Thursday February 29, 060 01PM 24 29 % %q"
        );
        // 1970-01-01 00:00:00 and a date before the epoch.
        assert_eq!(format_time(0, "%a %Y-%m-%d %-H"), "Thu 1970-01-01 0");
        assert_eq!(format_time(-86_400, "%Y-%m-%d %a"), "1969-12-31 Wed");
    }
}
