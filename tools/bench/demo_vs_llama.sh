#!/usr/bin/env bash
# Demo benchmark: Deltafin with every weight resident, Deltafin with every weight streamed, and
# llama.cpp (llama-cpp-python, via ../shared/tools/llama_peer.py), on the same GGUF file copied
# onto one drivelab drive, with the same thread count, interleaved in one run, cold page cache
# before every run.
#
#   sudo tools/bench/demo_vs_llama.sh [OUT_DIR]
#
# Environment: PYTHON (a python with llama-cpp-python==0.3.36, default python3), THREADS (2),
# TOKENS (64), REPS (3), MBPS (drive read cap, 1500), RAM (drivelab memory cap incl. page
# cache, 2G), BUDGET (Deltafin's --ram-budget for the streamed runs, 12M: nothing resident).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-bench-out}
PYTHON=${PYTHON:-python3}
THREADS=${THREADS:-2} TOKENS=${TOKENS:-64} REPS=${REPS:-3} MBPS=${MBPS:-1500} RAM=${RAM:-2G} BUDGET=${BUDGET:-12M}
LAB=${DRIVELAB:-../shared/tools/drivelab}
PEER=${PEER:-../shared/tools/llama_peer.py}
PROMPT="The Eiffel Tower is located in the city of"
mkdir -p "$OUT"
cargo build --release -q
BIN=$PWD/target/release/deltafin
SRC=$("$BIN" pull gemma-3-270m -q)
"$LAB" down >/dev/null 2>&1 || true
"$LAB" up 1 --size 1G --mbps "$MBPS" >/dev/null
trap '"$LAB" down >/dev/null 2>&1 || true' EXIT
DRIVE=$(awk '{print $4}' "$(cat /tmp/drivelab.dir)/state")
cp "$SRC" "$DRIVE/model.gguf"
M=$DRIVE/model.gguf
for r in $(seq 1 "$REPS"); do
  "$LAB" drop
  "$LAB" run --ram "$RAM" -- "$BIN" run -m "$M" -p "$PROMPT" -n "$TOKENS" --temp 0 -t "$THREADS" \
    --stats-json "$OUT/resident-$r.json" >/dev/null
  "$LAB" drop
  "$LAB" run --ram "$RAM" -- "$BIN" run -m "$M" -p "$PROMPT" -n "$TOKENS" --temp 0 -t "$THREADS" \
    --ram-budget "$BUDGET" --stats-json "$OUT/streamed-$r.json" >/dev/null
  "$LAB" drop
  "$LAB" run --ram "$RAM" -- "$PYTHON" "$PEER" "$M" --threads "$THREADS" --tokens "$TOKENS" \
    --prompt "$PROMPT" | tail -n 1 >"$OUT/llama-$r.json"
done
python3 - "$OUT" "$REPS" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
def load(kind): return [json.load(open(f"{out}/{kind}-{r}.json")) for r in range(1, reps + 1)]
rows = []
for kind in ["resident", "streamed"]:
    js = load(kind)
    rows.append((f"deltafin {kind}", [j["load_s"] for j in js], [j["ttft_s"] for j in js],
                 [j["decode_tok_s"] for j in js], [j["decode_bytes_per_token"] / 1e6 for j in js],
                 [j["peak_rss_bytes"] / 2**20 for j in js]))
js = load("llama")
rows.append(("llama.cpp (mmap)", [j["load_s"] for j in js], [j["ttft_s"] for j in js],
             [j["decode_tok_s"] for j in js], [j["decode_read_gb_per_token"] * 1e3 for j in js], [float("nan")] * reps))
print(f"{'engine':<20} {'load s':>8} {'TTFT s':>8} {'decode tok/s':>13} {'MB read/tok':>12} {'peak RSS MiB':>13}")
for name, *cols in rows:
    med = [statistics.median(c) for c in cols]
    print(f"{name:<20} {med[0]:>8.2f} {med[1]:>8.3f} {med[2]:>13.2f} {med[3]:>12.1f} {med[4]:>13.0f}")
print("(medians of", reps, "interleaved runs; every value:", out, ")")
PY
