//! The device a decoder computes on (`--device`): the model-side half of the backend seam.
//!
//! [`Device`] is a [`Backend`] that can also hold a sequence's KV cache slots: the CPU's are
//! the cache's own vectors ([`KvCache::k`], [`KvCache::v`]); a GPU's are device allocations
//! kept in [`KvCache::dev`], made at the first pass that needs them. A decoder holds the CPU
//! (with its numerics) and, when `--device` picked one, an open CUDA device ([`open_cuda`]).

use anyhow::{anyhow, bail, Result};

use super::KvCache;
use crate::backend::cpu::{Cpu, Numerics};
use crate::backend::cuda::{Cuda, CudaBuf};
use crate::backend::{Backend, DeviceKind, Op};

/// A backend a decoder's pass runs on: its ops plus the KV cache slots of a sequence.
pub trait Device: Backend {
    /// Layer `l`'s key and value slots of `cache` (`n_ctx × kv_dim` floats each,
    /// position-major) in this device's memory, allocated (zeros) at the first call for a
    /// cache that has none here.
    ///
    /// Errors: an allocation failing; a cache whose slots belong to another device.
    #[allow(clippy::type_complexity)]
    fn kv_slots<'c>(
        &self,
        cache: &'c mut KvCache,
        l: usize,
    ) -> Result<(&'c mut Self::Buf, &'c mut Self::Buf)>;
    /// Layer `l`'s latent slot of a latent `cache` (multi-head latent attention:
    /// `n_ctx × width` floats, position-major; [`KvCache::new_latent`]) in this device's memory.
    ///
    /// Errors: a device without latent slots yet (CUDA), a layer the cache has none for.
    fn latent_slot<'c>(&self, cache: &'c mut KvCache, l: usize) -> Result<&'c mut Self::Buf>;
    /// Layer `l`'s recurrent state slot of `cache` ([`KvCache::with_state`]) in this device's
    /// memory.
    ///
    /// Errors: a device without state slots yet (CUDA), a layer the cache keeps no state for.
    fn state_slot<'c>(&self, cache: &'c mut KvCache, l: usize) -> Result<&'c mut Self::Buf>;
}

impl Device for Cpu {
    fn kv_slots<'c>(
        &self,
        cache: &'c mut KvCache,
        l: usize,
    ) -> Result<(&'c mut Vec<f32>, &'c mut Vec<f32>)> {
        let need = cache.n_ctx * cache.kv_dim;
        let KvCache { k, v, .. } = cache;
        let (k, v) = (&mut k[l], &mut v[l]);
        if k.len() < need || v.len() < need {
            // a cache made for a GPU, now used on the CPU
            k.resize(need, 0.0);
            v.resize(need, 0.0);
        }
        Ok((k, v))
    }

    fn latent_slot<'c>(&self, cache: &'c mut KvCache, l: usize) -> Result<&'c mut Vec<f32>> {
        let need = cache.n_ctx * cache.kv_dim;
        let k = cache
            .k
            .get_mut(l)
            .filter(|k| k.len() >= need)
            .ok_or_else(|| anyhow!("no latent rows of layer {l} in the cache"))?;
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

/// A cache's key and value slots on a CUDA device, one pair per layer.
struct CudaSlots(Vec<(CudaBuf, CudaBuf)>);

impl Device for Cuda {
    fn kv_slots<'c>(
        &self,
        cache: &'c mut KvCache,
        l: usize,
    ) -> Result<(&'c mut CudaBuf, &'c mut CudaBuf)> {
        if cache.dev.is_none() {
            let floats = cache.n_ctx * cache.kv_dim;
            let slots = (0..cache.k.len())
                .map(|_| Ok((self.zeros(floats)?, self.zeros(floats)?)))
                .collect::<Result<Vec<_>>>()?;
            cache.dev = Some(Box::new(CudaSlots(slots)));
        }
        let slots = cache
            .dev
            .as_mut()
            .and_then(|d| d.downcast_mut::<CudaSlots>())
            .ok_or_else(|| anyhow!("a KV cache of another device used on {}", self.name()))?;
        let (k, v) = slots
            .0
            .get_mut(l)
            .ok_or_else(|| anyhow!("no layer {l} in the KV cache"))?;
        Ok((k, v))
    }

    fn latent_slot<'c>(&self, _: &'c mut KvCache, _: usize) -> Result<&'c mut CudaBuf> {
        bail!(
            "{}: latent cache slots are not implemented on cuda",
            self.name()
        )
    }

    fn state_slot<'c>(&self, _: &'c mut KvCache, _: usize) -> Result<&'c mut CudaBuf> {
        bail!(
            "{}: recurrent state slots are not implemented on cuda",
            self.name()
        )
    }
}

/// The CUDA device `kind` names, or `None` for the CPU, for the family `family` whose
/// layers need the ops `needs` beyond the core set ([`crate::backend::Op`]) and which
/// computes in `numerics` on the CPU. The one place a family is refused on a device that
/// lacks an op it needs ([`crate::backend::cuda::MISSING`]). `auto`: the first CUDA device
/// that opens when the family needs no missing op and computes in exact numerics, else the
/// CPU.
///
/// Errors: `cuda:N` for a family needing ops CUDA lacks (`FAMILY on cuda:N: cuda lacks OPS;
/// run it with --device cpu`), a CUDA device that does not open ([`Cuda::open`]'s message),
/// `--numerics q8` on a GPU.
pub fn open_cuda(
    kind: DeviceKind,
    family: &str,
    needs: &[Op],
    numerics: Numerics,
) -> Result<Option<Box<Cuda>>> {
    let lacking: Vec<&str> = needs
        .iter()
        .filter(|o| crate::backend::cuda::MISSING.contains(o))
        .map(|o| o.name())
        .collect();
    match kind {
        DeviceKind::Cpu => Ok(None),
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
            Ok(Some(Box::new(Cuda::open(n)?)))
        }
        DeviceKind::Auto => {
            let gpu =
                lacking.is_empty() && numerics == Numerics::Exact && !Cuda::devices().is_empty();
            match gpu.then(|| Cuda::open(0)) {
                Some(Ok(c)) => Ok(Some(Box::new(c))),
                _ => Ok(None),
            }
        }
    }
}
