//! The matrix products `y = x Wᵀ` on a CUDA device.
//!
//! Up to [`DIRECT_MAX_ROWS`] activation rows (a decode step, a speculative verification, a
//! few sequences decoded together): the `mv_<type>_<R>` kernels read the weights in their
//! stored encoding once per launch of R ≤ 8 rows (5 rows: one launch of 4, one of 1). More
//! rows (a prompt): the weights are dequantized to f32 in panels of rows (F32 weights are
//! used in place) and multiplied by cuBLAS's SGEMM (f32 inputs, f32 accumulation, no TF32),
//! so every type takes the same exact-f32 path; without cuBLAS, the direct kernels in groups
//! of 8 rows. Accumulation is f32 in either path, in another order than the CPU's, so
//! results agree with the CPU within rounding (`tests.rs` states the measured bound).

use anyhow::{bail, Context, Result};
use cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::kernels::{type_name, MV_ROWS, MV_WARPS};
use super::{Cuda, CudaBuf, CudaMatrix};

/// Activation rows up to which the products read the stored encoding directly.
pub const DIRECT_MAX_ROWS: usize = 8;

/// Floats of the dequantized panel of the cuBLAS path (64 MiB).
pub(super) const PANEL_FLOATS: usize = 16 << 20;

impl Cuda {
    /// `y = x Wᵀ` for `rows` rows of `x` (`rows × w.cols`) into `y` (`rows × w.rows`).
    /// Errors: shapes that disagree, a launch failing.
    pub(super) fn matmul_dev(
        &self,
        w: &CudaMatrix,
        x: &CudaBuf,
        rows: usize,
        y: &mut CudaBuf,
    ) -> Result<()> {
        if x.len != rows * w.cols || y.len != rows * w.rows {
            bail!(
                "matmul: {} matrix {}x{} with x of {} and y of {} floats for {rows} rows",
                w.ty,
                w.rows,
                w.cols,
                x.len,
                y.len
            );
        }
        if rows == 0 || w.rows == 0 {
            return Ok(());
        }
        match &self.blas {
            Some(_) if rows > DIRECT_MAX_ROWS => self.matmul_blas(w, x, rows, y),
            _ => self.matmul_direct(w, x, rows, y),
        }
    }

    /// The `mv_*` kernels over groups of 8, 4, 2 and 1 rows.
    pub(super) fn matmul_direct(
        &self,
        w: &CudaMatrix,
        x: &CudaBuf,
        rows: usize,
        y: &mut CudaBuf,
    ) -> Result<()> {
        let k = self.k()?;
        let t = type_name(w.ty).expect("a device type");
        let (m, n) = (w.rows, w.cols);
        let cfg = LaunchConfig {
            grid_dim: ((m as u32).div_ceil(MV_WARPS), 1, 1),
            block_dim: (32 * MV_WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (rb, m32, n32) = (w.row_bytes as u64, m as i32, n as i32);
        let mut t0 = 0;
        while t0 < rows {
            let r = *MV_ROWS.iter().find(|&&r| r <= rows - t0).expect("1 row");
            let f = k.get(&format!("mv_{t}_{r}"));
            let xv = x.data.slice(t0 * n..(t0 + r) * n);
            let mut yv = y.data.slice_mut(t0 * m..(t0 + r) * m);
            let mut b = self.stream.launch_builder(f);
            b.arg(&w.data)
                .arg(&rb)
                .arg(&m32)
                .arg(&n32)
                .arg(&xv)
                .arg(&mut yv);
            // SAFETY: the kernel reads `m` rows of `rb` bytes of `w` and `r × n` floats of
            // `xv`, and writes `r × m` floats of `yv`: the sizes checked above.
            unsafe { b.launch(cfg) }.context("CUDA mv kernel")?;
            t0 += r;
        }
        Ok(())
    }

    /// Panels of dequantized rows times `x` by SGEMM.
    fn matmul_blas(&self, w: &CudaMatrix, x: &CudaBuf, rows: usize, y: &mut CudaBuf) -> Result<()> {
        let blas = self.blas.as_ref().expect("cuBLAS");
        let (m, n) = (w.rows, w.cols);
        // the panel's lock also keeps one thread at a time on the cuBLAS handle
        let mut guard = self.panel.lock().unwrap_or_else(|e| e.into_inner());
        if w.ty == crate::quant::GgmlType::F32 {
            // SAFETY: F32 weights are `m × n` little-endian floats.
            let a = unsafe { w.data.transmute::<f32>(m * n) }.expect("F32 matrix bytes");
            let mut c = y.data.slice_mut(..);
            let cfg = sgemm_config(m, rows, n, m);
            // SAFETY: A is m × n (lda n), B is rows × n (ldb n), C is rows × m (ldc m).
            unsafe { blas.gemm(cfg, &a, &x.data, &mut c) }.context("cuBLAS SGEMM")?;
            return Ok(());
        }
        let panel_rows = (PANEL_FLOATS / n.max(1)).clamp(1, m);
        let panel = self.panel_of(&mut guard, panel_rows * n)?;
        let mut r0 = 0;
        while r0 < m {
            let pr = panel_rows.min(m - r0);
            self.dequantize_rows(w, r0, pr, panel)?;
            let a = panel.slice(..pr * n);
            let mut c = y.data.slice_mut(r0..);
            let cfg = sgemm_config(pr, rows, n, m);
            // SAFETY: A is pr × n (lda n), B rows × n (ldb n), C from row r0 with ldc m
            // covers (rows - 1) × m + pr ≤ rows × m - r0 floats.
            unsafe { blas.gemm(cfg, &a, &x.data, &mut c) }.context("cuBLAS SGEMM")?;
            r0 += pr;
        }
        Ok(())
    }

    /// The panel held by `guard` (the [`Cuda`]'s panel lock), grown to at least `floats`
    /// floats (the old one freed first). Errors: the allocation.
    pub(super) fn panel_of<'g>(
        &self,
        guard: &'g mut Option<CudaSlice<f32>>,
        floats: usize,
    ) -> Result<&'g mut CudaSlice<f32>> {
        if guard.as_ref().is_none_or(|p| p.len() < floats) {
            *guard = None; // free the old panel first
            *guard = Some(
                self.stream
                    .alloc_zeros::<f32>(floats)
                    .context("CUDA panel")?,
            );
        }
        Ok(guard.as_mut().expect("panel"))
    }

    /// Stored rows `first .. first + count` of `w` dequantized to f32 into the first
    /// `count × w.cols` floats of `panel` (the `deq_<type>` kernel). Errors: a panel too
    /// small, a launch.
    pub(super) fn dequantize_rows(
        &self,
        w: &CudaMatrix,
        first: usize,
        count: usize,
        panel: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let n = w.cols;
        if first + count > w.rows || panel.len() < count * n {
            bail!(
                "dequantize_rows: rows {first}..{} of {} into {} floats",
                first + count,
                w.rows,
                panel.len()
            );
        }
        let deq = self
            .k()?
            .get(&format!("deq_{}", type_name(w.ty).expect("a device type")));
        let cfg = LaunchConfig {
            grid_dim: (
                (n.div_ceil(32) as u32).div_ceil(128),
                count.min(65535) as u32,
                1,
            ),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (rb, n32, first32, count32) =
            (w.row_bytes as u64, n as i32, first as i32, count as i32);
        let null: u64 = 0;
        let mut b = self.stream.launch_builder(deq);
        b.arg(&w.data)
            .arg(&rb)
            .arg(&n32)
            .arg(&null)
            .arg(&first32)
            .arg(&count32)
            .arg(panel);
        // SAFETY: rows first .. first + count of `w` exist and the panel holds count × n
        // floats (both checked above).
        unsafe { b.launch(cfg) }.context("CUDA dequantize kernel")?;
        Ok(())
    }
}

/// The SGEMM computing `Y[t][i] = Σ_j A[i][j] · X[t][j]` for row-major `A` (`a_rows × n`),
/// `X` (`tokens × n`) and `Y` (`tokens` rows `ldc` apart). In cuBLAS's column-major terms
/// `A` is `n × a_rows` (read transposed), `X` is `n × tokens` and `Y` is `a_rows × tokens`.
fn sgemm_config(a_rows: usize, tokens: usize, n: usize, ldc: usize) -> GemmConfig<f32> {
    GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_T,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: a_rows as i32,
        n: tokens as i32,
        k: n as i32,
        alpha: 1.0,
        lda: n as i32,
        ldb: n as i32,
        beta: 0.0,
        ldc: ldc as i32,
    }
}
