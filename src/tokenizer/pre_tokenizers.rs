//! The byte-level BPE pre-tokenizers this crate implements, by `tokenizer.ggml.pre` name:
//! each one's split regex, its `ignore_merges` setting, and whether llama.cpp adds BOS by
//! default for it. A leaf shared by the vocabulary reader and the byte-level BPE builder.

/// The split regex of Qwen2/Qwen3 tokenizers (their `tokenizer.json`, one digit per piece),
/// with the case-insensitive contractions spelled out as llama.cpp spells them.
const QWEN2_PATTERN: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The split regex of Llama 3 tokenizers (up to three digits per piece).
const LLAMA3_PATTERN: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `tokenizer.ggml.pre` names whose pre-tokenizer is implemented: (names, regex,
/// ignore_merges), grouped as llama.cpp groups them.
pub(super) const PRE_TOKENIZERS: &[(&[&str], &str, bool)] = &[
    (&["qwen2", "deepseek-r1-qwen"], QWEN2_PATTERN, false),
    (&["llama3", "llama-v3", "llama-bpe"], LLAMA3_PATTERN, true),
];

/// Whether llama.cpp adds BOS by default for this `tokenizer.ggml.pre` (when the file has no
/// `tokenizer.ggml.add_bos_token`): the Llama 3 family does.
pub(super) fn default_add_bos(pre: &str) -> bool {
    PRE_TOKENIZERS[1].0.contains(&pre)
}
