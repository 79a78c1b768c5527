#!/bin/bash
# Speculative decoding, resident: alternates plain and --lookup decoding on a free and a
# repetitive prompt in one run (demo model, every weight resident, 2 threads, N greedy tokens
# (N=64 by default), 3 rounds). Prints: round, prompt, mode, decode tok/s, verification passes, plain passes,
# accepted, drafted, fallbacks. Run from the repository root after `cargo build --release`.
M=~/.cache/deltafin/models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf
B=${B:-target/release/deltafin}
OUT=${OUT:-$(mktemp -d)}
N=${N:-64}
FREE='Explain why the sky is blue to a child.'
REP='Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape. Again: apple, banana, cherry, date, elderberry, fig, grape. Again:'
for r in 1 2 3; do
  for p in free rep; do
    [ $p = free ] && P=$FREE || P=$REP
    for mode in plain lookup; do
      extra=(); [ $mode = lookup ] && extra=(--lookup)
      $B bench -m $M -t 2 --scenarios cold-decode -n $N --prompt "$P" "${extra[@]}" --json $OUT/$p-$mode-$r.json > /dev/null
      python3 -c "
import json,sys;d=json.load(open('$OUT/$p-$mode-$r.json'))['scenarios'][0];s=d.get('speculative') or {}
print('$r $p $mode', round(d['decode_tok_s'],2), s.get('verify_passes','-'), s.get('plain_passes','-'), s.get('accepted','-'), s.get('drafted','-'), s.get('fallbacks','-'))"
    done
  done
done
