//! `deltafin chat`: an interactive chat in the terminal. The conversation's KV cache is kept
//! between turns (only each turn's new tokens are prefilled), answers stream as they are
//! generated, `/reset` starts over, `/system TEXT` sets the system message, Ctrl-C stops the
//! current answer (at the prompt, it ends the program), and standard input that is not a
//! terminal is read line by line without prompts.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::serve::generate::Params;

/// Arguments of `deltafin chat`: the model and how it runs (`-n` bounds each answer),
/// `--system` (the first system message), and the statistics: `--stats` prints speculation's
/// counters after each answer, `--stats-json FILE` writes one JSON object per answer, one per
/// line (turn, finish reason, token counts, seconds, speculation).
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

/// Runs `deltafin chat`.
pub fn run(a: ChatArgs) -> Result<()> {
    let system = a.system.clone();
    let (mut engine, _) = a.engine.load_engine(4096)?;
    let mut stats_file = match &a.stats.stats_json {
        Some(p) => {
            Some(std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?)
        }
        None => None,
    };
    let mut turn = 0u64;
    let tmpl = engine
        .template
        .clone()
        .context("this model has no chat template; use `deltafin run`")?;
    let tty = std::io::stdin().is_terminal();
    // SAFETY: installing a handler that only touches atomics and calls _exit.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
    }
    let mut system = system;
    let mut history: Vec<Value> = Vec::new();
    let mut stdout = std::io::stdout();
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if tty {
            print!("> ");
            let _ = stdout.flush();
        }
        let Some(line) = lines.next() else { break };
        let line = line.context("reading standard input")?;
        let line = line.trim_end_matches(['\r', '\n']);
        if line.trim().is_empty() {
            continue;
        }
        if line.trim() == "/reset" {
            history.clear();
            engine.reset();
            continue;
        }
        if let Some(s) = line.strip_prefix("/system ") {
            system = Some(s.to_string());
            continue;
        }
        if line.trim() == "/exit" || line.trim() == "/quit" {
            break;
        }
        history.push(json!({"role": "user", "content": line}));
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
            eprintln!("the conversation fills the context; /reset to start over");
            history.pop();
            continue;
        }
        let p = Params {
            sampler,
            max_tokens: a.engine.sampling.max_tokens.min(room),
            stop: a.engine.sampling.stop.clone(),
            logprobs: None,
            tools: None,
        };
        let mut answer = String::new();
        STOP.store(false, Ordering::SeqCst);
        GENERATING.store(true, Ordering::SeqCst);
        let r = engine.generate(
            &ids,
            &p,
            &mut |c| {
                answer.push_str(&c.text);
                print!("{}", c.text);
                let _ = std::io::stdout().flush();
            },
            &|| STOP.load(Ordering::SeqCst),
        );
        GENERATING.store(false, Ordering::SeqCst);
        println!();
        let o = r?;
        if a.stats.stats {
            if let Some(sp) = &o.speculative {
                eprint!("{}", sp.table());
            }
        }
        if let Some(f) = stats_file.as_mut() {
            turn += 1;
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
    Ok(())
}
