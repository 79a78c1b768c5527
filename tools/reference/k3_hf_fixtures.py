#!/usr/bin/env python3
"""Tiny random-weight Kimi K3 Hugging Face folders, converted and referenced by llama.cpp.

There is no transformers implementation of Kimi K3, so the reference is llama.cpp (vendored by
llama-cpp-python 0.3.36): its converter `conversion/kimi_k3.py` defines which Hugging Face layout
a K3 checkpoint has, and `src/models/kimi-k3.cpp` computes the converted file. This script

1. writes two folders in that layout (`KimiK3ForConditionalGeneration`: the text model under
   `language_model.` with its config in `text_config`, a two-tensor stand-in vision tower and
   `mm_projector` that the converter skips):
   - `tests/fixtures/hf/kimi_k3/`: BF16 weights (A_log, dt_bias and the router bias F32);
   - `tests/fixtures/hf/kimi_k3_mxfp4/`: the same spine, routed experts as compressed-tensors
     MXFP4 (`quantization_config.format = mxfp4-pack-quantized`, group 32: `weight_packed` U8
     `[rows, cols/2]`, element 2i in the low nibble; `weight_scale` F8_E8M0 `[rows, cols/32]`),
     quantized here from the BF16 experts (round to the nearest E2M1 value under the group's
     power-of-two scale);
2. converts each with llama.cpp's own `convert_hf_to_gguf.py --outtype f32` (run by the torch
   venv's python through gguf_fixtures.py's wrapper, which only injects the pre-tokenizer name)
   into `tests/fixtures/gguf/kimi_k3_hf/`: `kimi_k3_hf-f32.gguf` (every tensor F32, exactly the
   BF16 values) and `kimi_k3_hf-mxfp4.gguf` (F32 spine, the experts repacked to GGML MXFP4 by
   the converter);
3. runs llama-cpp-python on each converted file (settings of gguf_fixtures.py: 1 thread, F32
   K/V cache, one batch): `f32.logits.f32`, `mxfp4.logits.f32` and `mxfp4.dequant.logits.f32`
   (the MXFP4 file dequantized to F32 by llama.cpp's quantizer: the same weight values without
   llama.cpp's 8-bit activation rounding), `n_prompt x n_vocab` little-endian f32; and
   `reference.json` (prompt ids, greedy continuations with their top-2 gaps, tensor types).

Shapes: hidden 64, 4 layers (KDA with a dense SiTU MLP, MLA, KDA, MLA: `full_attn_layers`
[2, 4]), 4 heads, KDA head 16, conv 4, q/kv LoRA 32, MLA nope 16 / rope 8 / v 16, 8 experts
top-2 (expert FFN 64) in a latent space of 32 with `routed_expert_norm`, 2 shared experts,
attention residual blocks of 2, SiTU betas 1.0 / 1.5, gate lower bound -5, routed scale 2.5,
`rms_norm_eps` 1e-3; the tokenizer of tests/fixtures/hf/kimi_linear.

Run (the venvs of tools/reference/README.md):
  /work/venv-ref/bin/python tools/reference/k3_hf_fixtures.py \
      --llama-cpp /work/dl/llama_cpp_python-0.3.36/vendor/llama.cpp --hf-python /work/venv-hf/bin/python
"""

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import gguf_fixtures as gf  # noqa: E402  (convert, quantize, load, prompt_logits, greedy, ...)
import llama_cpp  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TOK = os.path.join(ROOT, "tests", "fixtures", "hf", "kimi_linear")
PROMPT_REF = os.path.join(ROOT, "tests", "fixtures", "gguf", "kimi_linear", "reference.json")
OUT_HF = os.path.join(ROOT, "tests", "fixtures", "hf")
OUT_GGUF = os.path.join(ROOT, "tests", "fixtures", "gguf", "kimi_k3_hf")

D, N_LAYER, N_HEAD, KDA_HD, D_CONV = 64, 4, 4, 16, 4
Q_RANK, KV_RANK, ROPE, NOPE, VD = 32, 32, 8, 16, 16
N_EXPERT, N_USED, N_SHARED, FF_EXP, LATENT, FF_DENSE = 8, 2, 2, 64, 32, 48
FULL_ATTN = [2, 4]  # 1-based
DENSE_LEAD, RES_BLOCK = 1, 2
EPS = 1e-3

rng = np.random.default_rng(20261202)


def mat(rows, cols, gain=1.0):
    return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)


def vec(n, mean=1.0, sd=0.1):
    return (mean + sd * rng.standard_normal(n)).astype(np.float32)


def bf16_bits(x):
    """Round-to-nearest-even f32 -> bf16, as uint16 bits."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_round(x):
    return (bf16_bits(x).astype(np.uint32) << 16).view(np.float32).reshape(x.shape)


E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)


def mxfp4(w):
    """compressed-tensors MXFP4 of `w` [rows, cols]: (packed U8 [rows, cols/2], scale [rows, cols/32])."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // 32, 32)
    amax = np.abs(g).max(axis=-1)
    e = np.where(amax > 0, np.floor(np.log2(np.maximum(amax, 1e-30))) - 2, -127).astype(np.int32)
    e = np.clip(e, -127, 127)
    q = g / np.exp2(e)[..., None].astype(np.float32)
    mag = np.abs(q)
    idx = np.abs(mag[..., None] - E2M1).argmin(axis=-1).astype(np.uint8)
    codes = (idx | np.where(q < 0, 8, 0).astype(np.uint8)).reshape(rows, cols)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, (e + 127).astype(np.uint8)


def mxfp4_values(packed, scale):
    rows = packed.shape[0]
    codes = np.stack([packed & 15, packed >> 4], axis=-1).reshape(rows, -1)
    v = E2M1[codes & 7] * np.where(codes & 8, -1.0, 1.0)
    return (v.reshape(rows, -1, 32) * np.exp2(scale.astype(np.float32) - 127)[..., None]).reshape(rows, -1)


def write_safetensors(path, tensors):
    """tensors: list of (name, dtype string, shape, bytes)."""
    header, off = {}, 0
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, _, raw in tensors:
            f.write(raw)


def weights(vocab):
    """The text model's tensors, name (without `language_model.`) -> f32 array (values BF16-exact)."""
    t = {}
    t["model.embed_tokens.weight"] = mat(vocab, D, gain=np.sqrt(D))
    t["lm_head.weight"] = mat(vocab, D, gain=2.0)
    t["model.norm.weight"] = vec(D)
    t["model.output_attn_res_norm.weight"] = vec(D)
    t["model.output_attn_res_proj.weight"] = vec(D, 0.0, 0.5).reshape(1, D)
    dim = N_HEAD * KDA_HD
    for i in range(N_LAYER):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = vec(D)
        t[p + "post_attention_layernorm.weight"] = vec(D)
        for r in ("self_attention_res", "mlp_res"):
            t[p + f"{r}_norm.weight"] = vec(D)
            t[p + f"{r}_proj.weight"] = vec(D, 0.0, 0.5).reshape(1, D)
        a = p + "self_attn."
        if (i + 1) in FULL_ATTN:
            t[a + "q_a_proj.weight"] = mat(Q_RANK, D)
            t[a + "q_a_layernorm.weight"] = vec(Q_RANK)
            t[a + "q_b_proj.weight"] = mat(N_HEAD * (NOPE + ROPE), Q_RANK)
            t[a + "kv_a_proj_with_mqa.weight"] = mat(KV_RANK + ROPE, D)
            t[a + "kv_a_layernorm.weight"] = vec(KV_RANK)
            t[a + "kv_b_proj.weight"] = mat(N_HEAD * (NOPE + VD), KV_RANK)
            t[a + "g_proj.weight"] = mat(N_HEAD * VD, D)
            t[a + "o_proj.weight"] = mat(D, N_HEAD * VD)
        else:
            for x in "qkv":
                t[a + f"{x}_proj.weight"] = mat(dim, D)
                t[a + f"{x}_conv1d.weight"] = (rng.standard_normal((dim, 1, D_CONV)) * 0.5).astype(np.float32)
            t[a + "f_a_proj.weight"] = mat(KDA_HD, D)
            t[a + "f_b_proj.weight"] = mat(dim, KDA_HD)
            t[a + "b_proj.weight"] = mat(N_HEAD, D)
            t[a + "g_proj.weight"] = mat(dim, D)
            # `[heads]`: llama.cpp's kimi-k3 loader wants `ssm_a` 1-D, and the converter keeps the shape
            t[a + "A_log"] = np.log(rng.uniform(1.0, 16.0, N_HEAD)).astype(np.float32)
            t[a + "dt_bias"] = (0.1 * rng.standard_normal(dim)).astype(np.float32)
            t[a + "o_norm.weight"] = vec(KDA_HD)
            t[a + "o_proj.weight"] = mat(D, dim)
        if i < DENSE_LEAD:
            t[p + "mlp.gate_proj.weight"] = mat(FF_DENSE, D)
            t[p + "mlp.up_proj.weight"] = mat(FF_DENSE, D)
            t[p + "mlp.down_proj.weight"] = mat(D, FF_DENSE)
        else:
            m = p + "block_sparse_moe."
            t[m + "gate.weight"] = mat(N_EXPERT, D, gain=2.0)
            t[m + "gate.e_score_correction_bias"] = (0.1 * rng.standard_normal(N_EXPERT)).astype(np.float32)
            sff = FF_EXP * N_SHARED
            t[m + "shared_experts.gate_proj.weight"] = mat(sff, D)
            t[m + "shared_experts.up_proj.weight"] = mat(sff, D)
            t[m + "shared_experts.down_proj.weight"] = mat(D, sff)
            t[m + "routed_expert_down_proj.weight"] = mat(LATENT, D)
            t[m + "routed_expert_norm.weight"] = vec(LATENT)
            t[m + "routed_expert_up_proj.weight"] = mat(D, LATENT)
            for e in range(N_EXPERT):
                x = m + f"experts.{e}."
                t[x + "w1.weight"] = mat(FF_EXP, LATENT)
                t[x + "w3.weight"] = mat(FF_EXP, LATENT)
                t[x + "w2.weight"] = mat(LATENT, FF_EXP)
    f32_kept = ("A_log", "dt_bias", "e_score_correction_bias")
    return {k: (v if k.endswith(f32_kept) else bf16_round(v)) for k, v in t.items()}


def config(vocab, tok_cfg, mxfp4_experts):
    text = dict(
        architectures=["KimiLinearForCausalLM"], model_type="kimi_linear", vocab_size=vocab,
        hidden_size=D, intermediate_size=FF_DENSE, moe_intermediate_size=FF_EXP,
        num_hidden_layers=N_LAYER, num_attention_heads=N_HEAD, num_key_value_heads=N_HEAD,
        num_experts=N_EXPERT, num_experts_per_token=N_USED, num_shared_experts=N_SHARED,
        moe_renormalize=True, routed_scaling_factor=2.5, moe_router_activation_func="sigmoid",
        num_expert_group=1, topk_group=1, first_k_dense_replace=DENSE_LEAD,
        q_lora_rank=Q_RANK, kv_lora_rank=KV_RANK, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE,
        v_head_dim=VD, mla_use_nope=True, hidden_act="situ", activation_situ_beta=1.0,
        activation_situ_linear_beta=1.5, attn_res_block_size=RES_BLOCK,
        routed_expert_hidden_size=LATENT, latent_moe_use_norm=True, rms_norm_eps=EPS,
        max_position_embeddings=4096, tie_word_embeddings=False, torch_dtype="bfloat16",
        bos_token_id=tok_cfg["bos_token_id"], eos_token_id=tok_cfg["eos_token_id"],
        linear_attn_config=dict(full_attn_layers=FULL_ATTN,
                                kda_layers=[i for i in range(1, N_LAYER + 1) if i not in FULL_ATTN],
                                head_dim=KDA_HD, num_heads=N_HEAD, short_conv_kernel_size=D_CONV,
                                gate_lower_bound=-5.0),
    )
    c = dict(architectures=["KimiK3ForConditionalGeneration"], model_type="kimi_k3",
             text_config=text, vision_config=dict(model_type="moonvit", hidden_size=8),
             bos_token_id=tok_cfg["bos_token_id"], eos_token_id=tok_cfg["eos_token_id"],
             tie_word_embeddings=False, torch_dtype="bfloat16")
    if mxfp4_experts:
        c["quantization_config"] = dict(
            quant_method="compressed-tensors", format="mxfp4-pack-quantized",
            config_groups=dict(group_0=dict(
                targets=["re:.*block_sparse_moe\\.experts\\..*"], format="mxfp4-pack-quantized",
                weights=dict(num_bits=4, type="float", strategy="group", group_size=32, symmetric=True))),
            ignore=["lm_head"])
    return c


def write_folder(out, w, vocab, tok_cfg, mxfp4_experts):
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    ts = []
    for name, v in w.items():
        hf = "language_model." + name
        if mxfp4_experts and ".experts." in name:
            packed, scale = mxfp4(v)
            base = hf[: -len(".weight")]
            ts.append((base + ".weight_packed", "U8", packed.shape, packed.tobytes()))
            ts.append((base + ".weight_scale", "F8_E8M0", scale.shape, scale.tobytes()))
        elif v.dtype == np.float32 and name.endswith(("A_log", "dt_bias", "e_score_correction_bias")):
            ts.append((hf, "F32", v.shape, v.astype("<f4").tobytes()))
        else:
            ts.append((hf, "BF16", v.shape, bf16_bits(v).astype("<u2").tobytes()))
    # a stand-in vision tower and projector (text only: the converter and Deltafin skip them)
    ts.append(("mm_projector.pre_norm.weight", "BF16", (8,), bf16_bits(vec(8)).astype("<u2").tobytes()))
    ts.append(("vision_tower.patch_embed.proj.weight", "BF16", (8, 3, 2, 2),
               bf16_bits(rng.standard_normal((8, 3, 2, 2)).astype(np.float32)).astype("<u2").tobytes()))
    ts.sort(key=lambda x: x[0])
    write_safetensors(os.path.join(out, "model.safetensors"), ts)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config(vocab, tok_cfg, mxfp4_experts), f, indent=1)
        f.write("\n")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOK, f), os.path.join(out, f))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, help="vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist")
    ap.add_argument("--hf-python", required=True, help="python of the venv with torch and transformers")
    args = ap.parse_args()
    gf.ARGS = args
    llama_cpp.llama_backend_init()
    with open(os.path.join(TOK, "config.json")) as f:
        tok_cfg = json.load(f)
    vocab = tok_cfg["vocab_size"]
    with open(PROMPT_REF) as f:
        pref = json.load(f)
    ids = pref["prompt_ids"]
    w = weights(vocab)
    pre = gf.pre_tokenizer_of(TOK)
    os.makedirs(OUT_GGUF, exist_ok=True)
    tmp = tempfile.mkdtemp()
    result = dict(
        hf_fixtures=["tests/fixtures/hf/kimi_k3", "tests/fixtures/hf/kimi_k3_mxfp4"], pre_tokenizer=pre,
        versions=dict(llama_cpp_python=llama_cpp.__version__, numpy=np.__version__),
        settings=dict(threads=gf.THREADS, n_ctx=gf.N_CTX, type_k="F32", type_v="F32", flash_attn=False,
                      converter="vendor/llama.cpp/convert_hf_to_gguf.py --outtype f32 (pre-tokenizer name injected)"),
        prompt_ids=ids, variants={},
    )
    for variant, folder, mx in (("f32", "kimi_k3", False), ("mxfp4", "kimi_k3_mxfp4", True)):
        hf_dir = os.path.join(OUT_HF, folder)
        write_folder(hf_dir, w, vocab, tok_cfg, mx)
        path = os.path.join(OUT_GGUF, f"kimi_k3_hf-{variant}.gguf")
        gf.convert(args, hf_dir, pre, path)
        llm = gf.load(path)
        logits = gf.prompt_logits(llm, ids)
        cont, gaps = gf.greedy(llm, ids)
        del llm
        logits.astype("<f4").tofile(os.path.join(OUT_GGUF, f"{variant}.logits.f32"))
        types, counts = gf.tensor_types(path)
        ref = dict(file=os.path.basename(path), sha256=gf.sha256(path), bytes=os.path.getsize(path),
                   tensor_type_counts=counts, logits_file=f"{variant}.logits.f32",
                   continuation_ids=cont, continuation_gaps=gaps, max_abs_logit=float(np.abs(logits).max()))
        if mx:
            deq = os.path.join(tmp, "dequant.gguf")
            gf.quantize(path, deq, llama_cpp.LLAMA_FTYPE_ALL_F32, allow_requantize=True)
            llm = gf.load(deq)
            dl = gf.prompt_logits(llm, ids)
            dcont, dgaps = gf.greedy(llm, ids)
            del llm
            dl.astype("<f4").tofile(os.path.join(OUT_GGUF, f"{variant}.dequant.logits.f32"))
            ref.update(dequant_logits_file=f"{variant}.dequant.logits.f32", dequant_continuation_ids=dcont,
                       dequant_continuation_gaps=dgaps,
                       quantized_vs_dequant_rel=float(np.abs(logits - dl).max() / np.abs(dl).max()))
            # the experts' values: what the converter's repack must decode to
            e0 = w["model.layers.1.block_sparse_moe.experts.0.w2.weight"]
            p, s = mxfp4(e0)
            ref["mxfp4_expert_rel_error"] = float(np.abs(mxfp4_values(p, s) - e0).max() / np.abs(e0).max())
        result["variants"][variant] = ref
        print(f"{variant}: {ref['bytes']} bytes, {counts}, continuation {cont}, min gap {min(gaps):.4f}")
    shutil.rmtree(tmp)
    with open(os.path.join(OUT_GGUF, "reference.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
