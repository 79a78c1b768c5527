#!/usr/bin/env bash
# Speculative decoding on a MoE model streamed from a read-capped drive (issue 15, "the union
# effect"): a LAYERS-layer Qwen3-30B-A3B-shaped Q4_0 GGUF (random weights; 16 layers = 5.62 GB)
# on one drivelab drive capped at 1300 MB/s, under a RAM cap, every run cold (page cache
# dropped), plain decoding against --lookup, on a repetitive and a free prompt, with no expert
# cache and with the default cache. Prints one line per run (decode tok/s, expert MB read per
# token, target passes, drafted/accepted) and keeps each run's --json in OUT.
#
#   tools/bench/spec_moe_drivelab.sh
#
# Environment: LAYERS (16), SIZE (7G, the drive), RAM (2G, the cap), BUDGET (1800M), N (32
# decoded tokens), CACHES ("none lfu-da"), REPS (1), OUT (/tmp/spec_moe), KEEP=1 keeps the drive,
# PARTS ("synth pair small": which parts run).
# Needs root (drivelab).
set -euo pipefail
cd "$(dirname "$0")/../.."
DL=$(realpath "${DRIVELAB:-../shared/tools/drivelab}")
DF=$(realpath "${DF:-target/release/deltafin}")
export DRIVELAB_DIR=${DRIVELAB_DIR:-/var/tmp/drivelab-spec}
O=${OUT:-/tmp/spec_moe}; mkdir -p "$O"
L=${LAYERS:-16} RAM=${RAM:-2G} BUDGET=${BUDGET:-1800M} N=${N:-32} REPS=${REPS:-1}
"$DL" status 2>/dev/null | grep -q "$DRIVELAB_DIR/d0" || "$DL" up 1 --size "${SIZE:-7G}" --mbps 1300 --dir "$DRIVELAB_DIR"
M=$DRIVELAB_DIR/d0/q30-${L}l-q4_0.gguf
[ -f "$M" ] || "$DF" synth --arch qwen3_moe --preset qwen3-30b-a3b --layers "$L" --format gguf --quant q4_0 --out "$M"
REP='Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape. Again: apple, banana, cherry, date, elderberry, fig, grape. Again:'
FREE='Explain why the sky is blue to a child.'
PARTS=${PARTS:-synth pair small}
for r in $(seq 1 "$REPS"); do
  [[ " $PARTS " == *" synth "* ]] || break
  for task in rep free; do
    if [ $task = rep ]; then P=$REP; else P=$FREE; fi
    for c in ${CACHES:-none lfu-da}; do
      for mode in plain lookup; do
        flag=(); [ $mode = lookup ] && flag=(--lookup)
        j=$O/$task-$c-$mode-$r.json
        "$DL" drop >/dev/null
        "$DL" run --ram "$RAM" -- "$DF" bench -m "$M" --scenarios cold-decode --ram-budget "$BUDGET" -t 2 \
          -n "$N" --cache "$c" --heat-file none --prompt "$P" "${flag[@]}" --json "$j" >/dev/null 2>"$O/err.txt" ||
          { cat "$O/err.txt"; exit 1; }
        python3 - "$j" "$task" "$c" "$mode" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); s = j["scenarios"][0]; sp = s.get("speculative") or {}
passes = sp.get("target_passes", s["generated_tokens"] - 1)
print(f"{sys.argv[2]:4} cache {sys.argv[3]:6} {sys.argv[4]:6} decode {s['decode_tok_s']:6.2f} tok/s  "
      f"{s['decode_bytes_per_token'] / 1e6:7.1f} MB/token  target passes {passes:3}  "
      f"accepted/drafted {sp.get('accepted', '-')}/{sp.get('drafted', '-')}  load {sys.argv[5]}")
PY
      done
    done
  done
done
# The union effect with real acceptance: a MoE fixture (tests/fixtures/gguf, random weights) as
# the target, its own Q8_0 (Q4_0 for Mixtral) quantization as the draft model, so the draft
# agrees with the target most of the time; every expert streamed with no cache, the spine
# resident: the target's budget is TBUDGET in every mode, and the draft's resident bytes are
# added to --ram-budget when it runs (they come out of the budget first).
F=tests/fixtures/gguf
PAIRS="qwen3_moe:qwen3_moe-f32.gguf:qwen3_moe-q8_0.gguf:700 mixtral:mixtral-f32.gguf:mixtral-q4_0.gguf:600
       deepseek_v3:deepseek_v3-f32.gguf:deepseek_v3-q8_0.gguf:800"
[[ " $PARTS " == *" pair "* ]] || PAIRS=""
for pair in $PAIRS; do
  IFS=: read -r fam tgt dft tb <<<"$pair"
  cp "$F/$fam/$tgt" "$F/$fam/$dft" "$DRIVELAB_DIR/d0/"
  for r in $(seq 1 "$REPS"); do
    for mode in plain draft lookup; do
      flag=(); b=$((tb * 1024))
      [ $mode = lookup ] && flag=(--lookup)
      if [ $mode = draft ]; then
        flag=(--draft-model "$DRIVELAB_DIR/d0/$dft")
        # the draft's share of the budget (weights, KV cache, activations) as it reports it
        "$DF" bench -m "$DRIVELAB_DIR/d0/$tgt" --scenarios cold-decode -n 2 "${flag[@]}" --json "$O/probe.json" >/dev/null 2>&1
        b=$((b + $(python3 -c "import json; print(json.load(open('$O/probe.json'))['scenarios'][0]['speculative']['draft_bytes'])")))
      fi
      j=$O/pair-$fam-$mode-$r.json
      "$DL" drop >/dev/null
      "$DL" run --ram 1G -- "$DF" bench -m "$DRIVELAB_DIR/d0/$tgt" --scenarios cold-decode --ram-budget "$b" -t 2 \
        -n 64 --cache none --heat-file none --prompt 'hello world hello world' "${flag[@]}" --json "$j" >/dev/null 2>"$O/err.txt" ||
        { cat "$O/err.txt"; exit 1; }
      python3 - "$j" "$fam" "$mode" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); s = j["scenarios"][0]; sp = s.get("speculative") or {}
passes = sp.get("target_passes", s["generated_tokens"] - 1)
print(f"{sys.argv[2]:11} {sys.argv[3]:6} decode {s['decode_tok_s']:7.1f} tok/s  "
      f"{s['decode_bytes_per_token'] / 1e3:6.1f} kB/token  target passes {passes:3}  "
      f"accepted/drafted {sp.get('accepted', '-')}/{sp.get('drafted', '-')}  "
      f"[{s['placement'].split(';')[0]}]  load {sys.argv[4]}")
PY
    done
  done
done
# A larger pair: the `small` preset (4 layers, 64 experts, top-8, 0.40 MiB Q8_0 experts, 0.11 GB)
# as the streamed target; as drafts its Q4_0 quantization (the same random weights: measured
# acceptance) and the target file itself (every draft accepted: the union effect alone, the
# draft's own compute included). Target budget 20 MiB (spine resident, experts streamed).
if [[ " $PARTS " == *" small "* ]]; then
  S=$DRIVELAB_DIR/d0/small
  [ -f "$S-q8_0.gguf" ] || "$DF" synth --preset small --format gguf --quant q8_0 --out "$S-q8_0.gguf" >/dev/null
  [ -f "$S-q4_0.gguf" ] || "$DF" synth --preset small --format gguf --quant q4_0 --out "$S-q4_0.gguf" >/dev/null
  for r in $(seq 1 "$REPS"); do
    for d in none q4_0 q8_0 lookup; do
      flag=(); b=$((20 << 20))
      if [ $d = lookup ]; then flag=(--lookup)
      elif [ $d != none ]; then
        flag=(--draft-model "$S-$d.gguf")
        "$DF" bench -m "$S-q8_0.gguf" --scenarios cold-decode -n 2 "${flag[@]}" --json "$O/probe.json" >/dev/null 2>&1
        b=$((b + $(python3 -c "import json; print(json.load(open('$O/probe.json'))['scenarios'][0]['speculative']['draft_bytes'])")))
      fi
      j=$O/small-$d-$r.json
      "$DL" drop >/dev/null
      "$DL" run --ram 1G -- "$DF" bench -m "$S-q8_0.gguf" --scenarios cold-decode --ram-budget "$b" -t 2 \
        -n 64 --cache none --heat-file none --prompt 'hello world hello world' "${flag[@]}" --json "$j" >/dev/null 2>"$O/err.txt" ||
        { cat "$O/err.txt"; exit 1; }
      python3 - "$j" "small" "$d" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); s = j["scenarios"][0]; sp = s.get("speculative") or {}
passes = sp.get("target_passes", s["generated_tokens"] - 1)
print(f"{sys.argv[2]:5} draft {sys.argv[3]:6} decode {s['decode_tok_s']:6.1f} tok/s  "
      f"{s['decode_bytes_per_token'] / 1e6:6.2f} MB/token  target passes {passes:3}  "
      f"accepted/drafted {sp.get('accepted', '-')}/{sp.get('drafted', '-')}  load {sys.argv[4]}")
PY
    done
  done
fi
[ -n "${KEEP:-}" ] || "$DL" down
