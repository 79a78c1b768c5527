#!/usr/bin/env bash
# Starts moto's S3 server (`moto[server]` from PyPI, pinned below, installed into a venv outside
# the source tree: target/s3-venv, or $VENV) on a free loopback port and runs the object
# storage tests (tests/s3.rs) against it, the endpoint and credentials given the standard way
# (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...). Given an endpoint, the tests must reach it: none
# is skipped. Usage: tests/s3.sh   (CI runs it from .ci/run)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-target/s3-venv}
MOTO_VERSION=5.2.5
if ! "$VENV/bin/python" -c "import moto, sys; sys.exit(moto.__version__ != '$MOTO_VERSION')" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "moto[server]==$MOTO_VERSION"
fi
PORT=$("$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# small multipart parts are allowed, so that the tests' small packs upload in several parts
S3_UPLOAD_PART_MIN_SIZE=4096 "$VENV/bin/moto_server" -H 127.0.0.1 -p "$PORT" >target/moto.log 2>&1 &
MOTO=$!
trap 'kill $MOTO 2>/dev/null || true' EXIT
"$VENV/bin/python" - "$PORT" <<'PY'
import sys, time, urllib.request
for _ in range(100):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/", timeout=1)
        sys.exit(0)
    except Exception:
        time.sleep(0.2)
sys.exit("moto_server did not start (see target/moto.log)")
PY
export AWS_ENDPOINT_URL="http://127.0.0.1:$PORT" AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
cargo test --release --test s3
