//! GGUF metadata values ([`Value`]) and the errors of reading GGUF files ([`GgufError`]):
//! the types the file parser (`gguf_parse.rs`), the model reader (`gguf.rs`) and its metadata
//! getters (`gguf_meta.rs`) share. Public as `source::gguf::{Value, GgufError}`.

/// One metadata value, one variant per GGUF value type. Arrays may nest (each array holds
/// one element type; the reader limits nesting to 8 levels).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

/// Errors from reading GGUF files and their metadata. Every message names the file (its file
/// name) and the field, key or tensor concerned.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file (or folder) could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The path as given (or the file name when reading a header fails midway).
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The file content is malformed, hostile or inconsistent; `msg` names the field.
    #[error("{file}: {msg}")]
    Format {
        /// File name (last path component).
        file: String,
        /// What is wrong, starting with the field, key or tensor.
        msg: String,
    },
    /// A part of a split model is not on disk.
    #[error("split part {part} of {count} is missing: {path} does not exist")]
    MissingPart {
        /// Full path of the absent part.
        path: String,
        /// 1-based part number.
        part: u32,
        /// Number of parts in the set.
        count: u32,
    },
    /// A required metadata key is absent.
    #[error("{file}: metadata key '{key}' is missing")]
    MissingKey { file: String, key: String },
    /// A metadata key has the wrong type or an out-of-range value.
    #[error("{file}: metadata key '{key}' {problem}")]
    BadKey {
        file: String,
        key: String,
        problem: String,
    },
    /// A folder does not hold exactly one model.
    #[error("{dir}: {msg}")]
    NoModel { dir: String, msg: String },
}

impl Value {
    /// The GGUF type name: `u8`, `i8`, `u16`, `i16`, `u32`, `i32`, `u64`, `i64`, `f32`,
    /// `f64`, `bool`, `string` or `array`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }

    /// Any integer type holding a value ≥ 0, as `u64`; `None` for negative values and
    /// non-integers (floats and bools included).
    pub fn as_u64(&self) -> Option<u64> {
        self.as_integer().and_then(|v| u64::try_from(v).ok())
    }

    /// Any integer type holding a value in `i64` range, as `i64`; `None` otherwise.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_integer().and_then(|v| i64::try_from(v).ok())
    }

    /// Any integer type, widened to `i128`; `None` for non-integers.
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// An `f32` value, or an `f64` value rounded to `f32`; `None` for other types.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// An `f64` or `f32` value as `f64`; `None` for other types.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The text of a string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements of an array value.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A bool value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
}

/// Short human form for messages: numbers as written, strings quoted, arrays as
/// `[a, b, c, ... (N items)]` showing at most 8 items.
impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) => write!(f, "{s:?}"),
            Value::Array(a) => {
                f.write_str("[")?;
                for (i, e) in a.iter().take(8).enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{e}")?;
                }
                if a.len() > 8 {
                    write!(f, ", ... ({} items)", a.len())?;
                }
                f.write_str("]")
            }
        }
    }
}
