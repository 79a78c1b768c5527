#!/usr/bin/env python3
"""Tiny random-weight Hugging Face checkpoints with `transformers` reference logits.

For every family in `FAMILIES` this writes `tests/fixtures/hf/<name>/`:

- `config.json` as `transformers` 5 writes it (`rope_parameters`, `dtype`), plus
  `quantization_config` for the FP8 / MXFP4 variants;
- `model.safetensors` (or two shards + `model.safetensors.index.json`) in the published
  Hugging Face tensor layout (per-expert `experts.N.*` for Qwen3-MoE / DeepSeek-V3,
  `block_sparse_moe.experts.N.w1/w2/w3` for Mixtral, fused `experts.gate_up_proj` for gpt-oss);
- `tokenizer.json`, `tokenizer_config.json` (with `chat_template`), `generation_config.json`;
- `reference.json`: prompt text and ids, full float32 logits of the last prompt position, top-10
  ids/logits of every prompt position, a 16-token greedy continuation (argmax, lowest id on ties,
  EOS does not stop), and the library versions;

It also writes `tests/fixtures/hf/chat_templates.json` (templates x conversations ->
`apply_chat_template` output).

Weights are random (seeded per tensor name), rounded to bfloat16-representable values; the
reference runs in float32 with eager attention on CPU. Each fixture is re-loaded with
`AutoModelForCausalLM.from_pretrained(dtype=float32)` and its logits must equal the recorded ones.

Run: /work/venv-hf/bin/python tools/reference/hf_fixtures.py [--out tests/fixtures/hf] [names...]
"""

import argparse
import copy
import hashlib
import json
import os
import shutil
import tempfile
import zlib

import tokenizers
import torch
import transformers
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast


SEED = 20240611
THREADS = 1
N_CONTINUATION = 16
TOP_K = 10

# Training text for the byte-level BPE (written for this script; no download).
CORPUS = """\
The streaming engine reads each layer from disk just before it is needed, so a model that is
larger than memory can still answer questions. Experts in a mixture-of-experts layer are small
feed-forward networks; a router scores every expert for every token and keeps the best two.
Shared experts run for every token. Dense layers keep one feed-forward network.

Attention mixes information between positions. Rotary position embeddings rotate pairs of
channels by an angle that grows with the position; sliding-window layers only look back a few
tokens, while full-attention layers see the whole prefix. Sink logits let a head attend to nothing.

def route(scores, k=2):
    best = sorted(range(len(scores)), key=lambda i: -scores[i])[:k]
    total = sum(scores[i] for i in best)
    return [(i, scores[i] / total) for i in best]

Numbers: 0 1 2 3 4 5 6 7 8 9 10 16 32 64 128 256 512 1024 2048 4096 3.14159 2.71828 1e-6.
Quantized weights: FP8 E4M3 blocks of 128 x 128 with one scale each; MXFP4 packs two E2M1
values per byte, thirty-two values share one power-of-two scale.
Questions and answers: What is the capital of France? Paris. How many legs has a spider? Eight.
Café, naïve, Zürich, São Paulo, Kraków; 日本語のテキスト; 中文文本; emoji 🙂 and 🚀.
The quick brown fox jumps over the lazy dog. A tiny model, a small vocabulary, a fixed seed:
the same bytes every time the script runs. Tools return JSON such as {"city": "Paris", "temp": 21}.
"""

PROMPT_MESSAGES = [
    {"role": "user", "content": "Which experts does the router keep for café? Answer in 3 words."},
]

# Pre-tokenizer split patterns (the well-known published regexes, used as data).
PAT_QWEN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PAT_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TOKENIZERS = {
    # specials are appended after the BPE vocabulary, as in the published tokenizers.
    "chatml": dict(pattern=PAT_QWEN, specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                               "<tool_call>", "</tool_call>", "<think>", "</think>"],
                   bos=None, eos="<|im_end|>", pad="<|endoftext|>", template="chatml_tools",
                   gen_eos=["<|im_end|>", "<|endoftext|>"]),
    "llama3": dict(pattern=PAT_LLAMA3, specials=["<|begin_of_text|>", "<|end_of_text|>",
                                                 "<|start_header_id|>", "<|end_header_id|>",
                                                 "<|eot_id|>", "<|python_tag|>", "<|eom_id|>"],
                   bos="<|begin_of_text|>", eos="<|eot_id|>", pad=None, template="llama3",
                   gen_eos=["<|end_of_text|>", "<|eot_id|>", "<|eom_id|>"]),
    "mistral": dict(pattern=PAT_LLAMA3, specials=["<unk>", "<s>", "</s>", "[INST]", "[/INST]"],
                    bos="<s>", eos="</s>", pad=None, template="mistral", gen_eos=["</s>"]),
    "deepseek": dict(pattern=PAT_LLAMA3, specials=["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                                                   "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>",
                                                   "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                                                   "<｜tool▁call▁end｜>", "<｜tool▁sep｜>",
                                                   "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
                                                   "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"],
                     bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>", pad=None,
                     template="deepseek", gen_eos=["<｜end▁of▁sentence｜>"]),
    "harmony": dict(pattern=PAT_LLAMA3, specials=["<|startoftext|>", "<|endoftext|>", "<|return|>",
                                                  "<|start|>", "<|message|>", "<|end|>", "<|channel|>",
                                                  "<|constrain|>", "<|call|>"],
                    bos=None, eos="<|return|>", pad="<|endoftext|>", template="harmony",
                    gen_eos=["<|return|>", "<|call|>"]),
}

# ---------------------------------------------------------------- chat templates
# Written for these fixtures in the style of the published templates (ChatML with tools as in
# Qwen, Llama 3 headers, Mistral [INST], DeepSeek-V3 fullwidth markers, a reduced gpt-oss harmony).

CHATML_TOOLS = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions. Their signatures are inside <tools></tools>:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nReturn each call as JSON inside <tool_call></tool_call>.<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- elif message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant' }}{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tc in message.tool_calls %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tc.function.name + '\", \"arguments\": ' + (tc.function.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

LLAMA3 = (
    "{{- bos_token }}"
    "{%- if messages[0].role == 'system' %}{%- set system_message = messages[0].content | trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{%- if tools %}{{- 'Environment: ipython\\n' }}{%- endif %}"
    "{{- 'Cutting Knowledge Date: December 2023\\n\\n' + system_message }}"
    "{%- if tools %}{{- '\\n\\nYou have access to these functions:\\n' }}"
    "{%- for t in tools %}{{- '\\n' + (t | tojson(indent=2)) }}{%- endfor %}{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- for tc in message.tool_calls %}"
    "{{- '{\"name\": \"' + tc.function.name + '\", \"parameters\": ' + (tc.function.arguments | tojson) + '}' }}"
    "{%- endfor %}{{- '<|eot_id|>' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + (message.content | trim) + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

MISTRAL = (
    "{{- bos_token }}"
    "{%- if messages[0].role == 'system' %}{%- set sys = messages[0].content %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set sys = '' %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- for m in loop_messages %}"
    "{%- if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}"
    "{%- if m.role == 'user' %}"
    "{%- if loop.first and sys %}{{- '[INST] ' + sys + '\\n\\n' + m.content + ' [/INST]' }}"
    "{%- else %}{{- '[INST] ' + m.content + ' [/INST]' }}{%- endif %}"
    "{%- else %}{{- ' ' + m.content + eos_token }}{%- endif %}"
    "{%- endfor %}"
)

DEEPSEEK = (
    "{%- set ns = namespace(system='', is_tool=false) %}"
    "{%- for m in messages %}{%- if m.role == 'system' %}{%- set ns.system = m.content %}{%- endif %}{%- endfor %}"
    "{{- bos_token + ns.system }}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}{%- set ns.is_tool = false %}{{- '<｜User｜>' + m.content }}"
    "{%- elif m.role == 'assistant' %}"
    "{%- if ns.is_tool %}{{- '<｜tool▁outputs▁end｜>' }}{%- set ns.is_tool = false %}{%- endif %}"
    "{%- if m.tool_calls %}"
    "{{- '<｜Assistant｜>' + (m.content or '') + '<｜tool▁calls▁begin｜>' }}"
    "{%- for tc in m.tool_calls %}"
    "{{- '<｜tool▁call▁begin｜>function<｜tool▁sep｜>' + tc.function.name + '\\n```json\\n' + (tc.function.arguments | tojson) + '\\n```<｜tool▁call▁end｜>' }}"
    "{%- endfor %}"
    "{{- '<｜tool▁calls▁end｜><｜end▁of▁sentence｜>' }}"
    "{%- else %}{{- '<｜Assistant｜>' + m.content + '<｜end▁of▁sentence｜>' }}{%- endif %}"
    "{%- elif m.role == 'tool' %}"
    "{%- if not ns.is_tool %}{{- '<｜tool▁outputs▁begin｜>' }}{%- set ns.is_tool = true %}{%- endif %}"
    "{{- '<｜tool▁output▁begin｜>' + m.content + '<｜tool▁output▁end｜>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if ns.is_tool %}{{- '<｜tool▁outputs▁end｜>' }}{%- endif %}"
    "{%- if add_generation_prompt %}{{- '<｜Assistant｜>' }}{%- endif %}"
)

HARMONY = (
    "{{- '<|start|>system<|message|>You are a helpful assistant.\\nReasoning: medium<|end|>' }}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' %}{{- '<|start|>developer<|message|># Instructions\\n\\n' + m.content + '<|end|>' }}"
    "{%- elif m.role == 'user' %}{{- '<|start|>user<|message|>' + m.content + '<|end|>' }}"
    "{%- elif m.role == 'assistant' %}{{- '<|start|>assistant<|channel|>final<|message|>' + m.content + '<|end|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"
)

CHAT_TEMPLATES = {"chatml_tools": CHATML_TOOLS, "llama3": LLAMA3, "mistral": MISTRAL, "deepseek": DEEPSEEK,
                  "harmony": HARMONY}

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}]

_TOOL_TURN = [
    {"role": "system", "content": "You can look up the weather."},
    {"role": "user", "content": "Is it warm in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
    {"role": "tool", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
]
CONVERSATIONS = [
    {"name": "single_user", "messages": [{"role": "user", "content": "Hello!"}]},
    {"name": "system_multi_turn", "messages": [
        {"role": "system", "content": "  Answer briefly.  "},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3 × 3? Café 🙂"}]},
    {"name": "assistant_last", "messages": [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."}]},
    {"name": "tool_call", "tools": True, "messages": _TOOL_TURN},
    {"name": "tool_call_answered", "tools": True, "messages": _TOOL_TURN + [
        {"role": "assistant", "content": "Yes: 21 °C and clear."}]},
]

N_BPE = 480  # byte alphabet (256) + merges; specials come on top

# Each family: transformers model_type, config kwargs, tokenizer, storage dtype, vocab padding,
# number of safetensors shards, quantization ("fp8" / "mxfp4" / None).
FAMILIES = {
    "qwen3_moe": dict(
        model_type="qwen3_moe", tokenizer="chatml", dtype="bfloat16", pad_vocab=64, shards=2,
        config=dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
                    num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
                    rms_norm_eps=1e-6, rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                    max_position_embeddings=4096, tie_word_embeddings=False)),
    "mixtral": dict(
        model_type="mixtral", tokenizer="mistral", dtype="bfloat16", pad_vocab=None, shards=1,
        config=dict(hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
                    rms_norm_eps=1e-5, rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                    max_position_embeddings=4096, sliding_window=None, tie_word_embeddings=False)),
    "qwen3": dict(
        model_type="qwen3", tokenizer="chatml", dtype="float32", pad_vocab=64, shards=1,
        config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                    max_position_embeddings=4096, tie_word_embeddings=True)),
    "llama": dict(
        model_type="llama", tokenizer="llama3", dtype="bfloat16", pad_vocab=None, shards=1,
        config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
                    rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                         low_freq_factor=1.0, high_freq_factor=4.0,
                                         original_max_position_embeddings=64),
                    max_position_embeddings=1024, tie_word_embeddings=False)),
    "deepseek_v3": dict(
        model_type="deepseek_v3", tokenizer="deepseek", dtype="bfloat16", pad_vocab=64, shards=1,
        config=dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2,
                    n_group=4, topk_group=2, n_shared_experts=1, first_k_dense_replace=1,
                    routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=32, kv_lora_rank=16,
                    qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, rms_norm_eps=1e-6,
                    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                         original_max_position_embeddings=64, beta_fast=32, beta_slow=1,
                                         mscale=1.0, mscale_all_dim=1.0),
                    max_position_embeddings=256, tie_word_embeddings=False)),
    "gpt_oss": dict(
        model_type="gpt_oss", tokenizer="harmony", dtype="bfloat16", pad_vocab=None, shards=1,
        config=dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
                    sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                    rms_norm_eps=1e-5, swiglu_limit=7.0,
                    rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0,
                                         original_max_position_embeddings=4096, beta_fast=32.0,
                                         beta_slow=1.0, truncate=False),
                    max_position_embeddings=131072, tie_word_embeddings=False)),
}
# Kimi Linear: KDA (linear attention) layers 1, 2, 4 and an MLA (no-RoPE) layer 3 (1-based, as the
# published `linear_attn_config.full_attn_layers` counts), a dense first layer, then MoE layers
# (sigmoid routing, renormalized, scaled). `layer_types` / `mlp_layer_types` are set explicitly.
FAMILIES["kimi_linear"] = dict(
    model_type="kimi_linear", tokenizer="deepseek", dtype="bfloat16", pad_vocab=64, shards=1,
    config=dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=4, num_experts=8, num_local_experts=8,
                num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=1,
                routed_scaling_factor=2.446, norm_topk_prob=True, q_lora_rank=None, kv_lora_rank=16,
                qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, rms_norm_eps=1e-5,
                linear_head_dim=16, linear_num_heads=4, linear_conv_kernel_dim=4,
                layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
                mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
                max_position_embeddings=256, tie_word_embeddings=False),
    all_positions=True)
# DeepSeek-V3 with FP8 E4M3 block-quantized linear weights. 8 heads make q_b_proj 192 rows (one
# full and one partial 128-row block) and kv_b_proj 256 rows; the dense MLP is 256 wide.
FAMILIES["deepseek_v3_fp8"] = dict(
    FAMILIES["deepseek_v3"], quant="fp8",
    config=dict(FAMILIES["deepseek_v3"]["config"], num_attention_heads=8, num_key_value_heads=8,
                intermediate_size=256))
FAMILIES["gpt_oss_mxfp4"] = dict(FAMILIES["gpt_oss"], quant="mxfp4")
# DeepSeek-V3 with its multi-token-prediction layer (`num_nextn_predict_layers` = 1) written by
# this script as `model.layers.3.*` (transformers does not model it and drops it when saving):
# the same target model as `deepseek_v3`, plus `mtp_reference` in reference.json (see mtp_layer).
FAMILIES["deepseek_v3_mtp"] = dict(FAMILIES["deepseek_v3"], mtp=True)
# Qwen3-MoE with every layer sparse, as the published Qwen3-MoE models are: llama.cpp's converter
# and its `qwen3moe` architecture have no dense layers, so the GGUF fixtures start from this one.
FAMILIES["qwen3_moe_sparse"] = dict(
    FAMILIES["qwen3_moe"], shards=1,
    config=dict(FAMILIES["qwen3_moe"]["config"], mlp_only_layers=[]))

LM_HEAD_GAIN = 4.0
FP8_BLOCK = 128
FP8_MAX = 448.0
# Published DeepSeek-V3 keeps these unquantized (bf16): embeddings, norms, router, lm_head.
FP8_SKIP = ("embed_tokens", "norm", "mlp.gate.", "lm_head")


def bf16_round(t):
    return t.to(torch.bfloat16).to(torch.float32)


def tensor_gen(name):
    g = torch.Generator().manual_seed(SEED + zlib.crc32(name.encode()))
    return g


def random_value(name, shape, tied=False):
    """Deterministic random value for parameter `name`, rounded to bf16."""
    g = tensor_gen(name)
    x = torch.randn(shape, generator=g, dtype=torch.float32)
    leaf = name.rsplit(".", 1)[-1]
    if "norm" in name and leaf == "weight" or "layernorm" in name:
        v = 1.0 + 0.2 * x
    elif name.endswith("e_score_correction_bias"):
        v = 0.5 * x
    elif name.endswith("sinks"):
        v = x
    elif "bias" in leaf:
        v = 0.1 * x
    elif "embed_tokens" in name:
        v = x if not tied else 3.0 * x / shape[-1] ** 0.5
    elif len(shape) >= 2:
        fan_in = shape[-2] if name.endswith(("gate_up_proj", "down_proj")) and len(shape) == 3 else shape[-1]
        gain = LM_HEAD_GAIN if "lm_head" in name else 1.0
        v = gain * x / fan_in ** 0.5
    else:
        v = 0.1 * x
    return bf16_round(v)


def fill_weights(model):
    with torch.no_grad():
        for name, p in sorted(model.state_dict().items()):
            p.copy_(random_value(name, tuple(p.shape), model.config.tie_word_embeddings))


def build_tokenizer(spec):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(spec["pattern"]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=N_BPE, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS], trainer=trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in spec["specials"]])
    if spec["bos"]:
        bos = spec["bos"]
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                          special_tokens=[(bos, tok.token_to_id(bos))]),
        ])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=spec["bos"], eos_token=spec["eos"],
                                   pad_token=spec["pad"], unk_token=None)
    fast.chat_template = CHAT_TEMPLATES[spec["template"]]
    return fast


def save_tokenizer(fast, out):
    fast.save_pretrained(out, save_jinja_files=False)
    for extra in ("special_tokens_map.json", "chat_template.jinja"):
        if os.path.exists(os.path.join(out, extra)):
            os.remove(os.path.join(out, extra))
    cfg_path = os.path.join(out, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    assert "chat_template" in cfg, "tokenizer_config.json lacks chat_template"


def make_config(fam, vocab_size, fast, spec):
    kw = dict(fam["config"])
    kw["vocab_size"] = vocab_size
    kw["bos_token_id"] = fast.convert_tokens_to_ids(spec["bos"]) if spec["bos"] else None
    kw["eos_token_id"] = fast.convert_tokens_to_ids(spec["eos"])
    kw["pad_token_id"] = fast.convert_tokens_to_ids(spec["pad"]) if spec["pad"] else None
    cfg = AutoConfig.for_model(fam["model_type"], **kw)
    cfg._attn_implementation = "eager"
    return cfg


# ---------------------------------------------------------------- quantization

def fp8_quantize(w):
    """w [R, C] f32 -> (q float8_e4m3fn [R, C], scale_inv f32 [ceil(R/128), ceil(C/128)]).

    DeepSeek-V3 convention: dequantized = float(q[r, c]) * scale_inv[r // 128, c // 128]; the last
    block of a dimension that is not a multiple of 128 is partial. scale_inv = amax(block) / 448.
    """
    R, C = w.shape
    br, bc = -(-R // FP8_BLOCK), -(-C // FP8_BLOCK)
    scale = torch.empty(br, bc, dtype=torch.float32)
    q = torch.empty(R, C, dtype=torch.float8_e4m3fn)
    for i in range(br):
        for j in range(bc):
            blk = w[i * FP8_BLOCK:(i + 1) * FP8_BLOCK, j * FP8_BLOCK:(j + 1) * FP8_BLOCK]
            s = (blk.abs().max() / FP8_MAX).to(torch.float32)
            scale[i, j] = s
            q[i * FP8_BLOCK:(i + 1) * FP8_BLOCK, j * FP8_BLOCK:(j + 1) * FP8_BLOCK] = (blk / s).to(torch.float8_e4m3fn)
    return q, scale


def fp8_dequantize(q, scale):
    rows = torch.arange(q.shape[0]) // FP8_BLOCK
    cols = torch.arange(q.shape[1]) // FP8_BLOCK
    return q.to(torch.float32) * scale[rows][:, cols]


FP4_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def mxfp4_dequantize(blocks, scales):
    """blocks uint8 [E, R, G, 16], scales uint8 [E, R, G] -> f32 [E, G*32, R].

    Element 2j of a 32-group is the low nibble of byte j, element 2j+1 the high nibble; each
    nibble indexes FP4_E2M1 and is multiplied by 2**(scale - 127). The [E, R, G*32] result is
    transposed to transformers' [E, in, out] expert layout.
    """
    lut = torch.tensor(FP4_E2M1, dtype=torch.float32)
    lo = lut[(blocks & 0x0F).long()]
    hi = lut[(blocks >> 4).long()]
    vals = torch.stack([lo, hi], dim=-1).reshape(*blocks.shape[:-1], 32)
    vals = vals * torch.exp2(scales.to(torch.float32) - 127.0).unsqueeze(-1)
    E, R, G = scales.shape
    return vals.reshape(E, R, G * 32).transpose(1, 2).contiguous()


def mxfp4_random(name, E, R, C):
    g = tensor_gen(name + "#mxfp4")
    blocks = torch.randint(0, 256, (E, R, C // 32, 16), generator=g, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(121, 124, (E, R, C // 32), generator=g, dtype=torch.int32).to(torch.uint8)
    return blocks, scales


# ---------------------------------------------------------------- reference

def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].to(torch.float32)


def greedy(model, ids, n):
    """Incremental greedy decode with the KV cache: prompt in one pass, then one token per step."""
    out, step_logits = [], []
    with torch.no_grad():
        res = model(input_ids=torch.tensor([ids]), use_cache=True)
        cache = res.past_key_values
        last = res.logits[0, -1].to(torch.float32)
        for _ in range(n):
            nxt = int(torch.argmax(last))  # first maximal index: lowest id on ties
            out.append(nxt)
            step_logits.append(last)
            res = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, use_cache=True)
            cache = res.past_key_values
            last = res.logits[0, -1].to(torch.float32)
    return out, torch.stack(step_logits)


def top_gap(row):
    v = torch.topk(row, 2).values
    return float(v[0] - v[1])


def reference(model, fast, prompt_text, prompt_ids):
    lp = logits_of(model, prompt_ids)
    cont, step_logits = greedy(model, prompt_ids, N_CONTINUATION)
    full = logits_of(model, prompt_ids + cont)
    batched = full[len(prompt_ids) - 1:len(prompt_ids) - 1 + N_CONTINUATION]
    positions = []
    for row in lp:
        v, i = torch.topk(row, TOP_K)
        positions.append({"ids": [int(x) for x in i], "logits": [float(x) for x in v]})
    n_tok = len(fast)
    text = fast.decode(cont) if all(c < n_tok for c in cont) else None
    return lp, {
        "prompt_text": prompt_text,
        "prompt_ids": prompt_ids,
        "last_logits": [float(x) for x in lp[-1]],
        "positions": positions,
        "continuation_ids": cont,
        "continuation_text": text,
        "greedy_top1_logits": [float(r.max()) for r in step_logits],
        "greedy_min_gap": min(top_gap(r) for r in step_logits),
        "batched_argmax_matches_greedy": [int(x) for x in batched.argmax(-1)] == cont,
        "incremental_vs_batched_max_abs_diff": float((batched - step_logits).abs().max()),
    }


# ---------------------------------------------------------------- multi-token prediction

MTP_TOP_K = 8
MTP_FULL_ROWS = 3


def mtp_layer(model, cfg, dtype):
    """The multi-token-prediction layer of DeepSeek-V3 (technical report, sec. 2.2) for `model`:
    tensors `model.layers.{N}.*` (N = num_hidden_layers; random, bf16-rounded; stored in `dtype`)
    and the float32 modules computing it. Layout as published DeepSeek-V3 checkpoints name it:
    `embed_tokens`, `enorm`, `hnorm`, `eh_proj` (hidden x 2*hidden: embedding columns first),
    `shared_head.norm`, `shared_head.head`, and one decoder block (a MoE block: N >=
    first_k_dense_replace) under its usual names."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer, DeepseekV3RMSNorm
    n, d, v = cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size
    pre = f"model.layers.{n}."
    block = DeepseekV3DecoderLayer(cfg, layer_idx=n).eval()
    with torch.no_grad():
        for name, p in sorted(block.state_dict().items()):
            p.copy_(random_value(pre + name, tuple(p.shape)))
    parts = {
        "embed_tokens.weight": random_value(pre + "embed_tokens.weight", (v, d)),
        "enorm.weight": random_value(pre + "enorm.weight", (d,)),
        "hnorm.weight": random_value(pre + "hnorm.weight", (d,)),
        "eh_proj.weight": random_value(pre + "eh_proj.weight", (d, 2 * d)),
        "shared_head.norm.weight": random_value(pre + "shared_head.norm.weight", (d,)),
        "shared_head.head.weight": bf16_round(LM_HEAD_GAIN * random_value(pre + "shared_head.head.weight", (v, d))),
    }
    state = {pre + k: t.to(dtype) for k, t in parts.items()}
    for k, t in block.state_dict().items():
        if k == "mlp.experts.gate_up_proj":
            # transformers' fused [E, 2I, H] (gate rows first) as the published per-expert tensors
            i = t.shape[1] // 2
            for e in range(t.shape[0]):
                state[f"{pre}mlp.experts.{e}.gate_proj.weight"] = t[e, :i].to(dtype)
                state[f"{pre}mlp.experts.{e}.up_proj.weight"] = t[e, i:].to(dtype)
        elif k == "mlp.experts.down_proj":
            for e in range(t.shape[0]):
                state[f"{pre}mlp.experts.{e}.down_proj.weight"] = t[e].to(dtype)
        else:
            state[pre + k] = t.to(dtype)

    def norm(w):
        m = DeepseekV3RMSNorm(d, eps=cfg.rms_norm_eps)
        with torch.no_grad():
            m.weight.copy_(w)
        return m

    mods = dict(block=block, enorm=norm(parts["enorm.weight"]), hnorm=norm(parts["hnorm.weight"]),
                head_norm=norm(parts["shared_head.norm.weight"]), embed=parts["embed_tokens.weight"],
                eh=parts["eh_proj.weight"], head=parts["shared_head.head.weight"])
    return state, mods


def mtp_forward(model, mods, h, next_ids):
    """The MTP layer over rows at positions 0..T-1 in one causal pass: row i from hidden state
    h[i] (before the final norm) and token next_ids[i]. Returns (logits [T, vocab], the block's
    output hidden rows [T, d] before shared_head.norm)."""
    with torch.no_grad():
        e = mods["embed"][torch.tensor(next_ids)]
        x = torch.cat([mods["enorm"](e), mods["hnorm"](h)], dim=-1) @ mods["eh"].T
        T = x.shape[0]
        pos = torch.arange(T)[None]
        pe = model.model.rotary_emb(x[None], pos)
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        y = mods["block"](x[None], attention_mask=mask, position_ids=pos, position_embeddings=pe)
        y = (y[0] if isinstance(y, tuple) else y)[0]
        return mods["head_norm"](y) @ mods["head"].T, y


def mtp_reference(model, mods, ids):
    """Reference MTP logits over the sequence `ids` (prompt + greedy continuation): the target's
    hidden states h_i before the final norm (captured at model.model.norm's input); MTP row i
    from (h_i, ids[i+1]) proposes ids[i+2]. Then one chained step: the last row's block output
    with its own argmax token, at the next position."""
    got = {}
    hook = model.model.norm.register_forward_pre_hook(lambda m, a: got.__setitem__("h", a[0][0].clone()))
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]))
    hook.remove()
    h = got["h"]
    T = len(ids)
    logits, y = mtp_forward(model, mods, h[:T - 1], ids[1:])
    chain_tok = int(torch.argmax(logits[-1]))
    logits2, _ = mtp_forward(model, mods, torch.cat([h[:T - 1], y[-1:]]), ids[1:] + [chain_tok])
    top = []
    for row in logits:
        vals, idx = torch.topk(row, MTP_TOP_K)
        top.append({"ids": [int(x) for x in idx], "logits": [float(x) for x in vals]})
    full = list(range(MTP_FULL_ROWS)) + list(range(T - 1 - MTP_FULL_ROWS, T - 1))
    return {
        "ids": ids,
        "hidden_last": [float(x) for x in h[T - 1]],
        "positions": top,
        "full_rows": {str(i): [float(x) for x in logits[i]] for i in full},
        "chain": {"token": chain_tok, "logits": [float(x) for x in logits2[-1]]},
        "argmax_matches_next": sum(int(torch.argmax(logits[i])) == ids[i + 2] for i in range(T - 2)),
    }


# ---------------------------------------------------------------- writing

def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, ensure_ascii=False)
        f.write("\n")


def write_shards(state, out, shards):
    """Write `state` (name -> tensor) as model.safetensors or `shards` files plus the index."""
    names = sorted(state)
    meta = {"format": "pt"}
    if shards == 1:
        save_file({k: state[k].contiguous() for k in names}, os.path.join(out, "model.safetensors"), metadata=meta)
        return
    # split at layer boundaries by cumulative byte size
    total = sum(state[k].numel() * state[k].element_size() for k in names)
    weight_map, cur, part, parts = {}, 0, 0, [[] for _ in range(shards)]
    for k in names:
        parts[part].append(k)
        cur += state[k].numel() * state[k].element_size()
        if cur >= total * (part + 1) / shards and part < shards - 1:
            part += 1
    for p, keys in enumerate(parts):
        fname = f"model-{p + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: state[k].contiguous() for k in keys}, os.path.join(out, fname), metadata=meta)
        for k in keys:
            weight_map[k] = fname
    write_json(os.path.join(out, "model.safetensors.index.json"),
               {"metadata": {"total_size": total}, "weight_map": weight_map})


def saved_state(model, dtype):
    """The state dict in the published layout, via transformers' own save_pretrained."""
    with tempfile.TemporaryDirectory() as tmp:
        # a copy: casting the model itself would also round its rotary inv_freq buffers
        copy.deepcopy(model).to(dtype).save_pretrained(tmp)
        state = {}
        for fn in sorted(os.listdir(tmp)):
            if fn.endswith(".safetensors"):
                state.update(load_file(os.path.join(tmp, fn)))
        with open(os.path.join(tmp, "config.json")) as f:
            config = json.load(f)
    return state, config


def quantize_state(fam, state, model):
    """Replace tensors of `state` by their quantized form (in place) and return
    (quantization_config, dequantized state in the published layout, float32)."""
    deq = {k: v.to(torch.float32) for k, v in state.items()}
    if fam["quant"] == "fp8":
        for k in sorted(state):
            if k.endswith(".weight") and state[k].dim() == 2 and not any(s in k for s in FP8_SKIP):
                q, s = fp8_quantize(state[k].to(torch.float32))
                state[k] = q
                state[k + "_scale_inv"] = s
                deq[k] = fp8_dequantize(q, s)
        qc = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
              "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
    else:
        cfg = model.config
        E, H, I = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
        for k in sorted(state):
            if k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj"):
                rows, cols = (2 * I, H) if k.endswith("gate_up_proj") else (H, I)
                blocks, scales = mxfp4_random(k, E, rows, cols)
                del state[k]
                state[k + "_blocks"] = blocks
                state[k + "_scales"] = scales
                deq[k] = mxfp4_dequantize(blocks, scales)
        qc = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                         "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}
    return qc, deq


def load_dequantized(deq, config_json):
    """Load float32 tensors in the published layout into a transformers model via from_pretrained."""
    with tempfile.TemporaryDirectory() as tmp:
        save_file({k: v.contiguous() for k, v in deq.items()}, os.path.join(tmp, "model.safetensors"),
                  metadata={"format": "pt"})
        write_json(os.path.join(tmp, "config.json"), dict(config_json, dtype="float32"))
        m = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager")
    return m.eval()


def build_family(name, out_root):
    fam = FAMILIES[name]
    fam.setdefault("quant", None)
    spec = TOKENIZERS[fam["tokenizer"]]
    fast = build_tokenizer(spec)
    n_tok = len(fast)
    vocab = n_tok if not fam["pad_vocab"] else -(-n_tok // fam["pad_vocab"]) * fam["pad_vocab"]
    cfg = make_config(fam, vocab, fast, spec)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    fill_weights(model)
    store_dtype = getattr(torch, fam["dtype"])
    state, config_json = saved_state(model, store_dtype)
    if fam["quant"]:
        qc, deq = quantize_state(fam, state, model)
        model = load_dequantized(deq, config_json)
        config_json["quantization_config"] = qc

    mtp_mods = None
    if fam.get("mtp"):
        mtp_state, mtp_mods = mtp_layer(model, cfg, store_dtype)
        state.update(mtp_state)

    out = os.path.join(out_root, name)
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    write_shards(state, out, fam["shards"])
    write_json(os.path.join(out, "config.json"), config_json)
    save_tokenizer(fast, out)
    gen = GenerationConfig(
        bos_token_id=cfg.bos_token_id,
        eos_token_id=[fast.convert_tokens_to_ids(t) for t in spec["gen_eos"]],
        pad_token_id=cfg.pad_token_id, do_sample=True, temperature=0.6, top_p=0.95, top_k=20)
    gen.save_pretrained(out)

    prompt_text = fast.apply_chat_template(PROMPT_MESSAGES, tokenize=False, add_generation_prompt=True)
    prompt_ids = fast(prompt_text, add_special_tokens=False)["input_ids"]
    assert len(prompt_ids) >= 16, len(prompt_ids)
    lp, ref = reference(model, fast, prompt_text, prompt_ids)

    # Re-load the written folder the way a user would and compare.
    reload_note = None
    fp8_loader_diff = None
    if fam["quant"] == "fp8":
        # transformers 5.24's FP8 loader needs `accelerate` and derives the block size as
        # rows // scale_rows, which disagrees with DeepSeek's 128-row blocks for partial blocks;
        # the reference model is loaded from the script's dequantized float32 tensors instead.
        m2 = load_dequantized(deq, {k: v for k, v in config_json.items() if k != "quantization_config"})
        reload_note = ("fp8: transformers DeepseekV3ForCausalLM loaded (from_pretrained) from the script's "
                       "dequantized float32 tensors; transformers' own FP8 loader is not used")
        m3 = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
        fp8_loader_diff = float((logits_of(m3, prompt_ids) - lp).abs().max())
    else:
        m2 = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    m2.eval()
    lp2 = logits_of(m2, prompt_ids)
    reload_diff = float((lp2 - lp).abs().max())
    assert reload_diff == 0.0, (name, reload_diff)

    ref = {
        "family": name,
        "model_type": fam["model_type"],
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "tokenizers": tokenizers.__version__},
        "settings": {"seed": SEED, "dtype": "float32", "attn_implementation": "eager", "threads": THREADS,
                     "top_k": TOP_K, "storage_dtype": fam["dtype"], "quantization": fam["quant"],
                     "tokenizer_len": n_tok, "vocab_size": vocab},
        "reload_max_abs_diff": reload_diff,
        "reload_note": reload_note,
        "transformers_fp8_loader_max_abs_diff": fp8_loader_diff,
        **ref,
    }
    if mtp_mods is not None:
        ref["mtp_reference"] = mtp_reference(model, mtp_mods, prompt_ids + ref["continuation_ids"])
    if fam.get("all_positions"):
        # every prompt position's full float32 logits (prompt_len x vocab), for the families
        # whose tests compare every position over the whole vocabulary
        ref["all_logits"] = [[float(x) for x in row] for row in lp]
    write_json(os.path.join(out, "reference.json"), ref)
    return ref


def build_chat_templates(out_root):
    result = {"transformers_version": transformers.__version__, "tools": TOOLS, "templates": {}}
    for tname, spec in TOKENIZERS.items():
        fast = build_tokenizer(spec)
        tpl = CHAT_TEMPLATES[spec["template"]]
        cases = []
        for conv in CONVERSATIONS:
            if conv.get("tools") and spec["template"] in ("mistral", "harmony"):
                continue
            for agp in (False, True):
                kw = dict(tokenize=False, add_generation_prompt=agp)
                if conv.get("tools"):
                    kw["tools"] = TOOLS
                text = fast.apply_chat_template(conv["messages"], **kw)
                cases.append({"conversation": conv["name"], "add_generation_prompt": agp,
                              "with_tools": bool(conv.get("tools")), "output": text})
        result["templates"][spec["template"]] = {
            "template": tpl, "bos_token": spec["bos"], "eos_token": spec["eos"], "cases": cases}
    result["conversations"] = CONVERSATIONS
    write_json(os.path.join(out_root, "chat_templates.json"), result)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/hf")
    ap.add_argument("names", nargs="*", help="families to build (default: all, plus chat_templates.json)")
    args = ap.parse_args()
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)
    names = args.names or list(FAMILIES)
    for n in names:
        ref = build_family(n, args.out)
        size = sum(os.path.getsize(os.path.join(args.out, n, f)) for f in os.listdir(os.path.join(args.out, n)))
        print(f"{n}: {size} bytes, prompt {len(ref['prompt_ids'])} tokens, continuation {ref['continuation_ids']}, "
              f"min gap {ref['greedy_min_gap']:.4f}, batched==greedy {ref['batched_argmax_matches_greedy']}, "
              f"inc-vs-batched {ref['incremental_vs_batched_max_abs_diff']:.2e}")
    if not args.names:
        build_chat_templates(args.out)
    digest = hashlib.sha256()
    for root, _, files in sorted(os.walk(args.out)):
        for f in sorted(files):
            with open(os.path.join(root, f), "rb") as fh:
                digest.update(f.encode() + fh.read())
    print("sha256 of all fixture files:", digest.hexdigest())


if __name__ == "__main__":
    main()
