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

/// Checks a Hugging Face folder's `config.json` as this family's loader reads it, reading no
/// weights (what `pack` runs before writing anything).
pub type CheckHf = fn(&HfModel) -> Result<()>;

/// Checks a GGUF model's metadata as this family's loader reads it, reading no weights.
pub type CheckGguf = fn(&GgufModel) -> Result<()>;

/// How a family's routed-expert tensors are named, so that tools that never run the model
/// (`pack`, `inspect`) can tell experts from the spine, split stacked experts and order an
/// expert's tensors.
///
/// An expert tensor (one whose name holds a [marker](ExpertNames::markers)) is either one
/// expert's ([`ExpertNames::key`]: Hugging Face `model.layers.L.….experts.E.NAME`, where a
/// marker is followed by the expert's number, or a slice `NAME[E]` as packs list them) or
/// *stacked*, every expert of its layer in one tensor with the experts outermost
/// ([`ExpertNames::is_stacked`]: GGUF `blk.L.ffn_*_exps.*`, Hugging Face GPT-OSS
/// `model.layers.L.mlp.experts.gate_up_proj…`), which `pack` cuts into one slice per expert
/// (`TensorInfo::slice_outer`) and the loaders accept either way (`Tensors::stacked`).
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

    /// The (layer, expert) of a tensor holding one routed expert's weights: an expert tensor
    /// ([`ExpertNames::is_expert`]) of a layer ([`layer_of`]) named `NAME[E]`, or with a marker
    /// followed by `E.`; `None` for spine tensors and stacked expert tensors.
    pub fn key(&self, name: &str) -> Option<(usize, usize)> {
        if !self.is_expert(name) {
            return None;
        }
        let layer = layer_of(name)?;
        if let Some((_, e)) = name.strip_suffix(']').and_then(|n| n.rsplit_once('[')) {
            return Some((layer, e.parse().ok()?));
        }
        let e = self.markers.iter().find_map(|m| {
            let (_, rest) = name.split_once(m)?;
            rest.split_once('.')?.0.parse().ok()
        })?;
        Some((layer, e))
    }

    /// Whether `name` is a stacked expert tensor: an expert tensor of a layer that holds
    /// every expert of it (experts outermost) rather than one ([`ExpertNames::key`]).
    pub fn is_stacked(&self, name: &str) -> bool {
        self.is_expert(name) && layer_of(name).is_some() && self.key(name).is_none()
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

/// The layer of a tensor named `model.layers.L.…` (Hugging Face) or `blk.L.…` (GGUF).
pub fn layer_of(name: &str) -> Option<usize> {
    let rest = name
        .strip_prefix("model.layers.")
        .or_else(|| name.strip_prefix("blk."))?;
    rest.split_once('.')?.0.parse().ok()
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
    /// The configuration check of [`Family::load_hf`] alone (the config parsed as loading
    /// parses it; errors name the file and the field); `None` when there is no HF loader.
    pub check_hf: Option<CheckHf>,
    /// The configuration check of [`Family::load_gguf`] alone (errors name the file and the
    /// key); `None` when there is no GGUF loader.
    pub check_gguf: Option<CheckGguf>,
    /// Routed-expert tensor names; `None` for dense-only families.
    pub experts: Option<ExpertNames>,
    /// Whether `deltafin pack` writes packs of it (and loading accepts them).
    pub packable: bool,
    /// `model_type`s that `deltafin synth` writes for it (empty: none).
    pub synth: &'static [&'static str],
}

impl Family {
    /// The expert naming `deltafin pack` lays records out by, for a family it packs
    /// ([`Family::packable`]); `None` when it packs none of it.
    pub fn pack_experts(&self) -> Option<ExpertNames> {
        self.experts.filter(|_| self.packable)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_tensors_are_told_apart_by_layer_and_expert_or_as_stacked() {
        let n = SWIGLU_EXPERTS;
        let key = |s| n.key(s);
        assert_eq!(
            key("model.layers.3.mlp.experts.12.gate_proj.weight"),
            Some((3, 12))
        );
        assert_eq!(
            key("model.layers.1.mlp.experts.0.up_proj.weight_scale_inv"),
            Some((1, 0))
        );
        assert_eq!(
            key("model.layers.2.block_sparse_moe.experts.5.w2.weight"),
            Some((2, 5))
        );
        assert_eq!(key("blk.4.ffn_down_exps.weight[7]"), Some((4, 7)));
        for spine in [
            "model.layers.1.mlp.shared_experts.gate_proj.weight",
            "model.layers.1.mlp.gate.weight",
            "blk.1.ffn_gate_shexp.weight",
            "blk.1.exp_probs_b.bias",
            "token_embd.weight",
        ] {
            assert_eq!((key(spine), n.is_stacked(spine)), (None, false), "{spine}");
        }
        assert!(n.is_stacked("blk.0.ffn_gate_exps.weight"));
        assert!(!n.is_stacked("blk.0.ffn_gate_exps.weight[0]"));
        let oss = ExpertNames {
            markers: &[".experts.", "_exps."],
            roles: &[&["gate_up_proj"], &["down_proj"]],
        };
        assert!(oss.is_stacked("model.layers.0.mlp.experts.gate_up_proj_blocks"));
        assert_eq!(
            oss.key("model.layers.1.mlp.experts.down_proj_bias[3]"),
            Some((1, 3))
        );
        assert!(oss.is_stacked("blk.1.ffn_up_exps.bias"));
        assert_eq!(
            oss.role("model.layers.0.mlp.experts.down_proj_scales[2]"),
            1
        );
    }
}
