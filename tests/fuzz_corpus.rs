//! Replays every committed fuzz corpus file (`fuzz/corpus/TARGET/`) through the entry point
//! its AFL++ target uses (`deltafin::fuzzing`), so the corpus is exercised without AFL: each
//! must return without panicking.

use std::path::Path;

fn replay(target: &str, f: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        let data = std::fs::read(&p).unwrap();
        f(&data);
        n += 1;
    }
    assert!(n > 0, "{}: no corpus files", dir.display());
}

#[test]
fn gguf_corpus() {
    replay("gguf", deltafin::fuzzing::fuzz_gguf);
}

#[test]
fn safetensors_corpus() {
    replay("safetensors", deltafin::fuzzing::fuzz_safetensors);
}

#[test]
fn pack_manifest_corpus() {
    replay("pack_manifest", deltafin::fuzzing::fuzz_pack_manifest);
}

#[test]
fn heat_corpus() {
    replay("heat", deltafin::fuzzing::fuzz_heat);
}

#[test]
fn config_corpus() {
    replay("config", deltafin::fuzzing::fuzz_config);
}

#[test]
fn chat_corpus() {
    replay("chat", deltafin::fuzzing::fuzz_chat);
}
