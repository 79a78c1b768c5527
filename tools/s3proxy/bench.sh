#!/usr/bin/env bash
# The object storage measurements of BENCHMARKS.md ("Packs on object storage"): a synthetic
# qwen3_moe `small` (4 MoE layers x 64 experts of 216 KiB, top-8, Q4_0) packed locally and
# uploaded to moto's S3 server on loopback; decode through tools/s3proxy/s3proxy.py capped at
# RATE bytes/s with LATENCY_MS per request, at several --s3-concurrency values, without a local
# tier, then with a warm local tier, against the local pack. Every run: --cache none (every
# expert use is a miss), N tokens greedy (default 32); decode tok/s is the engine's (tokens
# after the first over decode time), per-token counts are over those tokens.
# Usage: [RATE=B/s] [LATENCY_MS=ms] [N=tokens] tools/s3proxy/bench.sh [WORKDIR]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
W=${1:-/tmp/deltafin-s3-bench}
D=$ROOT/target/release/deltafin
VENV=$ROOT/target/s3-venv
RATE=${RATE:-20000000}
LATENCY_MS=${LATENCY_MS:-20}
N=${N:-32}
mkdir -p "$W"
cd "$W"
rm -rf home nvme st*.json
[ -f small.gguf ] || "$D" synth --preset small --format gguf --out small.gguf >/dev/null 2>&1
[ -d pack ] || { mkdir -p d0; "$D" pack -m small.gguf --out pack --drives d0 >/dev/null; }
PORT=$("$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$VENV/bin/moto_server" -H 127.0.0.1 -p "$PORT" >moto.log 2>&1 &
MOTO=$!
python3 "$ROOT/tools/s3proxy/s3proxy.py" --upstream "http://127.0.0.1:$PORT" --rate "$RATE" --latency-ms "$LATENCY_MS" >proxy.out &
PROXY=$!
trap 'kill $MOTO $PROXY 2>/dev/null || true' EXIT
sleep 3
PPORT=$(head -1 proxy.out | cut -d' ' -f2)
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1 DELTAFIN_HOME=$W/home
"$VENV/bin/python" -c "import urllib.request as u; u.urlopen(u.Request('http://127.0.0.1:$PORT/bench', method='PUT'))"
AWS_ENDPOINT_URL=http://127.0.0.1:$PORT "$D" pack -m pack --out s3://bench/small
export AWS_ENDPOINT_URL=http://127.0.0.1:$PPORT
run() { # model, stats file, extra flags
    local m=$1 st=$2; shift 2
    "$D" run -m "$m" -p "the quick brown fox" -n "$N" --temp 0 --ram-budget 16M --cache none \
        --stats-json "$st" "$@" >/dev/null
    python3 - "$st" "$N" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); e = s["experts"]["decode"]
toks = s["generated_tokens"] - 1
print(f'decode {s["decode_tok_s"]:.2f} tok/s, '
      f'{e["fetched_bytes"] / max(toks, 1) / 1e6:.2f} MB fetched/token, '
      f'{e["bytes"] / max(toks, 1) / 1e6:.2f} MB read/token, {e["fetches"]} GETs, {e["tier_hits"]} tier hits')
PY
}
echo "link: $RATE B/s, $LATENCY_MS ms per request (0: no cap)"
echo -n "local pack:             "; run pack st0.json
echo -n "local pack, pread pool: "; run pack st0p.json --io-engine pool
for c in 1 2 4 8 16; do
    printf "s3, concurrency %-2s     " "$c"; run s3://bench/small st$c.json --s3-concurrency "$c"
done
echo -n "s3, c16, prefetch on:   "; run s3://bench/small stpf.json --prefetch on
echo -n "s3 + tier (cold):       "; run s3://bench/small stc.json --local-cache nvme
echo -n "s3 + tier (warm):       "; run s3://bench/small stw.json --local-cache nvme
