#!/usr/bin/env python3
"""llama.cpp's own tokenization of a shared set of strings under every `tokenizer.ggml.pre`.

For each pre-tokenizer name that llama.cpp (vendored in llama-cpp-python 0.3.36) accepts for a
`gpt2` vocabulary, writes a tiny vocabulary-only GGUF (a small byte-level BPE vocabulary with
merges learned from the strings; a raw-UTF-8 one with `<0xNN>` byte tokens for the names that
do not byte-encode), loads it with `llama_cpp.Llama(vocab_only=True)` and records the ids of
every string (`add_special=False, parse_special=False`) and of "a" with `add_special=True` (the
BOS rule). Names giving identical results share one entry. Output: one JSON file holding the
vocabularies, the strings and the ids, read by `tests/tokenizer_pretokenizers.rs`.

    /work/venv-ref/bin/python tools/reference/pretokenizer_reference.py \
        --out tests/fixtures/pretokenizers.json

Pinned: llama-cpp-python==0.3.36, gguf==0.19.0 (requirements.txt). Deterministic.
"""

import argparse
import collections
import json
import os
import re
import sys
import tempfile

import gguf
import llama_cpp

# Every name llama.cpp's `llama_vocab::impl::load` maps for a BPE vocabulary, plus None (no key).
NAMES = [
    None, "default", "minicpm5", "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1",
    "pixtral", "midm-2.0", "lfm2", "jina-v5-nano", "deepseek-llm", "deepseek-coder",
    "deepseek-v3", "spark2_5", "youtu", "falcon", "mpt", "starcoder", "gpt-2", "phi-2",
    "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
    "modern-bert", "jais-2", "gemma4", "granite-embed-multi-311m", "sarvam-moe", "jina-v1-en",
    "jina-v2-code", "roberta-bpe", "whitespace", "refact", "command-r", "qwen2",
    "deepseek-r1-qwen", "kormo", "f2llmv2", "qwen35", "stablelm2", "olmo", "dbrx", "smaug-bpe",
    "poro-chat", "chatglm-bpe", "glm4", "glm5", "viking", "jais", "tekken", "smollm",
    "codeshell", "bloom", "gpt3-finnish", "exaone", "exaone4", "exaone-moe", "chameleon",
    "minerva-7b", "megrez", "gpt-4o", "llama4", "kanana2", "talkie", "granite-embed-multi-97m",
    "tiny_aya", "cohere2moe", "superbpe", "trillion", "granite-docling", "bailingmoe",
    "bailingmoe2", "llada-moe", "seed-coder", "hunyuan", "hunyuan-dense", "hy_v4", "joyai-llm",
    "kimi-k2", "ufakzeka", "grok-2", "afmoe", "laguna", "minimax-m2", "solar-open", "mellum2",
]
UTF8_NAMES = {"gemma4", "granite-embed-multi-311m", "sarvam-moe", "whitespace"}

STRINGS = [
    "Hello world! It's a test, isn't it? I'LL SEE, we've, you'd, they're, 'S 'Ll don'T",
    "def f(x):\n    return x**2  # square\n\tif x >= 10_000: pass\n",
    "1 12 123 1234 12345 1234567 3.14159 -42 0x1F 2024-12-01 x1234y",
    "中文字符和日本語のテキスト、한국어 텍스트。混合mixed中文123〇",
    "emoji 😀👍🏽 🇫🇷 ❤️ and symbols © ® ™ ∑ → ≠ $5+3<=>^~|`",
    "   leading spaces\n\n\n  multiple   spaces\t\ttabs \r\n trailing   ",
    "Ünïcödé façade naïve café ÀÉÎÕÜ straße ΑΒΓ αβγ Кириллица ǄǅǆǱ",
    "e\u0301 a\u0308 combining\u0301marks Ǆungla x\u0301y",
    "مرحبا بالعالم ۔ नमस्ते दुनिया। ... !? …。，、",
    "IMGIMGABCZ <sentinel:12> <|im_start|>user\nhi<|im_end|>",
    " " * 20 + "x" + "\u3000\u3000全角　space\u00a0nbsp\u2003em",
    "CamelCaseWords HTTPServer getHTTPResponse MyXMLParser iPhone",
    "a",
    "\n",
    "    ",
]


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def learn(words, symbols, n_merges):
    """Greedy BPE over `words` (lists of symbols): the most frequent pair first, ties by text."""
    vocab = list(symbols)
    known = set(vocab)
    merges = []
    seqs = [list(w) for w in words]
    for _ in range(n_merges):
        counts = collections.Counter()
        for s in seqs:
            for a, b in zip(s, s[1:]):
                counts[(a, b)] += 1
        if not counts:
            break
        (a, b), c = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if c < 2:
            break
        merges.append(f"{a} {b}")
        if a + b not in known:
            known.add(a + b)
            vocab.append(a + b)
        for s in seqs:
            i = 0
            while i < len(s) - 1:
                if s[i] == a and s[i + 1] == b:
                    s[i:i + 2] = [a + b]
                i += 1
    return vocab, merges


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_vocab():
    b2u = bytes_to_unicode()
    words = []
    for s in STRINGS:
        for w in re.findall(r" ?\w+| ?[^\w\s]+|\s+", s):
            words.append([b2u[b] for b in w.encode("utf-8")])
    base = [b2u[b] for b in range(256)]
    vocab, merges = learn(words, base, 400)
    tokens = vocab + SPECIALS
    types = [1] * len(vocab) + [3] * len(SPECIALS)
    return {"tokens": tokens, "types": types, "merges": merges}


def utf8_vocab():
    words = []
    for s in STRINGS:
        for line in re.findall(r"[^\n]+|\n+", s.replace(" ", "\u2581")):
            words.append(list(line))
    chars = sorted({c for w in words for c in w})
    base = [f"<0x{b:02X}>" for b in range(256)]
    vocab, merges = learn(words, chars, 300)
    tokens = base + vocab + SPECIALS
    types = [6] * 256 + [1] * len(vocab) + [3] * len(SPECIALS)
    return {"tokens": tokens, "types": types, "merges": merges}


def write_gguf(path, vocab, pre):
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["types"])
    w.add_token_merges(vocab["merges"])
    w.add_bos_token_id(vocab["tokens"].index("<|endoftext|>"))
    w.add_eos_token_id(vocab["tokens"].index("<|endoftext|>"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    vocabs = {"bytes": byte_vocab(), "utf8": utf8_vocab()}
    distinct = []
    cases = {}
    with tempfile.TemporaryDirectory() as d:
        for name in NAMES:
            kind = "utf8" if name in UTF8_NAMES else "bytes"
            path = os.path.join(d, f"v{len(cases)}.gguf")
            write_gguf(path, vocabs[kind], name)
            llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
            # llama.cpp asserts (aborts) when a `whitespace` piece holds a space (that name is
            # meant for its `whitespace` tokenizer model): those strings are left out (null).
            ids = [None if name == "whitespace" and " " in s
                   else llm.tokenize(s.encode("utf-8"), add_bos=False, special=False)
                   for s in STRINGS]
            with_bos = llm.tokenize(b"a", add_bos=True, special=False)
            entry = {"vocab": kind, "ids": [None if x is None else " ".join(map(str, x)) for x in ids],
                     "a_with_special": with_bos}
            del llm
            if entry not in distinct:
                distinct.append(entry)
            cases[name if name is not None else "(none)"] = distinct.index(entry)
            print(name, distinct.index(entry), file=sys.stderr)
    out = {
        "generator": "tools/reference/pretokenizer_reference.py",
        "llama_cpp_python": llama_cpp.__version__,
        "strings": STRINGS,
        "vocabs": vocabs,
        "cases": cases,
        "results": distinct,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0, sort_keys=False)
        f.write("\n")


if __name__ == "__main__":
    main()
