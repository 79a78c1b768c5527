#!/bin/bash
# Cold time to first token of a 512-token prompt on a Qwen3-MoE-shaped Q4_0 GGUF larger than its
# memory cap, Deltafin (read-ahead on and off) against llama.cpp, alternated, then the same
# prefill with every expert resident (the compute reference) and resident decode against
# llama.cpp (BENCHMARKS.md, "Cold time to first token"). The drive and model as
# tools/bench/gguf_vs_llama.sh makes them (`drivelab up 1 --size SIZE --mbps MBPS`, LAYERS
# layers). Needs root and PYTHON=<venv with llama-cpp-python 0.3.36>.
# Defaults: LAYERS=16 SIZE=7G RAM=2G BUDGET=1800M MBPS=1300 REPS=2 THREADS=2; `drivelab down`
# at the end unless KEEP=1.
#
# Per round, each after `drivelab drop`, under `drivelab run --ram RAM`:
#   deltafin bench -m M --scenarios cold-prefill --prompt-tokens 512 --ram-budget BUDGET \
#     -t THREADS --heat-file none --read-ahead on|off --drive-bandwidth MBPS·1e6
#   python llama_peer.py M --tokens 2 --threads THREADS --no-repack --prompt "<157 words: 511 tokens>"
# then, outside the cap (page cache warm, every weight in RAM):
#   deltafin bench -m M --scenarios prefill --prompt-tokens 512 -t THREADS        (compute reference)
#   deltafin bench -m M --scenarios warm-decode -n 32 -t THREADS / llama_peer.py M --tokens 33
set -x
DL=$(realpath ${DRIVELAB:-../shared/tools/drivelab})
DF=$(realpath ${DF:-${CARGO_TARGET_DIR:-target}/release/deltafin})
PEER=$(realpath ${PEER:-../shared/tools/llama_peer.py})
PY=${PYTHON:-python3}
O=${OUT:-/tmp/ttftmeas}
export DRIVELAB_DIR=${DRIVELAB_DIR:-/var/tmp/drivelab}; D=$DRIVELAB_DIR
mkdir -p $O
L=${LAYERS:-16}; RAM=${RAM:-2G}; BUDGET=${BUDGET:-1800M}; MBPS=${MBPS:-1300}; T=${THREADS:-2}
$DL status | grep -q "d0" || $DL up 1 --size ${SIZE:-7G} --mbps $MBPS --dir $D
M=$D/d0/q30-${L}l-q4_0.gguf
[ -f $M ] || $DF synth --arch qwen3_moe --preset qwen3-30b-a3b --layers $L --format gguf --quant q4_0 --out $M
P="The city was founded on the banks of a wide river more than a thousand years ago. Merchants built warehouses along the water and the town grew rich from trade. Over the centuries it survived floods, fires and wars, and each time its people rebuilt its walls, its markets and its bridges."
PROMPT=$(python3 -c "import sys; w=(' '.join([sys.argv[1]]*12)).split(); print(' '.join(w[:157]))" "$P")
set +x
for r in $(seq 1 ${REPS:-2}); do
  echo "round $r (load $(cut -d' ' -f1 /proc/loadavg))"
  for ra in on off; do
    $DL drop
    $DL run --ram $RAM -- $DF bench -m $M --scenarios cold-prefill --prompt-tokens 512 --ram-budget $BUDGET \
      -t $T --heat-file none --read-ahead $ra --drive-bandwidth ${MBPS}000000 --json $O/df-ra$ra-$r.json > $O/df-ra$ra-$r.txt 2>&1
    python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['scenarios'][0]; p=s['summary']['prefill']; print(f\"  deltafin read-ahead $ra: load {s['load_s']:.2f} s, TTFT {s['ttft_s']:.2f} s, cold TTFT (load + TTFT) {s['load_s']+s['ttft_s']:.2f} s, compute {p['compute_s']:.2f} s, read wait {p['expert_io_wait_s']:.2f} s, I/O floor {p['io_floor_s']:.2f} s, {p['bytes']/1e9:.2f} GB, touched {p['experts_touched']}/{p['experts_total']}, amplification {p['read_amplification']:.3f}\")" $O/df-ra$ra-$r.json
  done
  $DL drop
  $DL run --ram $RAM -- $PY $PEER $M --tokens 2 --threads $T --no-repack --prompt "$PROMPT" > $O/llama-$r.txt 2>&1
  tail -1 $O/llama-$r.txt | python3 -c "import json,sys; j=json.load(sys.stdin); print(f\"  llama.cpp: load {j['load_s']} s ({j['load_read_gb']} GB), TTFT {j['ttft_s']} s ({j['prompt_tokens']} tokens, {j['prefill_read_gb']} GB), cold TTFT (load + TTFT) {j['load_s']+j['ttft_s']:.2f} s\")"
done
echo "resident (no cap, page cache warm, load $(cut -d' ' -f1 /proc/loadavg))"
cat $M > /dev/null
for r in $(seq 1 ${REPS:-2}); do
  $DF bench -m $M --scenarios prefill --prompt-tokens 512 -t $T --heat-file none --json $O/df-res-$r.json | awk '/^prefill/ {print "  deltafin resident prefill TTFT " $3 " s"}'
  $DF bench -m $M --scenarios warm-decode -n 32 -t $T --heat-file none | awk '/^warm-decode/ {print "  deltafin resident decode tok/s " $2}'
  $PY $PEER $M --tokens 33 --threads $T --no-repack 2>/dev/null | tail -1 |
    python3 -c "import json,sys; j=json.load(sys.stdin); print(f\"  llama.cpp resident decode tok/s {j['decode_tok_s']}\")"
done
[ -n "$KEEP" ] || $DL down
echo DONE
