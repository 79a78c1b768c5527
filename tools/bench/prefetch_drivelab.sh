#!/bin/bash
# Prefetch on and off, 1 read-capped drive against 4 (BENCHMARKS.md, "Prefetch").
# Needs root. Does `drivelab up 4 --size 8G --mbps 200`, a qwen3-30b-a3b synth model with 4
# layers (4.99 GB, 2.5x the 2 GiB memory cap) on the host disk, packs it onto d0 alone and onto
# d0..d3 (stripe, spread), then runs cold decode (--cache none) under `drivelab run --ram 2G`
# for every pack with --prefetch off and on, interleaved, REPS times. Packs are kept until the
# end; `KEEP=1` leaves the drives up.
set -x
DL=$(realpath ${DRIVELAB:-../shared/tools/drivelab})
DF=$(realpath ${DF:-${CARGO_TARGET_DIR:-target}/release/deltafin})
O=${OUT:-/tmp/pfmeas}
W=${WORK:-/var/tmp/packwork}
D=/var/tmp/drivelab
N=${TOKENS:-8}
B="--ram-budget 1500M -t 2 --decode-prompt-tokens 1 --scenarios cold-decode -n $N --cache none --heat-file none"
mkdir -p $O $W
$DL status | grep -q "d3" || $DL up 4 --size 8G --mbps 200
[ -f $W/src/config.json ] || $DF synth --arch qwen3_moe --preset qwen3-30b-a3b --layers 4 --out $W/src
pack() { # NAME PACKARGS...
  n=$1; shift
  [ -f $W/$n/manifest.json ] || $DF pack -m $W/src --out $W/$n "$@" > $O/pack-$n.txt 2>&1
}
pack one --drives $D/d0 --placement stripe
pack stripe4 --drives $D/d0,$D/d1,$D/d2,$D/d3 --placement stripe
pack spread4 --drives $D/d0,$D/d1,$D/d2,$D/d3 --placement spread
for rep in $(seq 1 ${REPS:-2}); do
  for n in ${PACKS:-one stripe4 spread4}; do
    for pf in off on; do
      $DL drop
      $DL run --ram 2G -- $DF bench -m $W/$n $B --prefetch $pf ${EXTRA:-} --json $O/$n-pf$pf-$rep.json > $O/$n-pf$pf-$rep.txt 2>&1
      tail -2 $O/$n-pf$pf-$rep.txt
    done
  done
done
[ -n "$KEEP" ] || { rm -rf $W/one $W/stripe4 $W/spread4 $D/d*/deltafin-pack-*.bin; $DL down; }
echo DONE
