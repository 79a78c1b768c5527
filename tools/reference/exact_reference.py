"""Exact (float64) reference logits for the demo model, independent of llama.cpp's numerics.

llama.cpp quantizes activations to 8 bits before its quantized dot products and keeps the KV
cache in f16, so its logits carry noise of about 1-3 units (its own single-token and batched
passes disagree by that much; see llama_gemma3_reference.json). This script computes Gemma 3's
forward pass in float64 numpy over the GGUF weights dequantized by the `gguf` package, for the
same token sequences as the llama.cpp fixture (prompt + llama.cpp's greedy continuation), and
records the top-10 logits of every position.

    pip install gguf==0.17.1 numpy==2.4.6
    python tools/reference/exact_reference.py MODEL.gguf \
        --llama tests/fixtures/llama_gemma3_reference.json \
        --out tests/fixtures/exact_gemma3_reference.json
"""
import argparse, hashlib, json

import gguf
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--llama", required=True, help="llama.cpp fixture whose sequences to evaluate")
ap.add_argument("--out", required=True)
a = ap.parse_args()

reader = gguf.GGUFReader(a.model)
tensors = {t.name: t for t in reader.tensors}
cache = {}


def w(name):
    if name not in cache:
        t = tensors[name]
        cache[name] = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64)
    return cache[name]


def field(key):
    f = reader.fields[key]
    return f.parts[f.data[0]][0]


d_model = int(field("gemma3.embedding_length"))
n_layer = int(field("gemma3.block_count"))
n_head = int(field("gemma3.attention.head_count"))
n_kv = int(field("gemma3.attention.head_count_kv"))
hd = int(field("gemma3.attention.key_length"))
eps = float(field("gemma3.attention.layer_norm_rms_epsilon"))
base_global = float(field("gemma3.rope.freq_base"))
base_local = 10000.0  # Gemma 3 rope_local_base_freq
window = int(field("gemma3.attention.sliding_window"))


def rms(x, g):  # GGUF norm weights already include Gemma's "1 +"
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def rope(x, pos, base):  # x: (n, heads, hd); NeoX halves
    half = x.shape[-1] // 2
    inv = base ** (-np.arange(half) * 2.0 / x.shape[-1])
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def forward(seq):
    n = len(seq)
    pos = np.arange(n, dtype=np.float64)
    x = w("token_embd.weight")[seq] * np.sqrt(float(d_model))
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    for l in range(n_layer):
        p = f"blk.{l}."
        sliding = (l + 1) % 6 != 0
        mask = np.where((j <= i) & ((i - j < window) | (not sliding)), 0.0, -np.inf)
        h = rms(x, w(p + "attn_norm.weight"))
        q = (h @ w(p + "attn_q.weight").T).reshape(n, n_head, hd)
        k = (h @ w(p + "attn_k.weight").T).reshape(n, n_kv, hd)
        v = (h @ w(p + "attn_v.weight").T).reshape(n, n_kv, hd)
        q, k = rms(q, w(p + "attn_q_norm.weight")), rms(k, w(p + "attn_k_norm.weight"))
        base = base_local if sliding else base_global
        q, k = rope(q, pos, base) * hd ** -0.5, rope(k, pos, base)
        rep = n_head // n_kv
        s = np.einsum("qhd,khd->hqk", q, np.repeat(k, rep, 1)) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", s, np.repeat(v, rep, 1)).reshape(n, n_head * hd)
        x = x + rms(o @ w(p + "attn_output.weight").T, w(p + "post_attention_norm.weight"))
        h = rms(x, w(p + "ffn_norm.weight"))
        f = gelu(h @ w(p + "ffn_gate.weight").T) * (h @ w(p + "ffn_up.weight").T)
        x = x + rms(f @ w(p + "ffn_down.weight").T, w(p + "post_ffw_norm.weight"))
    return rms(x, w("output_norm.weight")) @ w("token_embd.weight").T


llama = json.load(open(a.llama))
cases = []
for c in llama["cases"]:
    seq = c["prompt_ids"] + c["continuation_ids"]
    logits = forward(seq)
    top = np.argsort(-logits, 1, kind="stable")[:, :10]
    cases.append(dict(
        name=c["name"], ids=seq, top_ids=top.tolist(),
        top_logits=[[round(float(v), 5) for v in r] for r in np.take_along_axis(logits, top, 1)],
        max_abs=[round(float(v), 5) for v in np.abs(logits).max(1)]))
    print(c["name"], len(seq), flush=True)
sha = hashlib.sha256(open(a.model, "rb").read()).hexdigest()
out = dict(generator="tools/reference/exact_reference.py", model=dict(llama["model"], sha256=sha),
           method="float64 numpy forward pass of Gemma 3 over the GGUF weights dequantized by the gguf "
                  "package (gguf.quants.dequantize); no activation quantization",
           layout="ids = the sequence (prompt + llama.cpp greedy continuation); position i: top-10 logits "
                  "after ids[0..=i]; max_abs: max |logit| over the vocabulary",
           cases=cases)
json.dump(out, open(a.out, "w"), separators=(",", ":"))
