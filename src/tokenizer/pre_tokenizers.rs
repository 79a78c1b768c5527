//! The byte-level BPE pre-tokenizers of GGUF vocabularies, by `tokenizer.ggml.pre` name: every
//! name that llama.cpp (as vendored in llama-cpp-python 0.3.36, `src/llama-vocab.cpp`,
//! `llama_vocab::impl::load` and `llm_tokenizer_bpe`) recognises for a `gpt2` vocabulary, with
//! the split steps it runs, whether it sets `ignore_merges`, whether it adds BOS by default, and
//! whether the pieces are byte-encoded (GPT-2's alphabet) or kept as UTF-8 with `▁` for spaces.
//!
//! The regex strings are format data: they are the splits llama.cpp applies, written so that
//! Rust's `fancy-regex` gives llama.cpp's pieces (see [`super::pre_split`] for how llama.cpp's
//! `std::regex` reading is reproduced). A leaf shared by the vocabulary reader and the BPE
//! builder.

/// One step of a pre-tokenizer: every piece left by the steps before is split again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// A regex: each match becomes a piece, and so does the text between matches.
    Regex(&'static str),
    /// llama.cpp's own splitter for `kimi-k2` (its reading of Kimi's `tokenization_kimi.py`
    /// pattern, see [`super::pre_split::split_kimi_k2`]).
    KimiK2,
    /// llama.cpp's digit grouping for `afmoe` and `tiny_aya`: a run of digits is cut into a
    /// leading group of `len % 3` digits and then groups of three (the text before the run
    /// joins its first group, as llama.cpp emits it).
    DigitGroups,
}

/// A pre-tokenizer: how llama.cpp splits raw text before the BPE.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PreTokenizer {
    /// The `tokenizer.ggml.pre` names that select it.
    pub names: &'static [&'static str],
    /// Split steps, in order.
    pub steps: &'static [Step],
    /// A piece that is itself a token is taken whole (llama.cpp `ignore_merges`).
    pub ignore_merges: bool,
    /// llama.cpp adds BOS when the file has no `tokenizer.ggml.add_bos_token`.
    pub add_bos: bool,
    /// Pieces are mapped to GPT-2's byte alphabet (false: raw UTF-8, spaces written `▁`
    /// where `escape_spaces`, unknown bytes as `<0xNN>` tokens).
    pub byte_encode: bool,
    /// Spaces become `▁` before splitting (llama.cpp `escape_whitespaces`).
    pub escape_spaces: bool,
    /// A piece of newlines only that is a token is taken whole (llama.cpp's Gemma 4 rule).
    pub whole_newlines: bool,
}

/// Contractions, case-insensitive, spelled out as llama.cpp spells them for `std::regex`.
macro_rules! contractions {
    () => {
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    };
}

/// GPT-2's split (also the middle step of llama.cpp's default).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3's split (up to three digits per piece).
const LLAMA3: &str = concat!(
    contractions!(),
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// Qwen 2's split (one digit per piece).
const QWEN2: &str = concat!(
    contractions!(),
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// Qwen 3.5's split (marks join letters).
const QWEN35: &str = concat!(
    contractions!(),
    r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// GPT-4o's split; llama.cpp writes `\p{Lu}`-like classes with look-aheads because its
/// `std::regex` reading folds every letter category into one.
const GPT4O: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+",
    contractions!(),
    r"?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*",
    contractions!(),
    r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// DeepSeek V3's last step (also Hunyuan dense, JoyAI, Hy v4).
const DEEPSEEK3_WORDS: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;

/// Japanese and common CJK runs (DeepSeek V3 and relatives).
const CJK_KANA: &str = "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+";

/// Characters outside whitespace and `.,!?…。，、।۔،` runs (BLOOM, Poro, Viking). Non-ASCII
/// characters in these regexes are written as escapes, code point for code point as in
/// llama.cpp's source (several are Unicode singletons that text normalization would change).
const BLOOM: &str = " ?[^(\\s|.,!?\u{2026}\u{3002}\u{FF0C}\u{3001}\u{964}\u{6D4}\u{60C})]+";

/// Starcoder-like: digits one by one, then GPT-2.
const STARCODER: &[Step] = &[Step::Regex(r"\p{N}"), Step::Regex(GPT2)];

/// Every pre-tokenizer of a `gpt2` GGUF vocabulary, grouped as llama.cpp groups the names.
pub(crate) const PRE_TOKENIZERS: &[PreTokenizer] = &[
    pre(&["default"], &[
        Step::Regex(r"[\p{P}\$\+<=>\^~\|]+"),
        Step::Regex(GPT2),
        Step::Regex(r"\p{N}+"),
        Step::Regex(r"[0-9][0-9][0-9]"),
    ]),
    PreTokenizer {
        add_bos: true,
        ignore_merges: true,
        ..pre(
            &["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"],
            &[Step::Regex(LLAMA3)],
        )
    },
    PreTokenizer { ignore_merges: true, ..pre(&["minicpm5"], &[
        Step::Regex(r"\p{N}{1,3}"),
        Step::Regex(concat!(
            contractions!(),
            r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        )),
    ]) },
    pre(&["deepseek-llm"], &[
        Step::Regex(r"[\r\n]"),
        Step::Regex("\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+"),
        // llama.cpp's last range starts at U+3000, but it hands the regex U+000B in place of
        // every non-ASCII space, so U+3000 never matches it: the range starts at U+3001 here.
        Step::Regex("\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3001}-\u{3002}]+"),
        Step::Regex(r"\s+$"),
        Step::Regex("[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+"),
        Step::Regex(r"\p{N}+"),
    ]),
    pre(&["deepseek-coder"], &[
        Step::Regex(r"[\r\n]"),
        Step::Regex(r"\s?\p{L}+"),
        Step::Regex(r"\s?\p{P}+"),
        Step::Regex("[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+"),
        Step::Regex(r"\p{N}"),
    ]),
    pre(&["deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"], &[
        Step::Regex(r"\p{N}{1,3}"),
        Step::Regex(CJK_KANA),
        Step::Regex(DEEPSEEK3_WORDS),
    ]),
    pre(&["spark2_5"], &[
        Step::Regex(r"\p{N}{1,3}"),
        Step::Regex(CJK_KANA),
        Step::Regex(r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"##),
        Step::Regex(r"\p{N}"),
    ]),
    PreTokenizer { ignore_merges: true, ..pre(&["youtu"], &[
        Step::Regex("[\u{AC00}-\u{D7A3}\u{3131}-\u{318E}]+|[\u{FF01}\u{2026}\u{201C}\u{201D}\u{2018}\u{2019}\u{2014}\u{FF1A}\u{FF1B}\u{FF0C}\u{3001}-\u{303F}\u{FE30}-\u{FE4F}]+|[\u{3105}-\u{312F}]+|[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+"),
        Step::Regex(concat!(
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
            contractions!(),
            r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
            contractions!(),
            r"?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        )),
    ]) },
    pre(&["falcon"], &[
        Step::Regex(r"[\p{P}\$\+<=>\^~\|`]+"),
        Step::Regex(GPT2),
        Step::Regex(r"[0-9][0-9][0-9]"),
    ]),
    pre(&["starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"], STARCODER),
    pre(
        &[
            "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
            "a.x-4.0", "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe",
            "exaone4", "mpt", "olmo", "jais", "trillion", "granite-docling",
        ],
        &[Step::Regex(GPT2)],
    ),
    pre(&["jais-2"], &[Step::Regex(concat!(
        contractions!(),
        r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"
    ))]),
    PreTokenizer { byte_encode: false, escape_spaces: true, add_bos: true, whole_newlines: true, ..pre(
        &["gemma4", "granite-embed-multi-311m"],
        &[Step::Regex(r"[^\n]+|[\n]+")],
    ) },
    PreTokenizer { byte_encode: false, escape_spaces: true, ..pre(&["sarvam-moe"], &[Step::Regex(r"[^\n]+|[\n]+")]) },
    PreTokenizer { byte_encode: false, ..pre(&["whitespace"], &[Step::Regex(r"\S+")]) },
    pre(
        &["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "megrez", "hunyuan", "solar-open", "grok-2"],
        &[Step::Regex(QWEN2)],
    ),
    pre(&["qwen35"], &[Step::Regex(QWEN35)]),
    pre(&["dbrx", "smaug-bpe"], &[Step::Regex(LLAMA3)]),
    pre(&["poro-chat", "bloom", "gpt3-finnish"], &[Step::Regex(BLOOM)]),
    pre(&["chatglm-bpe"], &[Step::Regex(LLAMA3)]),
    PreTokenizer { ignore_merges: true, ..pre(&["glm4", "glm5"], &[Step::Regex(LLAMA3)]) },
    pre(&["viking"], &[Step::Regex(BLOOM), Step::Regex(r"\p{N}")]),
    PreTokenizer { ignore_merges: true, add_bos: true, ..pre(&["tekken"], &[Step::Regex(concat!(
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*",
        r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ))]) },
    PreTokenizer { add_bos: true, ..pre(&["chameleon"], &[
        Step::Regex(r"<sentinel:[0-9]+>"),
        Step::Regex(r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z"),
        Step::Regex(r"([\t\n]|    |  )"),
        Step::Regex(r"\p{N}"),
        Step::Regex(r"[\p{P}!-/:-@\[-`{-~]"),
        Step::Regex(GPT2),
    ]) },
    pre(&["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], &[Step::Regex(GPT4O)]),
    PreTokenizer { ignore_merges: true, ..pre(&["granite-embed-multi-97m"], &[Step::Regex(concat!(
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+",
        contractions!(),
        r"?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*",
        contractions!(),
        r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ))]) },
    pre(&["tiny_aya", "cohere2moe"], &[
        Step::DigitGroups,
        Step::Regex(concat!(
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
            contractions!(),
            r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
            contractions!(),
            r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        )),
    ]),
    pre(&["superbpe"], &[Step::Regex(r"\p{N}+"), Step::Regex(r"(?=([0-9]{3})+(?![0-9]))")]),
    pre(&["bailingmoe", "bailingmoe2", "llada-moe"], &[Step::Regex(
        r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    )]),
    pre(&["seed-coder"], &[Step::Regex(concat!(
        contractions!(),
        r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"
    ))]),
    pre(&["kimi-k2"], &[Step::KimiK2]),
    pre(&["ufakzeka"], &[Step::Regex(
        r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )]),
    pre(&["afmoe"], &[
        Step::DigitGroups,
        Step::Regex("[\u{4E00}-\u{9FFF}\u{3400}-\u{4DBF}\u{8C48}-\u{FAFF}\u{3040}-\u{309F}\u{30A0}-\u{30FF}\u{FF65}-\u{FF9F}\u{2F00}-\u{2FDF}\u{E40}-\u{E7F}\u{E80}-\u{EFF}\u{1780}-\u{17FF}\u{1000}-\u{109F}\u{AA60}-\u{AA7F}\u{A9E0}-\u{A9FF}\u{AC00}-\u{D7AF}\u{1100}-\u{11FF}]+"),
        Step::Regex(r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##),
    ]),
    pre(&["laguna"], &[Step::Regex(r"[^\n]+|[\n]+"), Step::Regex(QWEN2)]),
    pre(&["exaone-moe"], &[Step::Regex(concat!(
        contractions!(),
        r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"
    ))]),
];

/// A pre-tokenizer with llama.cpp's defaults for a `gpt2` vocabulary.
const fn pre(names: &'static [&'static str], steps: &'static [Step]) -> PreTokenizer {
    PreTokenizer {
        names,
        steps,
        ignore_merges: false,
        add_bos: false,
        byte_encode: true,
        escape_spaces: false,
        whole_newlines: false,
    }
}

/// The pre-tokenizer llama.cpp uses for `tokenizer.ggml.pre = name`; a missing key reads as
/// `default`. `None` for names llama.cpp does not know.
pub(crate) fn find(name: Option<&str>) -> Option<&'static PreTokenizer> {
    let name = name.unwrap_or("default");
    PRE_TOKENIZERS
        .iter()
        .find(|p| p.names.contains(&name) && !p.steps.is_empty())
}

/// Every supported name, in table order (for error messages).
pub(crate) fn names() -> Vec<&'static str> {
    PRE_TOKENIZERS
        .iter()
        .filter(|p| !p.steps.is_empty())
        .flat_map(|p| p.names.iter().copied())
        .collect()
}

/// Whether llama.cpp adds BOS by default for this `tokenizer.ggml.pre` (when the file has no
/// `tokenizer.ggml.add_bos_token`).
pub(crate) fn default_add_bos(pre: Option<&str>) -> bool {
    find(pre).is_some_and(|p| p.add_bos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_every_regex_compiles() {
        let all = names();
        let mut sorted = all.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), all.len(), "a name is listed twice");
        for p in PRE_TOKENIZERS.iter().filter(|p| !p.steps.is_empty()) {
            for s in p.steps {
                if let Step::Regex(r) = s {
                    super::super::pre_split::compile(r)
                        .unwrap_or_else(|e| panic!("{:?}: {r}: {e}", p.names));
                }
            }
        }
        assert!(find(None).is_some_and(|p| p.names == ["default"]));
        assert!(find(Some("gpt-2")).is_some());
        assert!(find(Some("no-such")).is_none());
    }
}
