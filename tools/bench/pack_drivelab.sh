#!/bin/bash
# Back-to-back measurement of packs: 4 read-capped drives against 1 (BENCHMARKS.md, "Packs").
# Needs root. Does `drivelab up 4 --size 8G --mbps 200`, a qwen3-30b-a3b synth model with 4
# layers (4.99 GB, 2.5x the 2 GiB memory cap) on the host disk, packs it onto 1 drive, then onto
# 4 (stripe, spread), runs cold decode with --cache none under `drivelab run --ram 2G`, and
# `drivelab down` at the end. Each pack is deleted after its run (disk use stays under 25 GB).
set -x
DL=$(realpath ${DRIVELAB:-../shared/tools/drivelab})
DF=$(realpath ${DF:-${CARGO_TARGET_DIR:-target}/release/deltafin})
O=${OUT:-/tmp/packmeas}
W=${WORK:-/var/tmp/packwork}
D=/var/tmp/drivelab
B="--ram-budget 1500M -t 2 --decode-prompt-tokens 1 --scenarios cold-decode -n 8 --cache none --heat-file none"
mkdir -p $O $W
$DL status | grep -q "d3" || $DL up 4 --size 8G --mbps 200
[ -f $W/src/config.json ] || $DF synth --arch qwen3_moe --preset qwen3-30b-a3b --layers 4 --out $W/src
du -sh $W/src
$DL drop
[ -n "$SKIP_FIO" ] || $DL run --ram 2G -- fio --name=rr --filename=$D/d0/fio.bin --size=2G --rw=randread --bs=1M --iodepth=32 --ioengine=io_uring --direct=1 --runtime=10 --time_based --output-format=json > $O/fio-d0.json
rm -f $D/d0/fio.bin
run() { # NAME PACKARGS...
  n=$1; shift
  /usr/bin/time -v $DF pack -m $W/src --out $W/$n "$@" > $O/pack-$n.txt 2>&1
  $DL drop
  $DL run --ram 2G -- $DF bench -m $W/$n $B --json $O/$n.json > $O/$n.txt 2>&1
  $DL status > $O/status-$n.txt 2>&1
  rm -rf $W/$n $D/d*/deltafin-pack-$n-*.bin
}
run one --drives $D/d0 --placement stripe
run stripe4 --drives $D/d0,$D/d1,$D/d2,$D/d3 --placement stripe
run spread4 --drives $D/d0,$D/d1,$D/d2,$D/d3 --placement spread
$DL drop
$DL down
echo DONE
