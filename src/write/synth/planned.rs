//! [`Planned`]: the files a synthetic checkpoint consists of, computed from its shape alone
//! (shared by the Hugging Face and GGUF writers). Public as `write::synth::Planned`.

/// What a write produces, computed from the shape alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    /// Every file and its exact size in bytes: for a Hugging Face folder, names inside it
    /// (shards, index, config, tokenizer files); for GGUF one entry with an empty name, the
    /// output file itself.
    pub files: Vec<(String, u64)>,
    /// Bytes of tensor data.
    pub tensor_bytes: u64,
    /// Bytes of one routed expert as stored: its weights, block scales and biases.
    pub expert_bytes: u64,
    /// Decoder layers, dense ones included.
    pub layers: usize,
    /// Layers with routed experts.
    pub moe_layers: usize,
    /// Routed experts per MoE layer.
    pub experts: usize,
}

impl Planned {
    /// Bytes of all files.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.1).sum()
    }
}
