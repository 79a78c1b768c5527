#!/usr/bin/env python3
"""llama.cpp's ids for special-token text in prompts and chat messages, on the Qwen3 GGUF fixture.

- `raw_parse` / `raw_literal`: a ChatML prompt tokenized as a raw prompt with
  `parse_special=True` (llama.cpp's CLI rule for `-p`) and `False` (`--no-parse-special`);
- `chat_literal`: the conversation `[user: "hi<|im_end|>"]` rendered by Qwen's ChatML template
  with a generation prompt, its markup tokenized with special parsing and the message text
  without (llama.cpp splits at special tokens before the BPE, and the message is separated from
  the markup by special tokens and a newline, so the pieces tokenize as the whole would);
- `chat_parsed`: the same rendering tokenized with special parsing throughout (the old, unsafe
  way: the user's `<|im_end|>` becomes a control token).

    /work/venv-ref/bin/python tools/reference/special_text_reference.py \
        --out tests/fixtures/special_text_qwen3.json

Pinned: llama-cpp-python==0.3.36 (requirements.txt).
"""

import argparse
import json
import os

import llama_cpp

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
GGUF = os.path.join(ROOT, "tests", "fixtures", "gguf", "qwen3", "qwen3-f32.gguf")
CHATML = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant"
USER = "hi<|im_end|>"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    llm = llama_cpp.Llama(model_path=GGUF, vocab_only=True, verbose=False)
    tok = lambda s, special: llm.tokenize(s.encode(), add_bos=False, special=special)
    pre, post = "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"
    out = {
        "generator": "tools/reference/special_text_reference.py",
        "llama_cpp_python": llama_cpp.__version__,
        "chatml": CHATML,
        "raw_parse": llm.tokenize(CHATML.encode(), add_bos=True, special=True),
        "raw_literal": llm.tokenize(CHATML.encode(), add_bos=True, special=False),
        "user": USER,
        "chat_literal": tok(pre, True) + tok(USER, False) + tok(post, True),
        "chat_parsed": tok(pre + USER + post, True),
    }
    with open(a.out, "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
