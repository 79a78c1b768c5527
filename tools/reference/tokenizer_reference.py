#!/usr/bin/env python3
"""Records llama.cpp's tokenization of the demo GGUF as a JSON fixture for the Rust tests.

Requirements (pinned): llama-cpp-python==0.3.36

Usage: tokenizer_reference.py MODEL.gguf OUT.json

For every case it stores the ids of llama_tokenize(add_special=True, parse_special=...) and the
text of llama_detokenize over those ids in two modes: `decoded_skip` (remove_special=True,
unparse_special=False) and `decoded_all` (remove_special=False, unparse_special=True).
"""
import ctypes
import json
import sys

import llama_cpp

CASES = [
    ("ascii_sentence", "The quick brown fox jumps over the lazy dog.", False),
    ("leading_space", " Hello world", False),
    ("leading_spaces", "   Hello", False),
    ("trailing_spaces", "Hello world   ", False),
    ("space_runs", "a  b   c    d                                        e", False),
    ("single_space", " ", False),
    ("tabs", "col1\tcol2\t\tcol3\n\tindented", False),
    ("newlines", "line one\nline two\n\nline four\n\n\n\nend", False),
    ("only_newlines", "\n\n\n", False),
    ("crlf", "windows\r\nline\r\n", False),
    ("cjk", "我爱自然语言处理。東京は日本の首都です。한국어도 됩니다.", False),
    ("arabic", "مرحبا بالعالم، كيف حالك؟", False),
    ("emoji", "I love 🦀 and 🍕!", False),
    ("emoji_zwj", "Family: 👨‍👩‍👧‍👦, flag: 🏳️‍🌈, skin: 👍🏽", False),
    ("combining", "Cafe\u0301 nai\u0308ve e\u0301\u0301\u0301 Å", False),
    ("byte_fallback", "\u0000\u0001\u001f rare: \U0001D11E \U00010348 \uE000 \U0010FFFD", False),
    ("code", "fn main() {\n    let x: Vec<u32> = vec![1, 2, 3];\n    println!(\"{x:?}\");\n}\n", False),
    ("python_code", "def f(a, b=2):\n\treturn a**b  # power\n", False),
    ("numbers", "3.14159 1,000,000 2026-11-29 0x1F 1e-9 12345678901234567890", False),
    ("html", "<table><tr><td>x</td></tr></table> <b>bold</b>", False),
    ("special_parsed", "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", True),
    ("special_unparsed", "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", False),
    ("special_inline_parsed", "text<bos>more<eos> <unk><pad>", True),
    ("special_inline_unparsed", "text<bos>more<eos> <unk><pad>", False),
    ("eog_user_defined_parsed", "a</s>b <s>c</s>", True),
    ("eog_user_defined_unparsed", "a</s>b <s>c</s>", False),
    ("empty", "", False),
    ("empty_parsed", "", True),
    ("punctuation", "Hello, world! What's up? (yes) [no] {maybe} -- ... \"quoted\" 'single'", False),
    ("mixed_scripts", "Ελληνικά русский עברית हिन्दी ไทย", False),
    ("url_email", "https://example.com/path?q=1&r=2 user@example.org", False),
    ("repeated", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", False),
    ("math", "∑_{i=1}^{n} x_i² ≤ √2 · π ≈ 3.14", False),
    ("long_word", "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism", False),
]


def tokenize(vocab, text: str, parse_special: bool):
    data = text.encode("utf-8")
    n_max = len(data) + 8
    buf = (llama_cpp.llama_token * n_max)()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, n_max, True, parse_special)
    assert n >= 0, n
    return [int(buf[i]) for i in range(n)]


def detokenize(vocab, ids, remove_special: bool, unparse_special: bool) -> bytes:
    arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    cap = 64 + 64 * len(ids)
    out = ctypes.create_string_buffer(cap)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), out, cap, remove_special, unparse_special)
    assert n >= 0, n
    return out.raw[:n]


def main():
    model_path, out_path = sys.argv[1], sys.argv[2]
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), params)
    assert model, "failed to load model"
    vocab = llama_cpp.llama_model_get_vocab(model)
    cases = []
    for name, text, parse_special in CASES:
        ids = tokenize(vocab, text, parse_special)
        skip = detokenize(vocab, ids, True, False)
        full = detokenize(vocab, ids, False, True)
        cases.append({
            "name": name,
            "text": text,
            "parse_special": parse_special,
            "ids": ids,
            "decoded_skip": skip.decode("utf-8"),
            "decoded_all": full.decode("utf-8"),
        })
    eog = [i for i in range(llama_cpp.llama_vocab_n_tokens(vocab)) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    fixture = {
        "generator": "tools/reference/tokenizer_reference.py, llama-cpp-python " + llama_cpp.__version__,
        "model": "gemma-3-270m Q4_K_M GGUF (sha256 a5fd3b62...)",
        "n_vocab": llama_cpp.llama_vocab_n_tokens(vocab),
        "bos": llama_cpp.llama_vocab_bos(vocab),
        "eos": llama_cpp.llama_vocab_eos(vocab),
        "eog": eog,
        "cases": cases,
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")
    llama_cpp.llama_model_free(model)


if __name__ == "__main__":
    main()
