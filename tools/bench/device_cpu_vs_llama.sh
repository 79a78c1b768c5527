#!/usr/bin/env bash
# Issue 31 on the device host: Deltafin against llama.cpp on the same 8-layer
# Qwen3-30B-A3B-shape Q4_0 GGUF, same prompt texts, alternating engines.
#
#   bash tools/bench/device_pack.sh LLAMA_VENV   (here: fills .dev/)
#   bash tools/bench/device_cpu_vs_llama.sh      (there, from the repository root, carrying .dev)
#
# Needs: .dev/deltafin.xz (the release binary, device_pack.sh), .dev/llama_peer.py and
# .dev/llama.tgz (a folder with llama_cpp/, diskcache/ and libgomp.so.1 at its top level),
# python3 with numpy. No registry, no Rust. Writes its work under $WORK (default /tmp/h31),
# copies the raw results to $OUT when set. Stops starting new runs past $BUDGET seconds
# (default 360; the longest single run is about a minute) so the whole call stays under 8 minutes.
set -u
ROOT=$(pwd)
WORK=${WORK:-/tmp/h31}
BUDGET=${BUDGET:-360}
T0=$(date +%s)
mkdir -p "$WORK"
cd "$WORK" || exit 1
el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[$(el)s] $*" >&2; }

# --- the engines -----------------------------------------------------------------------
H=$ROOT/${DEV:-.dev}; . "$ROOT/tools/bench/device_unpack.sh"; unpack deltafin "$PWD/deltafin" || exit 1
mkdir -p llama && tar -xzf "$ROOT/${DEV:-.dev}/llama.tgz" -C llama
LL=$(dirname "$(find "$WORK/llama" -maxdepth 3 -type d -name llama_cpp | head -1)")
export PYTHONPATH="$LL${PYTHONPATH:+:$PYTHONPATH}"
export LD_LIBRARY_PATH="$LL:$(dirname "$(find "$WORK/llama" -maxdepth 3 -name 'libgomp.so*' | head -1)")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
PEER="$ROOT/${DEV:-.dev}/llama_peer.py"  # a copy of ../shared/tools/llama_peer.py
nproc >&2; ./deltafin --version >&2
python3 -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__)" >&2 || { echo "llama_cpp does not import" >&2; }

# --- the model (every weight resident in both engines) -----------------------------------
[ -f q.gguf ] || ./deltafin synth --arch qwen3_moe --preset qwen3-30b-a3b --layers 8 --format gguf --quant q4_0 --out q.gguf >&2
S="The quick brown fox jumps over the lazy dog while the sun sets behind the hills. "
rep() { local i; for ((i = 0; i < $1; i++)); do printf '%s' "$S"; done; }
P45=$(rep 1); P990=$(rep 22); P4005=$(rep 89)

RES=$WORK/results.tsv
: > "$RES"
# one line per measure: engine threads measure value
put() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$RES"; }

# deltafin bench: scenarios, threads, extra flags...; prints "scenario tok_s" lines
dfb() {
  local sc=$1 t=$2; shift 2
  ./deltafin bench -m q.gguf --device cpu --scenarios "$sc" -n 48 -t "$t" --keep-page-cache --json df.json "$@" > df.out 2>&1 \
    || { tail -5 df.out >&2; return 1; }
  python3 - <<'EOF'
import json
import sys
for s in json.load(open("df.json"))["scenarios"]:
    print(s["scenario"], round(s["summary"]["tok_s"], 2), s["prompt_tokens"])
    d, n = s.get("pool", {}).get("decode"), s["generated_tokens"] - 1
    if d and d["regions"] and n > 0 and "decode" in s["scenario"]:
        # how the decode used the pool: regions per token, their mean length, the share of
        # the threads' time inside them that tasks ran, decode time outside them
        busy = 100 * d["busy_s"] / (d["wall_s"] * s["threads"])
        print(f"pool {s['threads']}t {s['scenario']} after {s['prompt_tokens']}: "
              f"{d['regions'] / n:.1f} regions/token, {1e6 * d['wall_s'] / d['regions']:.0f} us each, "
              f"busy {busy:.0f}%, outside {100 * (1 - d['wall_s'] / s['decode_s']):.0f}%", file=sys.stderr)
EOF
}
# llama.cpp: threads, prompt; prints "decode_tok_s prefill_tok_s prompt_tokens"
lcp() {
  python3 "$PEER" q.gguf --threads "$1" --tokens 48 --no-repack --prompt "$2" > lc.out 2>&1 \
    || { tail -5 lc.out >&2; return 1; }
  python3 - <<'EOF'
import json
j = json.loads([l for l in open("lc.out") if l.startswith("{")][-1])
print(j["decode_tok_s"], round(j["prompt_tokens"] / j["ttft_s"], 2) if j["ttft_s"] else 0, j["prompt_tokens"])
EOF
}
over() { [ "$(el)" -ge "$BUDGET" ]; }

# --- the memory-bandwidth ceiling: T processes each reading its own 256 MiB, at once -----
membw() {
  python3 - "$1" <<'EOF'
import sys, time, numpy as np
from multiprocessing import Barrier, Process, Queue
T = int(sys.argv[1]); N = 64 << 20  # float32 elements per process (256 MiB)
def run(b, q):
    a = np.ones(N, dtype=np.float32); a.max()
    b.wait(); t = time.perf_counter()
    for _ in range(8): a.max()
    q.put(8 * a.nbytes / (time.perf_counter() - t))
b, q = Barrier(T), Queue()
ps = [Process(target=run, args=(b, q)) for _ in range(T)]
[p.start() for p in ps]; r = [q.get() for _ in ps]; [p.join() for p in ps]
print(round(sum(r) / 1e9, 1))
EOF
}
for t in 1 16; do
  bw=$(membw $t) && put numpy "$t" "read GB/s (numpy max, $t procs x 256 MiB)" "$bw"
done
log "bandwidth done"

# --- 16 threads: decode after 45 / 990 / 4005 prompt tokens, prefill of 990 ------------
for round in 1 2; do
  for p in 45 990 4005; do
    over && break
    eval "P=\$P$p"
    r=$(lcp 16 "$P") && { set -- $r; put llama.cpp 16 "decode after $3 tok" "$1"; [ "$p" = 990 ] && put llama.cpp 16 "prefill $3 tok" "$2"; }
    log "llama 16t $p: $r"
    r=$(dfb cold-decode 16 --prompt "$P") && put deltafin 16 "decode after $(echo "$r" | awk '{print $3}') tok" "$(echo "$r" | awk '{print $2}')"
    log "deltafin 16t $p: $r"
  done
  [ "$round" = 1 ] || break
  over && break
  r=$(dfb prefill 16 --prompt-tokens 990) && put deltafin 16 "prefill 990 tok" "$(echo "$r" | awk '{print $2}')"
  r=$(dfb prefill,cold-decode 16 --prompt-tokens 990 --prompt "$P45" --numerics q8) && {
    put deltafin-q8 16 "prefill 990 tok" "$(echo "$r" | awk '/^prefill/{print $2}')"
    put deltafin-q8 16 "decode after $(echo "$r" | awk '/^cold-decode/{print $3}') tok" "$(echo "$r" | awk '/^cold-decode/{print $2}')"; }
  log "deltafin 16t prefill: $r"
  # --- thread sweep: decode after 45, prefill of 990, both engines ----------------------
  for t in 2 4 8; do
    over && break
    r=$(lcp "$t" "$P45") && put llama.cpp "$t" "decode after $(echo "$r" | awk '{print $3}') tok" "$(echo "$r" | awk '{print $1}')"
    r=$(lcp "$t" "$P990") && put llama.cpp "$t" "prefill $(echo "$r" | awk '{print $3}') tok" "$(echo "$r" | awk '{print $2}')"
    r=$(dfb cold-decode,prefill "$t" --prompt "$P45" --prompt-tokens 990) && {
      put deltafin "$t" "decode after $(echo "$r" | awk '/^cold-decode/{print $3}') tok" "$(echo "$r" | awk '/^cold-decode/{print $2}')"
      put deltafin "$t" "prefill 990 tok" "$(echo "$r" | awk '/^prefill/{print $2}')"; }
    log "sweep ${t}t done"
  done
  # the engine's own decode ceiling: its matvec over a 64 MiB Q4_0 matrix (deltafin plan)
  for t in 2 16; do
    over && break
    ./deltafin plan -m q.gguf -t "$t" --json > plan.json 2>/dev/null && python3 - "$t" >> "$RES" <<'EOF'
import json, sys
j = json.load(open("plan.json"))
v = j.get("compute", {}).get("spine_bytes_per_s")
if v: print(f"deltafin\t{sys.argv[1]}\tmatvec GB/s (plan: Q4_0, 64 MiB)\t{v / 1e9:.1f}")
EOF
  done
done

# --- the table ------------------------------------------------------------------------
python3 - "$RES" <<'EOF'
import sys, statistics as st
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
vals = {}
for e, t, m, v in rows:
    try: vals.setdefault((m, int(t)), {}).setdefault(e, []).append(float(v))
    except ValueError: pass
print(f"{'measure':44} {'thr':>3} {'llama.cpp':>10} {'deltafin':>10} {'ratio':>6} {'df q8':>8} {'other':>8}")
def med(x): return st.median(x) if x else None
for (m, t) in sorted(vals, key=lambda k: (k[0].split()[0], k[1], k[0])):
    d = vals[(m, t)]
    l, f, q = med(d.get("llama.cpp", [])), med(d.get("deltafin", [])), med(d.get("deltafin-q8", []))
    o = med(d.get("numpy", []))
    r = f"{f / l:.2f}" if l and f else ""
    fmt = lambda x: f"{x:.1f}" if x is not None else ""
    print(f"{m:44} {t:>3} {fmt(l):>10} {fmt(f):>10} {r:>6} {fmt(q):>8} {fmt(o):>8}")
# bytes a decode step reads: spine 90.3 MB + 8 layers x 8 experts x 2.654 MB (inspect), plus
# the KV cache (Deltafin f32: 16 KiB per position per layer; llama.cpp f16: half)
W = 0.0903 + 64 * 0.002654
for (m, t), d in sorted(vals.items()):
    if not m.startswith("decode after") or t != 16: continue
    pos = int(m.split()[2])
    for eng, kv in (("llama.cpp", 8192), ("deltafin", 16384)):
        x = med(d.get(eng, []))
        if x: print(f"{eng} {m}, 16 threads: {x * (W + 8 * pos * kv / 1e9):.1f} GB/s of weights and KV")
# scaling 2 -> 16 threads, per engine and measure
for (m, t), d in sorted(vals.items()):
    if t != 2 or (m, 16) not in vals: continue
    for eng in ("llama.cpp", "deltafin", "deltafin-q8"):
        a, b = med(d.get(eng, [])), med(vals[(m, 16)].get(eng, []))
        if a and b: print(f"scaling 2->16 threads, {eng}, {m}: {b / a:.2f}x")
EOF
echo "raw results: $RES ($(el)s in all)"
[ -n "${OUT:-}" ] && cp "$RES" df.out lc.out "$OUT/" 2>/dev/null
exit 0
