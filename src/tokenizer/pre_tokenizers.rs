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
const CJK_KANA: &str = r"[一-龥぀-ゟ゠-ヿ]+";

/// Characters outside whitespace and `.,!?…。，、।۔،` runs (BLOOM, Poro, Viking).
const BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";

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
        Step::Regex(r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+"),
        // llama.cpp's range starts at U+3000, but it hands the regex U+000B in place of every
        // non-ASCII space, so U+3000 never matches it: the range starts at U+3001 here.
        Step::Regex(r"\s?[!-/:-~！-／：-～‘-‟、-。]+"),
        Step::Regex(r"\s+$"),
        Step::Regex(r"[一-龥ࠀ-一가-퟿]+"),
        Step::Regex(r"\p{N}+"),
    ]),
    pre(&["deepseek-coder"], &[
        Step::Regex(r"[\r\n]"),
        Step::Regex(r"\s?\p{L}+"),
        Step::Regex(r"\s?\p{P}+"),
        Step::Regex(r"[一-龥ࠀ-一가-퟿]+"),
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
        Step::Regex(r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+"),
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
        Step::Regex(r"[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+"),
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
