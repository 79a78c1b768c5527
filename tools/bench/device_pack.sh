#!/bin/bash
# Fills .dev/ (ignored by git: add `/.dev` to .git/info/exclude) with what the device benches
# need on a machine with no Rust and no registry, built here:
#   bash tools/bench/device_pack.sh [LLAMA_VENV]
# - .dev/deltafin.gz: the release binary, stripped, gzipped (device_cpu_vs_llama.sh, device_gpu.sh)
# - .dev/deltafin_lib_tests.gz, .dev/device_pass.gz: the CUDA op tests and the model GPU tests
#   (device_gpu.sh), with .dev/BUILD_ROOT, the folder they look for tests/fixtures in
# - with LLAMA_VENV (a venv with llama-cpp-python==0.3.36): .dev/llama.tgz (llama_cpp,
#   diskcache, libgomp.so.1) and .dev/llama_peer.py (device_cpu_vs_llama.sh)
# Keep .dev under ~40 MiB: the device tool carries at most 64 MiB of tree in all.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .dev
T=${CARGO_TARGET_DIR:-target}
cargo build --release
strip -o .dev/deltafin "$T/release/deltafin" && gzip -f .dev/deltafin
tests=$(cargo test --release --no-run --lib --test device_pass 2>&1 | sed -n 's/.*Executable .*(\([^)]*\)).*/\1/p')
for t in $tests; do
  case $t in
    *deps/deltafin-*) n=deltafin_lib_tests ;;
    *deps/device_pass-*) n=device_pass ;;
    *) continue ;;
  esac
  strip -o ".dev/$n" "$t" && gzip -f ".dev/$n"
done
pwd > .dev/BUILD_ROOT
if [ $# -ge 1 ]; then
  sp=$(ls -d "$1"/lib/python3*/site-packages | head -1)
  tmp=$(mktemp -d)
  cp -r "$sp/llama_cpp" "$sp/diskcache" "$tmp/"
  cp /lib/x86_64-linux-gnu/libgomp.so.1 "$tmp/"
  tar -czf .dev/llama.tgz -C "$tmp" .
  rm -rf "$tmp"
  cp ../shared/tools/llama_peer.py .dev/llama_peer.py
fi
du -sh .dev
