#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/qwen3_moe_lowbit/: a small `qwen3moe` GGUF quantized by llama.cpp
itself into low-bit mixes, with llama.cpp's logits (checked by tests/gguf_lowbit.rs).

The committed qwen3_moe fixture has 64-element rows, on which llama.cpp's quantizer falls back
from every 256-element super-block type; this one has 256-element rows (hidden 256, expert FFN
256, 2 heads of 128, 1 KV head, 4 experts, top-2, one layer) so the k-quant and IQ blocks are
really used. Its tokenizer and chat metadata are copied from
tests/fixtures/gguf/qwen3_moe/qwen3_moe-f32.gguf; its weights are random (seeded, normal with
std 1/sqrt(fan in), embeddings std 1), written as F32, then quantized by
`llama_cpp.llama_model_quantize` (default parameters, one thread) to each variant below.

Per variant: `<v>.gguf`, `<v>.logits.f32` (llama.cpp's logits over the quantized file at every
prompt position, f32 LE, positions × 512), `<v>.dequant.logits.f32` (over a copy dequantized by
llama.cpp to F32, not kept) and reference.json (tensor types, greedy continuations of both
passes with top-2 gaps, llama.cpp's own quantized-vs-dequantized distance). Runtime settings are
those of gguf_fixtures.py (1 thread, F32 K/V cache, no flash attention).

Usage (venv of requirements.txt):
  lowbit_gguf_fixtures.py [--out tests/fixtures/gguf/qwen3_moe_lowbit]
"""
import argparse
import json
import os
import tempfile

import numpy as np
import llama_cpp
import gguf

from gguf_fixtures import load, prompt_logits, quantize, sha256, THREADS, N_CTX

SOURCE = "tests/fixtures/gguf/qwen3_moe/qwen3_moe-f32.gguf"
# variant -> llama_ftype (llama.h). Q2_K (Q2_K, Q3_K, Q6_K tensors) and Q3_K_M (Q3_K, Q4_K,
# Q5_K, Q6_K) cover the new k-quants; each file is ~0.6 MB, so the other mixes (Q5_K_M, IQ4_XS,
# ...) are not committed (add them here to check them locally).
VARIANTS = {
    "q2_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K,
    "q3_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_M,
}
D, FF, HEADS, KV_HEADS, HEAD_DIM, EXPERTS, USED, VOCAB = 256, 256, 2, 1, 128, 4, 2, 512
PROMPT = [481, 84, 82, 256, 198, 460, 72, 289]
N_CONT = 8


def write_source(path):
    r = gguf.GGUFReader(SOURCE)
    w = gguf.GGUFWriter(path, "qwen3moe")
    skip = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", "general.architecture"}
    dims = {
        "qwen3moe.block_count": 1, "qwen3moe.embedding_length": D, "qwen3moe.feed_forward_length": FF,
        "qwen3moe.attention.head_count": HEADS, "qwen3moe.attention.head_count_kv": KV_HEADS,
        "qwen3moe.expert_count": EXPERTS, "qwen3moe.expert_used_count": USED,
        "qwen3moe.attention.key_length": HEAD_DIM, "qwen3moe.attention.value_length": HEAD_DIM,
        "qwen3moe.expert_feed_forward_length": FF,
    }
    for k, f in r.fields.items():
        if k in skip:
            continue
        vt = f.types[0]
        sub = f.types[1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k, dims.get(k, f.contents()), vt, sub_type=sub)
    rng = np.random.default_rng(20261201)

    def t(name, shape, std):  # shape in numpy order (rows..., cols)
        w.add_tensor(name, (rng.standard_normal(shape) * std).astype(np.float32))

    t("token_embd.weight", (VOCAB, D), 1.0)
    t("output.weight", (VOCAB, D), D ** -0.5)
    w.add_tensor("output_norm.weight", np.ones(D, np.float32))
    p = "blk.0."
    w.add_tensor(p + "attn_norm.weight", np.ones(D, np.float32))
    w.add_tensor(p + "ffn_norm.weight", np.ones(D, np.float32))
    w.add_tensor(p + "attn_q_norm.weight", np.ones(HEAD_DIM, np.float32))
    w.add_tensor(p + "attn_k_norm.weight", np.ones(HEAD_DIM, np.float32))
    t(p + "attn_q.weight", (HEADS * HEAD_DIM, D), D ** -0.5)
    t(p + "attn_k.weight", (KV_HEADS * HEAD_DIM, D), D ** -0.5)
    t(p + "attn_v.weight", (KV_HEADS * HEAD_DIM, D), D ** -0.5)
    t(p + "attn_output.weight", (D, HEADS * HEAD_DIM), (HEADS * HEAD_DIM) ** -0.5)
    t(p + "ffn_gate_inp.weight", (EXPERTS, D), D ** -0.5)
    t(p + "ffn_gate_exps.weight", (EXPERTS, FF, D), D ** -0.5)
    t(p + "ffn_up_exps.weight", (EXPERTS, FF, D), D ** -0.5)
    t(p + "ffn_down_exps.weight", (EXPERTS, D, FF), FF ** -0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def greedy(llm):
    llm.reset()
    llm.eval(PROMPT)
    out, gaps = [], []
    for _ in range(N_CONT):
        row = np.array(llm.scores[llm.n_tokens - 1, :], dtype=np.float32)
        tok = int(np.argmax(row))
        top2 = np.sort(row)[-2:]
        out.append(tok)
        gaps.append(round(float(top2[1] - top2[0]), 6))
        llm.eval([tok])
    return out, gaps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/gguf/qwen3_moe_lowbit")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    llama_cpp.llama_backend_init()
    tmp = tempfile.mkdtemp()
    src = os.path.join(tmp, "f32.gguf")
    write_source(src)
    ref = dict(versions=dict(llama_cpp_python=llama_cpp.__version__, numpy=np.__version__, gguf="0.19.0"),
               settings=dict(threads=THREADS, n_ctx=N_CTX, type_k="F32", type_v="F32", flash_attn=False,
                             quantizer="llama_model_quantize, default params, nthread 1"),
               prompt_ids=PROMPT, variants={})
    for v, ftype in VARIANTS.items():
        dst = os.path.join(args.out, f"{v}.gguf")
        quantize(src, dst, ftype)
        deq = os.path.join(tmp, f"{v}-dequant.gguf")
        quantize(dst, deq, llama_cpp.LLAMA_FTYPE_ALL_F32, allow_requantize=True)
        llm = load(dst)
        logits = prompt_logits(llm, PROMPT)
        cont, gaps = greedy(llm)
        del llm
        llm = load(deq)
        dlogits = prompt_logits(llm, PROMPT)
        dcont, dgaps = greedy(llm)
        del llm
        logits.astype("<f4").tofile(os.path.join(args.out, f"{v}.logits.f32"))
        dlogits.astype("<f4").tofile(os.path.join(args.out, f"{v}.dequant.logits.f32"))
        r = gguf.GGUFReader(dst)
        types = {t.name: t.tensor_type.name for t in r.tensors}
        ref["variants"][v] = dict(
            file=f"{v}.gguf", sha256=sha256(dst), bytes=os.path.getsize(dst), ftype=int(ftype),
            tensor_types=types, logits_file=f"{v}.logits.f32", dequant_logits_file=f"{v}.dequant.logits.f32",
            max_abs_logit=float(np.abs(logits).max()),
            quantized_vs_dequant_rel=float(np.abs(logits - dlogits).max() / np.abs(dlogits).max()),
            continuation_ids=cont, continuation_gaps=gaps,
            dequant_continuation_ids=dcont, dequant_continuation_gaps=dgaps)
        print(v, os.path.getsize(dst), sorted(set(types.values())), ref["variants"][v]["quantized_vs_dequant_rel"], cont, dcont)
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
