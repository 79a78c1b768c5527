"""Concurrent streams against a running `deltafin serve` (continuous batching, `--parallel`).

For each level N of --streams, N clients start together, each streaming one chat completion of a
distinct prompt (--max-tokens tokens; greedy, or sampled at --temperature T with the server's
other sampling settings and seed; --ignore-eos asks the server to run every stream to that
length). Reported per level: aggregate generated tok/s over the level's wall time, mean
per-stream decode tok/s (tokens after the first / seconds after the first), p50 and p95 TTFT,
and bytes read from disk per generated token (the server's /metrics counters before and after).

Usage: python3 tools/serve_load.py PORT [--streams 1,2,4,8] [--max-tokens 64] [--rounds 1]
                                        [--ignore-eos] [--temperature T] [--json FILE]
(standard library only)
"""
import argparse
import http.client
import json
import statistics
import threading
import time

TOPICS = ["the sea", "mountains", "a city at night", "an old library", "the first train",
          "a garden in spring", "a storm", "the moon", "a bakery", "a long road",
          "winter", "a lighthouse", "the desert", "a market", "a river", "a forest"]


def metric(port, name):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def stream(port, i, max_tokens, ignore_eos, temperature, out, slot):
    """Streams request `i` (its topic); stores (ttft s, tokens, seconds after the first
    token) in out[slot]."""
    try:
        out[slot] = stream1(port, i, max_tokens, ignore_eos, temperature)
    except BaseException as e:  # noqa: BLE001 - reported, then the level fails
        print(f"stream {i} failed: {e!r}", flush=True)


def stream1(port, i, max_tokens, ignore_eos, temperature):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    body = {"messages": [{"role": "user", "content": f"Write a long story about {TOPICS[i % len(TOPICS)]}."}],
            "max_tokens": max_tokens, "stream": True, "temperature": temperature,
            "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit(f"stream {i}: HTTP {r.status}: {r.read()[:300]!r}")
    first = last = None
    usage = None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        v = json.loads(line[6:])
        if v.get("usage"):
            usage = v["usage"]
        if v.get("error"):
            raise SystemExit(f"stream {i}: {v['error']}")
        for ch in v["choices"]:
            if ch["delta"].get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
    n = usage["completion_tokens"] if usage else 0
    return ((first or time.perf_counter()) - t0, n, (last - first) if first else 0.0)


def level(port, n, max_tokens, ignore_eos, temperature, offset):
    out = [None] * n
    b0 = metric(port, "deltafin_bytes_read_total")
    g0 = metric(port, "deltafin_generated_tokens_total")
    threads = [threading.Thread(target=stream, args=(port, offset + i, max_tokens, ignore_eos, temperature, out, i))
               for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    gen = metric(port, "deltafin_generated_tokens_total") - g0
    read = metric(port, "deltafin_bytes_read_total") - b0
    ttfts = sorted(o[0] for o in out)
    per = [(o[1] - 1) / o[2] for o in out if o[1] > 1 and o[2] > 0]
    return {
        "streams": n,
        "tokens": int(gen),
        "wall_s": round(wall, 3),
        "aggregate_tok_s": round(gen / wall, 2),
        "per_stream_tok_s": round(statistics.mean(per), 2) if per else 0.0,
        "ttft_p50_s": round(ttfts[len(ttfts) // 2], 3),
        "ttft_p95_s": round(ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))], 3),
        "bytes_per_token": round(read / gen) if gen else 0,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sent in every request (default 0: greedy)")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    offset = 0
    for n in [int(x) for x in a.streams.split(",")]:
        for _ in range(a.rounds):
            rows.append(level(a.port, n, a.max_tokens, a.ignore_eos, a.temperature, offset))
            offset += n
            print(json.dumps(rows[-1]), flush=True)
    base = rows[0]
    print(f"{'streams':>7} {'tok/s':>8} {'x1':>6} {'per-stream':>10} {'TTFT p50':>9} {'p95':>7} {'B/token':>10} {'x1':>6}")
    for r in rows:
        print(f"{r['streams']:>7} {r['aggregate_tok_s']:>8} {r['aggregate_tok_s'] / base['aggregate_tok_s']:>6.2f} "
              f"{r['per_stream_tok_s']:>10} {r['ttft_p50_s']:>9} {r['ttft_p95_s']:>7} {r['bytes_per_token']:>10} "
              f"{(r['bytes_per_token'] / base['bytes_per_token']) if base['bytes_per_token'] else 0:>6.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


main()
