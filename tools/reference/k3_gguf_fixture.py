"""A tiny random-weight Kimi K3 GGUF (llama.cpp architecture `kimi-k3`) and its llama.cpp logits.

Writes `tests/fixtures/gguf/kimi_k3/`:
- `kimi_k3-f32.gguf`: F32 weights in exactly the layout llama.cpp 0.3.36's loader expects
  (`vendor/llama.cpp/src/models/kimi-k3.cpp`, `load_arch_hparams` / `load_arch_tensors`; names
  from `src/llama-arch.cpp`), written directly with gguf-py (there is no Hugging Face K3 fixture:
  the converter `conversion/kimi_k3.py` is not run). 4 layers: KDA (dense SiTU MLP), MLA (MoE),
  KDA (MoE), MLA (MoE); attention residual blocks of 2 layers; latent MoE (hidden 64, latent 32,
  8 experts, top 2, 2 shared); the tokenizer metadata of `tests/fixtures/gguf/kimi_linear`;
- `f32.logits.f32`: llama-cpp-python's logits at every prompt position (`n_prompt x n_vocab`
  little-endian f32, row-major);
- `reference.json`: the prompt ids (those of the Kimi Linear fixture), the greedy continuation
  (16 tokens, prompt in one batch then one token per decode) and its top-2 gaps, settings.

Run: /work/venv-ref/bin/python tools/reference/k3_gguf_fixture.py
"""

import hashlib
import json
import os

import numpy as np
import gguf
from gguf import GGUFReader, GGUFWriter, GGUFValueType
import llama_cpp

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "gguf", "kimi_k3")
TOK_SRC = os.path.join(ROOT, "tests", "fixtures", "gguf", "kimi_linear", "kimi_linear-f32.gguf")
REF_SRC = os.path.join(ROOT, "tests", "fixtures", "gguf", "kimi_linear", "reference.json")
ARCH = "kimi-k3"
N_CTX, THREADS, N_CONTINUATION = 256, 1, 16

# shapes
D, VOCAB, N_LAYER = 64, None, 4
N_HEAD, KDA_HD, D_CONV = 4, 16, 4
Q_RANK, KV_RANK, ROPE, NOPE, VD = 32, 32, 8, 16, 16
N_EXPERT, N_USED, N_SHARED, FF_EXP, LATENT, FF_DENSE = 8, 2, 2, 16, 32, 48
MLA_LAYERS = {1, 3}
DENSE_LEAD = 1
RES_BLOCK = 2
SITU_BETA, SITU_LINEAR_BETA = 1.0, 1.5
LOWER_BOUND = -5.0
SCALE = 2.5
# a large epsilon keeps KDA's gated output norm well-conditioned (tests/gguf_kimi_k3.rs)
EPS = 1e-3

rng = np.random.default_rng(20261201)


def mat(rows, cols, gain=1.0):
    """A numpy (rows, cols) matrix: GGML shape [cols, rows], i.e. `rows x cols` row-major."""
    return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)


def vec(n, mean=1.0, sd=0.1):
    return (mean + sd * rng.standard_normal(n)).astype(np.float32)


def copy_tokenizer(w):
    r = GGUFReader(TOK_SRC)
    vocab = None
    for name, f in r.fields.items():
        if not name.startswith("tokenizer."):
            continue
        t = f.types[0]
        if t == GGUFValueType.ARRAY:
            sub = f.types[1]
            vals = f.contents()
            w.add_array(name, vals) if sub == GGUFValueType.STRING else w.add_key_value(
                name, vals, GGUFValueType.ARRAY, sub_type=sub)
            if name == "tokenizer.ggml.tokens":
                vocab = len(vals)
        else:
            w.add_key_value(name, f.contents(), t)
    return vocab


def write(path):
    w = GGUFWriter(path, ARCH)
    vocab = copy_tokenizer(w)
    w.add_block_count(N_LAYER)
    w.add_context_length(N_CTX)
    w.add_embedding_length(D)
    w.add_feed_forward_length(FF_DENSE)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv([0 if i not in MLA_LAYERS else 1 for i in range(N_LAYER)])
    w.add_layer_norm_rms_eps(EPS)
    w.add_vocab_size(vocab)
    w.add_ssm_conv_kernel(D_CONV)
    w.add_kda_head_dim(KDA_HD)
    w.add_kda_gate_lower_bound(LOWER_BOUND)
    w.add_q_lora_rank(Q_RANK)
    w.add_kv_lora_rank(KV_RANK)
    w.add_rope_dimension_count(ROPE)
    w.add_key_length(KV_RANK + ROPE)
    w.add_value_length(KV_RANK)
    w.add_key_length_mla(NOPE + ROPE)
    w.add_value_length_mla(VD)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_USED)
    w.add_expert_feed_forward_length(FF_EXP)
    w.add_expert_shared_count(N_SHARED)
    w.add_leading_dense_block_count(DENSE_LEAD)
    w.add_expert_weights_scale(SCALE)
    w.add_expert_weights_norm(True)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_latent_length(LATENT)
    w.add_activation_situ_beta(SITU_BETA)
    w.add_activation_situ_linear_beta(SITU_LINEAR_BETA)
    w.add_attn_res_block_size(RES_BLOCK)

    t = w.add_tensor
    t("token_embd.weight", mat(vocab, D, gain=np.sqrt(D)))
    t("output_norm.weight", vec(D))
    t("output.weight", mat(vocab, D, gain=2.0))
    t("output_res_score.weight", vec(D, 0.0, 0.5))
    dim = N_HEAD * KDA_HD
    for i in range(N_LAYER):
        b = f"blk.{i}."
        t(b + "attn_norm.weight", vec(D))
        t(b + "ffn_norm.weight", vec(D))
        t(b + "attn_res_score.weight", vec(D, 0.0, 0.5))
        t(b + "ffn_res_score.weight", vec(D, 0.0, 0.5))
        if i not in MLA_LAYERS:
            for x in "qkv":
                # GGML [d_conv, 1, d_inner]
                t(b + f"ssm_conv1d_{x}.weight", (0.5 * rng.standard_normal((dim, 1, D_CONV))).astype(np.float32))
                # values 8x: KDA outputs well above ssm_norm's epsilon (a head output of mean
                # square ~eps makes the gated norm ill-conditioned, and any two f32 evaluations
                # disagree there by ~1e-4)
                t(b + f"attn_{x}.weight", mat(dim, D, gain=8.0 if x == "v" else 1.0))
            t(b + "ssm_f_a.weight", mat(KDA_HD, D))
            t(b + "ssm_f_b.weight", mat(dim, KDA_HD))
            t(b + "ssm_beta.weight", mat(N_HEAD, D))
            t(b + "ssm_a", (-np.exp(rng.uniform(-1.0, 1.0, N_HEAD))).astype(np.float32))
            t(b + "ssm_dt.bias", (0.5 * rng.standard_normal(dim)).astype(np.float32))
            t(b + "ssm_g.weight", mat(dim, D))
            t(b + "ssm_norm.weight", vec(KDA_HD))
            t(b + "attn_output.weight", mat(D, dim))
        else:
            t(b + "attn_q_a.weight", mat(Q_RANK, D))
            t(b + "attn_q_a_norm.weight", vec(Q_RANK))
            t(b + "attn_q_b.weight", mat(N_HEAD * (NOPE + ROPE), Q_RANK))
            t(b + "attn_kv_a_mqa.weight", mat(KV_RANK + ROPE, D))
            t(b + "attn_kv_a_norm.weight", vec(KV_RANK))
            # GGML [nope, rank, n_head] and [rank, vd, n_head]
            t(b + "attn_k_b.weight", (rng.standard_normal((N_HEAD, KV_RANK, NOPE)) / np.sqrt(KV_RANK)).astype(np.float32))
            t(b + "attn_v_b.weight", (rng.standard_normal((N_HEAD, VD, KV_RANK)) / np.sqrt(KV_RANK)).astype(np.float32))
            t(b + "attn_gate.weight", mat(N_HEAD * VD, D, gain=2.0))
            t(b + "attn_output.weight", mat(D, N_HEAD * VD))
        if i < DENSE_LEAD:
            t(b + "ffn_gate.weight", mat(FF_DENSE, D, gain=2.0))
            t(b + "ffn_up.weight", mat(FF_DENSE, D, gain=2.0))
            t(b + "ffn_down.weight", mat(D, FF_DENSE))
        else:
            t(b + "ffn_gate_inp.weight", mat(N_EXPERT, D, gain=2.0))
            t(b + "exp_probs_b.bias", (0.1 * rng.standard_normal(N_EXPERT)).astype(np.float32))
            g = lambda *s: (rng.standard_normal(s) * 2.0 / np.sqrt(s[-1])).astype(np.float32)
            t(b + "ffn_gate_exps.weight", g(N_EXPERT, FF_EXP, LATENT))
            t(b + "ffn_up_exps.weight", g(N_EXPERT, FF_EXP, LATENT))
            t(b + "ffn_down_exps.weight", (rng.standard_normal((N_EXPERT, LATENT, FF_EXP)) / np.sqrt(FF_EXP)).astype(np.float32))
            t(b + "ffn_routed_down.weight", mat(LATENT, D, gain=2.0))
            t(b + "ffn_routed_up.weight", mat(D, LATENT))
            t(b + "ffn_routed_norm.weight", vec(LATENT))
            sff = FF_EXP * N_SHARED
            t(b + "ffn_gate_shexp.weight", mat(sff, D, gain=2.0))
            t(b + "ffn_up_shexp.weight", mat(sff, D, gain=2.0))
            t(b + "ffn_down_shexp.weight", mat(D, sff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def load(path):
    return llama_cpp.Llama(model_path=path, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=THREADS,
                           n_threads_batch=THREADS, logits_all=True, type_k=llama_cpp.GGML_TYPE_F32,
                           type_v=llama_cpp.GGML_TYPE_F32, flash_attn=False, seed=0, verbose=False)


def main():
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "kimi_k3-f32.gguf")
    write(path)
    with open(REF_SRC) as f:
        ids = json.load(f)["prompt_ids"]
    llm = load(path)
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[: len(ids), :], dtype=np.float32)
    logits.astype("<f4").tofile(os.path.join(OUT, "f32.logits.f32"))
    llm.reset()
    llm.eval(ids)
    cont, gaps = [], []
    for _ in range(N_CONTINUATION):
        row = np.array(llm.scores[llm.n_tokens - 1, :], dtype=np.float32)
        tok = int(np.argmax(row))
        top2 = np.sort(row)[-2:]
        cont.append(tok)
        gaps.append(round(float(top2[1] - top2[0]), 6))
        llm.eval([tok])
    with open(path, "rb") as f:
        data = f.read()
    ref = dict(
        family="kimi_k3", generator="tools/reference/k3_gguf_fixture.py",
        versions=dict(llama_cpp_python=llama_cpp.__version__, numpy=np.__version__),
        settings=dict(threads=THREADS, n_ctx=N_CTX, n_batch=N_CTX, type_k="F32", type_v="F32",
                      flash_attn=False, logits_all=True),
        prompt_ids=ids,
        variants=dict(f32=dict(
            file="kimi_k3-f32.gguf", sha256=hashlib.sha256(data).hexdigest(), bytes=len(data),
            n_prompt=len(ids), n_vocab=llm.n_vocab(), logits_file="f32.logits.f32",
            max_abs_logit=float(np.abs(logits).max()),
            continuation_ids=cont, continuation_gaps=gaps)),
    )
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print(json.dumps(ref["variants"]["f32"], indent=1))


if __name__ == "__main__":
    main()
