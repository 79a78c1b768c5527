#!/bin/bash
# The same GGUF MoE file under the same memory cap: Deltafin (--cache none, lru, lfu-da) against
# llama.cpp (llama-cpp-python, mmap, repacking off) (BENCHMARKS.md, "The same GGUF").
# Needs root and PYTHON=<venv with llama-cpp-python 0.3.36>. Does `drivelab up 1 --size 7G
# --mbps 1300`, a 16-layer qwen3-30b-a3b-shaped Q4_0 GGUF (5.62 GB, 2.8x the 2 GiB cap) on the
# drive, then cold runs back to back, and `drivelab down` unless KEEP=1.
set -x
DL=$(realpath ${DRIVELAB:-../shared/tools/drivelab})
DF=$(realpath ${DF:-${CARGO_TARGET_DIR:-target}/release/deltafin})
PEER=$(realpath ${PEER:-../shared/tools/llama_peer.py})
O=${OUT:-/tmp/ggufmeas}
D=/var/tmp/drivelab
mkdir -p $O
$DL status | grep -q "d0" || $DL up 1 --size 7G --mbps 1300
M=$D/d0/q30-16l-q4_0.gguf
[ -f $M ] || $DF synth --arch qwen3_moe --preset qwen3-30b-a3b --layers 16 --format gguf --quant q4_0 --out $M
for c in none lru lfu-da; do
  $DL drop
  $DL run --ram 2G -- $DF bench -m $M --scenarios cold-decode --ram-budget 1800M -t 2 -n 24 \
    --cache $c --heat-file none --drive-bandwidth 1.3G --json $O/$c.json > $O/$c.txt 2>&1
  tail -1 $O/$c.txt
done
$DL drop
$DL run --ram 2G -- ${PYTHON:-python3} $PEER $M --tokens 4 --threads 2 --no-repack > $O/llama.txt 2>&1
tail -5 $O/llama.txt
[ -n "$KEEP" ] || $DL down
echo DONE
