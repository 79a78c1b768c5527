//! Writing a synthetic Hugging Face checkpoint: the tensor specs the architectures list
//! ([`TensorSpec`], grouped so a group never straddles shards), their safetensors shards with
//! `model.safetensors.index.json`, `config.json` and the tokenizer side files, and the spec
//! helpers the architectures share.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};

use super::fill::{self, Bf16Uniform, Rng};
use super::planned::Planned;

/// Safetensors dtype of a synthetic tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dtype {
    BF16,
    F32,
    F8E4M3,
    U8,
}

impl Dtype {
    fn size(self) -> usize {
        match self {
            Dtype::BF16 => 2,
            Dtype::F32 => 4,
            Dtype::F8E4M3 | Dtype::U8 => 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Dtype::BF16 => "BF16",
            Dtype::F32 => "F32",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::U8 => "U8",
        }
    }
}

/// How a tensor's values are drawn (see [`fill`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Fill {
    /// Every element this value (BF16 or F32): norm weights, block scales.
    Const(f32),
    /// Uniform in `±scale` (BF16 or F32).
    Uniform(f32),
    /// Random finite FP8 E4M3 codes ([`fill::fp8_e4m3`]).
    Fp8,
    /// Random bytes (MXFP4 nibble pairs).
    Bytes,
    /// E8M0 exponents uniform in `lo..=lo + 3` ([`fill::e8m0`]).
    E8m0 { lo: u8 },
}

/// One tensor of a Hugging Face checkpoint.
#[derive(Clone, Debug)]
pub(crate) struct TensorSpec {
    pub name: String,
    pub dtype: Dtype,
    /// PyTorch order (`[out, in]` for a linear weight).
    pub shape: Vec<usize>,
    pub fill: Fill,
    /// Routed experts whose weights the tensor holds: 0 (spine), 1 (one expert's tensor) or
    /// all of the layer's (fused or stacked experts).
    pub experts: usize,
}

impl TensorSpec {
    /// A spine tensor.
    pub fn new(name: String, dtype: Dtype, shape: Vec<usize>, fill: Fill) -> Self {
        TensorSpec {
            name,
            dtype,
            shape,
            fill,
            experts: 0,
        }
    }

    /// Marks the tensor as holding `n` routed experts.
    pub fn experts(mut self, n: usize) -> Self {
        self.experts = n;
        self
    }

    fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }
}

/// A Hugging Face checkpoint to write: tensors in groups that never straddle shards (e.g. the
/// embeddings, a layer's spine, one expert), the config and the small side files.
pub(crate) struct HfCheckpoint {
    pub groups: Vec<Vec<TensorSpec>>,
    pub config: serde_json::Value,
    /// The bytes of `generation_config.json`, `tokenizer.json`, `tokenizer_config.json`.
    pub side_files: [&'static [u8]; 3],
    pub layers: usize,
    pub moe_layers: usize,
    pub experts: usize,
}

/// One safetensors shard: file name, header (8-byte length included) and tensors.
struct Shard<'a> {
    name: String,
    header: Vec<u8>,
    tensors: Vec<&'a TensorSpec>,
}

impl HfCheckpoint {
    /// Shards of consecutive groups up to `shard_bytes` each, and the small JSON files.
    fn layout(&self, shard_bytes: usize) -> (Vec<Shard<'_>>, Vec<(&'static str, Vec<u8>)>) {
        let mut parts: Vec<Vec<&TensorSpec>> = vec![vec![]];
        let mut in_shard = 0usize;
        for g in &self.groups {
            let gb: usize = g.iter().map(|t| t.bytes()).sum();
            if in_shard > 0 && in_shard + gb > shard_bytes {
                parts.push(vec![]);
                in_shard = 0;
            }
            parts.last_mut().expect("one shard").extend(g.iter());
            in_shard += gb;
        }
        let n = parts.len();
        let mut weight_map = serde_json::Map::new();
        let shards: Vec<Shard> = parts
            .into_iter()
            .enumerate()
            .map(|(i, tensors)| {
                let name = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
                let mut header = serde_json::Map::new();
                header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
                let mut off = 0usize;
                for t in &tensors {
                    let end = off + t.bytes();
                    header.insert(
                        t.name.clone(),
                        serde_json::json!({"dtype": t.dtype.name(), "shape": t.shape, "data_offsets": [off, end]}),
                    );
                    weight_map.insert(t.name.clone(), name.clone().into());
                    off = end;
                }
                let mut h = serde_json::Value::Object(header).to_string().into_bytes();
                while !(8 + h.len()).is_multiple_of(8) {
                    h.push(b' ');
                }
                let mut header = (h.len() as u64).to_le_bytes().to_vec();
                header.extend(h);
                Shard { name, header, tensors }
            })
            .collect();
        let total = self.tensor_bytes();
        let index =
            serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let mut small: Vec<(&'static str, Vec<u8>)> = vec![
            (
                "model.safetensors.index.json",
                index.to_string().into_bytes(),
            ),
            (
                "config.json",
                serde_json::to_vec_pretty(&self.config).expect("json"),
            ),
        ];
        let names = [
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ];
        small.extend(names.into_iter().zip(self.side_files.map(|b| b.to_vec())));
        (shards, small)
    }

    fn tensor_bytes(&self) -> u64 {
        self.groups.iter().flatten().map(|t| t.bytes() as u64).sum()
    }

    /// What [`Self::write`] writes with `shard_bytes`-byte shards, without writing it.
    pub(super) fn plan(&self, shard_bytes: usize) -> Planned {
        let (shards, small) = self.layout(shard_bytes);
        let mut files: Vec<(String, u64)> = shards
            .iter()
            .map(|s| {
                let data: usize = s.tensors.iter().map(|t| t.bytes()).sum();
                (s.name.clone(), (s.header.len() + data) as u64)
            })
            .collect();
        files.extend(small.iter().map(|(n, b)| (n.to_string(), b.len() as u64)));
        let routed: u64 = self
            .groups
            .iter()
            .flatten()
            .filter(|t| t.experts > 0)
            .map(|t| t.bytes() as u64)
            .sum();
        Planned {
            files,
            tensor_bytes: self.tensor_bytes(),
            expert_bytes: routed / (self.moe_layers * self.experts).max(1) as u64,
            layers: self.layers,
            moe_layers: self.moe_layers,
            experts: self.experts,
        }
    }

    /// Writes the folder `out` (created; must not hold a `config.json`).
    pub(super) fn write(
        &self,
        out: &Path,
        shard_bytes: usize,
        seed: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<()> {
        if out.join("config.json").exists() {
            bail!("{}: already holds a model (config.json)", out.display());
        }
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let (shards, small) = self.layout(shard_bytes);
        let total = self.tensor_bytes();
        let mut rng = Rng::seeded(seed);
        let mut bf16: Option<Bf16Uniform> = None;
        let mut written = 0u64;
        let mut buf = Vec::new();
        for shard in &shards {
            let path = out.join(&shard.name);
            let wr = |w: &mut std::io::BufWriter<std::fs::File>, b: &[u8]| {
                w.write_all(b)
                    .with_context(|| format!("writing {}", path.display()))
            };
            let f = std::fs::File::create(&path)
                .with_context(|| format!("creating {}", path.display()))?;
            let mut w = std::io::BufWriter::with_capacity(8 << 20, f);
            wr(&mut w, &shard.header)?;
            for t in &shard.tensors {
                buf.resize(t.bytes(), 0);
                fill_tensor(&mut rng, &mut bf16, t, &mut buf);
                wr(&mut w, &buf)?;
                written += buf.len() as u64;
                progress(written, total);
            }
            w.flush()
                .with_context(|| format!("writing {}", path.display()))?;
        }
        for (name, bytes) in small {
            let p = out.join(name);
            std::fs::write(&p, bytes).with_context(|| format!("writing {}", p.display()))?;
        }
        Ok(())
    }
}

/// Fills `buf` with `t`'s values; `bf16` caches the lookup table of the last BF16 scale.
fn fill_tensor(rng: &mut Rng, bf16: &mut Option<Bf16Uniform>, t: &TensorSpec, buf: &mut [u8]) {
    match (t.fill, t.dtype) {
        (Fill::Const(v), Dtype::BF16) => fill::repeat(&half::bf16::from_f32(v).to_le_bytes(), buf),
        (Fill::Const(v), Dtype::F32) => fill::repeat(&v.to_le_bytes(), buf),
        (Fill::Uniform(s), Dtype::BF16) => {
            if bf16.as_ref().is_none_or(|u| u.scale != s) {
                *bf16 = Some(Bf16Uniform::new(s));
            }
            bf16.as_ref().expect("set").fill(rng, buf)
        }
        (Fill::Uniform(s), Dtype::F32) => fill::f32_uniform(rng, s, buf),
        (Fill::Fp8, Dtype::F8E4M3) => fill::fp8_e4m3(rng, buf),
        (Fill::Bytes, Dtype::U8) => fill::bytes(rng, buf),
        (Fill::E8m0 { lo }, Dtype::U8) => fill::e8m0(rng, lo, buf),
        (f, d) => unreachable!("tensor {}: fill {f:?} for dtype {d:?}", t.name),
    }
}

/// Spec helpers shared by the architectures: the token embeddings `[vocab, hidden]` uniform in
/// `±1` (BF16) as the first group, the final norm and the LM head as the last, a linear weight
/// `[out, in]` uniform in `±1/√in`, a norm weight of ones, a vector uniform in `±scale`.
pub(crate) fn embeddings(vocab: usize, hidden: usize) -> Vec<TensorSpec> {
    vec![TensorSpec::new(
        "model.embed_tokens.weight".into(),
        Dtype::BF16,
        vec![vocab, hidden],
        Fill::Uniform(1.0),
    )]
}

pub(crate) fn norm_and_head(vocab: usize, hidden: usize) -> Vec<TensorSpec> {
    vec![
        ones_bf16("model.norm.weight".into(), hidden),
        linear_bf16("lm_head.weight".into(), vocab, hidden),
    ]
}

pub(crate) fn linear_bf16(name: String, out: usize, inp: usize) -> TensorSpec {
    TensorSpec::new(
        name,
        Dtype::BF16,
        vec![out, inp],
        Fill::Uniform(1.0 / (inp as f32).sqrt()),
    )
}

pub(crate) fn ones_bf16(name: String, n: usize) -> TensorSpec {
    TensorSpec::new(name, Dtype::BF16, vec![n], Fill::Const(1.0))
}

pub(crate) fn vector_bf16(name: String, n: usize, scale: f32) -> TensorSpec {
    TensorSpec::new(name, Dtype::BF16, vec![n], Fill::Uniform(scale))
}
