#!/bin/bash
# The same GGUF MoE file under the same memory cap: Deltafin (--cache none, lru, lfu-da; prefetch
# off and on) against
# llama.cpp (llama-cpp-python, mmap, repacking off) (BENCHMARKS.md, "The same GGUF").
# Needs root and PYTHON=<venv with llama-cpp-python 0.3.36>. Does `drivelab up 1 --size SIZE
# --mbps 1300`, a LAYERS-layer qwen3-30b-a3b-shaped Q4_0 GGUF on the drive (16 layers: 5.62 GB,
# 2.8x a 2 GiB cap; 40 layers: 14 GB, 2.8x a 5 GiB cap, the scale example), then cold
# runs back to back under `drivelab run --ram RAM`, and `drivelab down` unless KEEP=1.
# Defaults: LAYERS=16 SIZE=7G RAM=2G BUDGET=1800M; the example: LAYERS=40 SIZE=16G
# RAM=5G BUDGET=4600M.
set -x
DL=$(realpath ${DRIVELAB:-../shared/tools/drivelab})
DF=$(realpath ${DF:-${CARGO_TARGET_DIR:-target}/release/deltafin})
PEER=$(realpath ${PEER:-../shared/tools/llama_peer.py})
O=${OUT:-/tmp/ggufmeas}
D=/var/tmp/drivelab
mkdir -p $O
L=${LAYERS:-16}; RAM=${RAM:-2G}; BUDGET=${BUDGET:-1800M}
$DL status | grep -q "d0" || $DL up 1 --size ${SIZE:-7G} --mbps 1300
M=$D/d0/q30-${L}l-q4_0.gguf
[ -f $M ] || $DF synth --arch qwen3_moe --preset qwen3-30b-a3b --layers $L --format gguf --quant q4_0 --out $M
for cp in none:off none:on lru:off lfu-da:off lfu-da:on; do
  c=${cp%:*}; pf=${cp#*:}
  $DL drop
  $DL run --ram $RAM -- $DF bench -m $M --scenarios cold-decode --ram-budget $BUDGET -t 2 -n 24 \
    --cache $c --prefetch $pf --heat-file none --drive-bandwidth 1.3G --json $O/$c-pf$pf.json > $O/$c-pf$pf.txt 2>&1
  tail -1 $O/$c-pf$pf.txt
done
$DL drop
$DL run --ram $RAM -- ${PYTHON:-python3} $PEER $M --tokens 4 --threads 2 --no-repack > $O/llama.txt 2>&1
tail -5 $O/llama.txt
[ -n "$KEEP" ] || $DL down
echo DONE
