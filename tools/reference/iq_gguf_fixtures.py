#!/usr/bin/env python3
"""Adds IQ variants to tests/fixtures/gguf/qwen3_moe_lowbit/: the same `qwen3moe` model as
lowbit_gguf_fixtures.py (same seeded F32 weights, 256-element rows), its matrices quantized by
ggml's own quantizer to one IQ type each, with llama.cpp's logits (checked by
tests/gguf_lowbit.rs).

llama_model_quantize cannot take an importance matrix from Python (the parameter is a C++ map)
and refuses IQ1_S / IQ2_XXS without one, so every matrix is quantized here by ggml's
`ggml_quantize_chunk` (libggml-base of llama-cpp-python 0.3.36, through ctypes) with a uniform
importance matrix (all ones: the quantizer's weighted error with equal weights; not computed
from activations). Quantized are all 2-D/3-D matrices except the router `ffn_gate_inp`, which
llama.cpp keeps F32 (a "pure" file, as `llama-quantize --pure` writes). The file is written by
gguf-py with the raw blocks; llama.cpp then runs it and a copy it dequantizes to F32 itself
(llama_model_quantize ALL_F32, allow_requantize).

Per variant: `<v>.gguf`, `<v>.logits.f32`, `<v>.dequant.logits.f32` and an entry in
reference.json, as lowbit_gguf_fixtures.py writes them (run that first: this script adds its
variants to the existing reference.json).

Usage (venv of requirements.txt):
  iq_gguf_fixtures.py [--out tests/fixtures/gguf/qwen3_moe_lowbit]
"""
import argparse
import ctypes
import json
import os
import tempfile

import numpy as np
import llama_cpp
import gguf

from gguf_fixtures import load, prompt_logits, quantize, sha256
from lowbit_gguf_fixtures import PROMPT, greedy, write_source

# variant -> (ggml type, llama_ftype recorded as general.file_type)
VARIANTS = {
    "iq1_s": (gguf.GGMLQuantizationType.IQ1_S, llama_cpp.LLAMA_FTYPE_MOSTLY_IQ1_S),
    "iq2_xxs": (gguf.GGMLQuantizationType.IQ2_XXS, llama_cpp.LLAMA_FTYPE_MOSTLY_IQ2_XXS),
    "iq3_s": (gguf.GGMLQuantizationType.IQ3_S, llama_cpp.LLAMA_FTYPE_MOSTLY_IQ3_S),
    "iq4_xs": (gguf.GGMLQuantizationType.IQ4_XS, llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_XS),
}


def ggml_base():
    lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so")
    g = ctypes.CDLL(lib)
    g.ggml_quantize_chunk.restype = ctypes.c_size_t
    g.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                      ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return g


def quantize_matrix(g, ty, a):
    """ggml_quantize_chunk of a float32 array (rows of a.shape[-1]) with an all-ones imatrix."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    n_per_row = a.shape[-1]
    nrows = a.size // n_per_row
    bs, ts = gguf.GGML_QUANT_SIZES[ty]
    out = np.zeros(nrows * n_per_row // bs * ts, dtype=np.uint8)
    imat = np.ones(n_per_row, dtype=np.float32)
    n = g.ggml_quantize_chunk(int(ty), a.ctypes.data, out.ctypes.data, 0, nrows, n_per_row, imat.ctypes.data)
    assert n == out.size, (n, out.size)
    return out.reshape(*a.shape[:-1], n_per_row // bs * ts)


def write_variant(g, src, dst, ty, ftype):
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, "qwen3moe")
    skip = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", "general.architecture", "general.file_type"}
    for k, f in r.fields.items():
        if k in skip:
            continue
        vt = f.types[0]
        sub = f.types[1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k, f.contents(), vt, sub_type=sub)
    w.add_file_type(int(ftype))
    for t in r.tensors:
        a = np.array(t.data, dtype=np.float32).reshape([int(d) for d in reversed(t.shape)])
        if a.ndim >= 2 and not t.name.endswith("ffn_gate_inp.weight"):
            w.add_tensor(t.name, quantize_matrix(g, ty, a), raw_dtype=ty)
        else:
            w.add_tensor(t.name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/gguf/qwen3_moe_lowbit")
    args = ap.parse_args()
    llama_cpp.llama_backend_init()
    g = ggml_base()
    tmp = tempfile.mkdtemp()
    src = os.path.join(tmp, "f32.gguf")
    write_source(src)
    ref_path = os.path.join(args.out, "reference.json")
    with open(ref_path) as f:
        ref = json.load(f)
    assert ref["prompt_ids"] == PROMPT
    ref["settings"]["iq_quantizer"] = "ggml_quantize_chunk, all-ones importance matrix (iq_gguf_fixtures.py)"
    for v, (ty, ftype) in VARIANTS.items():
        dst = os.path.join(args.out, f"{v}.gguf")
        write_variant(g, src, dst, ty, ftype)
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
        print(v, os.path.getsize(dst), sorted(set(types.values())), ref["variants"][v]["quantized_vs_dequant_rel"],
              cont, dcont, gaps)
    with open(ref_path, "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
