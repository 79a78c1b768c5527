//! Typed access to GGUF metadata for model loaders, with errors that name the file and key.

use anyhow::{anyhow, bail, Result};

use crate::source::gguf::{GgufModel, Value};

fn file(g: &GgufModel) -> String {
    g.files
        .first()
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// The string at `key`. Errors: missing or not a string.
pub fn get_str<'a>(g: &'a GgufModel, key: &str) -> Result<&'a str> {
    match g.metadata.get(key) {
        Some(Value::String(s)) => Ok(s),
        Some(v) => bail!(
            "{}: metadata key '{key}' should be a string, found {v:?}",
            file(g)
        ),
        None => bail!("{}: metadata key '{key}' is missing", file(g)),
    }
}

/// The integer at `key` (any integer type, non-negative), or `None` when absent.
/// Errors: present but not a non-negative integer.
pub fn opt_u64(g: &GgufModel, key: &str) -> Result<Option<u64>> {
    let v = match g.metadata.get(key) {
        None => return Ok(None),
        Some(v) => v,
    };
    let n: Option<u64> = match *v {
        Value::U8(x) => Some(x as u64),
        Value::U16(x) => Some(x as u64),
        Value::U32(x) => Some(x as u64),
        Value::U64(x) => Some(x),
        Value::I8(x) => u64::try_from(x).ok(),
        Value::I16(x) => u64::try_from(x).ok(),
        Value::I32(x) => u64::try_from(x).ok(),
        Value::I64(x) => u64::try_from(x).ok(),
        _ => None,
    };
    n.map(Some).ok_or_else(|| {
        anyhow!(
            "{}: metadata key '{key}' should be a non-negative integer, found {v:?}",
            file(g)
        )
    })
}

/// The integer at `key` as `usize`. Errors: missing, not an integer, or larger than `max`.
pub fn get_usize(g: &GgufModel, key: &str, max: u64) -> Result<usize> {
    let v =
        opt_u64(g, key)?.ok_or_else(|| anyhow!("{}: metadata key '{key}' is missing", file(g)))?;
    if v > max {
        bail!(
            "{}: metadata key '{key}' = {v} is larger than the supported maximum {max}",
            file(g)
        );
    }
    Ok(v as usize)
}

/// The float at `key` (f32 or f64), or `None` when absent. Errors: present but not a float.
pub fn opt_f32(g: &GgufModel, key: &str) -> Result<Option<f32>> {
    match g.metadata.get(key) {
        None => Ok(None),
        Some(Value::F32(x)) => Ok(Some(*x)),
        Some(Value::F64(x)) => Ok(Some(*x as f32)),
        Some(v) => bail!(
            "{}: metadata key '{key}' should be a float, found {v:?}",
            file(g)
        ),
    }
}
