//! AFL++ target: see `deltafin::fuzzing::fuzz_safetensors`.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        deltafin::fuzzing::fuzz_safetensors(data);
    });
}
