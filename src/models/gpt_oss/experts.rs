//! GPT-OSS experts: where one expert's tensors lie in its store unit, in each encoding the
//! loaders produce, and the expert FFN itself (clamped SwiGLU with biases, see
//! [`super::gpt_oss`]).
//!
//! Three layouts: Hugging Face float experts (input-major `gate_up` with gate in the even and
//! up in the odd outputs, computed in place with `Backend::matmul_host_t`); Hugging Face MXFP4 experts
//! (`*_blocks` + `*_scales`, repacked into GGML `MXFP4` rows); and GGUF experts as llama.cpp's
//! converter writes them (`convert_hf_to_gguf.py`, `conversion/gpt_oss.py`): separate
//! output-major `gate` and `up` matrices (the even and odd rows of Hugging Face's `gate_up`)
//! and `down`, in any GGML type (MXFP4 as stored), with separate `gate`/`up`/`down` biases.

use anyhow::Result;

use crate::models::budget::recycling_transform;
use crate::models::device::Device;
use crate::models::layers::{row_f32, Matrix};
use crate::models::loading::MatRef;
use crate::quant::mxfp4::repack_hf_mxfp4;
use crate::quant::GgmlType;
use crate::store::{AlignedBuf, ExpertTransform, UnitBytes};

/// Where one expert's tensors lie in its unit as read.
#[derive(Clone, Copy, Debug)]
pub(super) enum ExpertRef {
    /// Float experts, input-major: `gate_up` (`H` rows × `2I`), `down` (`I` rows × `H`).
    Float {
        gate_up: MatRef,
        down: MatRef,
        gate_up_bias: MatRef,
        down_bias: MatRef,
    },
    /// MXFP4 blocks and scales as Hugging Face stores them (byte spans in the unit), to be
    /// repacked into [`Packed`] layout.
    Mxfp4 {
        gate_up_blocks: MatRef,
        gate_up_scales: MatRef,
        down_blocks: MatRef,
        down_scales: MatRef,
        gate_up_bias: MatRef,
        down_bias: MatRef,
    },
    /// GGUF experts, output-major in any GGML type: `gate` and `up` (`I` rows × `H`), `down`
    /// (`H` rows × `I`), and their biases (`I`, `I`, `H` values).
    Split {
        gate: MatRef,
        up: MatRef,
        down: MatRef,
        gate_bias: MatRef,
        up_bias: MatRef,
        down_bias: MatRef,
    },
}

/// The layout of a repacked MXFP4 expert (one piece): `gate_up` MXFP4 rows (`2I × H`), `down`
/// MXFP4 rows (`H × I`), then the two biases in their stored encoding.
#[derive(Clone, Copy, Debug)]
pub(super) struct Packed {
    pub gate_up: usize,
    pub down: usize,
    pub gate_up_bias: usize,
    pub down_bias: usize,
    pub bias_ty: GgmlType,
}

impl Packed {
    /// Bytes of one repacked expert.
    pub fn total(&self) -> usize {
        self.gate_up + self.down + self.gate_up_bias + self.down_bias
    }
}

/// One expert's weights, ready to compute.
pub struct OssExpertView<'a> {
    /// `2I` outputs from `H` inputs: input-major (`H` rows) when `transposed`, else
    /// output-major (`2I` rows); with `up` set, only the gate's `I` output-major rows.
    gate_up: Matrix<'a>,
    /// The up projection (`I` output-major rows) and its bias (`I` values) when gate and up
    /// are stored apart (GGUF).
    up: Option<(Matrix<'a>, Matrix<'a>)>,
    /// `H` outputs from `I` inputs, oriented as `gate_up`.
    down: Matrix<'a>,
    transposed: bool,
    /// `2I` values (`I` with `up` set).
    gate_up_bias: Matrix<'a>,
    /// `H` values.
    down_bias: Matrix<'a>,
}

/// The experts of every layer: `units[layer][id] = (unit, where its tensors are)`.
pub(super) struct ExpertTable {
    pub units: Vec<Vec<(usize, ExpertRef)>>,
    /// Set for Hugging Face MXFP4 experts.
    pub packed: Option<Packed>,
    pub hidden: usize,
    pub ff: usize,
}

/// The view of a repacked MXFP4 expert in `b`.
fn packed_view<'a>(b: &'a [u8], p: &Packed, h: usize, ff: usize) -> OssExpertView<'a> {
    let (a, rest) = b.split_at(p.gate_up);
    let (d, rest) = rest.split_at(p.down);
    let (gb, rest) = rest.split_at(p.gate_up_bias);
    let db = &rest[..p.down_bias];
    let m = |ty, rows, cols, data| Matrix {
        ty,
        rows,
        cols,
        data,
    };
    OssExpertView {
        gate_up: m(GgmlType::MXFP4, 2 * ff, h, a),
        down: m(GgmlType::MXFP4, h, ff, d),
        up: None,
        transposed: false,
        gate_up_bias: m(p.bias_ty, 1, 2 * ff, gb),
        down_bias: m(p.bias_ty, 1, h, db),
    }
}

/// Repacks the MXFP4 expert `r` read into `u` into `buf` (at least `p.total()` bytes): one
/// piece in [`Packed`] layout.
pub(super) fn repack_expert(
    u: &UnitBytes,
    r: &ExpertRef,
    p: &Packed,
    mut buf: AlignedBuf,
) -> UnitBytes {
    let ExpertRef::Mxfp4 {
        gate_up_blocks,
        gate_up_scales,
        down_blocks,
        down_scales,
        gate_up_bias,
        down_bias,
    } = r
    else {
        unreachable!("repack of a float expert")
    };
    let span = |m: &MatRef| &u.piece(m.piece)[m.offset..m.offset + m.bytes];
    let out = &mut buf.as_mut_slice()[..p.total()];
    let (a, rest) = out.split_at_mut(p.gate_up);
    let (d, rest) = rest.split_at_mut(p.down);
    let (gb, db) = rest.split_at_mut(p.gate_up_bias);
    repack_hf_mxfp4(span(gate_up_blocks), span(gate_up_scales), a);
    repack_hf_mxfp4(span(down_blocks), span(down_scales), d);
    gb.copy_from_slice(span(gate_up_bias));
    db.copy_from_slice(span(down_bias));
    UnitBytes::from_parts(buf, vec![(0, p.total())])
}

/// The re-encoding of Hugging Face MXFP4 experts read on demand ([`repack_expert`] as each
/// lands) and the bytes of a repacked expert; `None` for other encodings.
pub(super) fn mxfp4_transform(table: &ExpertTable) -> Option<(ExpertTransform, usize)> {
    let p = table.packed?;
    let refs: Vec<Vec<ExpertRef>> = table
        .units
        .iter()
        .map(|le| le.iter().map(|(_, r)| *r).collect())
        .collect();
    let t =
        recycling_transform(move |layer, e, raw, buf| repack_expert(raw, &refs[layer][e], &p, buf));
    Some((t, p.total()))
}

impl ExpertTable {
    /// The view of expert `r` in `u`, its unit's bytes (repacked for MXFP4 experts).
    pub fn view<'a>(&self, r: &ExpertRef, u: &'a UnitBytes) -> OssExpertView<'a> {
        match r {
            ExpertRef::Float {
                gate_up,
                down,
                gate_up_bias,
                down_bias,
            } => OssExpertView {
                gate_up: gate_up.view(u),
                down: down.view(u),
                up: None,
                transposed: true,
                gate_up_bias: gate_up_bias.view(u),
                down_bias: down_bias.view(u),
            },
            ExpertRef::Split {
                gate,
                up,
                down,
                gate_bias,
                up_bias,
                down_bias,
            } => OssExpertView {
                gate_up: gate.view(u),
                down: down.view(u),
                up: Some((up.view(u), up_bias.view(u))),
                transposed: false,
                gate_up_bias: gate_bias.view(u),
                down_bias: down_bias.view(u),
            },
            ExpertRef::Mxfp4 { .. } => {
                let p = self.packed.as_ref().expect("MXFP4 experts have a layout");
                packed_view(u.piece(0), p, self.hidden, self.ff)
            }
        }
    }
}

/// One GPT-OSS expert `w` on `dev` over `m` gathered rows `x` (`m × H`) into a new `m × H`
/// buffer: `gate_up = x W_gu + b_gu` (or the separate gate and up projections of a GGUF
/// file), the clamped SwiGLU (`Backend::swiglu_oai`, `alpha`, `limit`), then
/// `h W_d + b_d`; input-major weights through `Backend::matmul_host_t`. `keep`: the
/// expert's unit is resident.
///
/// Errors: the device's.
pub(super) fn expert_ffn_on<D: Device>(
    dev: &D,
    w: &OssExpertView,
    keep: bool,
    alpha: f32,
    limit: f32,
    x: &D::Buf,
    m: usize,
) -> Result<D::Buf> {
    let proj = |mat: &Matrix, x: &D::Buf, outs: usize| -> Result<D::Buf> {
        let mut y = dev.zeros(m * outs)?;
        match w.transposed {
            true => dev.matmul_host_t(mat, keep, x, m, &mut y)?,
            false => dev.matmul_host(mat, keep, x, m, &mut y)?,
        }
        Ok(y)
    };
    let outs = |mat: &Matrix| if w.transposed { mat.cols } else { mat.rows };
    let (gu_b, d_b) = (row_f32(&w.gate_up_bias), row_f32(&w.down_bias));
    let ff2 = gu_b.len();
    let mut gu = proj(&w.gate_up, x, outs(&w.gate_up))?;
    dev.add_rows(&mut gu, &gu_b)?;
    let act = match &w.up {
        None => {
            let mut a = dev.zeros(m * ff2 / 2)?;
            dev.swiglu_oai(&gu, None, alpha, limit, &mut a)?;
            a
        }
        Some((up, up_b)) => {
            let mut uv = proj(up, x, outs(up))?;
            dev.add_rows(&mut uv, &row_f32(up_b))?;
            let mut a = dev.zeros(m * ff2)?;
            dev.swiglu_oai(&gu, Some(&uv), alpha, limit, &mut a)?;
            a
        }
    };
    let mut y = proj(&w.down, &act, outs(&w.down))?;
    dev.add_rows(&mut y, &d_b)?;
    Ok(y)
}
