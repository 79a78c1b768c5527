#!/usr/bin/env bash
# Prompt speed on the demo model, every weight resident: `deltafin bench --scenarios prefill`
# (400 synthetic token ids in one batch) against llama.cpp (llama-cpp-python through
# ../shared/tools/llama_peer.py) on a ~400-token prompt, same file and threads, alternated in
# one run; then the same for warm decode. Each binary runs once per NUMERICS value (default
# "exact q8": the exact mode and the lossy --numerics q8), alternated with llama.cpp. With MOE
# set to a MoE GGUF (e.g. /var/tmp/q30-16l-q4_0.gguf, `deltafin synth --arch qwen3_moe --preset
# qwen3-30b-a3b --layers 16 --format gguf --quant q4_0`), warm decode with every expert
# resident on that file too (32 tokens, --heat-file none; llama.cpp 33). Prints one line per run.
#
#   tools/bench/prefill_vs_llama.sh [DELTAFIN_BINARY...]
#
# Environment: NUMERICS (the --numerics values each binary runs, default "exact q8"; a
# binary older than the flag needs an older copy of this script), PYTHON (a python with llama-cpp-python==0.3.36, default /work/venv-ref/bin/python),
# THREADS (2), REPS (3), PARTS (which parts run, default "prefill decode moe"; moe only with
# MOE set), MOE (unset), PEER_ARGS (extra llama_peer.py flags, default --no-repack: the AMX
# repacked path of the 0.3.36 build here segfaults in ggml_backend_amx_mul_mat).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-/work/venv-ref/bin/python}
THREADS=${THREADS:-2} REPS=${REPS:-3} PEER_ARGS=${PEER_ARGS:---no-repack}
read -r -a NUMERICS <<< "${NUMERICS:-exact q8}"
PEER=${PEER:-../shared/tools/llama_peer.py}
PARTS=${PARTS:-prefill decode moe}
BINS=("$@")
[ ${#BINS[@]} -gt 0 ] || BINS=("$PWD/target/release/deltafin")
M=$("${BINS[0]}" pull gemma-3-270m -q)
# 360 words of a repeated three-sentence paragraph: 402 tokens for llama.cpp
P="The city was founded on the banks of a wide river more than a thousand years ago. Merchants built warehouses along the water and the town grew rich from trade. Over the centuries it survived floods, fires and wars, and each time its people rebuilt its walls, its markets and its bridges."
PROMPT=$(python3 -c "import sys; w=(' '.join([sys.argv[1]]*8)).split(); print(' '.join(w[:360]))" "$P")
for r in $(seq 1 "$REPS"); do
  [[ " $PARTS " == *" prefill "* ]] || break
  echo "round $r (load $(cut -d' ' -f1 /proc/loadavg))"
  for b in "${BINS[@]}"; do
    for nm in "${NUMERICS[@]}"; do
      echo "  $b --numerics $nm prefill tok/s $("$b" bench -m "$M" --scenarios prefill --prompt-tokens 400 -t "$THREADS" --numerics "$nm" | awk '/^prefill/ {print $2}')"
    done
  done
  # shellcheck disable=SC2086
  "$PYTHON" "$PEER" "$M" --tokens 2 --threads "$THREADS" $PEER_ARGS --prompt "$PROMPT" 2>/dev/null | tail -n 1 |
    python3 -c "import json,sys; j=json.load(sys.stdin); print(f\"  llama.cpp prefill tok/s {j['prompt_tokens']/j['ttft_s']:.1f} ({j['prompt_tokens']} tokens, TTFT {j['ttft_s']} s)\")"
done
for r in $(seq 1 "$REPS"); do
  [[ " $PARTS " == *" decode "* ]] || break
  echo "decode round $r (load $(cut -d' ' -f1 /proc/loadavg))"
  for b in "${BINS[@]}"; do
    for nm in "${NUMERICS[@]}"; do
      echo "  $b --numerics $nm decode tok/s $("$b" bench -m "$M" --scenarios warm-decode -n 64 -t "$THREADS" --numerics "$nm" | awk '/^warm-decode/ {print $2}')"
    done
  done
  # shellcheck disable=SC2086
  "$PYTHON" "$PEER" "$M" --tokens 65 --threads "$THREADS" $PEER_ARGS 2>/dev/null | tail -n 1 |
    python3 -c "import json,sys; j=json.load(sys.stdin); print(f\"  llama.cpp decode tok/s {j['decode_tok_s']}\")"
done
for r in $(seq 1 "$REPS"); do
  [[ -n "${MOE:-}" && " $PARTS " == *" moe "* ]] || break
  echo "moe decode round $r (load $(cut -d' ' -f1 /proc/loadavg))"
  for b in "${BINS[@]}"; do
    for nm in "${NUMERICS[@]}"; do
      echo "  $b --numerics $nm moe decode tok/s $("$b" bench -m "$MOE" --scenarios warm-decode -n 32 -t "$THREADS" --heat-file none --numerics "$nm" | awk '/^warm-decode/ {print $2}')"
    done
  done
  # shellcheck disable=SC2086
  "$PYTHON" "$PEER" "$MOE" --tokens 33 --threads "$THREADS" $PEER_ARGS 2>/dev/null | tail -n 1 |
    python3 -c "import json,sys; j=json.load(sys.stdin); print(f\"  llama.cpp moe decode tok/s {j['decode_tok_s']}\")"
done
