//! AFL++ target: see `deltafin::fuzzing::fuzz_heat`.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        deltafin::fuzzing::fuzz_heat(data);
    });
}
