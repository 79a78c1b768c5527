//! The device a decoder computes on (`--device`): the model-side half of the backend seam.
//!
//! [`Device`] is a [`Backend`] that can also hold a sequence's cache slots (keys and values,
//! latent rows, recurrent states): the CPU's are the cache's own vectors ([`KvCache::k`],
//! [`KvCache::v`], [`KvCache::state`]); a GPU's are device allocations kept per layer in
//! [`KvCache::dev`], each made at its layer's first use. A decoder holds the CPU (with its
//! numerics) and, when `--device` picked one, an open CUDA device ([`open_cuda`], deciding
//! with [`choose_device`]).

use anyhow::{anyhow, bail, Result};

use super::KvCache;
use crate::backend::cpu::{Cpu, Numerics};
use crate::backend::cuda::{Cuda, CudaBuf};
use crate::backend::{Backend, DeviceKind, Op};

/// A backend a decoder's pass runs on: its ops plus the KV cache slots of a sequence.
pub trait Device: Backend {
    /// Layer `l`'s key and value slots of `cache` (`kv_dim` floats a position,
    /// position-major) in this device's memory, holding at least positions `0 .. upto` (at
    /// most `n_ctx`): on the CPU the cache's vectors grown to `upto`
    /// ([`KvCache::reserve_rows`]); on a GPU `n_ctx` positions allocated (zeros) at the first
    /// call for a cache that has none there.
    ///
    /// Errors: an allocation failing; a cache whose slots belong to another device.
    #[allow(clippy::type_complexity)]
    fn kv_slots<'c>(
        &self,
        cache: &'c mut KvCache,
        l: usize,
        upto: usize,
    ) -> Result<(&'c mut Self::Buf, &'c mut Self::Buf)>;
    /// Layer `l`'s latent slot of a latent `cache` (multi-head latent attention:
    /// `width` floats a position, position-major; [`KvCache::new_latent`]) in this device's
    /// memory, holding at least positions `0 .. upto`, as [`Device::kv_slots`].
    ///
    /// Errors: an allocation failing; a layer the cache has none for (a recurrent layer, or
    /// on a GPU a layer whose slot already holds keys and values).
    fn latent_slot<'c>(
        &self,
        cache: &'c mut KvCache,
        l: usize,
        upto: usize,
    ) -> Result<&'c mut Self::Buf>;
    /// Layer `l`'s recurrent state slot of `cache` ([`KvCache::with_state`]) in this device's
    /// memory.
    ///
    /// Errors: an allocation or upload failing; a layer the cache keeps no state for.
    fn state_slot<'c>(&self, cache: &'c mut KvCache, l: usize) -> Result<&'c mut Self::Buf>;
}

impl Device for Cpu {
    fn kv_slots<'c>(
        &self,
        cache: &'c mut KvCache,
        l: usize,
        upto: usize,
    ) -> Result<(&'c mut Vec<f32>, &'c mut Vec<f32>)> {
        if cache.state.get(l).is_some_and(|s| !s.is_empty()) {
            bail!("no keys and values of layer {l} in the cache (a recurrent layer)");
        }
        let (n_ctx, kv_dim) = (cache.n_ctx, cache.kv_dim);
        let KvCache { k, v, .. } = cache;
        let (k, v) = (
            k.get_mut(l)
                .ok_or_else(|| anyhow!("no layer {l} in the KV cache"))?,
            &mut v[l],
        );
        KvCache::reserve_rows(k, upto, n_ctx, kv_dim);
        KvCache::reserve_rows(v, upto, n_ctx, kv_dim);
        Ok((k, v))
    }

    fn latent_slot<'c>(
        &self,
        cache: &'c mut KvCache,
        l: usize,
        upto: usize,
    ) -> Result<&'c mut Vec<f32>> {
        if cache.state.get(l).is_some_and(|s| !s.is_empty()) {
            bail!("no latent rows of layer {l} in the cache (a recurrent layer)");
        }
        let (n_ctx, width) = (cache.n_ctx, cache.kv_dim);
        let k = cache
            .k
            .get_mut(l)
            .ok_or_else(|| anyhow!("no layer {l} in the KV cache"))?;
        KvCache::reserve_rows(k, upto, n_ctx, width);
        Ok(k)
    }

    fn state_slot<'c>(&self, cache: &'c mut KvCache, l: usize) -> Result<&'c mut Vec<f32>> {
        cache
            .state
            .get_mut(l)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| anyhow!("no recurrent state of layer {l} in the cache"))
    }
}

/// One layer's slot of a cache on a CUDA device, made at the first pass that asks for it.
enum Slot {
    /// Not asked for yet.
    Empty,
    /// Keys and values, `n_ctx × kv_dim` floats each.
    Kv(CudaBuf, CudaBuf),
    /// Latent rows (MLA), `n_ctx × kv_dim` floats.
    Latent(CudaBuf),
    /// A recurrent state, as many floats as the host's `KvCache::state` of the layer.
    State(CudaBuf),
}

impl Slot {
    fn what(&self) -> &'static str {
        match self {
            Slot::Empty => "nothing",
            Slot::Kv(..) => "keys and values",
            Slot::Latent(_) => "latent rows",
            Slot::State(_) => "a recurrent state",
        }
    }
}

/// A cache's slots on a CUDA device, one per layer ([`KvCache::dev`]).
struct CudaSlots(Vec<Slot>);

impl Cuda {
    /// Layer `l`'s slot of `cache` on this device, the cache's slots made (empty) at the
    /// first call. Errors: a cache whose slots belong to another device, no layer `l`.
    fn slot<'c>(&self, cache: &'c mut KvCache, l: usize) -> Result<&'c mut Slot> {
        let layers = cache.k.len();
        let slots = cache
            .dev
            .get_or_insert_with(|| Box::new(CudaSlots((0..layers).map(|_| Slot::Empty).collect())));
        let slots = slots
            .downcast_mut::<CudaSlots>()
            .ok_or_else(|| anyhow!("a KV cache of another device used on {}", self.name()))?;
        slots
            .0
            .get_mut(l)
            .ok_or_else(|| anyhow!("no layer {l} in the KV cache"))
    }
}

impl Device for Cuda {
    fn kv_slots<'c>(
        &self,
        cache: &'c mut KvCache,
        l: usize,
        _upto: usize,
    ) -> Result<(&'c mut CudaBuf, &'c mut CudaBuf)> {
        let floats = cache.n_ctx * cache.kv_dim;
        let slot = self.slot(cache, l)?;
        if let Slot::Empty = slot {
            *slot = Slot::Kv(self.zeros(floats)?, self.zeros(floats)?);
        }
        match slot {
            Slot::Kv(k, v) => Ok((k, v)),
            s => bail!(
                "layer {l} of the cache holds {}, not keys and values",
                s.what()
            ),
        }
    }

    fn latent_slot<'c>(
        &self,
        cache: &'c mut KvCache,
        l: usize,
        _upto: usize,
    ) -> Result<&'c mut CudaBuf> {
        if cache.state.get(l).is_some_and(|s| !s.is_empty()) {
            bail!("no latent rows of layer {l} in the cache (a recurrent layer)");
        }
        let floats = cache.n_ctx * cache.kv_dim;
        let slot = self.slot(cache, l)?;
        if let Slot::Empty = slot {
            *slot = Slot::Latent(self.zeros(floats)?);
        }
        match slot {
            Slot::Latent(c) => Ok(c),
            s => bail!("layer {l} of the cache holds {}, not latent rows", s.what()),
        }
    }

    fn state_slot<'c>(&self, cache: &'c mut KvCache, l: usize) -> Result<&'c mut CudaBuf> {
        if cache.state.get(l).is_none_or(|s| s.is_empty()) {
            bail!("no recurrent state of layer {l} in the cache");
        }
        // the device's copy starts as the host's state (zeros: `KvCache::clear` drops the
        // device slots of a cache with a state, so a cleared state starts over from here)
        if let Slot::Empty = self.slot(cache, l)? {
            let buf = self.upload(&cache.state[l])?;
            *self.slot(cache, l)? = Slot::State(buf);
        }
        let slot = self.slot(cache, l)?;
        match slot {
            Slot::State(s) => Ok(s),
            s => bail!(
                "layer {l} of the cache holds {}, not a recurrent state",
                s.what()
            ),
        }
    }
}

/// Where a family runs for a `--device` choice ([`choose_device`]), before any device is
/// opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The CPU; `note` says why not the GPU when it matters (a GPU was found but the
    /// family needs ops whose kernels have not run on one yet): `cuda: OPS not yet verified
    /// on a GPU`, shown in the placement line as `device cpu (NOTE)`.
    Cpu { note: Option<String> },
    /// CUDA device `ordinal`; `warning` names the ops the family needs whose kernels have
    /// not yet run on a GPU ([`crate::backend::cuda::UNVERIFIED`]), printed to stderr.
    Cuda {
        ordinal: usize,
        warning: Option<String>,
    },
}

/// The device `kind` picks for the family `family`, whose layers need the ops `needs` beyond
/// the core set ([`crate::backend::Op`]) and which computes in `numerics` on the CPU, where
/// `gpu_found` says whether a CUDA device opens. Pure: the one decision of [`open_cuda`].
///
/// - `cpu`: the CPU.
/// - `cuda:N`: refused for a family needing an op of [`crate::backend::cuda::MISSING`] or
///   for `--numerics q8`; else device N, with a warning naming the needed ops of
///   [`crate::backend::cuda::UNVERIFIED`] when there are any (the GPU runs them anyway).
/// - `auto`: device 0 when a GPU is found, the family needs no missing and no unverified op,
///   and the numerics are exact; else the CPU, with a note naming the unverified ops when
///   they alone kept it off a GPU that was found.
///
/// Errors: `FAMILY on cuda:N: cuda lacks OPS (not implemented on cuda yet); run it with
/// --device cpu`; `--numerics q8 is CPU arithmetic; cuda:N computes in f32`.
pub fn choose_device(
    kind: DeviceKind,
    family: &str,
    needs: &[Op],
    numerics: Numerics,
    gpu_found: bool,
) -> Result<DeviceChoice> {
    use crate::backend::cuda::{MISSING, UNVERIFIED};
    choose_device_from(
        kind,
        family,
        needs,
        numerics,
        gpu_found,
        [MISSING, UNVERIFIED],
    )
}

/// [`choose_device`] with the lists of the ops CUDA lacks and those not yet verified given
/// (`[missing, unverified]`), so that each rule is tested whatever the lists hold today.
fn choose_device_from(
    kind: DeviceKind,
    family: &str,
    needs: &[Op],
    numerics: Numerics,
    gpu_found: bool,
    [missing, unverified_ops]: [&[Op]; 2],
) -> Result<DeviceChoice> {
    let named = |list: &[Op]| -> Vec<&'static str> {
        needs
            .iter()
            .filter(|o| list.contains(o))
            .map(|o| o.name())
            .collect()
    };
    let (lacking, unverified) = (named(missing), named(unverified_ops));
    match kind {
        DeviceKind::Cpu => Ok(DeviceChoice::Cpu { note: None }),
        DeviceKind::Cuda(n) => {
            if !lacking.is_empty() {
                bail!(
                    "{family} on cuda:{n}: cuda lacks {} (not implemented on cuda yet); run it with --device cpu",
                    lacking.join(", ")
                );
            }
            if numerics != Numerics::Exact {
                bail!("--numerics {numerics} is CPU arithmetic; cuda:{n} computes in f32");
            }
            let warning = (!unverified.is_empty()).then(|| {
                format!(
                    "warning: {family} on cuda:{n} runs kernels not yet verified on a GPU ({}); \
                     compare its output with --device cpu",
                    unverified.join(", ")
                )
            });
            Ok(DeviceChoice::Cuda {
                ordinal: n,
                warning,
            })
        }
        DeviceKind::Auto => {
            if !lacking.is_empty() || numerics != Numerics::Exact || !gpu_found {
                return Ok(DeviceChoice::Cpu { note: None });
            }
            if !unverified.is_empty() {
                let note = format!("cuda: {} not yet verified on a GPU", unverified.join(", "));
                return Ok(DeviceChoice::Cpu { note: Some(note) });
            }
            Ok(DeviceChoice::Cuda {
                ordinal: 0,
                warning: None,
            })
        }
    }
}

/// The CUDA device `kind` names, or `None` for the CPU, for the family `family` (needs and
/// numerics as [`choose_device`], which decides; the one place a family is refused on a
/// device), with the device as the placement line names it: `cpu`, `cpu (cuda: OPS not yet
/// verified on a GPU)` or the GPU's name. A warning about unverified kernels is printed to
/// stderr when `cuda:N` runs them. `auto` looks for GPUs only when the family could use one.
///
/// Errors: [`choose_device`]'s; a CUDA device that does not open ([`Cuda::open`]'s message).
pub fn open_cuda(
    kind: DeviceKind,
    family: &str,
    needs: &[Op],
    numerics: Numerics,
) -> Result<(Option<Box<Cuda>>, String)> {
    let could_use = kind == DeviceKind::Auto
        && numerics == Numerics::Exact
        && !needs
            .iter()
            .any(|o| crate::backend::cuda::MISSING.contains(o));
    let gpu_found = could_use && !Cuda::devices().is_empty();
    match choose_device(kind, family, needs, numerics, gpu_found)? {
        DeviceChoice::Cpu { note } => {
            let name = match note {
                Some(n) => format!("cpu ({n})"),
                None => "cpu".to_string(),
            };
            Ok((None, name))
        }
        DeviceChoice::Cuda { ordinal, warning } => {
            let opened = Cuda::open(ordinal);
            let c = match (kind, opened) {
                (_, Ok(c)) => c,
                (DeviceKind::Auto, Err(_)) => return Ok((None, "cpu".to_string())),
                (_, Err(e)) => return Err(e),
            };
            if let Some(w) = warning {
                eprintln!("{w}");
            }
            let name = c.name();
            Ok((Some(Box::new(c)), name))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MLA: &[Op] = &[Op::MlaAttention, Op::NormHead, Op::RopeTail];
    const GPT_OSS: &[Op] = &[Op::Bias, Op::MatmulT, Op::SwigluOai];

    /// The rules with an op listed as unverified (the lists are empty today: every kernel
    /// has passed its tests on an H100).
    const LISTS: [&[Op]; 2] = [&[], &[Op::MatmulT]];

    #[test]
    fn auto_keeps_a_family_with_unverified_kernels_on_the_cpu_and_says_so() {
        let exact = Numerics::Exact;
        let choose = |kind, family, needs, numerics, gpu| {
            choose_device_from(kind, family, needs, numerics, gpu, LISTS).unwrap()
        };
        // a GPU found: the GQA families take it, a family needing unverified ops does not
        assert_eq!(
            choose(DeviceKind::Auto, "llama", &[], exact, true),
            DeviceChoice::Cuda {
                ordinal: 0,
                warning: None
            }
        );
        assert_eq!(
            choose(DeviceKind::Auto, "gpt_oss", GPT_OSS, exact, true),
            DeviceChoice::Cpu {
                note: Some("cuda: matmul_host_t not yet verified on a GPU".into())
            }
        );
        assert_eq!(
            choose(DeviceKind::Auto, "deepseek_v3", MLA, exact, true),
            DeviceChoice::Cuda {
                ordinal: 0,
                warning: None
            }
        );
        // no GPU, or CPU arithmetic: the CPU with nothing to say
        for (numerics, gpu) in [(exact, false), (Numerics::Q8, true)] {
            for needs in [&[][..], GPT_OSS] {
                assert_eq!(
                    choose(DeviceKind::Auto, "x", needs, numerics, gpu),
                    DeviceChoice::Cpu { note: None }
                );
            }
        }
        assert_eq!(
            choose(DeviceKind::Cpu, "gpt_oss", GPT_OSS, exact, true),
            DeviceChoice::Cpu { note: None }
        );
    }

    /// A family needing an op CUDA lacks (none today) is refused on `cuda:N` by name and kept
    /// on the CPU by `auto` without a note.
    #[test]
    fn a_missing_op_refuses_cuda_and_auto_takes_the_cpu() {
        let lists: [&[Op]; 2] = [&[Op::MatmulT], &[]];
        let e = choose_device_from(
            DeviceKind::Cuda(0),
            "gpt_oss",
            GPT_OSS,
            Numerics::Exact,
            true,
            lists,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "gpt_oss on cuda:0: cuda lacks matmul_host_t (not implemented on cuda yet); run it \
             with --device cpu"
        );
        let c = choose_device_from(
            DeviceKind::Auto,
            "gpt_oss",
            GPT_OSS,
            Numerics::Exact,
            true,
            lists,
        );
        assert_eq!(c.unwrap(), DeviceChoice::Cpu { note: None });
    }

    #[test]
    fn every_family_takes_a_found_gpu_under_auto_now_that_every_kernel_passed_on_one() {
        for (family, needs) in [
            ("gpt_oss", GPT_OSS),
            ("deepseek_v3", MLA),
            ("llama", &[][..]),
        ] {
            assert_eq!(
                choose_device(DeviceKind::Auto, family, needs, Numerics::Exact, true).unwrap(),
                DeviceChoice::Cuda {
                    ordinal: 0,
                    warning: None
                },
                "{family}"
            );
        }
    }

    #[test]
    fn cuda_runs_unverified_kernels_with_a_warning_naming_them() {
        assert_eq!(
            choose_device_from(
                DeviceKind::Cuda(1),
                "gpt_oss",
                GPT_OSS,
                Numerics::Exact,
                false,
                LISTS
            )
            .unwrap(),
            DeviceChoice::Cuda {
                ordinal: 1,
                warning: Some(
                    "warning: gpt_oss on cuda:1 runs kernels not yet verified on a GPU \
                     (matmul_host_t); compare its output with --device cpu"
                        .into()
                )
            }
        );
        assert_eq!(
            choose_device(DeviceKind::Cuda(0), "qwen3", &[], Numerics::Exact, true).unwrap(),
            DeviceChoice::Cuda {
                ordinal: 0,
                warning: None
            }
        );
        let e = choose_device(DeviceKind::Cuda(0), "qwen3", &[], Numerics::Q8, true).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--numerics q8 is CPU arithmetic; cuda:0 computes in f32"
        );
    }

    /// On a GPU (skipped without one): a latent cache's slots on the device, the state
    /// slot starting from the host's state and starting over after `KvCache::clear`, and a
    /// layer's slot asked for as something else refused.
    #[test]
    fn latent_and_state_slots_on_a_gpu() {
        let dev = match Cuda::open(0) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("CUDA slot test skipped: {e:#}");
                return;
            }
        };
        // layer 0 latent (4 positions of 3 floats), layer 1 recurrent (5 floats)
        let mut c = KvCache::new_latent(2, 4, 3).with_state(&[0, 5]);
        assert!(c.k[0].is_empty(), "no host latent rows");
        let down = |b: &CudaBuf| {
            let mut v = vec![f32::NAN; b.len()];
            dev.download(b, &mut v).unwrap();
            v
        };
        let lat = dev.latent_slot(&mut c, 0, 4).unwrap();
        assert_eq!(down(lat), vec![0.0; 12]);
        let st = dev.state_slot(&mut c, 1).unwrap();
        assert_eq!(down(st), vec![0.0; 5]);
        *st = dev.upload(&[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
        assert_eq!(down(dev.state_slot(&mut c, 1).unwrap())[4], 5.0, "kept");
        let e = dev.latent_slot(&mut c, 1, 4).unwrap_err().to_string();
        assert_eq!(
            e,
            "no latent rows of layer 1 in the cache (a recurrent layer)"
        );
        let e = dev.kv_slots(&mut c, 0, 4).unwrap_err().to_string();
        assert_eq!(
            e,
            "layer 0 of the cache holds latent rows, not keys and values"
        );
        c.clear();
        assert!(
            c.dev.is_none(),
            "clear drops the device slots of a recurrent cache"
        );
        assert_eq!(down(dev.state_slot(&mut c, 1).unwrap()), vec![0.0; 5]);
        let e = dev.state_slot(&mut c, 0).unwrap_err().to_string();
        assert_eq!(e, "no recurrent state of layer 0 in the cache");
    }

    #[test]
    fn every_op_has_a_kernel_verified_on_a_gpu() {
        use crate::backend::cuda::{MISSING, UNVERIFIED};
        assert!(MISSING.is_empty());
        assert!(UNVERIFIED.is_empty());
    }
}
