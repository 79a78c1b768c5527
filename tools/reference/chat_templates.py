#!/usr/bin/env python3
"""Renders every template of tests/fixtures/chat_templates/templates/ over the conversations of
tests/fixtures/chat_templates/conversations.json with transformers' own renderer and writes
tests/fixtures/chat_templates/expected.json, which tests/chat_template_corpus.rs compares with
Deltafin's rendering byte for byte.

Pinned: transformers==5.24.0, jinja2==3.1.6 (no torch needed: only the template utilities are
imported). Run from the repository root:

    python3 -m venv /tmp/venv-tf && /tmp/venv-tf/bin/pip install transformers==5.24.0 jinja2==3.1.6
    /tmp/venv-tf/bin/python tools/reference/chat_templates.py

Each case is rendered as `tokenizer.apply_chat_template(..., tokenize=False)` does it: the
messages normalized (`_normalize_chat_messages`: keys whose value is None dropped), then
`render_jinja_template` with the tokenizer's special tokens and the extra keyword arguments
as template variables, with and without `add_generation_prompt`. A case whose rendering
raises keeps the exception's type and message instead of an output.
"""
import copy
import json
import os

import jinja2
import transformers
from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

assert transformers.__version__ == "5.24.0", transformers.__version__
assert jinja2.__version__ == "3.1.6", jinja2.__version__

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "chat_templates")

ALL = ["single_user", "system_multi_turn", "tool_calls_object", "tool_calls_string", "reasoning",
       "reasoning_inline", "content_parts", "bad_roles"]
TOOLS = ["system_multi_turn", "tool_calls_object", "tool_calls_string"]

QWEN = dict(file="qwen3.jinja", special={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
            conversations=[c for c in ALL if c != "content_parts"], tools=TOOLS,
            extras=[{}, {"enable_thinking": False}])

# name -> template file, the special tokens its tokenizer names, the conversations, which of them
# also get the tools, and the extra keyword arguments (each case is rendered once per extra).
TEMPLATES = {
    # Qwen3-8B and Qwen3-30B-A3B (qwen3_moe) publish the same template.
    "qwen3": QWEN,
    "qwen3_moe": QWEN,
    "llama3": dict(file="llama3.jinja", special={"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
                   conversations=["single_user", "system_multi_turn", "tool_calls_object", "reasoning"],
                   tools=["tool_calls_object", "system_multi_turn"],
                   extras=[{"date_string": "01 Dec 2026"}, {"tools_in_user_message": False}]),
    "mixtral": dict(file="mixtral.jinja", special={"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
                    conversations=["single_user", "system_multi_turn", "bad_roles", "tool_calls_object"],
                    tools=[], extras=[{}]),
    "deepseek_v3": dict(file="deepseek_v3.jinja",
                        special={"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
                        conversations=["single_user", "system_multi_turn", "tool_calls_string", "reasoning",
                                       "reasoning_inline"],
                        tools=["tool_calls_string"], extras=[{}]),
    "kimi_k2": dict(file="kimi_k2.jinja", special={"bos_token": "[BOS]", "eos_token": "[EOS]", "unk_token": "[UNK]",
                                                   "pad_token": "[PAD]"},
                    conversations=ALL, tools=TOOLS, extras=[{}]),
    "gpt_oss": dict(file="gpt_oss.jinja", special={"bos_token": "<|startoftext|>", "eos_token": "<|return|>",
                                                   "pad_token": "<|endoftext|>"},
                    conversations=["single_user", "system_multi_turn", "tool_calls_object", "tool_calls_string",
                                   "reasoning"],
                    tools=["tool_calls_object", "tool_calls_string"],
                    extras=[{"current_date": "2026-12-01"},
                            {"current_date": "2026-12-01", "reasoning_effort": "high",
                             "model_identity": "You are a test."}]),
    "gemma3": dict(file="gemma3.jinja", special={"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>",
                                                 "pad_token": "<pad>"},
                   conversations=["single_user", "system_multi_turn", "content_parts", "bad_roles", "reasoning"],
                   tools=[], extras=[{}]),
}
CONSTRUCT_SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
for name in ["construct_tojson", "construct_print", "construct_loops", "construct_strings", "construct_vars"]:
    TEMPLATES[name] = dict(file=name + ".jinja", special=CONSTRUCT_SPECIAL,
                           conversations=["system_multi_turn", "tool_calls_object", "reasoning"],
                           tools=["tool_calls_object"], documents=["reasoning"],
                           extras=[{}, {"enable_thinking": False, "reasoning_effort": "low"}])


def main():
    data = json.load(open(os.path.join(ROOT, "conversations.json"), encoding="utf-8"))
    cases = []
    for name, spec in TEMPLATES.items():
        src = open(os.path.join(ROOT, "templates", spec["file"]), encoding="utf-8").read()
        for conv in spec["conversations"]:
            for with_tools in ([False, True] if conv in spec["tools"] else [False]):
                with_docs = conv in spec.get("documents", [])
                for extra in spec["extras"]:
                    for agp in (False, True):
                        msgs = _normalize_chat_messages(copy.deepcopy(data["conversations"][conv]))
                        case = dict(template=name, file=spec["file"], special_tokens=spec["special"],
                                    conversation=conv, tools=with_tools, documents=with_docs, extra=extra,
                                    add_generation_prompt=agp)
                        try:
                            out, _ = render_jinja_template(
                                conversations=[msgs],
                                tools=copy.deepcopy(data["tools"]) if with_tools else None,
                                documents=copy.deepcopy(data["documents"]) if with_docs else None,
                                chat_template=src, add_generation_prompt=agp,
                                **{**spec["special"], **extra})
                            case["output"] = out[0]
                        except Exception as e:  # the reference's failure is the expected result
                            case["error_type"] = type(e).__name__
                            case["error"] = str(e)
                        cases.append(case)
    out = dict(transformers_version=transformers.__version__, jinja2_version=jinja2.__version__, cases=cases)
    with open(os.path.join(ROOT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum("error" in c for c in cases)
    print(f"{len(cases)} cases ({errors} errors) -> expected.json")


if __name__ == "__main__":
    main()
