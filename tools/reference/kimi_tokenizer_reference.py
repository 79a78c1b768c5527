#!/usr/bin/env python3
"""A small synthetic Kimi tokenizer folder and its reference tokenizations.

Writes `tests/fixtures/kimi_tokenizer/`:
- `tiktoken.model`: 256 byte tokens (ranks 0..255 in byte order) and merged tokens learned from
  the TRAIN texts below (not the test strings, so these need partial merges) under Kimi's split pattern (ranks in merge order), `BASE64 RANK` per line;
- `tokenizer_config.json`: special tokens (`added_tokens_decoder`) at Kimi K2's offsets after
  the ranks, `bos_token`/`eos_token`, and a small ChatML-like chat template in Kimi's markup;
- `kimi-k2.gguf`: the same vocabulary converted as llama.cpp's converter converts Kimi
  (`conversion/kimi_linear.py`: byte-encoded token texts, merges recovered from the ranks,
  `tokenizer.ggml.pre = kimi-k2`), vocabulary only;
- `reference.json`: for every string, tiktoken's ids (`encode(allowed_special="all")` and
  `encode_ordinary`) and, with --llama, llama.cpp's ids for the GGUF (`parse_special` true and
  false).

    /work/venv-real/bin/python tools/reference/kimi_tokenizer_reference.py   # tiktoken part
    /work/venv-ref/bin/python tools/reference/kimi_tokenizer_reference.py --llama-only

Pinned: tiktoken==0.12.0 (its `regex` dependency), llama-cpp-python==0.3.36, gguf==0.19.0.
"""

import argparse
import base64
import collections
import json
import os
import sys

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "kimi_tokenizer")

PAT = r"""[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

TRAIN = [
    "The quick brown fox jumps over the lazy dog. It's what we've seen, they'll say.",
    "中文分词测试，中文字符和汉字。日本語のテキストも少し。한국어 텍스트",
    "def main():\n    print('hello world')\n    return 0\n",
    "numbers 1234567890 and 3.14159, 2024-12-01",
    "emoji 😀😀 👍🏽 and symbols ©®™ → ≠",
    "   spaces   and\ttabs\n\n\nnewlines  ",
    "Hello there, hello world. Tests are testing the tester; isn't it a well-tested test?",
    "Multiple spaces, leading and trailing, symbols and CamelCase or camelCase words: getValue.",
    "中文混合测试，你好，世界。文字与数字一二三。こんにちは、カタカナとひらがな。",
    "return value; print(x); for i in range(10): pass  # comment\n",
]

STRINGS = [
    "Hello world! It's a test, isn't it? I'LL SEE, we've, you'd, THEY'RE",
    "中文分词测试：你好世界！混合mixed中文123和English",
    "日本語のテキスト、カタカナ。한국어 텍스트〇",
    "emoji 😀👍🏽 🇫🇷 ❤️ and symbols © ® ™ → ≠",
    "1 12 123 1234 12345 1234567 3.14159 -42",
    "   leading spaces\n\n\n  multiple   spaces\t\ttabs \r\n trailing   ",
    "def f(x):\n    return x**2  # square\n",
    "Ünïcödé café naïve e\u0301 a\u0308 ΑΒΓ αβγ Кириллица",
    "[BOS]<|im_user|>user<|im_middle|>hi<|im_end|>\n<|im_system|>system<|im_middle|>",
    "CamelCaseWords HTTPServer getHTTPResponse",
    "a",
    "\n",
    "    ",
]

# (offset after the ranks, text) as in Kimi K2's tokenizer_config.json
SPECIALS = [
    (0, "[BOS]"), (1, "[EOS]"), (2, "<|im_end|>"), (3, "<|im_user|>"), (4, "<|im_assistant|>"),
    (6, "<|start_header_id|>"), (7, "<|end_header_id|>"), (9, "[EOT]"), (10, "<|im_system|>"),
    (17, "<|im_middle|>"), (254, "[UNK]"), (255, "[PAD]"),
]

TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}<|im_system|>system<|im_middle|>"
    "{%- elif m.role == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- else -%}<|im_user|>{{ m.role }}<|im_middle|>{%- endif -%}"
    "{{ m.content }}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)


def train():
    import regex
    words = collections.Counter()
    for s in TRAIN:
        for w in regex.findall(PAT, s, flags=regex.V1):  # V1: `&&` is an intersection
            words[w.encode("utf-8")] += 1
    ranks = {bytes([b]): b for b in range(256)}
    seqs = {w: [bytes([b]) for b in w] for w in words}
    while len(ranks) < 256 + 400:
        counts = collections.Counter()
        for w, s in seqs.items():
            for a, b in zip(s, s[1:]):
                counts[(a, b)] += words[w]
        if not counts:
            break
        (a, b), c = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if a + b not in ranks:
            ranks[a + b] = len(ranks)
        for w, s in seqs.items():
            i = 0
            while i < len(s) - 1:
                if s[i] == a and s[i + 1] == b:
                    s[i:i + 2] = [a + b]
                i += 1
    return ranks


def read_ranks():
    ranks = {}
    with open(os.path.join(OUT, "tiktoken.model")) as f:
        for line in f:
            t, r = line.split()
            ranks[base64.b64decode(t)] = int(r)
    return ranks


def tiktoken_part():
    import tiktoken
    os.makedirs(OUT, exist_ok=True)
    ranks = train()
    with open(os.path.join(OUT, "tiktoken.model"), "w") as f:
        for t, r in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(t).decode()} {r}\n")
    n = len(ranks)
    named = {n + o: t for o, t in SPECIALS}
    special = {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(n, n + 256)}
    cfg = {
        "added_tokens_decoder": {str(i): {"content": t, "lstrip": False, "normalized": False,
                                          "rstrip": False, "single_word": False, "special": True}
                                 for i, t in sorted(named.items())},
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "chat_template": TEMPLATE,
        "tokenizer_class": "TikTokenTokenizer",
    }
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
        f.write("\n")
    enc = tiktoken.Encoding(name="kimi-synthetic", pat_str=PAT, mergeable_ranks=ranks,
                            special_tokens=special)
    ref = {
        "generator": "tools/reference/kimi_tokenizer_reference.py",
        "tiktoken": tiktoken.__version__,
        "n_ranks": n,
        "strings": STRINGS,
        "tiktoken_parse_special": [enc.encode(s, allowed_special="all") for s in STRINGS],
        "tiktoken_ordinary": [enc.encode_ordinary(s) for s in STRINGS],
    }
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(ref, f, ensure_ascii=False, indent=0)
        f.write("\n")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    k = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + k)
            k += 1
    return dict(zip(bs, map(chr, cs)))


def bpe(ranks, token, max_rank):
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            return parts
        i = best[1]
        parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2:]


def llama_part():
    import gguf
    import llama_cpp
    ranks = read_ranks()
    b2u = bytes_to_unicode()
    s = lambda b: "".join(b2u[x] for x in b)
    n = len(ranks)
    named = {n + o: t for o, t in SPECIALS}
    tokens, types, merges = [], [], []
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    for t, r in by_rank:
        if len(t) > 1:
            m = bpe(ranks, t, r)
            if len(m) == 2:
                merges.append(" ".join(map(s, m)))
    for t, _ in by_rank:
        tokens.append(s(t))
        types.append(1)
    for i in range(n, n + 256):
        tokens.append(named.get(i, f"<|reserved_token_{i}|>"))
        types.append(3)
    path = os.path.join(OUT, "kimi-k2.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("kimi-k2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(n)
    w.add_eos_token_id(n + 1)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    with open(os.path.join(OUT, "reference.json")) as f:
        ref = json.load(f)
    ref["llama_cpp_python"] = llama_cpp.__version__
    ref["llama_parse_special"] = [llm.tokenize(x.encode(), add_bos=False, special=True) for x in STRINGS]
    ref["llama_literal"] = [llm.tokenize(x.encode(), add_bos=False, special=False) for x in STRINGS]
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(ref, f, ensure_ascii=False, indent=0)
        f.write("\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-only", action="store_true")
    a = ap.parse_args()
    if a.llama_only:
        llama_part()
    else:
        tiktoken_part()
