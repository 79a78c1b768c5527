#!/bin/bash
# Back-to-back measurements of the expert store on one drivelab drive (200 MB/s read cap),
# RAM cap 4 GiB (BENCHMARKS.md, "Expert store"). Needs root and fio. Before:
#   ../shared/tools/drivelab up 1 --size 16G --mbps 200
#   deltafin synth --preset qwen3-30b-a3b --layers 8 --out /var/tmp/drivelab/d0/q30-8l
# After: ../shared/tools/drivelab down
set -x
M=/var/tmp/drivelab/d0/q30-8l
DL=$(realpath ${DRIVELAB:-../shared/tools/drivelab})
DF=$(realpath ${DF:-target/release/deltafin})
O=${OUT:-/tmp/meas}
B="--ram-budget 3500M -t 2 --decode-prompt-tokens 1"
mkdir -p $O
cd $O
$DL drop
$DL run --ram 4G -- fio --name=rr --filename=$M/model-00001-of-00003.safetensors:$M/model-00002-of-00003.safetensors --rw=randread --bs=1M --iodepth=32 --ioengine=io_uring --direct=1 --runtime=15 --time_based --readonly --output-format=json > fio-1m-qd32.json
for e in auto pool; do
  $DL run --ram 4G -- $DF bench -m $M $B --scenarios cold-decode -n 8 --cache none --io-engine $e --heat-file none --json none-$e.json > none-$e.txt 2>&1
done
for c in lru lfu-da; do
  $DL run --ram 4G -- $DF bench -m $M $B --scenarios cold-decode -n 16 --cache $c --heat-file none --json $c.json > $c.txt 2>&1
done
$DL run --ram 4G -- $DF bench -m $M $B --scenarios cold-decode -n 16 --cache none --heat-file none --json none-16.json > none-16.txt 2>&1
# LFU-DA seeded: a first run writes the heat file, the second reads it
rm -f $O/heat.json
$DL run --ram 4G -- $DF bench -m $M $B --scenarios cold-decode -n 16 --cache lfu-da --heat-file $O/heat.json --json lfu-seed1.json > lfu-seed1.txt 2>&1
$DL run --ram 4G -- $DF bench -m $M $B --scenarios cold-decode -n 16 --cache lfu-da --heat-file $O/heat.json --json lfu-seed2.json > lfu-seed2.txt 2>&1
for r in 256K 4M; do
  $DL run --ram 4G -- $DF bench -m $M $B --scenarios cold-decode -n 4 --cache none --io-request-size $r --heat-file none --json none-req$r.json > none-req$r.txt 2>&1
done
for d in 8 64; do
  $DL run --ram 4G -- $DF bench -m $M $B --scenarios cold-decode -n 4 --cache none --io-depth $d --heat-file none --json none-qd$d.json > none-qd$d.txt 2>&1
done
echo DONE
