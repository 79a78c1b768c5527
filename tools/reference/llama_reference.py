"""Write the llama.cpp reference fixture for a GGUF model (greedy continuations + top-k logits).

  python llama_reference.py MODEL.gguf --out tests/fixtures/llama_gemma3_reference.json

Runs MODEL.gguf through llama-cpp-python (pinned in requirements.txt) on the CPU and records, for
each prompt in PROMPTS:

  * the prompt text and llama.cpp's prompt token ids (BOS added the way llama.cpp adds it by
    default, i.e. `llama_tokenize(add_special=True, parse_special=False)`),
  * a greedy continuation of N_GENERATE tokens decoded incrementally (prompt in one batch, then
    one token per decode call; next token = argmax of the logits, lowest id on ties). EOS does not
    stop generation; an EOS inside the continuation is recorded in `eos_index`,
  * a teacher-forced evaluation of prompt + continuation in ONE decode batch, and for every
    position i (0-based; the logits after consuming tokens[0..=i], i.e. predicting token i+1):
    the TOP_K token ids by logit (descending, ties by ascending id), their logits rounded to
    DECIMALS decimals, and the top-1 minus top-2 gap (computed from the unrounded float32 values),
  * consistency checks between the batched and the incremental pass.

No full-vocabulary logits are stored, so the file stays well under 1 MB.
"""
import argparse
import hashlib
import json
import os
import sys

import numpy as np
import llama_cpp
import llama_cpp.llama_cpp as lc
from llama_cpp import Llama

N_GENERATE = 32
TOP_K = 10
DECIMALS = 5
N_THREADS = 2
N_CTX = 512
N_BATCH = 512  # also n_ubatch: the whole teacher-forced sequence is one physical batch
SEED = 1234

# (name, prompt). Varied on purpose: facts, code, lists, questions, other scripts, digits,
# newlines/tabs, a long paragraph, JSON, emoji, a one-word prompt.
PROMPTS = [
    ("eiffel", "The Eiffel Tower is located in the city of"),
    ("capital_japan", "The capital of Japan is"),
    ("python_code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    ("rust_code", "fn main() {\n    let v = vec![1, 2, 3];\n    println!("),
    ("shopping_list", "Shopping list:\n1. Milk\n2. Eggs\n3."),
    ("question", "Question: What is the boiling point of water at sea level in degrees Celsius?\nAnswer:"),
    ("french", "La capitale de l'Allemagne est"),
    ("german", "Ich habe heute Morgen einen Kaffee getrunken und dann"),
    ("japanese", "東京は日本の首都です。富士山は"),
    ("arithmetic", "12 + 7 = 19\n25 + 13 = 38\n41 + 16 ="),
    ("fibonacci_numbers", "1, 1, 2, 3, 5, 8, 13, 21,"),
    ("poem_newlines", "Roses are red,\nViolets are blue,\n"),
    ("json", '{"name": "Alice", "age": 30, "city": '),
    ("translation", "English: Good morning, how are you?\nSpanish:"),
    ("emoji", "I love pizza \U0001F355 because"),
    ("whitespace", "    indented line\n\tTabbed line\n  two  spaces   three"),
    ("hello", "Hello"),
    (
        "long_paragraph",
        "The history of the printing press begins in the fifteenth century, when Johannes "
        "Gutenberg combined movable metal type, oil-based ink and a wooden press adapted from "
        "those used to make wine. Within a few decades, printing shops had spread across Europe, "
        "books became far cheaper, and literacy began to rise. Historians often argue that",
    ),
]


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def piece(llm, token):
    """Bytes of one token's piece (no special-token rendering), with a buffer that grows."""
    size = 64
    while True:
        buf = (lc.ctypes.c_char * size)()
        n = lc.llama_token_to_piece(llm._model.vocab, lc.llama_token(token), buf, size, 0, False)
        if n >= 0:
            return bytes(buf[:n])
        size = -n


def top_k_row(row):
    """Top TOP_K (ids, logits, gap) of one float32 logit row; ties broken by ascending id."""
    kth = np.partition(row, -TOP_K)[-TOP_K]
    cand = np.nonzero(row >= kth)[0]
    order = cand[np.lexsort((cand, -row[cand]))][:TOP_K]
    vals = row[order]
    gap = float(vals[0]) - float(vals[1])
    return [int(i) for i in order], [round(float(v), DECIMALS) for v in vals], round(gap, DECIMALS)


def clear(llm):
    """Forget all evaluated tokens and empty the KV cache (SWA cache included)."""
    llm.reset()
    llm._ctx.kv_cache_clear()


def run_case(llm, name, prompt, eos_id):
    prompt_ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=False)

    # Incremental greedy decode: prompt in one batch, then one token per decode call.
    clear(llm)
    llm.eval(prompt_ids)
    cont, greedy_logits, greedy_gaps = [], [], []
    for step in range(N_GENERATE):
        row = llm.scores[llm.n_tokens - 1]
        ids, vals, gap = top_k_row(row)
        cont.append(ids[0])
        greedy_logits.append(vals[0])
        greedy_gaps.append(gap)
        if step + 1 < N_GENERATE:
            llm.eval([ids[0]])
    p = len(prompt_ids)
    incremental = np.array(llm.scores[p - 1 : p - 1 + N_GENERATE], copy=True)

    # Teacher-forced: the full sequence in one decode batch.
    seq = prompt_ids + cont
    assert len(seq) <= N_BATCH, f"{name}: {len(seq)} tokens exceed n_batch {N_BATCH}"
    clear(llm)
    llm.eval(seq)
    scores = np.array(llm.scores[: len(seq)], copy=True)
    top_ids, top_logits, gaps = [], [], []
    for i in range(len(seq)):
        ids, vals, gap = top_k_row(scores[i])
        top_ids.append(ids)
        top_logits.append(vals)
        gaps.append(gap)

    mismatches = []
    for j, tok in enumerate(cont):
        pos = p - 1 + j
        if top_ids[pos][0] != tok:
            mismatches.append(dict(step=j, position=pos, greedy=tok, batched_argmax=top_ids[pos][0],
                                   greedy_gap=greedy_gaps[j], batched_gap=gaps[pos]))
    batched = scores[p - 1 : p - 1 + N_GENERATE]
    diff = float(np.max(np.abs(batched - incremental)))
    top = np.array(top_ids[p - 1 : p - 1 + N_GENERATE])
    diff_top = float(np.max(np.abs(np.take_along_axis(batched, top, 1)
                                   - np.take_along_axis(incremental, top, 1))))

    text = b"".join(piece(llm, t) for t in cont).decode("utf-8", errors="replace")
    eos_index = cont.index(eos_id) if eos_id in cont else None
    return dict(
        name=name,
        prompt=prompt,
        prompt_ids=prompt_ids,
        continuation_ids=cont,
        continuation_text=text,
        eos_index=eos_index,
        greedy_top1_logits=greedy_logits,
        batched_argmax_matches_greedy=not mismatches,
        mismatches=mismatches,
        incremental_vs_batched_max_abs_diff=round(diff, DECIMALS),
        incremental_vs_batched_top10_max_abs_diff=round(diff_top, DECIMALS),
        positions=dict(top_ids=top_ids, top_logits=top_logits, gap=gaps),
    )


def dump(obj, indent=0):
    """JSON with lists of scalars kept on one line (readable diffs, small file)."""
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{inner}{json.dumps(k)}: {dump(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(x, (dict, list)) for x in obj):
        return "[\n" + ",\n".join(inner + dump(x, indent + 1) for x in obj) + "\n" + pad + "]"
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    llm = Llama(model_path=a.model, n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH,
                n_threads=N_THREADS, n_threads_batch=N_THREADS, seed=SEED, logits_all=True,
                verbose=False)
    eos_id = llm.token_eos()
    meta = llm.metadata
    cases = []
    for name, prompt in PROMPTS:
        c = run_case(llm, name, prompt, eos_id)
        cases.append(c)
        flag = "ok" if c["batched_argmax_matches_greedy"] else f"MISMATCH x{len(c['mismatches'])}"
        print(f"{name:18s} {len(c['prompt_ids']):3d} tok  {flag:12s} "
              f"diff={c['incremental_vs_batched_max_abs_diff']:.3f} "
              f"top10={c['incremental_vs_batched_top10_max_abs_diff']:.3f}  {c['continuation_text']!r}",
              file=sys.stderr)

    fixture = dict(
        generator="tools/reference/llama_reference.py",
        llama_cpp_python_version=llama_cpp.__version__,
        system_info=lc.llama_print_system_info().decode().strip(),
        model=dict(
            file=os.path.basename(a.model),
            sha256=sha256_of(a.model),
            size_bytes=os.path.getsize(a.model),
            architecture=meta.get("general.architecture"),
            name=meta.get("general.name"),
            n_vocab=llm.n_vocab(),
            bos_id=llm.token_bos(),
            eos_id=eos_id,
            add_bos_token=meta.get("tokenizer.ggml.add_bos_token"),
        ),
        settings=dict(n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH, n_threads=N_THREADS, seed=SEED,
                      logits_all=True, flash_attn=False, tokenize_add_special=True,
                      tokenize_parse_special=False, n_generate=N_GENERATE, top_k=TOP_K,
                      decimals=DECIMALS),
        layout=("positions.*[i] describe the logits after consuming tokens[0..=i] of "
                "prompt_ids + continuation_ids (so they predict token i+1); there are "
                "len(prompt_ids) + n_generate positions, the last one predicts past the "
                "continuation. top_ids/top_logits: top_k by logit, descending, ties by ascending "
                "id. gap: top-1 minus top-2 logit from unrounded float32. continuation_ids come "
                "from incremental greedy decoding (argmax; EOS does not stop it, eos_index marks "
                "the first EOS if any); positions come from one teacher-forced batch of the whole "
                "sequence. continuation_text: concatenated token pieces, invalid UTF-8 replaced. "
                "incremental_vs_batched_*: max |logit| difference between the incremental and "
                "the batched pass at the n_generate continuation positions, over the full "
                "vocabulary or over the batched top_k ids: llama.cpp's own single-token and "
                "batched kernels disagree by this much, so compare against this fixture with a "
                "tolerance of that order, and expect argmax flips where gap is small."),
        cases=cases,
    )
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(dump(fixture) + "\n")
    print(f"wrote {a.out} ({os.path.getsize(a.out)} bytes, {len(cases)} cases)", file=sys.stderr)


if __name__ == "__main__":
    main()
