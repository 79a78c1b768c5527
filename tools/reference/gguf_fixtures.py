#!/usr/bin/env python3
"""GGUF fixtures of the tiny Hugging Face checkpoints, converted and referenced by llama.cpp.

For every family in `FAMILIES` this writes `tests/fixtures/gguf/<family>/`:

- `<family>-f32.gguf`: the Hugging Face fixture folder `tests/fixtures/hf/<hf>` converted by
  llama.cpp's own `convert_hf_to_gguf.py` (from the llama-cpp-python 0.3.36 source distribution)
  with `--outtype f32`;
- `<family>-<quant>.gguf` for each quantized variant, made from the f32 file by llama.cpp's
  quantizer (`llama_cpp.llama_model_quantize`, default parameters, one thread);
- `<variant>.logits.f32`: llama-cpp-python's logits at every prompt position (logits_all),
  `n_prompt x n_vocab` little-endian float32, row-major;
- for quantized variants also `<variant>.dequant.logits.f32`: the same pass over a copy of the
  file whose tensors llama.cpp dequantized to F32 (`LLAMA_FTYPE_ALL_F32`, allow_requantize), i.e.
  the quantized weights' exact values computed in float32 (that copy is not kept), with its own
  greedy continuation;
- `reference.json`: per variant the file's sha256, the type of every tensor (and counts per
  type), llama.cpp's tokenizations of the prompt text, the 16-token greedy continuation with
  each step's top-1 minus top-2 gap, and the settings.

The tiny BPE tokenizers are not in the converter's list of known pre-tokenizers (it hashes the
token ids of a probe text and refuses unknown hashes). Instead of editing the converter, the
converter runs through a small wrapper (`CONVERT_WRAPPER`) that replaces
`TextModel.get_vocab_base_pre` at run time with a function returning the llama.cpp pre-tokenizer
name whose split regex is the one in the fixture's `tokenizer.json` (checked below: `qwen2` for
the Qwen pattern, `llama-bpe` for the Llama 3 pattern). Everything else in the converter runs
unchanged, with its own `gguf-py`.

llama.cpp settings: CPU only, 1 thread, n_ctx 256, one batch for the whole prompt, F32 K/V cache
(`type_k = type_v = GGML_TYPE_F32`, the default F16 cache would round keys and values), flash
attention off. With F32 weights ggml's CPU matmul keeps activations in f32; with quantized
weights it quantizes activations to 8 bits (Q8_0 / Q8_K blocks) before the integer dot products.

Run (see tools/reference/README.md for the two virtual environments):
  /work/venv-ref/bin/python tools/reference/gguf_fixtures.py \
      --llama-cpp /work/dl/llama_cpp_python-0.3.36/vendor/llama.cpp \
      --hf-python /work/venv-hf/bin/python [--out tests/fixtures/gguf] [families...]
"""

import argparse
import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import llama_cpp

N_CONTINUATION = 16
N_CTX = 256
THREADS = 1

# The split regexes of the fixture tokenizers (tools/reference/hf_fixtures.py, as data) and the
# llama.cpp pre-tokenizer implementing each.
PAT_QWEN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PAT_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_OF_PATTERN = {PAT_QWEN: "qwen2", PAT_LLAMA3: "llama-bpe"}

# family -> (Hugging Face fixture folder, quantized variants: name -> llama_ftype)
FAMILIES = {
    # Q4_K_M / Q4_K_S on these 64-wide rows fall back to Q5_0, Q5_1 and Q8_0 (no 256-wide k-quant
    # blocks fit); Q5_0 is the largest mix without Q5_1, which Deltafin does not compute yet.
    "qwen3_moe": ("qwen3_moe_sparse", {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
                                       "q5_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_0}),
    "mixtral": ("mixtral", {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
                            "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0}),
    "qwen3": ("qwen3", {}),
    "llama": ("llama", {}),
    "deepseek_v3": ("deepseek_v3", {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0}),
    # the converter keeps the MXFP4 experts as they are (the "f32" file is F32 + MXFP4); requantizing
    # them is refused, MXFP4_MOE keeps them and makes the rest Q8_0.
    "gpt_oss": ("gpt_oss_mxfp4", {"mxfp4_moe": llama_cpp.LLAMA_FTYPE_MOSTLY_MXFP4_MOE}),
    "kimi_linear": ("kimi_linear", {}),
}

# Keys the published config.json of a family carries but transformers 5 does not write, added to
# a copy of the fixture's config before conversion. DeepSeek-V3's `scoring_func` is what makes the
# converter write `deepseek2.expert_gating_func = sigmoid`; without it llama.cpp routes DeepSeek
# models with a softmax (its default for old DeepSeek-V2 files).
PUBLISHED_CONFIG_KEYS = {
    "deepseek_v3": {"scoring_func": "sigmoid", "topk_method": "noaux_tc"},
    # Kimi Linear: the converter reads the published `linear_attn_config` (1-based MLA layer list,
    # KDA head size and count, short-conv kernel), `first_k_dense_replace` and the router's
    # activation; transformers 5 writes `layer_types` / `mlp_layer_types` instead. Filled in from
    # the fixture's own config by `kimi_linear_config` below.
    "kimi_linear": {"moe_router_activation_func": "sigmoid"},
}

# Tensor renames applied to a copy of the fixture's safetensors before conversion: transformers
# 5.24 writes Kimi Linear's leading dense MLP as `block_sparse_moe.{gate,up,down}_proj`, the
# published checkpoints (and llama.cpp's converter) name it `mlp.{gate,up,down}_proj`.
RENAMES = {
    "kimi_linear": [(f".block_sparse_moe.{p}_proj.", f".mlp.{p}_proj.") for p in ("gate", "up", "down")],
}


def kimi_linear_config(cfg):
    """The published Kimi Linear keys derived from a transformers 5 config (see above)."""
    n = cfg["num_hidden_layers"]
    full = [i + 1 for i, t in enumerate(cfg["layer_types"]) if t == "full_attention"]
    dense = [i for i, t in enumerate(cfg["mlp_layer_types"]) if t == "dense"]
    assert dense == list(range(len(dense))), "dense MLP layers must lead"
    return {
        "linear_attn_config": {
            "full_attn_layers": full,
            "kda_layers": [i for i in range(1, n + 1) if i not in full],
            "head_dim": cfg["linear_head_dim"],
            "num_heads": cfg["linear_num_heads"],
            "short_conv_kernel_size": cfg["linear_conv_kernel_dim"],
        },
        "first_k_dense_replace": len(dense),
    }


DERIVED_CONFIG = {"kimi_linear": kimi_linear_config}


def rename_safetensors(src, dst, renames):
    """Copy a .safetensors file with tensor names rewritten (header only; data bytes unchanged)."""
    with open(src, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        for a, b in renames:
            k = k.replace(a, b)
        out[k] = v
    raw = json.dumps(out, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(dst, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        f.write(data)

CONVERT_WRAPPER = """
import runpy, sys
src, pre = sys.argv[1], sys.argv[2]
sys.path.insert(0, src + "/gguf-py")
sys.path.insert(0, src)
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv = [src + "/convert_hf_to_gguf.py"] + sys.argv[3:]
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
"""

GGML_TYPE_NAMES = {v: k[len("GGML_TYPE_"):] for k, v in vars(llama_cpp).items()
                   if k.startswith("GGML_TYPE_") and isinstance(v, int)}


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def pre_tokenizer_of(hf_dir):
    with open(os.path.join(hf_dir, "tokenizer.json")) as f:
        tok = json.load(f)
    splits = [p for p in tok["pre_tokenizer"]["pretokenizers"] if p["type"] == "Split"]
    pattern = splits[0]["pattern"]["Regex"]
    if pattern not in PRE_OF_PATTERN:
        raise SystemExit(f"{hf_dir}: no llama.cpp pre-tokenizer known for split regex {pattern!r}")
    return PRE_OF_PATTERN[pattern]


def hf_config(hf_dir):
    with open(os.path.join(hf_dir, "config.json")) as f:
        return json.load(f)


def convert(args, hf_dir, pre, out):
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as w:
        w.write(CONVERT_WRAPPER)
    try:
        cmd = [args.hf_python, w.name, args.llama_cpp, pre, hf_dir, "--outtype", "f32", "--outfile", out]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"converter failed for {hf_dir}:\n{r.stderr[-4000:]}")
    finally:
        os.unlink(w.name)


def quantize(src, dst, ftype, allow_requantize=False):
    p = llama_cpp.llama_model_quantize_default_params()
    p.nthread = THREADS
    p.ftype = ftype
    p.allow_requantize = allow_requantize
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), p)
    if rc != 0:
        raise SystemExit(f"llama_model_quantize({src} -> {dst}, ftype {ftype}) failed: {rc}")


def tensor_types(path):
    sys.path.insert(0, os.path.join(ARGS.llama_cpp, "gguf-py"))
    from gguf import GGUFReader
    r = GGUFReader(path)
    types = {t.name: t.tensor_type.name for t in r.tensors}
    counts = {}
    for ty in types.values():
        counts[ty] = counts.get(ty, 0) + 1
    return types, dict(sorted(counts.items()))


def load(path):
    return llama_cpp.Llama(model_path=path, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=THREADS,
                           n_threads_batch=THREADS, logits_all=True, type_k=llama_cpp.GGML_TYPE_F32,
                           type_v=llama_cpp.GGML_TYPE_F32, flash_attn=False, seed=0, verbose=False)


def prompt_logits(llm, ids):
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids), :], dtype=np.float32)


def greedy(llm, ids):
    """16 greedy tokens (argmax, lowest id on ties; EOS does not stop), prompt in one batch then
    one token per decode, with each step's top-1 minus top-2 gap."""
    llm.reset()
    llm.eval(ids)
    out, gaps = [], []
    for _ in range(N_CONTINUATION):
        row = np.array(llm.scores[llm.n_tokens - 1, :], dtype=np.float32)
        t = int(np.argmax(row))
        top2 = np.sort(row)[-2:]
        out.append(t)
        gaps.append(float(top2[1] - top2[0]))
        llm.eval([t])
    return out, gaps


def pieces(llm, ids):
    """The tokens' bytes from llama_token_to_piece(special = true, lstrip = 0), concatenated."""
    out = b""
    for t in ids:
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(llm._model.vocab, t, buf, 256, 0, True)
        assert 0 <= n <= 256, n
        out += buf.raw[:n]
    return out


def reference_of(path, hf_ref, dequant_path=None):
    llm = load(path)
    prompt_text = hf_ref["prompt_text"]
    # The chat-formatted prompt holds control tokens: parse them (llama_tokenize parse_special).
    chat_ids = llm.tokenize(prompt_text.encode(), add_bos=False, special=True)
    plain_text = "Which experts does the router keep for café? Answer in 3 words."
    plain_ids = llm.tokenize(plain_text.encode(), add_bos=True, special=False)
    ids = hf_ref["prompt_ids"]
    logits = prompt_logits(llm, ids)
    cont, gaps = greedy(llm, ids)
    ref = dict(
        chat_ids=chat_ids, chat_ids_equal_hf=chat_ids == ids,
        plain_text=plain_text, plain_ids=plain_ids,
        n_prompt=len(ids), n_vocab=llm.n_vocab(),
        continuation_ids=cont, continuation_gaps=[round(g, 6) for g in gaps],
        continuation_pieces=pieces(llm, cont).decode("utf-8", errors="replace"),
        hf_continuation_equal=cont == hf_ref["continuation_ids"],
    )
    del llm
    extra = None
    if dequant_path is not None:
        llm = load(dequant_path)
        extra = prompt_logits(llm, ids)
        dcont, dgaps = greedy(llm, ids)
        ref.update(dequant_continuation_ids=dcont, dequant_continuation_gaps=[round(g, 6) for g in dgaps])
        del llm
    return ref, logits, extra


def build(family, out_root):
    hf_name, quants = FAMILIES[family]
    hf_dir = os.path.join(ARGS.hf_root, hf_name)
    with open(os.path.join(hf_dir, "reference.json")) as f:
        hf_ref = json.load(f)
    out = os.path.join(out_root, family)
    os.makedirs(out, exist_ok=True)
    pre = pre_tokenizer_of(hf_dir)
    f32 = os.path.join(out, f"{family}-f32.gguf")
    tmp = tempfile.mkdtemp()
    src = hf_dir
    if family in PUBLISHED_CONFIG_KEYS:
        src = os.path.join(tmp, "hf")
        os.makedirs(src)
        for f in os.listdir(hf_dir):
            if f.endswith(".safetensors") and family in RENAMES:
                rename_safetensors(os.path.join(hf_dir, f), os.path.join(src, f), RENAMES[family])
            else:
                os.symlink(os.path.abspath(os.path.join(hf_dir, f)), os.path.join(src, f))
        with open(os.path.join(hf_dir, "config.json")) as f:
            cfg = json.load(f)
        cfg.update(PUBLISHED_CONFIG_KEYS[family])
        if family in DERIVED_CONFIG:
            cfg.update(DERIVED_CONFIG[family](cfg))
        os.unlink(os.path.join(src, "config.json"))
        with open(os.path.join(src, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
    convert(ARGS, src, pre, f32)
    variants = {"f32": (f32, None)}
    if set(tensor_types(f32)[1]) - {"F32"}:  # MXFP4 experts: also a dequantized reference
        deq = os.path.join(tmp, f"{family}-f32-dequant.gguf")
        quantize(f32, deq, llama_cpp.LLAMA_FTYPE_ALL_F32, allow_requantize=True)
        variants["f32"] = (f32, deq)
    for q, ftype in quants.items():
        dst = os.path.join(out, f"{family}-{q}.gguf")
        quantize(f32, dst, ftype)
        deq = os.path.join(tmp, f"{family}-{q}-dequant.gguf")
        quantize(dst, deq, llama_cpp.LLAMA_FTYPE_ALL_F32, allow_requantize=True)
        variants[q] = (dst, deq)
    result = dict(
        family=family, hf_fixture=f"tests/fixtures/hf/{hf_name}", pre_tokenizer=pre,
        config_keys_added={**PUBLISHED_CONFIG_KEYS.get(family, {}),
                           **(DERIVED_CONFIG[family](hf_config(hf_dir)) if family in DERIVED_CONFIG else {})},
        tensor_renames=RENAMES.get(family, []),
        versions=dict(llama_cpp_python=llama_cpp.__version__, numpy=np.__version__),
        settings=dict(threads=THREADS, n_ctx=N_CTX, n_batch=N_CTX, type_k="F32", type_v="F32",
                      flash_attn=False, logits_all=True,
                      converter="vendor/llama.cpp/convert_hf_to_gguf.py --outtype f32 (pre-tokenizer name injected)",
                      quantizer="llama_model_quantize, default params, nthread 1"),
        prompt_ids=hf_ref["prompt_ids"], prompt_text=hf_ref["prompt_text"],
        variants={},
    )
    for v, (path, deq) in variants.items():
        try:
            ref, logits, deq_logits = reference_of(path, hf_ref, deq)
        except Exception as e:  # llama.cpp may not run an architecture: record why
            ref, logits, deq_logits = dict(error=f"{type(e).__name__}: {e}"), None, None
        types, counts = tensor_types(path)
        ref.update(file=os.path.basename(path), sha256=sha256(path), bytes=os.path.getsize(path),
                   tensor_type_counts=counts, tensor_types=types)
        if logits is not None:
            logits.astype("<f4").tofile(os.path.join(out, f"{v}.logits.f32"))
            ref["logits_file"] = f"{v}.logits.f32"
            ref["max_abs_logit"] = float(np.abs(logits).max())
        if deq_logits is not None:
            deq_logits.astype("<f4").tofile(os.path.join(out, f"{v}.dequant.logits.f32"))
            ref["dequant_logits_file"] = f"{v}.dequant.logits.f32"
            ref["quantized_vs_dequant_rel"] = float(np.abs(logits - deq_logits).max() / np.abs(deq_logits).max())
        result["variants"][v] = ref
    shutil.rmtree(tmp)
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return result


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, help="vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist")
    ap.add_argument("--hf-python", required=True, help="python of the venv with torch and transformers")
    ap.add_argument("--hf-root", default="tests/fixtures/hf")
    ap.add_argument("--out", default="tests/fixtures/gguf")
    ap.add_argument("families", nargs="*")
    ARGS = ap.parse_args()
    llama_cpp.llama_backend_init()
    for fam in ARGS.families or list(FAMILIES):
        r = build(fam, ARGS.out)
        for v, ref in r["variants"].items():
            if "error" in ref:
                print(f"{fam}/{v}: llama.cpp failed: {ref['error']}")
                continue
            print(f"{fam}/{v}: {ref['bytes']} bytes, types {ref['tensor_type_counts']}, "
                  f"chat ids == hf: {ref['chat_ids_equal_hf']}, continuation == hf: {ref['hf_continuation_equal']}, "
                  f"min gap {min(ref['continuation_gaps']):.4f}"
                  + (f", quantized vs dequantized rel {ref['quantized_vs_dequant_rel']:.2e}"
                     if "quantized_vs_dequant_rel" in ref else ""))


ARGS = None

if __name__ == "__main__":
    main()
