//! AFL++ target: see `deltafin::fuzzing::fuzz_chat`.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        deltafin::fuzzing::fuzz_chat(data);
    });
}
