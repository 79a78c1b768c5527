//! The CUDA kernels: committed `.cu` sources (`kernels/`), joined into one program and
//! compiled by NVRTC at a device's first use, for that device's architecture. The PTX is
//! cached per process and architecture, so a second device of the same kind (or a second
//! [`super::Cuda`] on the same one) only loads it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{anyhow, Context, Result};
use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{CompileOptions, Ptx};

use crate::quant::GgmlType;

/// The program's sources, in order (each file may use the ones before it).
const SOURCES: [(&str, &str); 6] = [
    ("decode.cuh", include_str!("kernels/decode.cuh")),
    ("matvec.cu", include_str!("kernels/matvec.cu")),
    ("ops.cu", include_str!("kernels/ops.cu")),
    ("attention.cu", include_str!("kernels/attention.cu")),
    ("mla_kda.cu", include_str!("kernels/mla_kda.cu")),
    ("family_ops.cu", include_str!("kernels/family_ops.cu")),
];

/// Activation rows of one `mv_*` launch: the kernels exist for these counts.
pub(super) const MV_ROWS: [usize; 4] = [8, 4, 2, 1];
/// Warps (output rows) per block of the `mv_*` kernels (`MV_WARPS` in `matvec.cu`).
pub(super) const MV_WARPS: u32 = 8;
/// Warps per block of the attention kernel (`ATT_WARPS` in `attention.cu`).
pub(super) const ATT_WARPS: u32 = 8;
/// The largest head dimension the attention kernel takes (`ATT_MAX_DIM`).
pub(super) const ATT_MAX_DIM: usize = 512;
/// Warps per block of the latent attention kernel (`MLA_WARPS` in `mla_kda.cu`).
pub(super) const MLA_WARPS: u32 = 8;
/// The largest latent width (`kv_lora_rank`) the latent attention kernel takes.
pub(super) const MLA_MAX_RANK: usize = 1024;
/// The largest rotary width (`qk_rope_head_dim`) the latent attention kernel takes.
pub(super) const MLA_MAX_ROPE: usize = 256;
/// State columns (threads) per block of the KDA scan (`KDA_COLS`).
pub(super) const KDA_COLS: u32 = 32;
/// The largest key width of a KDA head the scan takes (`KDA_MAX_DK`).
pub(super) const KDA_MAX_DK: usize = 256;
/// The largest rotary slice (floats) `rope_tail` takes (`ROPE_TAIL_MAX` in `family_ops.cu`).
pub(super) const ROPE_TAIL_MAX: usize = 512;
/// The largest KDA convolution (taps per channel) `kda_conv` takes (`KDA_MAX_CONV`).
pub(super) const KDA_MAX_CONV: usize = 8;
/// The most sources (banked checkpoints and the current rows) of one `res_mix` (`RES_MIX_MAX`).
pub(super) const RES_MIX_MAX: usize = 64;
/// Activation rows of one `matmul_t` launch (`MT_ROWS`).
pub(super) const MT_ROWS: usize = 8;

/// The kernels' name for each weight type they read in its stored encoding; `None` for the
/// types the backend dequantizes to F32 on upload.
pub(super) fn type_name(ty: GgmlType) -> Option<&'static str> {
    Some(match ty {
        GgmlType::F32 => "f32",
        GgmlType::F16 => "f16",
        GgmlType::BF16 => "bf16",
        GgmlType::Q8_0 => "q8_0",
        GgmlType::Q4_0 => "q4_0",
        GgmlType::Q5_0 => "q5_0",
        GgmlType::Q4_K => "q4_k",
        GgmlType::Q6_K => "q6_k",
        GgmlType::MXFP4 => "mxfp4",
        GgmlType::F8_E4M3_B128 => "f8b128",
        _ => return None,
    })
}

/// The weight types with kernels of their own.
pub const DEVICE_TYPES: [GgmlType; 10] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::MXFP4,
    GgmlType::F8_E4M3_B128,
];

/// The element-wise and row kernels (besides the per-type `mv_*` and `deq_*`).
const OP_KERNELS: [&str; 26] = [
    "rms_norm",
    "rope",
    "rope_rows",
    "write_kv_rows",
    "glu",
    "softcap",
    "add",
    "gather_rows",
    "scatter_add_rows",
    "attention",
    "attention_rows",
    "mla_absorb_joint",
    "mla_head_dot",
    "mla_attention",
    "kda_scan",
    "rms_norm_part",
    "rope_tail",
    "kda_conv",
    "l2norm_heads",
    "kda_decay",
    "sigmoid_mul",
    "res_mix",
    "add_rows",
    "swiglu_oai",
    "matmul_t",
    // listed so a missing one fails at load, not at its first call
    "deq_f32",
];

/// Every kernel of the program loaded on one device, by name.
pub(super) struct Kernels {
    funcs: HashMap<String, CudaFunction>,
}

impl Kernels {
    /// The program compiled for `ctx`'s architecture (or taken from the process cache) and
    /// loaded on it. Errors: NVRTC missing or failing (with its log), the module not loading.
    pub(super) fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        let (major, minor) = ctx.compute_capability()?;
        let arch = format!("compute_{major}{minor}");
        let ptx = ptx_for(&arch)?;
        let module = ctx
            .load_module(Ptx::from_src(ptx))
            .with_context(|| format!("loading the CUDA kernels ({arch})"))?;
        let mut funcs = HashMap::new();
        for n in kernel_names() {
            let f = module
                .load_function(&n)
                .with_context(|| format!("CUDA kernel {n}"))?;
            funcs.insert(n, f);
        }
        Ok(Self { funcs })
    }

    /// The kernel `name` (one of the program's; panics otherwise: a typo in this crate).
    pub(super) fn get(&self, name: &str) -> &CudaFunction {
        self.funcs
            .get(name)
            .unwrap_or_else(|| panic!("no CUDA kernel {name}"))
    }
}

/// The name of every kernel the program defines and [`Kernels::load`] loads.
fn kernel_names() -> Vec<String> {
    let mut names: Vec<String> = OP_KERNELS.iter().map(|s| s.to_string()).collect();
    for ty in DEVICE_TYPES {
        let t = type_name(ty).expect("device type");
        names.push(format!("deq_{t}"));
        names.extend(MV_ROWS.iter().map(|r| format!("mv_{t}_{r}")));
    }
    names
}

/// The program's PTX for `arch` (`compute_90`), compiled once per process.
fn ptx_for(arch: &str) -> Result<String> {
    static CACHE: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = cache.get(arch) {
        return Ok(p.clone());
    }
    let src: String = SOURCES
        .iter()
        .map(|(name, text)| format!("// ---- {name}\n{text}\n"))
        .collect();
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "-std=c++17".into()],
        name: Some("deltafin_kernels.cu".into()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, opts)
        .map_err(|e| anyhow!("compiling the CUDA kernels with NVRTC for {arch}: {e}"))?
        .to_src();
    cache.insert(arch.to_string(), ptx.clone());
    Ok(ptx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_device_type_has_a_kernel_name_and_the_sources_define_them() {
        let all: String = SOURCES.iter().map(|(_, s)| *s).collect();
        for ty in DEVICE_TYPES {
            let t = type_name(ty).unwrap();
            assert!(all.contains(&format!("TYPE_KERNELS({t}, ")), "{ty}");
        }
        for k in OP_KERNELS.iter().filter(|k| !k.starts_with("deq_")) {
            assert!(all.contains(&format!(" {k}(")), "{k}");
        }
        assert_eq!(type_name(GgmlType::Q2_K), None);
        assert!(all.contains(&format!("#define MV_WARPS {MV_WARPS}\n")));
        assert!(all.contains(&format!("#define ATT_WARPS {ATT_WARPS}\n")));
        assert!(all.contains(&format!("#define ATT_MAX_DIM {ATT_MAX_DIM}\n")));
        assert!(all.contains(&format!("#define MLA_WARPS {MLA_WARPS}\n")));
        assert!(all.contains(&format!("#define MLA_MAX_RANK {MLA_MAX_RANK}\n")));
        assert!(all.contains(&format!("#define MLA_MAX_ROPE {MLA_MAX_ROPE}\n")));
        assert!(all.contains(&format!("#define KDA_COLS {KDA_COLS}\n")));
        assert!(all.contains(&format!("#define KDA_MAX_DK {KDA_MAX_DK}\n")));
        assert!(all.contains(&format!("#define ROPE_TAIL_MAX {ROPE_TAIL_MAX}\n")));
        assert!(all.contains(&format!("#define KDA_MAX_CONV {KDA_MAX_CONV}\n")));
        assert!(all.contains(&format!("#define RES_MIX_MAX {RES_MIX_MAX}\n")));
        assert!(all.contains(&format!("#define MT_ROWS {MT_ROWS}\n")));
    }

    /// NVRTC compiles without a GPU or a driver: where its library is found (the CUDA
    /// toolkit, or the `nvidia-cuda-nvrtc` wheel's `lib/` on `LD_LIBRARY_PATH`), the committed
    /// sources must compile for the H100/H200 architecture and define every kernel the
    /// backend loads; elsewhere (CI) the test says it skipped.
    #[test]
    fn the_sources_compile_with_nvrtc_where_it_is_found() {
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("NVRTC compile check skipped: no NVRTC library found");
            return;
        }
        let ptx = ptx_for("compute_90").unwrap_or_else(|e| panic!("{e:#}"));
        for k in kernel_names() {
            assert!(
                ptx.contains(&format!(".entry {k}(")),
                "kernel {k} not in the PTX"
            );
        }
    }
}
