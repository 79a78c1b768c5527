#!/bin/bash
# Issue 28 on the device host (16 cores; the GPU too): aggregate tok/s at 1, 2, 4, 8 sequences
# decoding together, on the demo model's shapes. That host reaches no registry and carries at
# most 64 MiB, so the demo GGUF goes as a tiled copy (tools/bench/gguf_tile.py: every tensor's
# first rows repeated; same shapes and encodings, so the same work per token).
# Here:  bash tools/bench/device_pack.sh   (fills .dev/: the binaries and the tiled model)
# There: bash tools/bench/device_batch.sh   (carrying .dev; prints, and copies to $OUT/batch.txt)
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
H=$ROOT/${DEV:-.dev}
W=${WORK:-/tmp/batch-bench}
mkdir -p "$W"
LOG=$W/h28.txt
: > "$LOG"
say() { echo "$@" | tee -a "$LOG"; }
run() { "$@" 2>&1 | tee -a "$LOG"; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
. "$ROOT/tools/bench/device_unpack.sh"
for b in deltafin batch_decode; do unpack $b "$W/$b" || exit 1; done
unpack gemma-tiled.gguf "$W/m.gguf" || exit 1
say "=== $(date -u) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo)"
for num in exact q8; do
  say "=== batch_decode (forward_batch, all cores), numerics $num"
  run timeout 150 "$W/batch_decode" "$W/m.gguf" 1,2,4,8 32 - lfu-da $num
done
port=18300
for spec in "cpu exact" "cpu q8" "cuda exact"; do
  set -- $spec
  port=$((port + 1))
  say "=== serve --parallel 8 --device $1 --numerics $2; serve_load.py --streams 1,2,4,8 --max-tokens 64 --rounds 2 --ignore-eos"
  "$W/deltafin" serve -m "$W/m.gguf" --parallel 8 --device "$1" --numerics "$2" --port $port \
    > "$W/serve-$port.log" 2>&1 &
  pid=$!
  for _ in $(seq 60); do
    python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/v1/models', timeout=1)" 2>/dev/null && break
    sleep 0.5
  done
  run timeout 150 python3 tools/serve_load.py $port --streams 1,2,4,8 --max-tokens 64 --rounds 2 --ignore-eos
  kill $pid; wait $pid 2>/dev/null
  grep -E 'placement|device' "$W/serve-$port.log" | head -3 | tee -a "$LOG"
done
say "=== done $(date -u)"
[ -n "${OUT:-}" ] && cp "$LOG" "$OUT/batch.txt"
exit 0
