#!/bin/bash
# Issue 27: the models on CUDA. Run from the repository root on the device machine (the
# `device` tool of the tool library: no Rust there, so build here first):
#   bash tools/bench/device_pack.sh            (here: fills .dev/ with the binaries)
#   bash tools/bench/device_gpu.sh             (there, carrying .dev)
# Needs: the NVIDIA driver, /usr/local/cuda/lib64 (NVRTC, cuBLAS), tests/fixtures of the tree.
# Prints (and copies to $OUT/gpu.txt when $OUT is set): the GPU tests of the models
# (tests/device_pass.rs: the GQA families, and DeepSeek V3, Kimi Linear, Kimi K3 and GPT-OSS,
# whose kernels this is the first GPU run of), the CUDA op tests (backend::cuda) and the
# device cache slots (models::device), `run --stats`'s placement line,
# and `deltafin bench` of synthetic Qwen3-30B-A3B-shape Q4_K GGUFs on --device cuda and cpu:
# 4 layers (1.4 GB) and 16 layers (5.6 GB) resident, then the 16-layer one with its experts
# streamed from the disk (--ram-budget 2G, no expert cache). About 3 minutes.
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
H=$ROOT/${DEV:-.dev}
W=${WORK:-/tmp/gpu-bench}
mkdir -p "$W"
LOG=$W/h27.txt
: > "$LOG"
say() { echo "$@" | tee -a "$LOG"; }
run() { "$@" 2>&1 | grep -v '^synth: .* written' | tee -a "$LOG"; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
say "=== $(date -u) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
. "$ROOT/tools/bench/device_unpack.sh"
for b in deltafin deltafin_lib_tests device_pass; do unpack $b "$W/$b" || exit 1; done
# the test binaries look for the fixtures where they were built (.dev/BUILD_ROOT)
B0=$(cat "$H/BUILD_ROOT" 2>/dev/null || echo /work/main)
if [ ! -d "$B0/tests/fixtures" ]; then
  mkdir -p "$(dirname "$B0")" && rm -rf "$B0" && ln -s "$ROOT" "$B0"
fi
say "=== CUDA op tests (src/backend/cuda/tests.rs, tests_family.rs) and the device slots"
run timeout 120 "$W/deltafin_lib_tests" backend::cuda models::device --test-threads 1 --nocapture
say "=== model tests on the GPU (tests/device_pass.rs)"
(cd "$ROOT" && run timeout 240 "$W/device_pass" --test-threads 1 --nocapture)
B="$W/deltafin bench --scenarios warm-decode,prefill -n 64 --repetitions 3 --output md"
for L in 4 16; do
  say "=== bench: synthetic Qwen3-30B-A3B shape, $L layers, q4_k, every weight resident"
  run "$W/deltafin" synth --arch qwen3_moe --preset qwen3-30b-a3b --layers $L --format gguf \
    --quant q4_k --out "$W/q3moe-$L.gguf"
  for dev in cuda cpu; do
    say "--- --device $dev, --prompt-tokens 512"
    run timeout 60 $B -m "$W/q3moe-$L.gguf" --device $dev --prompt-tokens 512
  done
done
say "=== run --stats on the GPU (the placement line)"
run timeout 30 "$W/deltafin" run -m "$W/q3moe-16.gguf" -p "Hello" -n 8 --stats --device auto \
  | grep -E "placement|decode  |time to first"
say "=== bench: 16 layers, experts streamed from the disk (--ram-budget 2G, --cache none)"
for dev in cuda cpu; do
  say "--- --device $dev"
  run timeout 60 "$W/deltafin" bench -m "$W/q3moe-16.gguf" --device $dev --ram-budget 2G \
    --cache none --scenarios cold-decode -n 16 --output md
done
say "=== done $(date -u)"
[ -n "${OUT:-}" ] && cp "$LOG" "$OUT/gpu.txt"
exit 0
