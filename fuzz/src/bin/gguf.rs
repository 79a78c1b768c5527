//! AFL++ target: see `deltafin::fuzzing::fuzz_gguf`.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        deltafin::fuzzing::fuzz_gguf(data);
    });
}
