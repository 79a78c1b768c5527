//! AFL++ target: see `deltafin::fuzzing::fuzz_config`.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        deltafin::fuzzing::fuzz_config(data);
    });
}
