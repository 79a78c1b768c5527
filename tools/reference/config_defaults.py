#!/usr/bin/env python3
"""Writes tests/fixtures/config_defaults.json: for each model_type Deltafin reads from a
config.json, the value transformers' config class gives every field the family reads when
config.json omits it (the class built with no arguments), plus the values it derives when only
`hidden_size` = 1024 and `num_attention_heads` = 64 are given (`num_key_value_heads`,
`head_dim`), and the RoPE parameters its initialisation standardizes (`rope_parameters`).

Pinned: transformers==5.24.0 (no torch needed). Run from the repository root:
    /tmp/venv-tf/bin/python tools/reference/config_defaults.py
"""
import json
import os

import transformers
from transformers import DeepseekV3Config, GptOssConfig, LlamaConfig, MixtralConfig, Qwen3Config, Qwen3MoeConfig

assert transformers.__version__ == "5.24.0", transformers.__version__

COMMON = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
          "attention_bias", "hidden_act"]
FIELDS = {
    "qwen3": (Qwen3Config, COMMON + ["use_sliding_window", "sliding_window"]),
    "qwen3_moe": (Qwen3MoeConfig, COMMON + ["use_sliding_window", "sliding_window", "num_local_experts",
                                             "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                                             "decoder_sparse_step", "mlp_only_layers"]),
    "llama": (LlamaConfig, COMMON + ["mlp_bias"]),
    "mixtral": (MixtralConfig, COMMON + ["sliding_window", "num_local_experts", "num_experts_per_tok"]),
    "deepseek_v3": (DeepseekV3Config, COMMON + [
        "moe_intermediate_size", "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "n_group",
        "topk_group", "routed_scaling_factor", "norm_topk_prob", "first_k_dense_replace", "q_lora_rank",
        "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "rope_interleave",
        "num_nextn_predict_layers"]),
    "gpt_oss": (GptOssConfig, COMMON + ["num_local_experts", "num_experts_per_tok", "sliding_window",
                                         "swiglu_alpha", "swiglu_limit", "layer_types"]),
}
# Kimi K2 checkpoints (model_type kimi_k2) ship DeepSeek V3's configuration class as remote code.
FIELDS["kimi_k2"] = FIELDS["deepseek_v3"]


def main():
    out = {"transformers_version": transformers.__version__, "model_types": {}}
    for mt, (cls, fields) in FIELDS.items():
        c = cls()
        defaults = {f: getattr(c, f, None) for f in fields}
        defaults["rope_parameters"] = c.rope_parameters
        d = cls(hidden_size=1024, num_attention_heads=64)
        derived = {"num_key_value_heads": d.num_key_value_heads, "head_dim": getattr(d, "head_dim", None)}
        out["model_types"][mt] = {"class": cls.__name__, "defaults": defaults, "derived_1024_64": derived}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures",
                        "config_defaults.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
