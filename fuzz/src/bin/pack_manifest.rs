//! AFL++ target: see `deltafin::fuzzing::fuzz_pack_manifest`.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        deltafin::fuzzing::fuzz_pack_manifest(data);
    });
}
