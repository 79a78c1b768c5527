//! The CUDA backend's place. This build has none: [`Cuda::open`] says so and
//! [`Cuda::devices`] lists nothing, so `--device auto` falls back to the CPU. The type
//! implements [`Backend`] over an uninhabited device, so the trait's every op has its slot
//! here and the code around it compiles everywhere, with or without a GPU or a CUDA toolkit
//! (as candle keeps its dummy CUDA backend). ARCHITECTURE.md, "Adding a compute device", says
//! what fills it: the driver loaded at run time (`cudarc` with dynamic loading), kernels from
//! committed `.cu` sources, and device buffers for [`Backend::Buf`] and
//! [`Backend::Weights`].

use anyhow::{bail, Result};

use super::{AttnShape, Backend, Glu, MlaProj, MlaShape};

/// Nothing: no value of it exists in this build.
#[derive(Clone, Copy, Debug)]
enum Never {}

/// A CUDA device (none in this build: no value of this type can be made).
#[derive(Debug)]
pub struct Cuda {
    never: Never,
}

/// A buffer in a CUDA device's memory (none in this build).
#[derive(Debug)]
pub enum CudaBuf {}

/// A weight matrix in a CUDA device's memory (none in this build).
#[derive(Clone, Copy, Debug)]
pub enum CudaWeights {}

impl Cuda {
    /// The usable CUDA devices, by name: none in this build.
    pub fn devices() -> Vec<String> {
        Vec::new()
    }

    /// Opens CUDA device `ordinal`.
    ///
    /// Errors: always, in this build: `cuda:N: this build of deltafin has no CUDA backend;
    /// use --device cpu`.
    pub fn open(ordinal: usize) -> Result<Self> {
        bail!("cuda:{ordinal}: this build of deltafin has no CUDA backend; use --device cpu")
    }
}

impl Backend for Cuda {
    type Buf = CudaBuf;
    type Weights<'a> = CudaWeights;

    fn name(&self) -> String {
        match self.never {}
    }
    fn run_pass<R: Send>(&self, _: impl FnOnce() -> R + Send) -> R {
        match self.never {}
    }
    fn zeros(&self, _: usize) -> Result<CudaBuf> {
        match self.never {}
    }
    fn upload(&self, _: &[f32]) -> Result<CudaBuf> {
        match self.never {}
    }
    fn download(&self, _: &CudaBuf, _: &mut [f32]) -> Result<()> {
        match self.never {}
    }
    fn matmul(&self, _: CudaWeights, _: &CudaBuf, _: usize, _: &mut CudaBuf) -> Result<()> {
        match self.never {}
    }
    fn embed_rows(&self, _: CudaWeights, _: &[u32], _: &mut CudaBuf) -> Result<()> {
        match self.never {}
    }
    fn rms_norm_rows(&self, _: &CudaBuf, _: &[f32], _: f32, _: &mut CudaBuf) -> Result<()> {
        match self.never {}
    }
    fn rope(
        &self,
        _: &mut CudaBuf,
        _: usize,
        _: usize,
        _: usize,
        _: &[f32],
        _: bool,
        _: f32,
    ) -> Result<()> {
        match self.never {}
    }
    fn attention(
        &self,
        _: &AttnShape,
        _: &CudaBuf,
        _: &CudaBuf,
        _: &CudaBuf,
        _: usize,
        _: Option<&[f32]>,
        _: &mut CudaBuf,
    ) -> Result<()> {
        match self.never {}
    }
    fn mla_attention(
        &self,
        _: &MlaShape,
        _: &CudaBuf,
        _: MlaProj<CudaWeights>,
        _: &CudaBuf,
        _: usize,
        _: &mut CudaBuf,
    ) -> Result<()> {
        match self.never {}
    }
    fn kda_scan(
        &self,
        _: usize,
        _: usize,
        _: usize,
        _: [&CudaBuf; 4],
        _: &CudaBuf,
        _: &mut CudaBuf,
        _: &mut CudaBuf,
    ) -> Result<()> {
        match self.never {}
    }
    fn glu(&self, _: Glu, _: &mut CudaBuf, _: &CudaBuf) -> Result<()> {
        match self.never {}
    }
    fn softcap(&self, _: &mut CudaBuf, _: f32) -> Result<()> {
        match self.never {}
    }
    fn add(&self, _: &mut CudaBuf, _: &CudaBuf) -> Result<()> {
        match self.never {}
    }
    fn gather_rows(&self, _: &CudaBuf, _: usize, _: &[usize], _: &mut CudaBuf) -> Result<()> {
        match self.never {}
    }
    fn scatter_add_rows(
        &self,
        _: &CudaBuf,
        _: usize,
        _: &[usize],
        _: &[f32],
        _: &mut CudaBuf,
    ) -> Result<()> {
        match self.never {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_build_finds_no_cuda_device_and_says_so() {
        assert!(Cuda::devices().is_empty());
        assert_eq!(
            Cuda::open(1).unwrap_err().to_string(),
            "cuda:1: this build of deltafin has no CUDA backend; use --device cpu"
        );
    }
}
