//! A small GGUF writer, for tests and tooling: it makes tiny synthetic model files (every
//! metadata type, raw tensor bytes, version 2 or 3, any alignment, optionally split into
//! `<prefix>-NNNNN-of-MMMMM.gguf` parts). It is not used to run models; `deltafin pack` uses
//! [`header_at`] for the GGUF header of a pack's spine file.
//!
//! Layout follows the GGUF spec (ggml `docs/gguf.md`): header, metadata, tensor infos,
//! padding to the alignment, then each tensor's data at an aligned offset. No padding follows
//! the last tensor, so a file truncated anywhere no longer reads as valid.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::quant::GgmlType;
use crate::source::gguf::{split_path, Value};
use crate::source::gguf_parse::{
    ARRAY, BOOL, DEFAULT_ALIGNMENT, F32, F64, I16, I32, I64, I8, STRING, U16, U32, U64, U8,
};

/// One tensor to write: name, type, shape in GGML order (`shape[0]` is the row length) and its
/// encoded bytes.
#[derive(Clone, Debug)]
struct PendingTensor {
    name: String,
    ty: GgmlType,
    shape: Vec<u64>,
    data: Vec<u8>,
}

/// Builds a GGUF file in memory and writes it. Test and tooling support only.
///
/// ```
/// use deltafin::source::gguf::Value;
/// use deltafin::write::gguf_writer::GgufWriter;
/// let mut w = GgufWriter::new();
/// w.add("general.architecture", Value::String("tiny".into()))
///     .add_f32_tensor("w", &[2, 1], &[1.0, 2.0]);
/// let bytes = w.to_bytes();
/// assert_eq!(&bytes[..4], b"GGUF");
/// ```
#[derive(Clone, Debug)]
pub struct GgufWriter {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty version-3 file with the default 32-byte alignment.
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Sets the version number written in the header (any value, so tests can write
    /// unsupported versions; the layout is always that of versions 2 and 3).
    pub fn version(&mut self, version: u32) -> &mut Self {
        self.version = version;
        self
    }

    /// Sets the data alignment in bytes and stores it as `general.alignment` (u32).
    ///
    /// Panics unless `alignment` is a nonzero power of two that fits in u32.
    pub fn alignment(&mut self, alignment: u64) -> &mut Self {
        assert!(
            alignment.is_power_of_two() && alignment <= u32::MAX as u64,
            "alignment {alignment} is not a power of two that fits in u32"
        );
        self.alignment = alignment;
        self.add("general.alignment", Value::U32(alignment as u32))
    }

    /// Adds a metadata pair (or replaces the value of an existing key, keeping its place).
    /// Writing `general.alignment` this way does not change the layout (see
    /// [`GgufWriter::alignment`]), so tests can write inconsistent files.
    pub fn add(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        let key = key.into();
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key, value)),
        }
        self
    }

    /// Adds a tensor with its encoded bytes; `shape` is in GGML order (`shape[0]` is the row
    /// length in elements).
    ///
    /// Panics when `data.len()` differs from the size the shape and type imply
    /// (`ty.row_bytes(shape[0]) * rows`) or the row length is not a whole number of blocks.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        shape: &[u64],
        data: Vec<u8>,
    ) -> &mut Self {
        let name = name.into();
        let cols = shape.first().copied().unwrap_or(1) as usize;
        let rows: u64 = shape.iter().skip(1).product();
        let expected = ty
            .row_bytes(cols)
            .map(|b| b as u64 * rows)
            .unwrap_or_else(|| panic!("tensor {name}: row length {cols} is not whole {ty} blocks"));
        assert_eq!(
            data.len() as u64,
            expected,
            "tensor {name}: {ty} {shape:?} needs {expected} bytes"
        );
        self.tensors.push(PendingTensor {
            name,
            ty,
            shape: shape.to_vec(),
            data,
        });
        self
    }

    /// Adds an F32 tensor from its values (little-endian). Panics on a size mismatch.
    pub fn add_f32_tensor(
        &mut self,
        name: impl Into<String>,
        shape: &[u64],
        values: &[f32],
    ) -> &mut Self {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_tensor(name, GgmlType::F32, shape, data)
    }

    /// The whole file as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let refs: Vec<&PendingTensor> = self.tensors.iter().collect();
        self.write_file(&mut out, &self.metadata, &refs)
            .expect("writing to a Vec cannot fail");
        out
    }

    /// Writes the file to `path`.
    pub fn write(&self, path: &Path) -> io::Result<()> {
        let mut f = io::BufWriter::new(std::fs::File::create(path)?);
        let refs: Vec<&PendingTensor> = self.tensors.iter().collect();
        self.write_file(&mut f, &self.metadata, &refs)?;
        f.flush()
    }

    /// Writes the model as `n_parts` files `dir/<prefix>-NNNNN-of-MMMMM.gguf` the way
    /// llama.cpp's `gguf-split` does: tensors are cut into `n_parts` consecutive runs of
    /// near-equal count; the first part carries all metadata, every part carries `split.no`
    /// (u16, 0-based), `split.count` (u16) and `split.tensors.count` (i32), plus
    /// `general.alignment` when set. Returns the part paths in order.
    ///
    /// Panics unless `1 <= n_parts <= 65535`.
    pub fn write_split(&self, dir: &Path, prefix: &str, n_parts: u32) -> io::Result<Vec<PathBuf>> {
        assert!(
            (1..=u16::MAX as u32).contains(&n_parts),
            "n_parts {n_parts} out of range"
        );
        let n = self.tensors.len();
        let mut paths = Vec::new();
        for part in 0..n_parts as usize {
            let lo = n * part / n_parts as usize;
            let hi = n * (part + 1) / n_parts as usize;
            let refs: Vec<&PendingTensor> = self.tensors[lo..hi].iter().collect();
            let mut meta: Vec<(String, Value)> = if part == 0 {
                self.metadata.clone()
            } else {
                self.metadata
                    .iter()
                    .filter(|(k, _)| k == "general.alignment")
                    .cloned()
                    .collect()
            };
            meta.push(("split.no".into(), Value::U16(part as u16)));
            meta.push(("split.count".into(), Value::U16(n_parts as u16)));
            meta.push(("split.tensors.count".into(), Value::I32(n as i32)));
            let path = split_path(dir, prefix, part as u32 + 1, n_parts);
            let mut f = io::BufWriter::new(std::fs::File::create(&path)?);
            self.write_file(&mut f, &meta, &refs)?;
            f.flush()?;
            paths.push(path);
        }
        Ok(paths)
    }

    fn write_file(
        &self,
        w: &mut impl Write,
        meta: &[(String, Value)],
        tensors: &[&PendingTensor],
    ) -> io::Result<()> {
        let infos: Vec<(&str, GgmlType, &[u64], u64)> = tensors
            .iter()
            .map(|t| {
                (
                    t.name.as_str(),
                    t.ty,
                    t.shape.as_slice(),
                    t.data.len() as u64,
                )
            })
            .collect();
        let header = header_bytes(self.version, self.alignment, meta, &infos);
        let a = self.alignment;
        w.write_all(&header)?;
        let mut pos = header.len() as u64;
        for t in tensors {
            let pad = pos.next_multiple_of(a) - pos;
            w.write_all(&vec![0u8; pad as usize])?;
            w.write_all(&t.data)?;
            pos += pad + t.data.len() as u64;
        }
        Ok(())
    }
}

/// The header, metadata and tensor infos of a GGUF file whose tensors (name, type, GGML shape,
/// data bytes) follow in order, each at the next multiple of `alignment`.
fn header_bytes(
    version: u32,
    alignment: u64,
    meta: &[(String, Value)],
    tensors: &[(&str, GgmlType, &[u64], u64)],
) -> Vec<u8> {
    let mut offset = 0u64;
    let placed: Vec<(&str, GgmlType, &[u64], u64)> = tensors
        .iter()
        .map(|&(name, ty, shape, n_bytes)| {
            let at = offset;
            offset = (offset + n_bytes).next_multiple_of(alignment);
            (name, ty, shape, at)
        })
        .collect();
    header_at(version, meta, &placed)
}

/// The header of a GGUF file (GGUF spec, ggml `docs/gguf.md`): magic, `version`, the counts,
/// the metadata pairs in the order given, then one info per tensor (name, GGML shape, type,
/// offset), each `offset` relative to the data section, which starts at the end of this header
/// rounded up to the alignment (`general.alignment` in `meta`, else 32). The offsets are the
/// caller's: each a multiple of the alignment, the data not overlapping. The length does not
/// depend on the offsets.
pub fn header_at(
    version: u32,
    meta: &[(String, Value)],
    tensors: &[(&str, GgmlType, &[u64], u64)],
) -> Vec<u8> {
    let mut header = Vec::new();
    header.extend_from_slice(b"GGUF");
    header.extend_from_slice(&version.to_le_bytes());
    header.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    header.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        put_str(&mut header, k);
        header.extend_from_slice(&type_id(v).to_le_bytes());
        put_value(&mut header, v);
    }
    for (name, ty, shape, offset) in tensors {
        put_str(&mut header, name);
        header.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        for d in *shape {
            header.extend_from_slice(&d.to_le_bytes());
        }
        header.extend_from_slice(&ty.id().to_le_bytes());
        header.extend_from_slice(&offset.to_le_bytes());
    }
    header
}

/// One tensor of a streamed GGUF file: name, type and shape in GGML order (`shape[0]` is the
/// row length); its bytes come from the fill callback of [`write_streamed`].
#[derive(Clone, Debug)]
pub struct StreamTensor {
    pub name: String,
    pub ty: GgmlType,
    pub shape: Vec<u64>,
}

impl StreamTensor {
    /// Encoded bytes (`ty.row_bytes(shape[0]) × rows`). Panics when the row length is not a
    /// whole number of blocks.
    pub fn n_bytes(&self) -> u64 {
        let cols = self.shape.first().copied().unwrap_or(1) as usize;
        let rows: u64 = self.shape.iter().skip(1).product();
        let row = self.ty.row_bytes(cols).unwrap_or_else(|| {
            panic!(
                "tensor {}: row length {cols} is not whole {} blocks",
                self.name, self.ty
            )
        });
        row as u64 * rows
    }
}

/// Writes a version-3 GGUF file (32-byte alignment, the layout of [`GgufWriter`]) to `w`
/// without holding it in memory: the header from `meta` and `tensors`, then each tensor's
/// bytes as `fill(index, buffer)` writes them into a reused buffer of exactly
/// [`StreamTensor::n_bytes`]. Memory use is the largest tensor. Returns the bytes written.
///
/// Errors: a write fails.
pub fn write_streamed(
    w: &mut impl Write,
    meta: &[(String, Value)],
    tensors: &[StreamTensor],
    fill: &mut dyn FnMut(usize, &mut [u8]),
) -> io::Result<u64> {
    let a = DEFAULT_ALIGNMENT;
    let header = streamed_header(meta, tensors);
    w.write_all(&header)?;
    let mut pos = header.len() as u64;
    let mut buf = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        let pad = pos.next_multiple_of(a) - pos;
        w.write_all(&vec![0u8; pad as usize])?;
        buf.resize(t.n_bytes() as usize, 0);
        fill(i, &mut buf);
        w.write_all(&buf)?;
        pos += pad + buf.len() as u64;
    }
    Ok(pos)
}

/// The header [`write_streamed`] writes.
fn streamed_header(meta: &[(String, Value)], tensors: &[StreamTensor]) -> Vec<u8> {
    let infos: Vec<(&str, GgmlType, &[u64], u64)> = tensors
        .iter()
        .map(|t| (t.name.as_str(), t.ty, t.shape.as_slice(), t.n_bytes()))
        .collect();
    header_bytes(3, DEFAULT_ALIGNMENT, meta, &infos)
}

/// The size in bytes of the file [`write_streamed`] writes for `meta` and `tensors`, without
/// writing it: the header, then each tensor at a 32-byte aligned offset (no padding after the
/// last).
pub fn streamed_len(meta: &[(String, Value)], tensors: &[StreamTensor]) -> u64 {
    let mut pos = streamed_header(meta, tensors).len() as u64;
    for t in tensors {
        pos = pos.next_multiple_of(DEFAULT_ALIGNMENT) + t.n_bytes();
    }
    pos
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// GGUF type id of a value.
fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => U8,
        Value::I8(_) => I8,
        Value::U16(_) => U16,
        Value::I16(_) => I16,
        Value::U32(_) => U32,
        Value::I32(_) => I32,
        Value::U64(_) => U64,
        Value::I64(_) => I64,
        Value::F32(_) => F32,
        Value::F64(_) => F64,
        Value::Bool(_) => BOOL,
        Value::String(_) => STRING,
        Value::Array(_) => ARRAY,
    }
}

/// Appends the encoding of `v` (without its type id). An empty array is written with element
/// type u8. Panics when an array mixes element types.
fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::Array(items) => {
            let et = items.first().map_or(U8, type_id);
            assert!(
                items.iter().all(|e| type_id(e) == et),
                "GGUF arrays hold one element type"
            );
            out.extend_from_slice(&et.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for e in items {
                put_value(out, e);
            }
        }
    }
}
