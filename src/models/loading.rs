//! Loading helpers shared by the architectures: a checkpoint's files opened (a pack's
//! physical files and relocation included), tensor lookup with shape and type checks,
//! grouping tensors into read units, and views of matrices inside a unit's bytes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};

use crate::backend::cpu::Matrix;
use crate::quant::{dequantize_row, GgmlType};
use crate::source::gguf::GgufModel;
use crate::source::pack::PackInfo;
use crate::source::tensor::TensorInfo;
use crate::store::checksum::SpineCheck;
use crate::store::{DirectFile, ReadRange, Unit, UnitBytes};

/// A checkpoint's files opened for reading. Loaders build units over a checkpoint's tensor
/// index, in its *logical* files; for a pack (see [`crate::source::pack`]) those differ from
/// the files on disk, so every unit goes through [`CheckpointFiles::relocate`] before it is
/// read, and the stores open [`CheckpointFiles::paths`].
pub struct CheckpointFiles {
    /// The physical files (what the stores open): the checkpoint's own, or the pack's
    /// ([`crate::store::relocate::Relocation::files`]).
    pub paths: Vec<PathBuf>,
    /// Those files, opened.
    pub files: Vec<DirectFile>,
    /// The pack the checkpoint's files belong to (for the expert store: drive labels and
    /// checksums).
    pub pack: Option<Arc<PackInfo>>,
    /// Whether [`CheckpointFiles::vector`] checks a pack's spine tensors against their
    /// checksums (on unless `--no-verify-experts`).
    pub verify: bool,
}

impl CheckpointFiles {
    /// Opens `files` (a checkpoint's files, the logical files of `pack` when it has one) for
    /// reading, with `O_DIRECT` when `direct_io`; with `verify`, the spine tensors of a pack
    /// read through [`CheckpointFiles::vector`] are checked against its checksums.
    ///
    /// Errors: a file cannot be opened (named).
    pub fn open(
        files: &[PathBuf],
        pack: Option<&Arc<PackInfo>>,
        direct_io: bool,
        verify: bool,
    ) -> Result<Self> {
        let paths = match pack {
            Some(p) => p.relocation.files.clone(),
            None => files.to_vec(),
        };
        let files = paths
            .iter()
            .map(|p| {
                DirectFile::open(p, direct_io).with_context(|| format!("opening {}", p.display()))
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            paths,
            files,
            pack: pack.cloned(),
            verify,
        })
    }

    /// `u` (ranges in the checkpoint's logical files) as reads of [`CheckpointFiles::paths`],
    /// the same pieces where the logical layout puts them.
    pub fn relocate(&self, u: &Unit) -> Unit {
        match &self.pack {
            Some(p) => p.relocation.apply(u),
            None => u.clone(),
        }
    }

    /// Every unit of `units` relocated ([`CheckpointFiles::relocate`]).
    pub fn relocate_all(&self, units: Vec<Unit>) -> Vec<Unit> {
        match &self.pack {
            Some(_) => units.iter().map(|u| self.relocate(u)).collect(),
            None => units,
        }
    }

    /// Reads a small tensor (a norm weight) into f32.
    ///
    /// Errors: the read fails (the message names the tensor); a pack's spine tensor does not
    /// match its checksum (with `verify`: the message names the spine file, the tensor and
    /// both checksums).
    pub fn vector(&self, t: &TensorInfo) -> Result<Vec<f32>> {
        let unit = self.relocate(&Unit {
            pieces: None,
            ranges: vec![ReadRange {
                file: t.file,
                offset: t.offset,
                len: t.n_bytes as usize,
            }],
        });
        let stats = crate::store::IoStats::default();
        let b = crate::store::load_resident(&self.files, &unit, &stats)
            .and_then(|b| match (&self.pack, self.verify) {
                (Some(p), true) => SpineCheck::new(p.spine.clone())
                    .check_unit(&unit, &b)
                    .map(|()| b),
                _ => Ok(b),
            })
            .with_context(|| format!("reading tensor '{}'", t.name))?;
        let n = t.shape.iter().product::<u64>() as usize;
        let mut out = vec![0f32; n];
        dequantize_row(t.ty, b.piece(0), &mut out);
        Ok(out)
    }
}

/// Where a matrix lives inside its unit.
#[derive(Clone, Copy, Debug)]
pub struct MatRef {
    /// Index of the unit's range holding the matrix.
    pub piece: usize,
    /// Byte offset of the matrix in that range.
    pub offset: usize,
    /// The stored encoding.
    pub ty: GgmlType,
    /// Output rows (GGML's second dimension).
    pub rows: usize,
    /// Elements per row (GGML's first dimension).
    pub cols: usize,
    /// Encoded bytes.
    pub bytes: usize,
}

impl MatRef {
    /// The matrix inside `u`, the bytes of its unit.
    pub fn view<'a>(&self, u: &'a UnitBytes) -> Matrix<'a> {
        Matrix {
            ty: self.ty,
            rows: self.rows,
            cols: self.cols,
            data: &u.piece(self.piece)[self.offset..self.offset + self.bytes],
        }
    }
}

/// Looks up tensors by name and checks their type and shape.
pub struct Tensors<'a> {
    /// What error messages name as the source (a file or folder path).
    label: String,
    /// Every tensor of the checkpoint by name.
    pub by_name: HashMap<&'a str, &'a TensorInfo>,
    /// Error messages print shapes outermost first, as safetensors headers and PyTorch do
    /// (Hugging Face sources), instead of GGML's innermost-first order (GGUF sources).
    row_major: bool,
}

impl<'a> Tensors<'a> {
    /// Indexes the tensors of `g` by name.
    pub fn new(g: &'a GgufModel) -> Self {
        Self::from_list(g.files[0].display().to_string(), &g.tensors)
    }

    /// Indexes `tensors` by name; errors name `label` (a file or folder) as their source and
    /// print shapes in GGML order.
    pub fn from_list(label: String, tensors: &'a [TensorInfo]) -> Self {
        Self {
            label,
            by_name: tensors.iter().map(|t| (t.name.as_str(), t)).collect(),
            row_major: false,
        }
    }

    /// [`Tensors::from_list`] for a Hugging Face folder's tensors (or a pack of one): shapes
    /// are still given and checked in GGML order, but errors print them as the folder's
    /// safetensors headers list them (outermost first), e.g. `[out_features, in_features]`.
    pub fn hf(label: String, tensors: &'a [TensorInfo]) -> Self {
        Self {
            row_major: true,
            ..Self::from_list(label, tensors)
        }
    }

    /// `shape` (GGML order) as error messages print it.
    fn shown(&self, shape: &[usize]) -> Vec<usize> {
        let mut s = shape.to_vec();
        if self.row_major {
            s.reverse();
        }
        s
    }

    /// The tensor `name`. Errors: missing, naming the file and the tensor.
    fn lookup(&self, name: &str) -> Result<&'a TensorInfo> {
        self.by_name
            .get(name)
            .copied()
            .ok_or_else(|| anyhow!("{}: tensor '{name}' is missing", self.label))
    }

    /// The tensor `name`, checked to have `shape` (GGML order) and a type with kernels.
    /// Errors name the file and the tensor.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<&'a TensorInfo> {
        let t = self.lookup(name)?;
        let got: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
        if got != shape {
            bail!(
                "{}: tensor '{name}' has shape {:?}, expected {:?}",
                self.label,
                self.shown(&got),
                self.shown(shape)
            );
        }
        if !t.ty.has_kernels() {
            bail!(
                "{}: tensor '{name}' has type {} which Deltafin cannot compute yet",
                self.label,
                t.ty
            );
        }
        Ok(t)
    }
}

impl<'a> Tensors<'a> {
    /// The `n` slices of the stacked tensor `name` (GGML `shape`, slices outermost: `n` is
    /// `shape`'s last dimension, e.g. the experts of a GGUF `ffn_*_exps` tensor), one tensor
    /// each ([`TensorInfo::slice_outer`]). Where the index lists the slices instead of the
    /// stacked tensor (`NAME[0]` … `NAME[n-1]`, as a pack does, each slice in its expert's
    /// record), those are returned, each checked to have the slice shape.
    ///
    /// Errors: as [`Tensors::get`], naming the stacked tensor or the slice.
    pub fn stacked(&self, name: &str, shape: &[usize]) -> Result<Vec<TensorInfo>> {
        self.stacked_by(name, shape, |n, s| self.get(n, s))
    }

    /// [`Tensors::stacked`] for tensors read as bytes, checked as [`Tensors::get_raw`] does
    /// (type `ty` exactly).
    ///
    /// Errors: as [`Tensors::get_raw`], naming the stacked tensor or the slice.
    pub fn stacked_raw(
        &self,
        name: &str,
        shape: &[usize],
        ty: GgmlType,
    ) -> Result<Vec<TensorInfo>> {
        self.stacked_by(name, shape, |n, s| self.get_raw(n, s, ty))
    }

    /// [`Tensors::stacked`] with `get` looking up and checking each tensor.
    fn stacked_by(
        &self,
        name: &str,
        shape: &[usize],
        get: impl Fn(&str, &[usize]) -> Result<&'a TensorInfo>,
    ) -> Result<Vec<TensorInfo>> {
        let n = *shape.last().expect("a stacked tensor has dimensions");
        let first = format!("{name}[0]");
        if self.by_name.contains_key(name) || !self.by_name.contains_key(first.as_str()) {
            let t = get(name, shape)?;
            return Ok((0..n).map(|i| t.slice_outer(i, n)).collect());
        }
        let slice = &shape[..shape.len() - 1];
        (0..n)
            .map(|i| get(&format!("{name}[{i}]"), slice).cloned())
            .collect()
    }

    /// The tensor `name` holding `n` values in a shape padded with dimensions of 1 (Kimi's
    /// `A_log` is `[1, 1, heads, 1]` in Hugging Face files and `[1, heads, 1, 1]` after
    /// llama.cpp's converter; a hand-written GGUF may hold `[heads]`), with a type with kernels.
    /// Errors name the file and the tensor.
    pub fn vector(&self, name: &str, n: usize) -> Result<&'a TensorInfo> {
        let t = self.lookup(name)?;
        let got: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
        if got.iter().product::<usize>() != n || got.iter().filter(|&&d| d != 1).count() > 1 {
            bail!(
                "{}: tensor '{name}' has shape {:?}, expected {n} values",
                self.label,
                self.shown(&got)
            );
        }
        self.get(name, &got)
    }

    /// The tensor `name`, checked to have `shape` (GGML order) and type `ty` exactly, for
    /// tensors read as bytes (e.g. MXFP4 blocks and scales, indexed as `I8`).
    /// Errors name the file and the tensor.
    pub fn get_raw(&self, name: &str, shape: &[usize], ty: GgmlType) -> Result<&'a TensorInfo> {
        let t = self.lookup(name)?;
        let got: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
        if got != shape {
            bail!(
                "{}: tensor '{name}' has shape {:?}, expected {:?}",
                self.label,
                self.shown(&got),
                self.shown(shape)
            );
        }
        if t.ty != ty {
            bail!(
                "{}: tensor '{name}' has type {}, expected {ty}",
                self.label,
                t.ty
            );
        }
        Ok(t)
    }
}

/// A gated MLP's `[gate, up, down]` tensors, named `names`, for rows of width `d` and a hidden
/// width `ff`: `gate` and `up` of shape `[d, ff]`, `down` of shape `[ff, d]`, each read by
/// `get(name, shape)` (which checks the shape).
///
/// Errors: the first that `get` returns.
pub fn gate_up_down<T>(
    get: impl Fn(&str, &[usize]) -> Result<T>,
    names: [String; 3],
    d: usize,
    ff: usize,
) -> Result<[T; 3]> {
    let [g, u, dn] = names;
    Ok([get(&g, &[d, ff])?, get(&u, &[d, ff])?, get(&dn, &[ff, d])?])
}

/// Groups tensors into read ranges (merging byte-adjacent ones in the same file) and returns
/// the unit plus each tensor's (piece, offset) in it.
pub fn unit_of(tensors: &[&TensorInfo]) -> (Unit, Vec<(usize, usize)>) {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| (tensors[i].file, tensors[i].offset));
    let mut ranges: Vec<ReadRange> = Vec::new();
    let mut place = vec![(0usize, 0usize); tensors.len()];
    for i in order {
        let t = tensors[i];
        // merge when the gap to the previous range is small (alignment padding)
        match ranges.last_mut() {
            Some(r)
                if r.file == t.file
                    && t.offset >= r.offset + r.len as u64
                    && t.offset - (r.offset + r.len as u64) <= 4096 =>
            {
                let off = (t.offset - r.offset) as usize;
                r.len = off + t.n_bytes as usize;
                place[i] = (ranges.len() - 1, off);
            }
            _ => {
                ranges.push(ReadRange {
                    file: t.file,
                    offset: t.offset,
                    len: t.n_bytes as usize,
                });
                place[i] = (ranges.len() - 1, 0);
            }
        }
    }
    (Unit::of(ranges), place)
}

/// Like [`unit_of`] (byte-adjacent tensors, gaps up to 4 KiB, read as one range), but with
/// one piece per tensor: piece `i` of the unit's bytes is `tensors[i]` exactly (explicit
/// [`Unit::pieces`]), for code that addresses tensors by piece (FP8 repacking).
pub fn unit_of_pieces(tensors: &[&TensorInfo]) -> Unit {
    let (mut unit, place) = unit_of(tensors);
    // where each range's first byte lands in the buffer
    let starts: Vec<usize> = unit.piece_layout().iter().map(|p| p.0).collect();
    let pieces = place
        .iter()
        .zip(tensors)
        .map(|(&(r, off), t)| (starts[r] + off, t.n_bytes as usize))
        .collect();
    unit.pieces = Some(pieces);
    unit
}

/// The matrix view of tensor `t` at `place` (piece, offset) of its unit.
pub fn mat(t: &TensorInfo, place: (usize, usize)) -> MatRef {
    MatRef {
        piece: place.0,
        offset: place.1,
        ty: t.ty,
        rows: t.shape[1..].iter().product::<u64>() as usize,
        cols: t.shape[0] as usize,
        bytes: t.n_bytes as usize,
    }
}

/// A tensor that llama.cpp accepts in either of two GGML shapes (`a`, else `b`).
pub(crate) fn either<'a>(
    ts: &Tensors<'a>,
    name: &str,
    a: &[usize],
    b: &[usize],
) -> Result<TensorInfo> {
    match ts.by_name.get(name).map(|t| t.shape.len()) {
        Some(r) if r == b.len() && r != a.len() => Ok(ts.get(name, b)?.clone()),
        _ => Ok(ts.get(name, a)?.clone()),
    }
}
