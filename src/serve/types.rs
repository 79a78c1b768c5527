//! OpenAI request bodies (serde), as the chat and completions endpoints accept them. A field
//! the server does not support is refused with a 400 naming it ([`check_fields`]), never
//! ignored; a field of the wrong type is a 400 naming it; a field set to `null` is absent.

use serde::Deserialize;

use super::error::ApiError;

/// The fields `POST /v1/chat/completions` accepts (`user` is accepted and unused: it only
/// names the end user).
pub const CHAT_FIELDS: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "response_format",
    "logit_bias",
    "ignore_eos",
    "grammar",
    "json_schema",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "user",
];

/// The fields `POST /v1/completions` accepts.
pub const COMPLETION_FIELDS: &[&str] = &[
    "model",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "n",
    "best_of",
    "stream",
    "stream_options",
    "logprobs",
    "echo",
    "suffix",
    "response_format",
    "logit_bias",
    "ignore_eos",
    "grammar",
    "json_schema",
    "user",
];

/// Drops the fields of `body` set to `null` and refuses, by name, the first field not in
/// `accepted` (known ones with the reason). Errors: a 400 whose `param` is the field.
pub fn check_fields(
    body: &mut serde_json::Map<String, serde_json::Value>,
    accepted: &[&str],
) -> Result<(), ApiError> {
    body.retain(|_, v| !v.is_null());
    let Some(f) = body.keys().find(|k| !accepted.contains(&k.as_str())) else {
        return Ok(());
    };
    let why = match f.as_str() {
        "functions" | "function_call" => {
            format!("{f} (deprecated by OpenAI) is not supported; use tools and tool_choice")
        }
        "messages" | "prompt" => format!(
            "{f} belongs to the other endpoint ({})",
            if f == "messages" {
                "/v1/chat/completions"
            } else {
                "/v1/completions"
            }
        ),
        _ => format!("{f} is not a parameter this server supports"),
    };
    Err(ApiError::invalid(Some(f), why))
}

/// `stop`: one string or a list.
#[derive(Clone, Debug)]
pub enum StopField {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl<'de> Deserialize<'de> for StopField {
    /// A string or a list of strings; anything else is an error saying so (serde's untagged
    /// enums only say that no variant matched).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(s) => Ok(StopField::One(s)),
            serde_json::Value::Array(a) => a
                .into_iter()
                .map(|v| match v {
                    serde_json::Value::String(s) => Ok(s),
                    other => Err(D::Error::custom(format!(
                        "{other} is not a string; expected a string or a list of strings"
                    ))),
                })
                .collect::<Result<_, _>>()
                .map(StopField::Many),
            other => Err(D::Error::custom(format!(
                "{other} is not a string or a list of strings"
            ))),
        }
    }
}

/// `stream_options` (only with `stream: true`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// A last chunk carries the usage of the whole request.
    #[serde(default)]
    pub include_usage: bool,
}

/// A tool of `tools`, as checked (the request keeps the JSON it sent for the template):
/// `{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolDef {
    /// Only `function`.
    #[serde(rename = "type")]
    pub kind: ToolKind,
    /// The function the model may call.
    pub function: FunctionDef,
}

/// The kinds of tool served: functions only.
#[derive(Clone, Copy, Debug, Deserialize)]
pub enum ToolKind {
    /// A function the client runs.
    #[serde(rename = "function")]
    Function,
}

/// A function of a tool.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionDef {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// Its arguments' JSON schema.
    pub parameters: Option<serde_json::Value>,
    /// OpenAI's structured calls: only `false` (calls are parsed, not constrained).
    pub strict: Option<bool>,
}

/// Deserializes `v` as a `T` with errors naming the path of the field at fault under `root`
/// (`stop[0]: …`, `tools[1].function: missing field …`). Errors: a 400 whose `param` is that
/// path.
pub fn read_as<T: serde::de::DeserializeOwned>(
    v: serde_json::Value,
    root: &str,
) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let inner = e.inner().to_string();
        let path = e.path().to_string();
        let param = match (root.is_empty(), path.as_str()) {
            (true, ".") => None,
            (true, _) => Some(path),
            (false, ".") => Some(root.to_string()),
            (false, p) if p.starts_with('[') => Some(format!("{root}{p}")),
            (false, p) => Some(format!("{root}.{p}")),
        };
        match param {
            Some(p) => ApiError::invalid(Some(&p), format!("{p}: {inner}")),
            None => ApiError::invalid(
                None,
                format!("the body does not match the request schema: {inner}"),
            ),
        }
    })
}

/// Refuses, by its path, the first key of the object `v` (at `path`) not in `allowed`.
pub fn known_keys(v: &serde_json::Value, path: &str, allowed: &[&str]) -> Result<(), ApiError> {
    let Some(obj) = v.as_object() else {
        return Ok(());
    };
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => {
            let at = format!("{path}.{k}");
            Err(ApiError::invalid(
                Some(&at),
                format!("{at} is not supported (known: {})", allowed.join(", ")),
            ))
        }
        None => Ok(()),
    }
}

/// Declares a request struct with the sampling and stop fields both endpoints share
/// (fields are written out, not flattened, so serde's errors name the field at fault).
macro_rules! request {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $f:ident : $t:ty,)* }) => {
        $(#[$m])*
        #[derive(Clone, Debug, Deserialize)]
        pub struct $name {
            /// The model named (any name is answered by the one model served).
            #[serde(default)]
            pub model: String,
            pub max_tokens: Option<u32>,
            pub max_completion_tokens: Option<u32>,
            pub temperature: Option<f32>,
            pub top_p: Option<f32>,
            pub top_k: Option<i64>,
            pub min_p: Option<f32>,
            pub presence_penalty: Option<f32>,
            pub frequency_penalty: Option<f32>,
            pub repetition_penalty: Option<f32>,
            pub seed: Option<i64>,
            pub stop: Option<StopField>,
            pub n: Option<u32>,
            #[serde(default)]
            pub stream: bool,
            pub stream_options: Option<StreamOptions>,
            /// `{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}`,
            /// read by [`super::steer`].
            pub response_format: Option<serde_json::Value>,
            /// Token id (as a string) → bias in [-100, 100], read by [`super::steer`].
            pub logit_bias: Option<serde_json::Value>,
            /// llama-server's: end-of-generation tokens are never sampled.
            #[serde(default)]
            pub ignore_eos: bool,
            /// llama-server's: a grammar, GBNF (read by `super::gbnf`) or llguidance's Lark syntax.
            pub grammar: Option<String>,
            /// llama-server's: a JSON schema the output follows.
            pub json_schema: Option<serde_json::Value>,
            $($(#[$fm])* pub $f: $t,)*
        }
    };
}

request!(
    /// `POST /v1/chat/completions`.
    ChatRequest {
        /// Messages in the OpenAI shape, passed to the chat template as they are.
        messages: Vec<serde_json::Value>,
        #[serde(default)]
        logprobs: bool,
        top_logprobs: Option<u32>,
        tools: Option<Vec<serde_json::Value>>,
        tool_choice: Option<serde_json::Value>,
        parallel_tool_calls: Option<bool>,
        /// Accepted and unused (it names the end user).
        #[allow(dead_code)]
        user: Option<String>,
    }
);

request!(
    /// `POST /v1/completions`.
    CompletionRequest {
        /// Read by [`super::info::read_prompt`] (so its errors name `prompt`).
        prompt: serde_json::Value,
        /// Legacy logprobs: the number of alternatives per token.
        logprobs: Option<u32>,
        #[serde(default)]
        echo: bool,
        suffix: Option<String>,
        best_of: Option<u32>,
        /// Accepted and unused (it names the end user).
        #[allow(dead_code)]
        user: Option<String>,
    }
);

/// The fields both requests share, borrowed.
pub struct Common<'a> {
    pub model: &'a str,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<&'a StopField>,
    pub n: Option<u32>,
    pub response_format: Option<&'a serde_json::Value>,
    pub logit_bias: Option<&'a serde_json::Value>,
    pub ignore_eos: bool,
    pub grammar: Option<&'a str>,
    pub json_schema: Option<&'a serde_json::Value>,
}

macro_rules! common {
    ($t:ty) => {
        impl $t {
            /// The shared fields (`max_completion_tokens` wins over `max_tokens`).
            pub fn common(&self) -> Common<'_> {
                Common {
                    model: &self.model,
                    max_tokens: self.max_completion_tokens.or(self.max_tokens),
                    temperature: self.temperature,
                    top_p: self.top_p,
                    top_k: self.top_k,
                    min_p: self.min_p,
                    presence_penalty: self.presence_penalty,
                    frequency_penalty: self.frequency_penalty,
                    repetition_penalty: self.repetition_penalty,
                    seed: self.seed,
                    stop: self.stop.as_ref(),
                    n: self.n,
                    response_format: self.response_format.as_ref(),
                    logit_bias: self.logit_bias.as_ref(),
                    ignore_eos: self.ignore_eos,
                    grammar: self.grammar.as_deref(),
                    json_schema: self.json_schema.as_ref(),
                }
            }

            /// Checks what the schema cannot: `stream_options` only with `stream: true`, and
            /// the keys of `response_format`. Errors: a 400 naming the field.
            pub fn check_common(&self) -> Result<(), ApiError> {
                if self.stream_options.is_some() && !self.stream {
                    return Err(ApiError::invalid(
                        Some("stream_options"),
                        "stream_options is only allowed with stream: true",
                    ));
                }
                if let Some(f) = &self.response_format {
                    known_keys(f, "response_format", &["type", "json_schema"])?;
                    if let Some(js) = f.get("json_schema") {
                        known_keys(
                            js,
                            "response_format.json_schema",
                            &["name", "description", "schema", "strict"],
                        )?;
                    }
                }
                Ok(())
            }

            /// Whether usage goes on a final chunk of the stream.
            pub fn include_usage(&self) -> bool {
                self.stream_options
                    .as_ref()
                    .is_some_and(|o| o.include_usage)
            }
        }
    };
}
common!(ChatRequest);

impl ChatRequest {
    /// Checks each tool against [`ToolDef`]; `strict: true` is refused (calls are parsed
    /// from the output, not constrained to the schema). Errors: a 400 naming the tool's field
    /// (`tools[0].function`, `tools[1].type`).
    pub fn check_tools(&self) -> Result<(), ApiError> {
        for (i, t) in self.tools.iter().flatten().enumerate() {
            let at = format!("tools[{i}]");
            let def: ToolDef = read_as(t.clone(), &at)?;
            if def.function.strict == Some(true) {
                let p = format!("{at}.function.strict");
                return Err(ApiError::invalid(
                    Some(&p),
                    format!(
                        "{p} true is not supported: tool calls are read from the output, not \
                         constrained to the parameters' schema"
                    ),
                ));
            }
        }
        Ok(())
    }
}
common!(CompletionRequest);
