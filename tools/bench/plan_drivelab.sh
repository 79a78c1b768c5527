#!/bin/bash
# `deltafin plan` against `deltafin bench` on drivelab setups (BENCHMARKS.md, "`deltafin plan`
# against `bench`"). Needs root. Does `drivelab up 4 --size 8G --mbps $MBPS` (its own
# DRIVELAB_DIR), then for each model: synth on the host disk, packs onto d0 alone and onto
# d0..d3 (stripe), the source deleted; for each setup `deltafin plan --drives ... --json` (the
# drive probe runs under `drivelab run`, so it sees the read cap) and `deltafin bench
# --scenarios cold-decode --json`, page cache dropped first, both under the same memory cap.
# Models: a qwen3-30b-a3b synth cut to 2 layers (BF16, 128 experts of 9.44 MB, top-8), packed;
# and the kimi-k3 preset cut to 2 MoE layers of 32 experts (17.5 MB MXFP4, top-16) as one GGUF
# on a drive of its own (no pack: its 6.8 GB spine twice would not fit the host disk). Every
# file and `drivelab down` at the end.
set -x
DL=$(realpath ${DRIVELAB:-../shared/tools/drivelab})
DF=$(realpath ${DF:-${CARGO_TARGET_DIR:-target}/release/deltafin})
export DRIVELAB_DIR=${DRIVELAB_DIR:-/var/tmp/drivelab-plan}
D=$DRIVELAB_DIR
O=${OUT:-/tmp/planmeas}
W=${WORK:-/var/tmp/planwork}
MBPS=${MBPS:-200}
mkdir -p $O $W
$DL status | grep -q "d3" || $DL up 4 --size 8G --mbps $MBPS
ONE="$D/d0"; FOUR="$D/d0,$D/d1,$D/d2,$D/d3"
packs() { # SRC NAME
  $DF pack -m $1 --out $W/$2-one --drives $ONE --placement stripe > $O/pack-$2-one.txt 2>&1
  $DF pack -m $1 --out $W/$2-four --drives $FOUR --placement stripe > $O/pack-$2-four.txt 2>&1
}
# setup NAME PACK RAM DRIVES N BUDGET CACHE [PLAN FLAGS...]
setup() {
  n=$1; p=$2; ram=$3; drv=$4; tok=$5; bud=$6; cache=$7; shift 7
  $DL run --ram $ram -- $DF plan -m $W/$p --drives $drv --ram-budget $bud -c 32 -t 2 \
    --heat-file none --prompt-tokens 1 --probe-seconds 3 --json "$@" > $O/$n-plan.json 2> $O/$n-plan.err
  $DL drop
  $DL run --ram $ram -- $DF bench -m $W/$p --ram-budget $bud -t 2 --decode-prompt-tokens 1 \
    --scenarios cold-decode -n $tok --cache $cache --heat-file none --json $O/$n-bench.json > $O/$n-bench.txt 2>&1
}
if [ -z "$SKIP_QWEN" ]; then
  $DF synth --arch qwen3_moe --preset qwen3-30b-a3b --layers 2 --out $W/q > $O/synth-q.txt 2>&1
  packs $W/q q; rm -rf $W/q
  for r in 1 2; do
    setup q-one-nocache-$r q-one 2G $ONE 8 1500M none --hit-rate 0
    setup q-four-nocache-$r q-four 2G $FOUR 8 1500M none --hit-rate 0
    setup q-one-cache-$r q-one 2G $ONE 16 1300M lfu-da --decode-tokens 16
  done
  rm -rf $W/q-one $W/q-four $D/d*/deltafin-pack-*.bin
fi
$DL down
if [ -z "$SKIP_K3" ]; then
  # one 10 GB drive holding the GGUF itself (disk space allows no pack beside it); the spine is
  # read through the cap once at load, then decode reads only experts (3 slices each)
  export DRIVELAB_DIR=$D-k3
  $DL up 1 --size 10G --mbps $MBPS
  K=$DRIVELAB_DIR/d0/k3.gguf
  $DF synth --arch kimi_k3 --preset kimi-k3 --format gguf --layers 2 --dense-layers 0 --experts 32 \
    --out $K > $O/synth-k3.txt 2>&1
  for r in 1 2; do
    $DL run --ram 9G -- $DF plan -m $K --ram-budget 7000M -c 32 -t 2 --heat-file none --prompt-tokens 1 \
      --probe-seconds 3 --hit-rate 0 --json > $O/k3-one-$r-plan.json 2> $O/k3-one-$r-plan.err
    $DL drop
    $DL run --ram 9G -- $DF bench -m $K --ram-budget 7000M -t 2 --decode-prompt-tokens 1 \
      --scenarios cold-decode -n 4 --cache none --heat-file none --json $O/k3-one-$r-bench.json > $O/k3-one-$r-bench.txt 2>&1
  done
  rm -f $K
fi
$DL down
echo DONE
