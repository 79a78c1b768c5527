#!/bin/bash
# Cold decode of a Kimi K3-shaped synthetic pack on 1 and 4 read-capped drives (BENCHMARKS.md,
# "Kimi K3 shape"). Needs root and fio. Does `drivelab up 4 --size 10G --mbps $MBPS` (its own
# DRIVELAB_DIR), a `synth --arch kimi_k3 --preset kimi-k3` GGUF cut to $LAYERS MoE layers of
# $EXPERTS experts (each expert K3's 17.5 MB MXFP4, top-16), packs it onto d0 alone and onto
# d0..d3 (stripe), deletes the GGUF, measures the drives with fio (1 MiB random reads, QD 32,
# O_DIRECT; d0 alone and d0..d3 together), then runs `deltafin bench --scenarios cold-decode`
# under `drivelab run --ram $RAM` for each pack and prefetch setting, alternated, $REPS times,
# page cache dropped before each run; `drivelab down` and every file removed at the end.
set -x
DL=$(realpath ${DRIVELAB:-../shared/tools/drivelab})
DF=$(realpath ${DF:-${CARGO_TARGET_DIR:-target}/release/deltafin})
export DRIVELAB_DIR=${DRIVELAB_DIR:-/var/tmp/drivelab-k3}
D=$DRIVELAB_DIR
O=${OUT:-/tmp/k3meas}
W=${WORK:-/var/tmp/k3work}
MBPS=${MBPS:-200}
LAYERS=${LAYERS:-2}
EXPERTS=${EXPERTS:-128}
RAM=${RAM:-3G}
BUDGET=${BUDGET:-2400M}
REPS=${REPS:-2}
N=${N:-8}
B="--ram-budget $BUDGET -t 2 --decode-prompt-tokens 1 --scenarios cold-decode -n $N --cache none --heat-file none"
mkdir -p $O $W
$DL status | grep -q "d3" || $DL up 4 --size 10G --mbps $MBPS
[ -f $W/k3.gguf ] || $DF synth --arch kimi_k3 --preset kimi-k3 --format gguf --layers $LAYERS --dense-layers 0 \
  --experts $EXPERTS --out $W/k3.gguf
ls -l $W/k3.gguf
[ -f $W/one/manifest.json ] || $DF pack -m $W/k3.gguf --out $W/one --drives $D/d0 --placement stripe > $O/pack-one.txt 2>&1
[ -f $W/four/manifest.json ] || $DF pack -m $W/k3.gguf --out $W/four --drives $D/d0,$D/d1,$D/d2,$D/d3 --placement stripe > $O/pack-four.txt 2>&1
rm -f $W/k3.gguf
du -sh $W/one $W/four $D/d*/
fio_rr() { # NAME FILES...
  n=$1; shift
  args=()
  for f in "$@"; do args+=(--name=$(basename $(dirname $f)) --filename=$f); done
  $DL drop
  $DL run -- fio --size=1G --rw=randread --bs=1M --iodepth=32 --ioengine=io_uring --direct=1 --runtime=15 \
    --time_based --group_reporting --output-format=json "${args[@]}" > $O/fio-$n.json
  rm -f "$@"
}
fio_rr d0 $D/d0/fio.bin
fio_rr d0123 $D/d0/fio.bin $D/d1/fio.bin $D/d2/fio.bin $D/d3/fio.bin
for r in $(seq 1 $REPS); do
  for p in one four; do
    for pf in off on; do
      $DL drop
      $DL run --ram $RAM -- $DF bench -m $W/$p $B --prefetch $pf --json $O/$p-$pf-$r.json > $O/$p-$pf-$r.txt 2>&1
    done
  done
done
rm -rf $W/one $W/four $D/d*/deltafin-pack-*.bin
$DL down
echo DONE
