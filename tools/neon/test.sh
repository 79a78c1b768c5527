#!/usr/bin/env bash
# Runs the aarch64 (NEON level) unit tests under qemu-user on an x86-64 machine:
#
#   tools/neon/test.sh [FILTER...]      (default filters: quant:: backend::)
#
# Sets up what it needs when missing: the rustup target aarch64-unknown-linux-gnu, and
# Debian/Ubuntu's qemu-user, gcc-aarch64-linux-gnu and libc6-dev-arm64-cross (apt-get, as
# root or through passwordless sudo). When the target or the packages cannot be installed it
# prints "skipped: ..." and exits 0. It builds tools/neon/Cargo.toml, a crate of the two
# modules alone (`src/quant` and `src/backend` by #[path]; they import nothing else of
# Deltafin), so only their dependencies (anyhow, half, rayon, proptest) are cross-compiled; builds go
# to target/neon. Test failures exit non-zero.
set -euo pipefail
cd "$(dirname "$0")/../.."
TARGET=aarch64-unknown-linux-gnu
skip() { echo "tools/neon/test.sh: skipped: $*"; exit 0; }

if ! rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
  rustup target add "$TARGET" >/dev/null 2>&1 || skip "rustup target $TARGET could not be added"
fi

qemu=$(command -v qemu-aarch64 || command -v qemu-aarch64-static || true)
if [[ -z $qemu || ! -x $(command -v aarch64-linux-gnu-gcc || echo /nonexistent) \
      || ! -d /usr/aarch64-linux-gnu/lib ]]; then
  if [[ $(id -u) == 0 ]]; then as_root=(); elif sudo -n true 2>/dev/null; then as_root=(sudo -n);
  else skip "qemu-user / gcc-aarch64-linux-gnu missing and no root to install them"; fi
  command -v apt-get >/dev/null || skip "qemu-user / gcc-aarch64-linux-gnu missing and no apt-get"
  { "${as_root[@]}" apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq \
      qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross; } >/dev/null 2>&1 ||
    skip "apt-get could not install qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross"
  qemu=$(command -v qemu-aarch64 || command -v qemu-aarch64-static || true)
  [[ -n $qemu ]] || skip "no qemu-aarch64 after installing qemu-user"
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$qemu -L /usr/aarch64-linux-gnu"
(($# > 0)) || set -- quant:: backend::
exec cargo test --release --manifest-path tools/neon/Cargo.toml --target-dir target/neon \
  --target "$TARGET" --lib -- "$@"
