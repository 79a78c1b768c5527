#!/usr/bin/env bash
# Starts the real `deltafin serve` binary on a free loopback port over the committed Qwen3-MoE
# fixture and drives it with the official `openai` Python package (pinned below), installed
# into a venv outside the source tree (target/openai-venv, or $VENV). Then a bounded load test
# (8 clients x 5 requests), a client that disconnects mid-stream, and SIGTERM.
# Usage: tests/serve_openai.sh   (after `cargo build --release`; BIN overrides the binary)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/deltafin}
VENV=${VENV:-target/openai-venv}
OPENAI_VERSION=3.51.0
if ! "$VENV/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "openai==$OPENAI_VERSION"
fi
exec timeout 300 "$VENV/bin/python" tests/serve_openai.py "$BIN" tests/fixtures/hf/qwen3_moe
