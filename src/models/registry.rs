//! The architecture registry's entry type: what one family (a folder under `models/`) tells
//! the rest of Deltafin about itself. Each family folder defines one `pub const FAMILY:
//! Family`; `models/mod.rs` lists the folders once (`families!`), which declares their modules
//! and builds [`super::FAMILIES`], the table that loading ([`super::load_gguf`],
//! [`super::load_hf_model`]), `inspect`, `pack` and `synth` read.

use anyhow::Result;

use super::{LoadOptions, Model};
use crate::source::gguf::GgufModel;
use crate::source::hf::HfModel;
use crate::store::WeightStore;

/// A loaded model and the store holding its weights.
pub type ModelAndStore = (Box<dyn Model>, WeightStore);

/// Loads a Hugging Face folder of this family (see [`super::load_hf_model`]).
pub type LoadHf = fn(&HfModel, &LoadOptions) -> Result<ModelAndStore>;

/// Loads a GGUF model of this family (see [`super::load_gguf`]).
pub type LoadGguf = fn(&GgufModel, &LoadOptions) -> Result<ModelAndStore>;

/// How a family's routed-expert tensors are named, so that tools that never run the model
/// (`pack`, `inspect`) can tell experts from the spine and order an expert's tensors.
#[derive(Clone, Copy, Debug)]
pub struct ExpertNames {
    /// Substrings that mark a tensor holding routed-expert weights: Hugging Face per-expert
    /// tensors `model.layers.L.….experts.E.NAME` and stacked ones (`….experts.gate_up_proj`),
    /// GGUF stacked tensors `blk.L.ffn_{gate,up,down}_exps.*`.
    pub markers: &'static [&'static str],
    /// The order of one expert's tensors inside its pack record: role `i` holds the tensors
    /// whose names contain one of `roles[i]`; tensors matching no role come last, by name.
    pub roles: &'static [&'static [&'static str]],
}

impl ExpertNames {
    /// Whether `name` is a routed-expert tensor ([`ExpertNames::markers`]).
    pub fn is_expert(&self, name: &str) -> bool {
        self.markers.iter().any(|m| name.contains(m))
    }

    /// The record position of the tensor `name` ([`ExpertNames::roles`]); `roles.len()` for
    /// a tensor matching no role.
    pub fn role(&self, name: &str) -> usize {
        self.roles
            .iter()
            .position(|r| r.iter().any(|x| name.contains(x)))
            .unwrap_or(self.roles.len())
    }
}

/// The expert naming of the SwiGLU MoE families: Hugging Face `experts.E.{gate,up,down}_proj`
/// (Mixtral: `w1`, `w3`, `w2`) and GGUF `ffn_{gate,up,down}_exps`.
pub const SWIGLU_EXPERTS: ExpertNames = ExpertNames {
    markers: &[".experts.", "_exps."],
    roles: &[
        &["gate_proj", ".w1.", "_gate_exps."],
        &["up_proj", ".w3.", "_up_exps."],
        &["down_proj", ".w2.", "_down_exps."],
    ],
};

/// One architecture family: the names it answers to, its loaders, and what the tools may do
/// with it.
#[derive(Clone, Copy, Debug)]
pub struct Family {
    /// The family's folder under `models/`, e.g. `"llama"`.
    pub name: &'static str,
    /// `config.json` `model_type` values it loads (e.g. `qwen3`, `mixtral`).
    pub model_types: &'static [&'static str],
    /// GGUF `general.architecture` values it loads (llama.cpp's names, e.g. `qwen3moe`).
    pub gguf_architectures: &'static [&'static str],
    /// Loader of Hugging Face folders; `None` when the family is read from GGUF only.
    pub load_hf: Option<LoadHf>,
    /// Loader of GGUF files; `None` when the family is read from Hugging Face folders only.
    pub load_gguf: Option<LoadGguf>,
    /// Routed-expert tensor names; `None` for dense-only families.
    pub experts: Option<ExpertNames>,
    /// Whether `deltafin pack` writes packs of it (and loading accepts them).
    pub packable: bool,
    /// `model_type`s that `deltafin synth` writes for it (empty: none).
    pub synth: &'static [&'static str],
}

/// The family loading `config.json` `model_type` `mt`, among `families`.
pub fn by_model_type<'a>(families: &'a [Family], mt: &str) -> Option<&'a Family> {
    families.iter().find(|f| f.model_types.contains(&mt))
}

/// The family loading GGUF architecture `arch`, among `families`.
pub fn by_gguf_architecture<'a>(families: &'a [Family], arch: &str) -> Option<&'a Family> {
    families
        .iter()
        .find(|f| f.gguf_architectures.contains(&arch))
}

/// Every name `key` lists over `families` that `keep` accepts, comma-separated, for errors
/// such as "supported: qwen3, qwen3_moe, …".
pub fn names(
    families: &[Family],
    key: impl Fn(&Family) -> &'static [&'static str],
    keep: impl Fn(&Family) -> bool,
) -> String {
    families
        .iter()
        .filter(|f| keep(f))
        .flat_map(&key)
        .copied()
        .collect::<Vec<_>>()
        .join(", ")
}

/// Boxes a family's `(model, store)` into [`ModelAndStore`], for the registry's loader entries.
pub fn boxed<M: Model + 'static>((m, s): (M, WeightStore)) -> ModelAndStore {
    (Box::new(m), s)
}
