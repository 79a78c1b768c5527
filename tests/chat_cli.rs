//! `deltafin chat` as the real binary with standard input that is not a terminal: commands and
//! their confirmations (standard error), refused unknown commands, `//` sending a literal
//! slash, `--system` without `--chat`, the `--stats` lines of each answer, and the context
//! chosen to fit `--ram-budget` (the committed Qwen3-MoE fixture and the demo model).

mod common;

use std::process::{Command, Output};

const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf/qwen3_moe");

fn chat(args: &[&str], stdin: &str) -> Output {
    common::output_with_stdin(
        Command::new(env!("CARGO_BIN_EXE_deltafin"))
            .arg("chat")
            .args(args),
        stdin,
    )
}

/// Standard output and error of a run that succeeded.
fn ok(o: Output) -> (String, String) {
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(o.status.success(), "{err}");
    (String::from_utf8(o.stdout).unwrap(), err)
}

#[test]
fn commands_are_confirmed_and_unknown_ones_never_reach_the_model() {
    let args = ["-m", MODEL, "--temp", "0", "-n", "5"];
    let input =
        "/help\n/foo bar\n/reset now\n/system Be brief.\n/system\n/reset\n \n/exit\nHello\n";
    let (out, err) = ok(chat(&args, input));
    // nothing was sent to the model (and nothing after /exit)
    assert_eq!(out, "");
    assert_eq!(
        err,
        "commands:\n\
         \x20 /help          this list\n\
         \x20 /reset         forget the conversation (the system prompt stays)\n\
         \x20 /system TEXT   set the system prompt (the conversation stays); /system alone removes it\n\
         \x20 /exit, /quit   end the chat (Ctrl-D too); Ctrl-C stops an answer\n\
         any other line is a message; one starting with // is sent with its first / removed\n\
         unknown command /foo; /help lists them\n\
         /reset takes no text; /help lists the commands\n\
         system prompt set (16 tokens)\n\
         system prompt removed\n\
         history cleared\n"
    );
}

/// `deltafin run --chat` on the fixture: the greedy answer to one user message.
fn run_chat(prompt: &str, extra: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args([
            "run", "-m", MODEL, "--chat", "-p", prompt, "-n", "5", "--temp", "0",
        ])
        .args(extra)
        .output()
        .unwrap();
    ok(o).0
}

/// `//reset` sends the message `/reset` (the answer `run --chat -p /reset` gives), while
/// `/reset` is the command and sends nothing.
#[test]
fn a_double_slash_sends_a_literal_slash() {
    let args = ["-m", MODEL, "--temp", "0", "-n", "5"];
    let (escaped, err) = ok(chat(&args, "//reset\n"));
    assert_eq!(err, "");
    assert_eq!(escaped, ".+ad\u{FFFD}\n");
    assert_eq!(escaped, run_chat("/reset", &[]));
    let (command, err) = ok(chat(&args, "/reset\n"));
    assert_eq!((command.as_str(), err.as_str()), ("", "history cleared\n"));
}

/// `chat --system TEXT` (no `--chat`) answers as `/system TEXT` does, and differently from no
/// system prompt.
#[test]
fn system_flag_works_without_chat_flag() {
    let args = ["-m", MODEL, "--temp", "0", "-n", "5"];
    let (flag, _) = ok(chat(
        &[&args[..], &["--system", "Be brief."]].concat(),
        "Hello\n",
    ));
    let (command, err) = ok(chat(&args, "/system Be brief.\nHello\n"));
    let (none, _) = ok(chat(&args, "Hello\n"));
    // the 16 tokens `<|im_start|>system\nBe brief.<|im_end|>\n` adds to the prompt
    assert_eq!(err, "system prompt set (16 tokens)\n");
    assert_eq!(flag, command);
    assert_eq!(flag, ".-of\u{FFFD} scv\n");
    assert_eq!(flag, run_chat("Hello", &["--system", "Be brief."]));
    assert_eq!(none, ". netwSharJS\u{FFFD}\n");
}

/// `--stats`: the model's block once, then one block per answer on standard error; the second
/// turn reuses the first's KV cache.
#[test]
fn stats_print_each_answer() {
    let args = ["-m", MODEL, "--temp", "0", "-n", "5", "--stats"];
    let (out, err) = ok(chat(&args, "Hello\nHello\n"));
    assert_eq!(out, ". netwSharJS\u{FFFD}\n.\u{30d3}\u{FFFD}en\n");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 5 + 2 * 7, "{err}");
    assert_eq!(lines[0], "--- model ---", "{err}");
    assert!(lines[1].starts_with("load                 "), "{err}");
    assert_eq!(lines[2], "context              4096 tokens", "{err}");
    // the placement line ends with the device `auto` chose (the CPU: no GPU here)
    assert!(
        lines[3].starts_with(
            "placement            3/3 layers and 16/16 experts resident, LM head resident; device "
        ),
        "{err}"
    );
    assert_eq!(lines[4], "resident weights     0.5 MiB, not resident 0.0 MiB (read from disk when a pass uses it), stream buffers 0.0 MiB, KV cache 3.0 MiB, activations 1.3 MiB", "{err}");
    let answer = |i: usize| &lines[5 + 7 * i..5 + 7 * (i + 1)];
    for (i, (prompt, generated)) in [
        // 20 prompt tokens; then the cache holds them and 4 of the 5 answer tokens (the
        // last one generated is never fed back)
        (
            "20 (0 reused from the KV cache, 20 prefilled)",
            "5 (length)",
        ),
        (
            "49 (24 reused from the KV cache, 25 prefilled)",
            "5 (length)",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let a = answer(i);
        assert_eq!(a[0], format!("--- answer {} ---", i + 1), "{err}");
        assert_eq!(a[1], format!("prompt tokens        {prompt}"), "{err}");
        assert_eq!(a[2], format!("generated tokens     {generated}"), "{err}");
        assert!(a[3].starts_with("time to first token  ") && a[3].ends_with(" s"));
        assert!(a[4].starts_with("decode               ") && a[4].ends_with(" tok/s"));
        // the fixture is resident: nothing is read from disk while answering
        assert_eq!(
            a[5],
            "disk read            0.0 MiB in 0 reads, I/O wait 0.000 s"
        );
        assert!(a[6].starts_with("peak RSS             "), "{err}");
    }
}

/// Under `--ram-budget 64M` (where `run` works) the demo model's default 4096-token KV cache
/// does not fit: `chat` takes the largest context that does and says so; a `-c` that does not
/// fit is refused naming that size, which loads while one token more does not.
#[test]
fn the_context_fits_the_ram_budget() {
    let model = common::demo_gguf();
    let args = ["-m", model.to_str().unwrap(), "--temp", "0", "-n", "8"];
    let budget = [&args[..], &["--ram-budget", "64M"]].concat();
    let (out, err) = ok(chat(&budget, "Hello\n"));
    assert_eq!(
        err,
        "context 1057 tokens: the largest that fits --ram-budget 64.0 MiB (4096 need 170.9 MiB besides the weights; -c sets it)\n"
    );
    // the answer `run --chat` gives with every weight resident and the default context
    let o = Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args(["run", "--chat", "-p", "Hello"])
        .args(args)
        .output()
        .unwrap();
    assert_eq!(out, ok(o).0);
    assert!(out.len() > 2, "{out}");
    let c = |n: &'static str| [&budget[..], &["-c", n]].concat();
    let refused = |n: &'static str| {
        let o = chat(&c(n), "Hello\n");
        assert!(!o.status.success());
        String::from_utf8(o.stderr).unwrap()
    };
    assert_eq!(
        refused("4096"),
        "error: -c 4096 does not fit --ram-budget 64.0 MiB: the KV cache for 4096 tokens (144.0 MiB), activations (19.2 MiB) and stream buffers (7.6 MiB) need at least 170.9 MiB; the largest context that fits is -c 1057\n"
    );
    assert_eq!(
        refused("1058"),
        "error: -c 1058 does not fit --ram-budget 64.0 MiB: the KV cache for 1058 tokens (37.2 MiB), activations (19.2 MiB) and stream buffers (7.6 MiB) need at least 64.03 MiB; the largest context that fits is -c 1057\n"
    );
    let (out_n, err_n) = ok(chat(&c("1057"), "Hello\n"));
    assert_eq!((out_n.as_str(), err_n.as_str()), (out.as_str(), ""));
}
