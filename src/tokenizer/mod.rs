//! Tokenization through the `tokenizers` crate (GGUF vocabularies converted to it), chat
//! templates through `minijinja`, and incremental detokenization for streamed output.
