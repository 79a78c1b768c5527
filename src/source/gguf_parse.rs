//! Parser for one GGUF file: header, metadata and tensor infos (never tensor data).
//!
//! Layout (GGUF spec, ggml `docs/gguf.md`, versions 2 and 3, little-endian):
//! `"GGUF"` magic, `u32` version, `u64` tensor count, `u64` metadata count, the metadata
//! key/value pairs, the tensor infos (`string` name, `u32` n_dims, `u64` dims, `u32` ggml type,
//! `u64` offset relative to the data section), padding up to `general.alignment`, then the data.
//!
//! Every count, length and offset read from the file is checked against the bytes that remain
//! before anything is allocated or read; buffers grow only as bytes are really read, so memory
//! stays proportional to the header actually present.

use std::collections::{BTreeMap, HashSet};
use std::io::Read;

use super::gguf_value::{GgufError, Value};
use super::tensor::TensorInfo;
use crate::quant::GgmlType;

/// Deepest nesting of arrays accepted in metadata (an array of arrays has depth 2).
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Longest metadata key in bytes (GGUF spec: keys are at most 2^16 - 1 bytes).
pub const MAX_KEY_BYTES: u64 = 65_535;
/// Longest tensor name in bytes (GGUF spec: names are at most 64 bytes).
pub const MAX_TENSOR_NAME_BYTES: u64 = 64;
/// Most dimensions a tensor may have (GGML `GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;
/// Default `general.alignment` in bytes.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Smallest possible encoded tensor info: empty name (8) + n_dims (4) + type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 24;
/// Smallest possible encoded metadata pair: empty key (8) + type (4) + a 1-byte value.
const MIN_KV_BYTES: u64 = 13;
/// Largest initial capacity given to a vector whose length comes from the file.
const MAX_PREALLOC: usize = 4096;
/// Most memory (bytes, estimated as `size_of` of each value or tensor info plus its heap
/// bytes) the metadata and tensor infos of one file may take. Real headers take far less
/// (Gemma 3, 262144-token vocabulary: about 30 MB); the limit stops a file whose "header" is
/// a long run of tiny values from growing memory many times beyond the file size.
pub const MAX_HEADER_MEMORY: u64 = 1 << 30;

/// Everything read from one file of a model.
#[derive(Debug)]
pub struct ParsedFile {
    pub version: u32,
    /// `general.alignment` of this file, in bytes.
    pub alignment: u64,
    pub metadata: BTreeMap<String, Value>,
    /// Tensor infos with absolute offsets; `file` is 0 (the caller sets it).
    pub tensors: Vec<TensorInfo>,
}

/// Metadata value type ids (GGUF spec `gguf_metadata_value_type`).
mod ty {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}
pub use ty::*;

/// Smallest encoded size of one value of type `t` in bytes, or `None` for an unknown type.
fn min_value_bytes(t: u32) -> Option<u64> {
    Some(match t {
        U8 | I8 | BOOL => 1,
        U16 | I16 => 2,
        U32 | I32 | F32 => 4,
        U64 | I64 | F64 => 8,
        STRING => 8,
        ARRAY => 12,
        _ => return None,
    })
}

/// Plural noun for array elements of type `t`, used in error messages.
fn elem_noun(t: u32) -> &'static str {
    match t {
        U8 => "u8 values",
        I8 => "i8 values",
        U16 => "u16 values",
        I16 => "i16 values",
        U32 => "u32 values",
        I32 => "i32 values",
        F32 => "f32 values",
        BOOL => "bools",
        STRING => "strings",
        ARRAY => "arrays",
        U64 => "u64 values",
        I64 => "i64 values",
        F64 => "f64 values",
        _ => "values",
    }
}

/// A reader that knows its position and the file length.
struct Cursor<R> {
    r: R,
    pos: u64,
    len: u64,
    file: String,
    /// Bytes of [`MAX_HEADER_MEMORY`] not yet used.
    budget: u64,
}

type Result<T> = std::result::Result<T, GgufError>;

impl<R: Read> Cursor<R> {
    fn remaining(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    fn err(&self, msg: String) -> GgufError {
        GgufError::Format {
            file: self.file.clone(),
            msg,
        }
    }

    fn io_err(&self, source: std::io::Error) -> GgufError {
        GgufError::Io {
            path: self.file.clone(),
            source,
        }
    }

    fn truncated(&self, ctx: &str, need: u64) -> GgufError {
        self.err(format!(
            "{ctx}: unexpected end of file at byte {} (needs {need} bytes, {} remain)",
            self.pos,
            self.remaining()
        ))
    }

    fn array<const N: usize>(&mut self, ctx: &str) -> Result<[u8; N]> {
        if N as u64 > self.remaining() {
            return Err(self.truncated(ctx, N as u64));
        }
        let mut b = [0u8; N];
        self.r.read_exact(&mut b).map_err(|e| self.io_err(e))?;
        self.pos += N as u64;
        Ok(b)
    }

    fn u8(&mut self, ctx: &str) -> Result<u8> {
        Ok(self.array::<1>(ctx)?[0])
    }
    fn u16(&mut self, ctx: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(ctx)?))
    }
    fn u32(&mut self, ctx: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(ctx)?))
    }
    fn u64(&mut self, ctx: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(ctx)?))
    }

    /// Reads a GGUF string (`u64` length + UTF-8 bytes, no terminator).
    fn string(&mut self, ctx: &str, max_len: Option<u64>) -> Result<String> {
        let n = self.u64(ctx)?;
        if n > self.remaining() {
            return Err(self.err(format!(
                "{ctx}: string of {n} bytes cannot fit in the remaining {} bytes",
                self.remaining()
            )));
        }
        if let Some(max) = max_len {
            if n > max {
                return Err(self.err(format!(
                    "{ctx}: string of {n} bytes is longer than the {max}-byte limit"
                )));
            }
        }
        self.charge(n, ctx)?;
        // `n` fits in the file, so it fits in memory addressing on 64-bit targets; the buffer
        // grows only as bytes arrive.
        let mut buf = Vec::with_capacity((n as usize).min(1 << 16));
        (&mut self.r)
            .take(n)
            .read_to_end(&mut buf)
            .map_err(|e| self.io_err(e))?;
        if buf.len() as u64 != n {
            self.pos += buf.len() as u64;
            return Err(self.truncated(ctx, n - buf.len() as u64));
        }
        self.pos += n;
        String::from_utf8(buf).map_err(|e| {
            self.err(format!(
                "{ctx}: string is not valid UTF-8 (bad byte at index {})",
                e.utf8_error().valid_up_to()
            ))
        })
    }

    /// Reads one metadata value of type `t`; `depth` counts enclosing arrays.
    /// Takes `n` bytes from the memory budget.
    fn charge(&mut self, n: u64, ctx: &str) -> Result<()> {
        match self.budget.checked_sub(n) {
            Some(b) => {
                self.budget = b;
                Ok(())
            }
            None => Err(self.err(format!(
                "{ctx}: the header would take more than {MAX_HEADER_MEMORY} bytes of memory"
            ))),
        }
    }

    fn value(&mut self, t: u32, ctx: &str, depth: usize) -> Result<Value> {
        self.charge(std::mem::size_of::<Value>() as u64, ctx)?;
        Ok(match t {
            U8 => Value::U8(self.u8(ctx)?),
            I8 => Value::I8(self.u8(ctx)? as i8),
            U16 => Value::U16(self.u16(ctx)?),
            I16 => Value::I16(self.u16(ctx)? as i16),
            U32 => Value::U32(self.u32(ctx)?),
            I32 => Value::I32(self.u32(ctx)? as i32),
            F32 => Value::F32(f32::from_bits(self.u32(ctx)?)),
            U64 => Value::U64(self.u64(ctx)?),
            I64 => Value::I64(self.u64(ctx)? as i64),
            F64 => Value::F64(f64::from_bits(self.u64(ctx)?)),
            BOOL => match self.u8(ctx)? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.err(format!("{ctx}: bool value {b} is neither 0 nor 1"))),
            },
            STRING => Value::String(self.string(ctx, None)?),
            ARRAY => self.array_value(ctx, depth + 1)?,
            other => return Err(self.err(format!("{ctx}: unknown value type {other}"))),
        })
    }

    fn array_value(&mut self, ctx: &str, depth: usize) -> Result<Value> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(self.err(format!(
                "{ctx}: arrays nested deeper than {MAX_ARRAY_DEPTH} levels"
            )));
        }
        let et = self.u32(ctx)?;
        let Some(min) = min_value_bytes(et) else {
            return Err(self.err(format!("{ctx}: array of unknown value type {et}")));
        };
        let n = self.u64(ctx)?;
        let rem = self.remaining();
        if n.checked_mul(min).is_none_or(|b| b > rem) {
            return Err(self.err(format!(
                "{ctx}: array of {n} {} cannot fit in the remaining {rem} bytes",
                elem_noun(et)
            )));
        }
        let mut items = Vec::with_capacity((n as usize).min(MAX_PREALLOC));
        for _ in 0..n {
            items.push(self.value(et, ctx, depth)?);
        }
        Ok(Value::Array(items))
    }
}

/// Parses the header, metadata and tensor infos of one GGUF file of `len` bytes from `r`
/// (positioned at byte 0). `file` names the file in errors. Tensor data is not read.
///
/// Errors: [`GgufError::Format`] naming the field or tensor for any malformed or
/// inconsistent content; [`GgufError::Io`] when reading fails.
pub fn parse<R: Read>(r: R, len: u64, file: &str) -> Result<ParsedFile> {
    parse_with_budget(r, len, file, MAX_HEADER_MEMORY)
}

/// [`parse`] with a memory budget other than [`MAX_HEADER_MEMORY`] (for tests).
fn parse_with_budget<R: Read>(r: R, len: u64, file: &str, budget: u64) -> Result<ParsedFile> {
    let mut c = Cursor {
        r,
        pos: 0,
        len,
        file: file.to_string(),
        budget,
    };
    if len < 4 {
        return Err(c.err(format!(
            "not a GGUF file (only {len} bytes, shorter than the magic)"
        )));
    }
    let magic: [u8; 4] = c.array("magic")?;
    if &magic != b"GGUF" {
        return Err(c.err(format!(
            "not a GGUF file (magic \"{}\" instead of \"GGUF\")",
            magic.escape_ascii()
        )));
    }
    let version = c.u32("header version")?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(
                c.err("GGUF version 1 is not supported (only versions 2 and 3 are)".to_string())
            )
        }
        v if v & 0xffff == 0 && matches!(v.swap_bytes(), 1..=3) => {
            return Err(c.err(format!(
                "big-endian GGUF (version {}) is not supported",
                v.swap_bytes()
            )))
        }
        v => {
            return Err(c.err(format!(
                "unsupported GGUF version {v} (only versions 2 and 3 are supported)"
            )))
        }
    }
    let n_tensors = c.u64("header tensor count")?;
    let n_kv = c.u64("header metadata count")?;
    let rem = c.remaining();
    if n_tensors > rem / MIN_TENSOR_INFO_BYTES {
        return Err(c.err(format!(
            "tensor count {n_tensors} cannot fit in the remaining {rem} bytes"
        )));
    }
    if n_kv > rem / MIN_KV_BYTES
        || (n_tensors * MIN_TENSOR_INFO_BYTES).saturating_add(n_kv * MIN_KV_BYTES) > rem
    {
        return Err(c.err(format!(
            "metadata count {n_kv} cannot fit in the remaining {rem} bytes \
             (with {n_tensors} tensor infos)"
        )));
    }

    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = c.string(&format!("metadata entry #{i} key"), Some(MAX_KEY_BYTES))?;
        if key.is_empty() {
            // The GGUF spec requires keys of at least one character (llama.cpp refuses them too).
            return Err(c.err(format!("metadata entry #{i} has an empty key")));
        }
        let ctx = format!("metadata key '{key}'");
        let t = c.u32(&ctx)?;
        let v = c.value(t, &ctx, 0)?;
        if metadata.insert(key, v).is_some() {
            return Err(c.err(format!("{ctx} appears more than once")));
        }
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a.is_power_of_two() && a <= u32::MAX as u64 => a,
            Some(a) => {
                return Err(c.err(format!(
                    "metadata key 'general.alignment': {a} is not a nonzero power of two \
                     that fits in u32"
                )))
            }
            None => {
                return Err(c.err(format!(
                    "metadata key 'general.alignment' has type {}, expected u32",
                    v.type_name()
                )))
            }
        },
    };

    let mut tensors: Vec<TensorInfo> = Vec::with_capacity((n_tensors as usize).min(MAX_PREALLOC));
    let mut names = HashSet::new();
    for i in 0..n_tensors {
        let name = c.string(
            &format!("tensor info #{i} name"),
            Some(MAX_TENSOR_NAME_BYTES),
        )?;
        let ctx = format!("tensor '{name}'");
        c.charge(std::mem::size_of::<TensorInfo>() as u64 + 32, &ctx)?;
        let info = read_tensor_info(&mut c, name, &ctx)?;
        if !names.insert(info.name.clone()) {
            return Err(c.err(format!("{ctx} appears more than once")));
        }
        tensors.push(info);
    }

    let header_end = c.pos;
    let data_start = header_end
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| c.err("data section start overflows".to_string()))?;
    for t in &mut tensors {
        let rel = t.offset;
        if rel % alignment != 0 {
            return Err(c.err(format!(
                "tensor '{}': data offset {rel} is not a multiple of the alignment {alignment}",
                t.name
            )));
        }
        let start = data_start.checked_add(rel);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(s), Some(e)) if e <= len => t.offset = s,
            _ => {
                return Err(c.err(format!(
                    "tensor '{}': {} data bytes at offset {rel} lie outside the data section \
                     ({} bytes from byte {data_start})",
                    t.name,
                    t.n_bytes,
                    len.saturating_sub(data_start)
                )))
            }
        }
    }
    check_overlaps(&c, &tensors)?;

    Ok(ParsedFile {
        version,
        alignment,
        metadata,
        tensors,
    })
}

/// Reads the rest of one tensor info after its name; the offset stays relative.
fn read_tensor_info<R: Read>(c: &mut Cursor<R>, name: String, ctx: &str) -> Result<TensorInfo> {
    let n_dims = c.u32(ctx)?;
    if n_dims > MAX_DIMS {
        return Err(c.err(format!(
            "{ctx}: {n_dims} dimensions (at most {MAX_DIMS} are allowed)"
        )));
    }
    let mut shape = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        shape.push(c.u64(ctx)?);
    }
    let type_id = c.u32(ctx)?;
    let Some(ggml_ty) = GgmlType::from_u32(type_id) else {
        return Err(c.err(format!("{ctx}: unknown ggml type id {type_id}")));
    };
    let offset = c.u64(ctx)?;

    // Element count must fit in i64 (GGML counts elements in int64_t). Zero dimensions count
    // as 1 here so that the row count (product of shape[1..]) is bounded too.
    let bounded = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d.max(1)))
        .filter(|&n| n <= i64::MAX as u64);
    if bounded.is_none() {
        return Err(c.err(format!(
            "{ctx}: shape {shape:?} has more than 2^63 - 1 elements"
        )));
    }
    let cols = shape.first().copied().unwrap_or(1);
    let rows: u64 = shape.iter().skip(1).product(); // ≤ `bounded`, cannot overflow
    let block = ggml_ty.block_elems() as u64;
    if cols % block != 0 {
        return Err(c.err(format!(
            "{ctx}: row length {cols} is not a multiple of the {ggml_ty} block size {block}"
        )));
    }
    let n_bytes = (cols / block)
        .checked_mul(ggml_ty.block_bytes() as u64)
        .and_then(|b| b.checked_mul(rows))
        .ok_or_else(|| c.err(format!("{ctx}: byte size of shape {shape:?} overflows")))?;
    Ok(TensorInfo {
        name,
        ty: ggml_ty,
        shape,
        file: 0,
        offset,
        n_bytes,
    })
}

/// Rejects tensors whose data ranges overlap (offsets are absolute here).
fn check_overlaps<R: Read>(c: &Cursor<R>, tensors: &[TensorInfo]) -> Result<()> {
    let mut order: Vec<usize> = (0..tensors.len())
        .filter(|&i| tensors[i].n_bytes > 0)
        .collect();
    order.sort_by_key(|&i| tensors[i].offset);
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        if a.offset + a.n_bytes > b.offset {
            return Err(c.err(format!(
                "tensor '{}' and tensor '{}' have overlapping data",
                a.name, b.name
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(n_tensors: u64, n_kv: u64) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&n_tensors.to_le_bytes());
        b.extend_from_slice(&n_kv.to_le_bytes());
        b
    }

    fn parse_bytes(b: &[u8], budget: u64) -> Result<ParsedFile> {
        parse_with_budget(b, b.len() as u64, "m.gguf", budget)
    }

    #[test]
    fn empty_metadata_key_is_refused_with_its_index() {
        // Entry #0 "k" = u8 7, entry #1 "" = u8 1.
        let mut b = header(0, 2);
        for key in [&b"k"[..], b""] {
            b.extend_from_slice(&(key.len() as u64).to_le_bytes());
            b.extend_from_slice(key);
            b.extend_from_slice(&U8.to_le_bytes());
            b.push(7);
        }
        let e = parse_bytes(&b, MAX_HEADER_MEMORY).unwrap_err().to_string();
        assert_eq!(e, "m.gguf: metadata entry #1 has an empty key");
        // The same file with the second key named parses.
        let mut ok = header(0, 2);
        for key in [&b"k"[..], b"j"] {
            ok.extend_from_slice(&(key.len() as u64).to_le_bytes());
            ok.extend_from_slice(key);
            ok.extend_from_slice(&U8.to_le_bytes());
            ok.push(7);
        }
        assert_eq!(
            parse_bytes(&ok, MAX_HEADER_MEMORY).unwrap().metadata["j"],
            Value::U8(7)
        );
    }

    #[test]
    fn memory_budget_bounds_metadata_values() {
        // Key "k": an array of 1000 u8 values (1012 file bytes, 33000 bytes in memory).
        let mut b = header(0, 1);
        b.extend_from_slice(&1u64.to_le_bytes());
        b.push(b'k');
        b.extend_from_slice(&ARRAY.to_le_bytes());
        b.extend_from_slice(&U8.to_le_bytes());
        b.extend_from_slice(&1000u64.to_le_bytes());
        b.extend(std::iter::repeat_n(5u8, 1000));
        let vsize = std::mem::size_of::<Value>() as u64;
        // Charged: the key (1 byte), the array value and its 1000 elements.
        let p = parse_bytes(&b, 1001 * vsize + 1).unwrap();
        assert_eq!(p.metadata["k"].as_array().unwrap().len(), 1000);
        assert_eq!(p.metadata["k"].as_array().unwrap()[999], Value::U8(5));
        let e = parse_bytes(&b, 1001 * vsize).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "m.gguf: metadata key 'k': the header would take more than \
                 {MAX_HEADER_MEMORY} bytes of memory"
            )
        );
    }

    #[test]
    fn memory_budget_bounds_strings_and_tensor_infos() {
        let mut b = header(0, 1);
        b.extend_from_slice(&1u64.to_le_bytes());
        b.push(b'k');
        b.extend_from_slice(&STRING.to_le_bytes());
        b.extend_from_slice(&100u64.to_le_bytes());
        b.extend(std::iter::repeat_n(b'a', 100));
        let vsize = std::mem::size_of::<Value>() as u64;
        // Charged: the key (1 byte), the value and its 100 string bytes.
        assert!(parse_bytes(&b, vsize + 101).is_ok());
        assert!(parse_bytes(&b, vsize + 100).is_err());

        let mut b = header(1, 0);
        b.extend_from_slice(&1u64.to_le_bytes());
        b.push(b't');
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.resize(64 + 4, 0);
        let tsize = std::mem::size_of::<TensorInfo>() as u64 + 32;
        // Charged: the name (1 byte) and the tensor info.
        let p = parse_bytes(&b, tsize + 1).unwrap();
        assert_eq!(p.tensors[0].offset, 64);
        let e = parse_bytes(&b, tsize).unwrap_err().to_string();
        assert!(
            e.starts_with("m.gguf: tensor 't': the header would take more than"),
            "{e}"
        );
    }
}
