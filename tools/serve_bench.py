"""Measures a running `deltafin serve`: TTFT of a chat's second turn with and without KV
prefix reuse, and the time per generated token seen by a streaming client.

Usage: python3 tools/serve_bench.py PORT [MODEL_ID]   (standard library only)
Without reuse: an unrelated request runs between the two turns, so the second turn's
prompt shares nothing with the kept KV cache and is prefilled whole.
"""
import http.client
import json
import sys
import time

PORT = int(sys.argv[1])
MODEL = sys.argv[2] if len(sys.argv) > 2 else None


def stream(messages, max_tokens):
    """Returns (seconds to the first content chunk, seconds per token after it, usage)."""
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=600)
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": True,
            "temperature": 0, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    first = last = None
    n = 0
    usage = None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        v = json.loads(line[6:])
        if v.get("usage"):
            usage = v["usage"]
        for ch in v["choices"]:
            if ch["delta"].get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
                n += 1
    per = (last - first) / max(n - 1, 1) if first else 0.0
    return first - t0, per, usage


def models():
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    c.request("GET", "/v1/models")
    return json.loads(c.getresponse().read())["data"][0]["id"]


MODEL = MODEL or models()
history = [{"role": "user", "content": "Tell me about the sea. " * 40}]
ans = stream(history, 8)
turn2 = history + [{"role": "assistant", "content": "The sea is wide."},
                   {"role": "user", "content": "And the mountains?"}]
# with reuse: turn 1 is the kept conversation (its prompt is a prefix of turn 2's)
stream(turn2[:1], 8)
ttft_reuse, _, u1 = stream(turn2, 8)
# without reuse: an unrelated conversation in between
stream([{"role": "user", "content": "Unrelated."}], 2)
ttft_fresh, _, u2 = stream(turn2, 8)
_, per_tok, u3 = stream([{"role": "user", "content": "Count."}], 64)
print(json.dumps({
    "turn2_prompt_tokens": u1["prompt_tokens"],
    "ttft_with_reuse_s": round(ttft_reuse, 4), "cached_tokens": u1["prompt_tokens_details"]["cached_tokens"],
    "ttft_without_reuse_s": round(ttft_fresh, 4), "cached_tokens_without": u2["prompt_tokens_details"]["cached_tokens"],
    "stream_s_per_token": round(per_tok, 5), "tokens": u3["completion_tokens"],
}))
