#!/bin/bash
# Issue 27: the Kimi K3 shape with its experts streamed from the device machine's disk, on the
# GPU and on the CPU, against the disk's own read rate. Run from the repository root there
# (carrying .dev from `bash tools/bench/device_pack.sh`), after tools/bench/device_gpu.sh has
# shown the K3 fixture's GPU logits within bounds (until then `--device cuda` runs K3 with a
# warning that its MLA / KDA kernels are not yet verified on a GPU, and `auto` takes the CPU).
#   bash tools/bench/device_k3.sh        (LAYERS=4 EXPERTS=64 N=16 PROMPT=512 by default;
#                                          BUDGET: the spine plus 512 MiB)
# Writes a `synth --arch kimi_k3 --preset kimi-k3` GGUF cut to $LAYERS MoE layers of $EXPERTS
# experts (each K3's 17.5 MB MXFP4 expert, top-16 per token: a decode step reads
# 16 x 17.5 MB per MoE layer), packs it (one read per expert), deletes the GGUF, measures the
# disk (fio 1 MiB random reads, QD 32, O_DIRECT, when fio is there; else dd with
# iflag=direct over the pack's expert file), then `deltafin bench` with no expert cache:
# cold decode tok/s (goal: >= 0.9 of the disk's limit, the limit being disk MB/s over the
# bytes a token reads) and the cold prefill of $PROMPT tokens (TTFT; goal <= 1.2 x
# max(I/O floor, GPU compute)), on --device cuda and --device cpu (16 cores). Prints the
# figures, copies the log to $OUT/k3.txt when $OUT is set, removes what it wrote. A VRAM
# expert cache (--vram-budget) does not exist yet, so only --cache none and the host cache run.
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
H=$ROOT/${DEV:-.dev}
W=${WORK:-/tmp/k3-dev}
LAYERS=${LAYERS:-4}
EXPERTS=${EXPERTS:-64}
N=${N:-16}
PROMPT=${PROMPT:-512}
mkdir -p "$W/drive"
LOG=$W/k3.txt
: > "$LOG"
say() { echo "$@" | tee -a "$LOG"; }
run() { "$@" 2>&1 | grep -v '^synth: .* written' | tee -a "$LOG"; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
DF=$W/deltafin
. tools/bench/device_unpack.sh
if [ -f "$H/deltafin.xz" ]; then unpack deltafin "$DF"; else cp "${DF_BIN:-target/release/deltafin}" "$DF"; fi
chmod +x "$DF"
say "=== $(date -u) $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo no GPU)"
run "$DF" synth --arch kimi_k3 --preset kimi-k3 --format gguf --layers "$LAYERS" --dense-layers 0 \
  --experts "$EXPERTS" --out "$W/k3.gguf"
run "$DF" pack -m "$W/k3.gguf" --out "$W/pack" --drives "$W/drive" --placement stripe
rm -f "$W/k3.gguf"
du -sh "$W/pack" "$W/drive" | tee -a "$LOG"
big=$(ls -S "$W"/drive/* | head -1)
say "=== the disk: 1 MiB reads with O_DIRECT of $big"
if command -v fio > /dev/null; then
  run fio --name=disk --filename="$big" --rw=randread --bs=1M --iodepth=32 --ioengine=io_uring \
    --direct=1 --runtime=15 --time_based --readonly | grep -E "READ:|bw="
fi
# dd (one request at a time, so a floor of the disk's rate): its bytes per second go to bench
# as --drive-bandwidth, for the I/O floor of the prefill and the decode's limit %
dd if="$big" of=/dev/null bs=1M iflag=direct count=8192 2> "$W/dd.txt"
cat "$W/dd.txt" | tee -a "$LOG"
BW=$(awk '/copied/ { printf "%d", $1 / $(NF-3) }' "$W/dd.txt")
say "drive bandwidth for bench: $BW bytes/s"
# the RAM budget: the spine (the pack folder) plus 512 MiB, so the experts stream
BUDGET=${BUDGET:-$(( $(du -sm "$W/pack" | cut -f1) + 512 ))M}
B="bench -m $W/pack --drive-bandwidth $BW --ram-budget $BUDGET --cache none --heat-file none --output md"
for dev in cuda cpu; do
  say "=== --device $dev: cold decode, $N tokens after 1 prompt token, no expert cache"
  sync; echo 3 > /proc/sys/vm/drop_caches 2> /dev/null
  run timeout 240 "$DF" $B --device $dev --scenarios cold-decode -n "$N" --decode-prompt-tokens 1
  say "=== --device $dev: cold prefill of $PROMPT tokens (TTFT), no expert cache"
  sync; echo 3 > /proc/sys/vm/drop_caches 2> /dev/null
  run timeout 240 "$DF" $B --device $dev --scenarios cold-prefill --prompt-tokens "$PROMPT"
done
rm -rf "$W/pack" "$W/drive"
say "=== done $(date -u)"
[ -n "${OUT:-}" ] && cp "$LOG" "$OUT/k3.txt"
exit 0
