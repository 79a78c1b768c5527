//! `deltafin chat`: an interactive chat in the terminal. The conversation's KV cache is kept
//! between turns (only each turn's new tokens are prefilled), answers stream as they are
//! generated, and Ctrl-C stops the current answer (at the prompt, it ends the program).
//!
//! A line that starts with `/` is a command: `/help`, `/reset`, `/system TEXT` (`/system`
//! alone removes the system prompt), `/exit` or `/quit`; any other `/word` is refused with a
//! message, never sent to the model. A line that starts with `//` is sent with its first `/`
//! removed; any other line (one starting with a space included) is sent as typed.
//!
//! Standard output carries the answers only, one per line; the banner, command confirmations,
//! refusals and `--stats` go to standard error. On a terminal the line is edited with
//! `rustyline` (arrows, Ctrl-A/E/W/U, history with Up/Down for this session); standard input
//! that is not a terminal is read line by line without prompts or banner.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::engine::{Engine, FinishReason, Outcome, Params};
use crate::tokenizer::chat::ChatTemplate;

/// Arguments of `deltafin chat`: the model and how it runs (`-n` bounds each answer; `-c` the
/// context, default 4096 tokens or the largest that fits the RAM budget), `--system` (the
/// first system message), and the statistics: `--stats` prints each answer's statistics to
/// standard error, `--stats-json FILE` writes one JSON object per answer, one per line (turn,
/// finish reason, token counts, seconds, speculation).
#[derive(clap::Args, Debug, Clone)]
pub struct ChatArgs {
    #[command(flatten)]
    pub engine: super::engine_args::EngineArgs,
    /// System message of the conversation (/system TEXT changes it)
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    #[command(flatten)]
    pub stats: super::engine_args::StatsArgs,
}

/// The context `chat` asks for when `-c` is not given, in tokens.
const DEFAULT_CTX: usize = 4096;

static GENERATING: AtomicBool = AtomicBool::new(false);
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    if GENERATING.load(Ordering::SeqCst) {
        STOP.store(true, Ordering::SeqCst);
    } else {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(130) }
    }
}

/// What one line of input asks for.
#[derive(Debug, PartialEq, Eq)]
enum Input<'a> {
    /// Nothing (an empty or blank line).
    Empty,
    /// A message to the model.
    Message(&'a str),
    Help,
    Reset,
    /// `/system TEXT`; `None`: `/system` alone.
    System(Option<&'a str>),
    Exit,
    /// A command that takes no text, given some (the command's name).
    NoText(&'a str),
    /// An unknown command (its name, `/` included).
    Unknown(&'a str),
}

/// Reads one line (without its line ending) as [`Input`]: see the module header.
fn parse(line: &str) -> Input<'_> {
    if line.trim().is_empty() {
        return Input::Empty;
    }
    if line.starts_with("//") {
        return Input::Message(&line[1..]);
    }
    if !line.starts_with('/') {
        return Input::Message(line);
    }
    let line = line.trim_end();
    let (name, text) = match line.find(char::is_whitespace) {
        Some(i) => (&line[..i], line[i..].trim()),
        None => (line, ""),
    };
    match (name, text.is_empty()) {
        ("/system", true) => Input::System(None),
        ("/system", false) => Input::System(Some(text)),
        ("/help" | "/reset" | "/exit" | "/quit", false) => Input::NoText(name),
        ("/help", true) => Input::Help,
        ("/reset", true) => Input::Reset,
        ("/exit" | "/quit", true) => Input::Exit,
        _ => Input::Unknown(name),
    }
}

/// What `/help` prints.
const HELP: &str = "\
commands:
  /help          this list
  /reset         forget the conversation (the system prompt stays)
  /system TEXT   set the system prompt (the conversation stays); /system alone removes it
  /exit, /quit   end the chat (Ctrl-D too); Ctrl-C stops an answer
any other line is a message; one starting with // is sent with its first / removed";

/// Where lines come from: a line editor on a terminal, else standard input line by line.
enum Lines {
    Terminal(Box<rustyline::DefaultEditor>),
    Piped(std::io::Lines<std::io::StdinLock<'static>>),
}

impl Lines {
    /// The line source for standard input: `rustyline` when it is a terminal.
    fn new() -> Result<Self> {
        if !std::io::stdin().is_terminal() {
            return Ok(Lines::Piped(std::io::stdin().lock().lines()));
        }
        let config = rustyline::Config::builder()
            .history_ignore_dups(true)
            .context("configuring the line editor")?
            .build();
        let ed =
            rustyline::DefaultEditor::with_config(config).context("starting the line editor")?;
        Ok(Lines::Terminal(Box::new(ed)))
    }

    /// The next line without its line ending; `None` at the end of input (Ctrl-D on a
    /// terminal). Ctrl-C at a terminal's prompt ends the program (exit status 130).
    fn next(&mut self) -> Result<Option<String>> {
        use rustyline::error::ReadlineError;
        match self {
            Lines::Terminal(ed) => match ed.readline("> ") {
                Ok(line) => {
                    if !line.trim().is_empty() {
                        let _ = ed.add_history_entry(line.as_str());
                    }
                    Ok(Some(line))
                }
                Err(ReadlineError::Eof) => Ok(None),
                Err(ReadlineError::Interrupted) => std::process::exit(130),
                Err(e) => Err(e).context("reading the terminal"),
            },
            Lines::Piped(lines) => Ok(lines
                .next()
                .transpose()
                .context("reading standard input")?
                .map(|l| l.trim_end_matches(['\r', '\n']).to_string())),
        }
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / 1048576.0)
}

/// The banner printed when standard input is a terminal.
fn banner(model: &std::path::Path, engine: &Engine, max_tokens: usize) -> String {
    let name = model.file_name().map_or_else(
        || model.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    format!(
        "deltafin chat: {name} ({})\n\
         context {} tokens (-c), answers up to {max_tokens} tokens (-n)\n\
         placement: {}\n\
         commands: /help, /reset, /system TEXT, /exit (or Ctrl-D); Ctrl-C stops an answer\n",
        model.display(),
        engine.n_ctx(),
        engine.session.model.placement().summary,
    )
}

/// What `--stats` prints once the model is loaded.
fn load_table(engine: &Engine, load_s: f64) -> String {
    let p = engine.session.model.placement();
    format!(
        "--- model ---\n\
         load                 {load_s:.3} s\n\
         context              {} tokens\n\
         placement            {}\n\
         resident weights     {}, not resident {} (read from disk when a pass uses it), stream buffers {}, KV cache {}, activations {}\n",
        engine.n_ctx(),
        p.summary,
        mib(p.resident_bytes as u64),
        mib(p.streamed_bytes as u64),
        mib(p.stream_buffer_bytes as u64),
        mib(p.kv_bytes as u64),
        mib(p.scratch_bytes as u64),
    )
}

/// What `--stats` prints after answer `turn`: `io` is the store's (bytes read, reads, busy,
/// wait nanoseconds) during the answer.
fn answer_table(turn: u64, o: &Outcome, io: (u64, u64, u64, u64)) -> String {
    let finish = match o.finish {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool calls",
        FinishReason::Cancelled => "cancelled",
    };
    let decoded = o.completion_tokens.saturating_sub(1);
    let tok_s = if decoded == 0 || o.decode_s <= 0.0 {
        0.0
    } else {
        decoded as f64 / o.decode_s
    };
    format!(
        "--- answer {turn} ---\n\
         prompt tokens        {} ({} reused from the KV cache, {} prefilled)\n\
         generated tokens     {} ({finish})\n\
         time to first token  {:.3} s\n\
         decode               {tok_s:.2} tok/s\n\
         disk read            {} in {} reads, I/O wait {:.3} s\n\
         peak RSS             {}\n",
        o.prompt_tokens,
        o.cached_tokens,
        o.prompt_tokens - o.cached_tokens,
        o.completion_tokens,
        o.ttft_s,
        mib(io.0),
        io.1,
        io.3 as f64 / 1e9,
        mib(crate::engine::session::peak_rss_bytes()),
    )
}

/// The tokens the system prompt `text` adds to a conversation's prompt under `tmpl`.
///
/// Errors: the template refuses a system message (its own message), the tokenizer fails.
fn system_tokens(engine: &Engine, tmpl: &ChatTemplate, text: &str) -> Result<usize> {
    let user = json!({"role": "user", "content": "Hi"});
    let with = json!([{"role": "system", "content": text}, user.clone()]);
    let n = |m: &Value| engine.tok.encode_messages_json(tmpl, m, None, true);
    Ok(n(&with)?.len().saturating_sub(n(&json!([user]))?.len()))
}

/// Runs `deltafin chat`.
pub fn run(mut a: ChatArgs) -> Result<()> {
    let system = a.system.clone();
    a.engine.model = match a.engine.model_path()? {
        Some(m) => Some(m),
        None => {
            use crate::pull::{home_dir, pull, PullOptions, DEMO_MODEL};
            Some(pull(DEMO_MODEL, &home_dir(), &PullOptions::default())?)
        }
    };
    let t_load = std::time::Instant::now();
    let (mut engine, _) = a.engine.load_engine(DEFAULT_CTX, true)?;
    let load_s = t_load.elapsed().as_secs_f64();
    let mut stats_file = match &a.stats.stats_json {
        Some(p) => {
            Some(std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?)
        }
        None => None,
    };
    let tmpl = engine
        .template
        .clone()
        .context("this model has no chat template; use `deltafin run`")?;
    if let Some(s) = &system {
        system_tokens(&engine, &tmpl, s).context("--system")?;
    }
    let mut lines = Lines::new()?;
    if matches!(lines, Lines::Terminal(_)) {
        let model = a.engine.model.as_deref().expect("resolved above");
        eprint!("{}", banner(model, &engine, a.engine.sampling.max_tokens));
    }
    if a.stats.stats {
        eprint!("{}", load_table(&engine, load_s));
    }
    // SAFETY: installing a handler that only touches atomics and calls _exit.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
    }
    let mut system = system;
    let mut history: Vec<Value> = Vec::new();
    let mut turn = 0u64;
    while let Some(line) = lines.next()? {
        let text = match parse(&line) {
            Input::Empty => continue,
            Input::Message(t) => t,
            Input::Help => {
                eprintln!("{HELP}");
                continue;
            }
            Input::Reset => {
                history.clear();
                engine.reset();
                eprintln!("history cleared");
                continue;
            }
            Input::System(None) => {
                system = None;
                eprintln!("system prompt removed");
                continue;
            }
            Input::System(Some(s)) => {
                match system_tokens(&engine, &tmpl, s) {
                    Ok(n) => {
                        system = Some(s.to_string());
                        eprintln!("system prompt set ({n} tokens)");
                    }
                    Err(e) => eprintln!("system prompt refused: {}", super::error_chain(&e)),
                }
                continue;
            }
            Input::Exit => break,
            Input::NoText(name) => {
                eprintln!("{name} takes no text; /help lists the commands");
                continue;
            }
            Input::Unknown(name) => {
                eprintln!("unknown command {name}; /help lists them");
                continue;
            }
        };
        history.push(json!({"role": "user", "content": text}));
        let mut msgs = Vec::new();
        if let Some(s) = &system {
            msgs.push(json!({"role": "system", "content": s}));
        }
        msgs.extend(history.iter().cloned());
        // the same path as `run --chat` and the server: message text stays literal
        let ids = engine
            .tok
            .encode_messages_json(&tmpl, &Value::Array(msgs), None, true)?;
        let mut sampler = engine.defaults.clone();
        if a.engine.sampling.seed.is_none() {
            sampler.seed = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
        }
        let room = engine.n_ctx().saturating_sub(ids.len());
        if room == 0 {
            eprintln!(
                "the conversation ({} tokens) fills the context of {} tokens; /reset to start over",
                ids.len(),
                engine.n_ctx()
            );
            history.pop();
            continue;
        }
        let p = Params {
            sampler,
            max_tokens: a.engine.sampling.max_tokens.min(room),
            stop: a.engine.sampling.stop.clone(),
            logprobs: None,
            tools: None,
            steering: Default::default(),
        };
        let mut answer = String::new();
        let io0 = engine.session.store.stats().snapshot();
        STOP.store(false, Ordering::SeqCst);
        GENERATING.store(true, Ordering::SeqCst);
        let r = engine.generate(
            &ids,
            &p,
            &mut |c| {
                answer.push_str(&c.text);
                out!("{}", c.text);
            },
            &|| STOP.load(Ordering::SeqCst),
        );
        GENERATING.store(false, Ordering::SeqCst);
        outln!();
        let o = r?;
        let io1 = engine.session.store.stats().snapshot();
        turn += 1;
        if a.stats.stats {
            let io = (io1.0 - io0.0, io1.1 - io0.1, io1.2 - io0.2, io1.3 - io0.3);
            eprint!("{}", answer_table(turn, &o, io));
            if let Some(sp) = &o.speculative {
                eprint!("{}", sp.table());
            }
        }
        if let Some(f) = stats_file.as_mut() {
            let mut v = json!({
                "turn": turn,
                "finish": o.finish.as_str(),
                "prompt_tokens": o.prompt_tokens,
                "cached_tokens": o.cached_tokens,
                "completion_tokens": o.completion_tokens,
                "ttft_s": o.ttft_s,
                "decode_s": o.decode_s,
            });
            if let Some(sp) = &o.speculative {
                v["speculative"] = sp.json();
            }
            writeln!(f, "{v}").context("writing the --stats-json file")?;
        }
        history.push(json!({"role": "assistant", "content": answer}));
    }
    if matches!(lines, Lines::Terminal(_)) {
        outln!();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_commands_messages_or_refusals() {
        assert_eq!(parse(""), Input::Empty);
        assert_eq!(parse("  \t"), Input::Empty);
        assert_eq!(parse("Hello"), Input::Message("Hello"));
        assert_eq!(parse(" /help"), Input::Message(" /help"));
        assert_eq!(parse("//help me"), Input::Message("/help me"));
        assert_eq!(parse("///"), Input::Message("//"));
        assert_eq!(parse("/help"), Input::Help);
        assert_eq!(parse("/help "), Input::Help);
        assert_eq!(parse("/reset"), Input::Reset);
        assert_eq!(parse("/reset now"), Input::NoText("/reset"));
        assert_eq!(parse("/exit"), Input::Exit);
        assert_eq!(parse("/quit"), Input::Exit);
        assert_eq!(parse("/system"), Input::System(None));
        assert_eq!(parse("/system   "), Input::System(None));
        assert_eq!(
            parse("/system  Be brief.  "),
            Input::System(Some("Be brief."))
        );
        assert_eq!(parse("/systemic"), Input::Unknown("/systemic"));
        assert_eq!(parse("/foo bar"), Input::Unknown("/foo"));
        assert_eq!(parse("/"), Input::Unknown("/"));
    }
}
