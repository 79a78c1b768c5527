//! The CUDA backend: an NVIDIA GPU behind [`Backend`].
//!
//! Nothing of CUDA is needed to build or to run elsewhere: the driver (`libcuda`), NVRTC and
//! cuBLAS are loaded at run time through `cudarc`'s dynamic loading, so [`Cuda::open`] on a
//! machine without them returns an error that says which is missing, and `--device auto`
//! can fall back to the CPU. The kernels are committed CUDA C++ sources (`kernels/*.cu`),
//! compiled by NVRTC for the device's architecture at its first use and cached per process
//! (`kernels.rs`).
//!
//! Buffers ([`CudaBuf`]) are f32 device allocations; weights ([`CudaMatrix`]) are a matrix's
//! stored bytes copied to the device once, read by the product kernels in their encoding
//! (F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q6_K, MXFP4, FP8 with 128-element block scales:
//! [`DEVICE_TYPES`]); any other type is dequantized to F32 on upload (4 bytes per weight,
//! [`CudaMatrix::dequantized_from`] says so). Every op is queued on the device's one stream,
//! in call order; [`Backend::download`] waits for it.
//!
//! Files: `ops.rs` (the [`Backend`] ops), `matmul.rs` (the matrix products: the `mv_*`
//! kernels for 1 to 8 rows, dequantized panels through cuBLAS for more), `mla_kda.rs`
//! (multi-head latent attention and the KDA scan), `family_ops.rs` (the other ops only some
//! families need: MLA's partial norm and RoPE, the KDA convolution, L2 norms, decay,
//! sigmoids and gated norm, Kimi K3's residual mix, GPT-OSS's biases, input-major products
//! and clamped SwiGLU), `kernels.rs` (the NVRTC program), `kernels/` (the CUDA sources:
//! `decode.cuh` the block decoders, `matvec.cu`, `ops.cu`, `attention.cu`, `mla_kda.cu`,
//! `family_ops.cu`), `tests.rs` (each op against the CPU's, on a GPU when one is found).
//!
//! Weights the models hand over as host bytes ([`Backend::matmul_host`]): a resident unit's
//! matrix is copied at its first use and kept, found by its host address
//! ([`Cuda::resident_matrix`]); any other (a streamed unit, a routed expert) is copied for
//! the one product ([`Cuda::weight_bytes`] counts both).
//!
//! Every op of the trait has a kernel ([`MISSING`] is empty), and every kernel has passed its
//! tests on an H100 ([`UNVERIFIED`] is empty): `--device auto` takes a found GPU for every
//! family.
//! Not yet here (ARCHITECTURE.md, "Adding a compute device"): pinned staging buffers, a copy
//! stream, a VRAM expert cache.

mod family_ops;
mod kernels;
mod matmul;
mod mla_kda;
mod ops;
mod seqs;

/// The [`crate::backend::Op`]s this backend has no kernel for yet (none: every op of the
/// trait has one). A family whose layers need one is refused on CUDA by name
/// (`models::device::open_cuda`); an op added to the trait is listed here, with a stub
/// returning `cuda:N: OP is not implemented on cuda`, until its kernel exists.
pub const MISSING: &[crate::backend::Op] = &[];

/// The [`crate::backend::Op`]s whose kernels have not yet passed their op tests on a GPU:
/// written and checked without one (NVRTC compiles them; `tools/cuda_emu` runs their source
/// on the host against the CPU's formulas). `--device auto` keeps a family needing one of
/// them on the CPU; `--device cuda` runs it with a warning (`models::device::open_cuda`). An
/// op leaves this list when its GPU tests have passed on a device.
///
/// The MLA, KDA, Kimi K3 and GPT-OSS kernels written without a GPU ran on an H100 in
/// session 20 (`tools/bench/device_gpu.sh`): their op tests passed and every family's
/// logits on the GPU matched the CPU's (worst relative difference 1.36e-5, Kimi K3; greedy
/// continuations equal; a batch equal to each sequence alone). The input-major product
/// (`matmul_host_t`, GPT-OSS), the last one listed, passed its op test on an H100 in session
/// 22 (`input_major_products_match_the_cpu`, every encoding), with GPT-OSS's model tests
/// (`tests/device_pass.rs`); the list is empty.
pub const UNVERIFIED: &[crate::backend::Op] = &[];
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{anyhow, bail, Context, Result};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, PinnedHostSlice};

use super::cpu::Matrix;
use crate::quant::{dequantize_row, GgmlType};

pub use kernels::DEVICE_TYPES;

/// What finds a resident matrix's device copy: its host bytes' address and length, its
/// encoding, rows and columns.
type ResidentKey = (usize, usize, GgmlType, usize, usize);

/// An open CUDA device: its context, the stream every op is queued on, the kernels (compiled
/// at first use) and cuBLAS when its library is found.
pub struct Cuda {
    ordinal: usize,
    label: String,
    /// The device's memory in bytes (0 when the driver did not say).
    total_bytes: u64,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: OnceLock<std::result::Result<kernels::Kernels, String>>,
    blas: Option<CudaBlas>,
    /// The f32 panel of dequantized weight rows the cuBLAS path multiplies (grown on demand).
    panel: Mutex<Option<CudaSlice<f32>>>,
    /// Resident weights copied to the device ([`Backend::matmul_host`] with `keep`), by
    /// [`ResidentKey`]: each uploaded at its first use, kept for the device's life.
    resident: Mutex<HashMap<ResidentKey, Arc<CudaMatrix>>>,
    /// Bytes of weights copied for one call only (streamed units, routed experts), since
    /// the device was opened.
    transient_bytes: AtomicU64,
    /// Page-locked host memory that large downloads ([`Backend::download_spans`]: a pass's
    /// logits) go through, grown on demand: a copy from the device into pageable memory is
    /// staged by the driver and pays the fresh pages' faults, this one runs at the bus's speed.
    staging: Mutex<Option<PinnedHostSlice<f32>>>,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuda").field("label", &self.label).finish()
    }
}

/// An f32 buffer in a CUDA device's memory (`len` floats).
pub struct CudaBuf {
    len: usize,
    data: CudaSlice<f32>,
}

impl CudaBuf {
    /// Floats in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no float.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for CudaBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBuf({} floats)", self.len)
    }
}

/// A weight matrix (`rows × cols`, GGML order: `cols` contiguous) in a device's memory, in
/// its stored encoding `ty` (one of [`DEVICE_TYPES`]).
pub struct CudaMatrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    /// The stored type when it had no kernel and was dequantized to F32 on upload.
    pub dequantized_from: Option<GgmlType>,
    row_bytes: usize,
    data: CudaSlice<u8>,
}

impl std::fmt::Debug for CudaMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaMatrix({} {}x{})", self.ty, self.rows, self.cols)
    }
}

impl CudaMatrix {
    /// Bytes the matrix takes on the device.
    pub fn bytes(&self) -> usize {
        self.rows * self.row_bytes
    }
}

/// Why no CUDA device can be used at all (before any ordinal is looked at).
fn driver_missing() -> Option<String> {
    // SAFETY: only tries to open the driver library by its usual names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Some("no CUDA driver found (libcuda.so)".into());
    }
    None
}

/// The number of CUDA devices the driver sees. Errors: no driver, or it fails to start.
fn device_count() -> Result<usize, String> {
    if let Some(e) = driver_missing() {
        return Err(e);
    }
    match cudarc::driver::result::init() {
        Ok(()) => {}
        Err(e) if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_NO_DEVICE => return Ok(0),
        Err(e) => return Err(format!("the CUDA driver failed to start: {e}")),
    }
    CudaContext::device_count()
        .map(|n| n.max(0) as usize)
        .map_err(|e| format!("the CUDA driver failed to count devices: {e}"))
}

impl Cuda {
    /// The usable CUDA devices in ordinal order, named as [`Backend::name`] names them
    /// (empty without a driver or a GPU, or when none opens).
    pub fn devices() -> Vec<String> {
        let n = device_count().unwrap_or(0);
        (0..n)
            .filter_map(|i| Cuda::open(i).ok())
            .map(|c| c.label)
            .collect()
    }

    /// Opens CUDA device `ordinal`: its primary context and a stream of its own. The kernels
    /// are compiled at the first op that needs them.
    ///
    /// Errors (each starting `cuda:N: `): `no CUDA driver found (libcuda.so)`; `no GPU N
    /// (this machine has M)`; `no NVRTC library found (libnvrtc.so …)`, which compiles the
    /// kernels; a driver error while creating the context or stream.
    pub fn open(ordinal: usize) -> Result<Self> {
        let count = device_count().map_err(|e| anyhow!("cuda:{ordinal}: {e}"))?;
        if ordinal >= count {
            bail!("cuda:{ordinal}: no GPU {ordinal} (this machine has {count})");
        }
        // SAFETY: only tries to open the library by its usual names.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            bail!(
                "cuda:{ordinal}: no NVRTC library found (libnvrtc.so, from the CUDA toolkit; \
                 it compiles the kernels)"
            );
        }
        let ctx = CudaContext::new(ordinal).with_context(|| format!("cuda:{ordinal}"))?;
        // one stream orders every op: the per-buffer events are not needed
        // SAFETY: called before any buffer of this context exists on this stream.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .with_context(|| format!("cuda:{ordinal}"))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let total_bytes = ctx.total_mem().unwrap_or(0) as u64;
        let gib = total_bytes as f64 / (1u64 << 30) as f64;
        // SAFETY: only tries to open the library by its usual names.
        let blas = match unsafe { cudarc::cublas::sys::is_culib_present() } {
            true => Some(
                CudaBlas::new(stream.clone()).with_context(|| format!("cuda:{ordinal}: cuBLAS"))?,
            ),
            false => None,
        };
        let label = format!(
            "cuda:{ordinal} ({name}, {gib:.0} GiB{})",
            if blas.is_some() { "" } else { ", no cuBLAS" }
        );
        Ok(Self {
            ordinal,
            label,
            total_bytes,
            ctx,
            stream,
            kernels: OnceLock::new(),
            blas,
            panel: Mutex::new(None),
            resident: Mutex::new(HashMap::new()),
            transient_bytes: AtomicU64::new(0),
            staging: Mutex::new(None),
        })
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's memory in bytes, as the driver reports it at open (0 when it did not).
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// Whether large products go through cuBLAS (its library was found).
    pub fn has_cublas(&self) -> bool {
        self.blas.is_some()
    }

    /// The kernels, compiled and loaded at the first call. Errors: NVRTC's log, or the
    /// module not loading (the same error at every later call).
    fn k(&self) -> Result<&kernels::Kernels> {
        self.kernels
            .get_or_init(|| kernels::Kernels::load(&self.ctx).map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(|e| anyhow!("cuda:{}: {e}", self.ordinal))
    }

    /// Compiles and loads the kernels now rather than at the first op (a caller that wants
    /// the compile time out of its measurements). Errors as the first op's would.
    pub fn warm_up(&self) -> Result<()> {
        self.k().map(|_| ())
    }

    /// Waits until every queued op has finished. Errors: a failed launch or copy.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().context("CUDA stream")
    }

    /// `m` copied to the device in its stored encoding (or dequantized to F32 first when its
    /// type has no kernel). Errors: an allocation or copy failing.
    pub fn upload_matrix(&self, m: &Matrix) -> Result<CudaMatrix> {
        if kernels::type_name(m.ty).is_some() {
            let data = self.put(m.data)?;
            return Ok(CudaMatrix {
                ty: m.ty,
                rows: m.rows,
                cols: m.cols,
                dequantized_from: None,
                row_bytes: m.row_bytes(),
                data,
            });
        }
        let mut f = vec![0f32; m.rows * m.cols];
        for (r, out) in f.chunks_exact_mut(m.cols.max(1)).enumerate() {
            dequantize_row(m.ty, m.row(r), out);
        }
        let bytes: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok(CudaMatrix {
            ty: GgmlType::F32,
            rows: m.rows,
            cols: m.cols,
            dequantized_from: Some(m.ty),
            row_bytes: 4 * m.cols,
            data: self.put(&bytes)?,
        })
    }

    /// The device copy of the resident matrix `m` (host bytes that never move nor change
    /// while the device lives), uploaded at the first call ([`Cuda::upload_matrix`]) and
    /// reused after: found by the bytes' address and length, the encoding and the shape, so
    /// one allocation read as two encodings (BF16 and F16 rows of the same size, say) is two
    /// copies. Errors: an allocation or copy failing.
    pub fn resident_matrix(&self, m: &Matrix) -> Result<Arc<CudaMatrix>> {
        let key = (m.data.as_ptr() as usize, m.data.len(), m.ty, m.rows, m.cols);
        let mut map = self.resident.lock().expect("resident weights lock");
        if let Some(w) = map.get(&key) {
            return Ok(w.clone());
        }
        let w = Arc::new(self.upload_matrix(m)?);
        map.insert(key, w.clone());
        Ok(w)
    }

    /// `f` over the host matrix `m` on the device, as the `*_host` ops take weights: the
    /// kept copy when `keep` (a resident unit, [`Cuda::resident_matrix`]), else a copy for
    /// this call ([`Cuda::transient_matrix`]). Errors: the upload's, `f`'s.
    pub(super) fn with_matrix<R>(
        &self,
        m: &Matrix,
        keep: bool,
        f: impl FnOnce(&CudaMatrix) -> Result<R>,
    ) -> Result<R> {
        match keep {
            true => f(&*self.resident_matrix(m)?),
            false => f(&self.transient_matrix(m)?),
        }
    }

    /// Bytes of resident weights on the device ([`Cuda::resident_matrix`]) and bytes of
    /// weights copied for one product only since the device was opened.
    pub fn weight_bytes(&self) -> (usize, u64) {
        let map = self.resident.lock().expect("resident weights lock");
        (
            map.values().map(|w| w.bytes()).sum(),
            self.transient_bytes.load(Ordering::Relaxed),
        )
    }

    /// `m` copied for one product (a streamed unit, a routed expert), counted in
    /// [`Cuda::weight_bytes`]; freed in stream order when dropped.
    pub(super) fn transient_matrix(&self, m: &Matrix) -> Result<CudaMatrix> {
        self.transient_bytes
            .fetch_add(m.data.len() as u64, Ordering::Relaxed);
        self.upload_matrix(m)
    }

    /// `host` copied to a new device allocation (one element at least, so an empty slice
    /// still gets a valid pointer).
    fn put<T: DeviceRepr + Default + Copy>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        let r = match host.is_empty() {
            true => self.stream.clone_htod(&[T::default()]),
            false => self.stream.clone_htod(host),
        };
        r.context("CUDA upload")
    }

    /// Row indices as the kernels take them (u32). Errors: an index past `limit` rows.
    fn put_rows(&self, rows: &[usize], limit: usize, what: &str) -> Result<CudaSlice<u32>> {
        if let Some(&r) = rows.iter().find(|&&r| r >= limit) {
            bail!("{what}: row {r} of {limit}");
        }
        let v: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        self.put(&v)
    }
}
