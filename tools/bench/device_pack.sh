#!/bin/bash
# Fills .dev/ (ignored by git: add `/.dev` to .git/info/exclude) with what the device benches
# need on a machine with no Rust and no registry, built here:
#   bash tools/bench/device_pack.sh [LLAMA_VENV]
# - .dev/deltafin.xz: the release binary, stripped, xz-compressed (every device script)
# - .dev/deltafin_lib_tests.xz, .dev/device_pass.xz: the CUDA op tests and the model GPU tests
#   (device_gpu.sh), with .dev/BUILD_ROOT, the folder they look for tests/fixtures in
# - .dev/batch_decode.xz and .dev/gemma-tiled.gguf.xz (device_batch.sh): examples/batch_decode,
#   and the demo model tiled by tools/bench/gguf_tile.py (same shapes, 3.4 MB compressed)
# (xz, not gzip: with the tree's ~31 MiB the whole must stay under the tool's 64 MiB)
# - with LLAMA_VENV (a venv with llama-cpp-python==0.3.36): .dev/llama.tgz (llama_cpp,
#   diskcache, libgomp.so.1) and .dev/llama_peer.py (device_cpu_vs_llama.sh)
# Keep .dev under ~30 MiB: the device tool carries at most 64 MiB of tree in all.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .dev
T=${CARGO_TARGET_DIR:-target}
cargo build --release --bin deltafin --example batch_decode
pack() { strip -o ".dev/$2" "$1" && xz -9 -T0 -f ".dev/$2"; }
pack "$T/release/deltafin" deltafin
pack "$T/release/examples/batch_decode" batch_decode
demo=$("$T/release/deltafin" pull gemma-3-270m 2>/dev/null | tail -1)
demo=${demo:-$HOME/.cache/deltafin/models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf}
python3 tools/bench/gguf_tile.py "$demo" .dev/gemma-tiled.gguf && xz -9 -T0 -f .dev/gemma-tiled.gguf
tests=$(cargo test --release --no-run --lib --test device_pass 2>&1 | sed -n 's/.*Executable .*(\([^)]*\)).*/\1/p')
for t in $tests; do
  case $t in
    *deps/deltafin-*) n=deltafin_lib_tests ;;
    *deps/device_pass-*) n=device_pass ;;
    *) continue ;;
  esac
  pack "$t" "$n"
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
