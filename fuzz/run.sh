#!/usr/bin/env bash
# Runs every AFL++ target (or those named) for SECONDS each (default 120), one after another,
# under a 2048 MB memory limit (-m) and a 2 s per-input timeout (-t), then prints executions,
# crashes and hangs per target. Exits non-zero when a target could not run or found a crash or a
# hang (their inputs are left in fuzz/out/T/default/crashes/ and hangs/). Needs fuzz/setup.sh
# once (cargo-afl 0.18.2 and its AFL++ build); see docs/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")"
secs=${SECONDS_PER_TARGET:-120}
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(gguf safetensors pack_manifest heat config chat)
cargo afl build --release
export AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_AFFINITY=1
failed=0
for t in "${targets[@]}"; do
  rm -rf "out/$t"; mkdir -p out
  cargo afl fuzz -i "corpus/$t" -o "out/$t" -V "$secs" -m 2048 -t 2000 "target/release/$t" \
    > "out-$t.log" 2>&1 || { echo "$t: afl-fuzz failed, see fuzz/out-$t.log"; failed=1; continue; }
  s="out/$t/default/fuzzer_stats"
  printf '%s: %s executions, %s crashes, %s hangs, %s corpus entries\n' "$t" \
    "$(awk '/^execs_done/{print $3}' "$s")" "$(awk '/^saved_crashes/{print $3}' "$s")" \
    "$(awk '/^saved_hangs/{print $3}' "$s")" "$(awk '/^corpus_count/{print $3}' "$s")"
  [ "$(awk '/^saved_crashes/{print $3}' "$s")" = 0 ] && [ "$(awk '/^saved_hangs/{print $3}' "$s")" = 0 ] \
    || failed=1
done
exit $failed
