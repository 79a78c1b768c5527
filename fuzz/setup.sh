#!/usr/bin/env bash
# Installs what fuzz/run.sh needs, once: cargo-afl 0.18.2 (from crates.io, into ~/.cargo/bin)
# and the AFL++ build it manages (`cargo afl config --build`, without the LLVM plugins, so no
# LLVM toolchain is needed: the targets are instrumented by rustc's own SanitizerCoverage).
# Both steps are skipped when already done.
set -euo pipefail
if ! cargo afl --version >/dev/null 2>&1; then
  cargo install cargo-afl --version 0.18.2 --locked
fi
# `cargo afl config --build` refuses to rebuild an existing AFL++ unless --force is given, so
# its "already built" answer is success here.
out=$(cargo afl config --build 2>&1) || {
  grep -q 'already built' <<<"$out" || { echo "$out" >&2; exit 1; }
}
cargo afl --version
