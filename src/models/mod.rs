//! Model architectures: one folder per family (listed once in [`FAMILIES`], the registry),
//! each turning a checkpoint's tensor index into a forward pass ([`decoder::Decoder`]) over
//! weights held by a [`crate::store::WeightStore`].
//!
//! Files:
//!
//! - `model.rs`: the `Model` trait, `LoadOptions` and `Placement`.
//! - `registry.rs`: the registry's entry type, `Family`; the table, [`FAMILIES`], is built in
//!   this file by `families!`.
//! - `decoder.rs`: the shared decoder skeleton, which implements `Model` once over a family's
//!   `Blocks`; `decoder_dev.rs`: its one layer loop, on any device (`device.rs`: `Device`, a
//!   backend that holds cache slots, and `--device`'s choice, refusing a device that lacks an
//!   op the family needs); `moe_dev.rs`: the routed-experts step there.
//! - `mtp_layer.rs`: the multi-token-prediction layer's weights (`MtpLayer`, `ChunkedMatrix`;
//!   DeepSeek V3 builds it); `mtp_decoder.rs`: its forward pass (`Decoder` as `models::Mtp`,
//!   `Model::mtp`, loaded with `LoadOptions::mtp`; the family's spine and experts as layer
//!   `num_hidden_layers`).
//! - One folder per family, owning its config, GGUF metadata mapping, tensor names and blocks:
//!   - `llama/`: Qwen3, Qwen3-MoE, Llama, Mixtral (`config.rs`, `gguf.rs`);
//!   - `deepseek_v3/`: DeepSeek V3, Kimi K2 (`config.rs`, `tensors.rs`, `gguf.rs`);
//!   - `gpt_oss/`: `config.rs`, `experts.rs`, `gguf.rs`;
//!   - `gemma3/`: `config.rs`;
//!   - `kimi_linear/`: Kimi Linear (`config.rs`, `tensors.rs`, `gguf.rs`);
//!   - `kimi_k3/`: Kimi K3. `config.rs` (GGUF metadata and `config.json`); tensors from GGUF
//!     in `gguf.rs` and from Hugging Face folders in `hf.rs`, both into one `Checkpoint`;
//!     compressed-tensors MXFP4 experts repacked to GGML MXFP4 as they land in `mxfp4.rs`.
//!
//!   No family imports another: what two families share lives beside them.
//! - Shared blocks, over any backend (`Device`): `layers/` (`generic.rs`: grouped-query
//!   attention, the gated feed-forward, norms; `mixers.rs`: multi-head latent attention over
//!   a latent slot (DeepSeek V3 with RoPE, Kimi Linear and K3 without) and the KDA token
//!   mixer; `hybrid.rs`: the Kimi families' per-layer KDA/MLA layout from `config.json` or
//!   GGUF; `mod.rs`: host helpers; the kernels `mla` and `kda` re-exported from
//!   `backend/cpu/`), `moe.rs` (routing, expert tables, the store's side of the MoE
//!   block), `rope.rs` (RoPE scaling), `embed_head.rs` (embeddings, LM head), `loading.rs`
//!   (tensor resolution and units), `budget.rs` (placement under the RAM budget), `needs.rs` (each family's memory
//!   needs besides its weights, turned into reserved bytes), `config.rs`
//!   (serde defaults and bounded GGUF getters), `kv_cache.rs` (KV rows, latent rows and
//!   recurrent states per layer, and the final hidden rows a multi-token-prediction drafter
//!   reads: `HiddenRows`, rolled back with the cache).

pub mod batch;
mod budget;
pub mod config;
pub mod decoder;
mod decoder_dev;
pub mod device;
pub mod embed_head;
pub mod kv_cache;
pub mod layers;
pub mod loading;
mod model;
pub mod moe;
mod moe_dev;
mod mtp_decoder;
pub mod mtp_layer;
mod needs;
pub mod registry;
pub mod rope;

/// Declares the family folders and [`FAMILIES`], their registry entries in this order (the
/// order of the "supported: …" lists in errors). Adding a family: its folder (with
/// `pub const FAMILY: registry::Family`) and its name here.
macro_rules! families {
    ($($f:ident),* $(,)?) => {
        $(pub mod $f;)*
        /// Every architecture family, one [`Family`] entry each (see [`registry`]).
        pub const FAMILIES: &[Family] = &[$($f::FAMILY),*];
        /// The family folders, as listed: each entry's [`Family::name`] must be its folder.
        #[cfg(test)]
        const FOLDERS: &[&str] = &[$(stringify!($f)),*];
    };
}

families!(gemma3, llama, gpt_oss, deepseek_v3, kimi_linear, kimi_k3);

pub use crate::backend::cpu::Numerics;
pub use batch::SeqPass;
pub use kv_cache::KvCache;
pub use model::{
    run_batch, run_pass, BudgetTooSmall, LoadOptions, Logits, Model, Mtp, MtpOut, Placement,
};
pub use registry::{Family, ModelAndStore};

use crate::source::gguf::GgufModel;
use crate::source::hf::HfModel;

/// Loads the model described by a GGUF file set, choosing the family from
/// `general.architecture` ([`FAMILIES`]).
///
/// Errors: unknown architecture, a pack of a family that cannot be packed, missing or
/// malformed tensors or metadata (the message names the key or tensor), a budget too small to
/// run at all, or an unreadable file.
pub fn load_gguf(gguf: &GgufModel, opts: &LoadOptions) -> anyhow::Result<ModelAndStore> {
    let arch = gguf.architecture()?;
    let family = registry::by_gguf_architecture(FAMILIES, arch).filter(|f| f.load_gguf.is_some());
    if gguf.pack.is_some() && !family.is_some_and(|f| f.packable) {
        anyhow::bail!(
            "{}: packs of GGUF architecture '{arch}' cannot be loaded yet (supported: {})",
            gguf.files[0].display(),
            registry::names(FAMILIES, |f| f.gguf_architectures, |f| f.packable)
        );
    }
    match family.and_then(|f| f.load_gguf) {
        Some(load) => with_numerics(load(gguf, opts)?, opts),
        None => anyhow::bail!(
            "{}: architecture '{arch}' is not supported (supported: {})",
            gguf.files[0].display(),
            registry::names(
                FAMILIES,
                |f| f.gguf_architectures,
                |f| f.load_gguf.is_some()
            )
        ),
    }
}

/// Loads a Hugging Face checkpoint folder (see [`HfModel::open`]), choosing the family from
/// `config.json`'s `model_type`.
///
/// Errors: unknown `model_type` (named), config or tensor errors (the message names the field
/// or tensor and the folder), a budget too small to run at all, or an unreadable file.
pub fn load_hf(folder: &std::path::Path, opts: &LoadOptions) -> anyhow::Result<ModelAndStore> {
    let hf = HfModel::open(folder)?;
    load_hf_model(&hf, opts)
}

/// A loaded model set to `opts.numerics` on `opts.device`.
fn with_numerics((mut m, s): ModelAndStore, opts: &LoadOptions) -> anyhow::Result<ModelAndStore> {
    m.set_numerics(opts.numerics)?;
    m.set_device(opts.device)?;
    Ok((m, s))
}

/// [`load_hf`] over an already opened folder.
pub fn load_hf_model(hf: &HfModel, opts: &LoadOptions) -> anyhow::Result<ModelAndStore> {
    let mt = hf.model_type()?;
    let family = registry::by_model_type(FAMILIES, mt).filter(|f| f.load_hf.is_some());
    if hf.pack.is_some() && !family.is_some_and(|f| f.packable) {
        anyhow::bail!(
            "{}: packs of model_type '{mt}' cannot be loaded yet (supported: {})",
            hf.dir.display(),
            registry::names(FAMILIES, |f| f.model_types, |f| f.packable)
        );
    }
    match family.and_then(|f| f.load_hf) {
        Some(load) => with_numerics(load(hf, opts)?, opts),
        None => anyhow::bail!(
            "{}: model_type '{mt}' is not supported (supported: {})",
            hf.config_path().display(),
            registry::names(FAMILIES, |f| f.model_types, |f| f.load_hf.is_some())
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_named_after_its_folder_and_claims_distinct_names() {
        let names: Vec<&str> = FAMILIES.iter().map(|f| f.name).collect();
        assert_eq!(names, FOLDERS);
        let mut types: Vec<&str> = FAMILIES
            .iter()
            .flat_map(|f| f.model_types)
            .copied()
            .collect();
        let mut archs: Vec<&str> = FAMILIES
            .iter()
            .flat_map(|f| f.gguf_architectures)
            .copied()
            .collect();
        let (nt, na) = (types.len(), archs.len());
        types.sort_unstable();
        types.dedup();
        archs.sort_unstable();
        archs.dedup();
        assert_eq!((types.len(), archs.len()), (nt, na), "a name claimed twice");
        // a packable family names its expert tensors
        assert!(FAMILIES.iter().all(|f| !f.packable || f.experts.is_some()));
    }
}
