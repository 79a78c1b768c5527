//! Typed metadata accessors of [`GgufModel`]. Required getters (`get_*`) fail with
//! [`GgufError::MissingKey`] or [`GgufError::BadKey`] naming the key; optional ones (`opt_*`)
//! return `Ok(None)` for a missing key and still fail on a wrong type.

use super::gguf::{GgufError, GgufModel, Value};

type Result<T> = std::result::Result<T, GgufError>;

impl GgufModel {
    /// The metadata value stored under `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// `general.architecture`, e.g. `"gemma3"`.
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")
    }

    fn bad(&self, key: &str, problem: String) -> GgufError {
        GgufError::BadKey {
            file: self.file_name(),
            key: key.to_string(),
            problem,
        }
    }

    fn wrong_type(&self, key: &str, v: &Value, expected: &str) -> GgufError {
        self.bad(
            key,
            format!("has type {}, expected {expected}", describe(v)),
        )
    }

    fn required(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            file: self.file_name(),
            key: key.to_string(),
        })
    }

    /// Applies `conv` to the value of `key` when present.
    fn opt_with<'a, T>(
        &'a self,
        key: &str,
        conv: impl Fn(&'a Value) -> Result<T>,
    ) -> Result<Option<T>> {
        self.get(key).map(conv).transpose()
    }

    fn int<T: TryFrom<i128>>(&self, key: &str, v: &Value, name: &str) -> Result<T> {
        let Some(i) = v.as_integer() else {
            return Err(self.wrong_type(key, v, &format!("an integer that fits in {name}")));
        };
        T::try_from(i).map_err(|_| self.bad(key, format!("value {i} does not fit in {name}")))
    }

    /// An integer value (any integer type) that fits in `u32`.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        let v = self.required(key)?;
        self.int(key, v, "u32")
    }

    /// Like [`GgufModel::get_u32`]; `Ok(None)` when the key is missing.
    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        self.opt_with(key, |v| self.int(key, v, "u32"))
    }

    fn u64_of(&self, key: &str, v: &Value) -> Result<u64> {
        self.int(key, v, "u64")
    }

    /// An integer value (any integer type) that fits in `u64`.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self.required(key)?;
        self.u64_of(key, v)
    }

    /// Like [`GgufModel::get_u64`]; `Ok(None)` when the key is missing.
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        self.opt_with(key, |v| self.u64_of(key, v))
    }

    /// An integer value (any integer type) that fits in `i64`.
    pub fn get_i64(&self, key: &str) -> Result<i64> {
        let v = self.required(key)?;
        self.int(key, v, "i64")
    }

    /// Like [`GgufModel::get_i64`]; `Ok(None)` when the key is missing.
    pub fn opt_i64(&self, key: &str) -> Result<Option<i64>> {
        self.opt_with(key, |v| self.int(key, v, "i64"))
    }

    fn f32_of(&self, key: &str, v: &Value) -> Result<f32> {
        v.as_f32()
            .ok_or_else(|| self.wrong_type(key, v, "f32 or f64"))
    }

    /// An `f32` value, or an `f64` value rounded to `f32`.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.required(key)?;
        self.f32_of(key, v)
    }

    /// Like [`GgufModel::get_f32`]; `Ok(None)` when the key is missing.
    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        self.opt_with(key, |v| self.f32_of(key, v))
    }

    fn bool_of(&self, key: &str, v: &Value) -> Result<bool> {
        v.as_bool().ok_or_else(|| self.wrong_type(key, v, "bool"))
    }

    /// A bool value.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        let v = self.required(key)?;
        self.bool_of(key, v)
    }

    /// Like [`GgufModel::get_bool`]; `Ok(None)` when the key is missing.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.opt_with(key, |v| self.bool_of(key, v))
    }

    fn str_of<'a>(&self, key: &str, v: &'a Value) -> Result<&'a str> {
        v.as_str().ok_or_else(|| self.wrong_type(key, v, "string"))
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.required(key)?;
        self.str_of(key, v)
    }

    /// Like [`GgufModel::get_str`]; `Ok(None)` when the key is missing.
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        self.opt_with(key, |v| self.str_of(key, v))
    }

    fn str_array_of<'a>(&self, key: &str, v: &'a Value) -> Result<Vec<&'a str>> {
        let expected = "array of strings";
        let a = v
            .as_array()
            .ok_or_else(|| self.wrong_type(key, v, expected))?;
        a.iter()
            .map(|e| e.as_str().ok_or_else(|| self.wrong_type(key, v, expected)))
            .collect()
    }

    /// An array of strings (e.g. `tokenizer.ggml.tokens`).
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        let v = self.required(key)?;
        self.str_array_of(key, v)
    }

    /// Like [`GgufModel::get_str_array`]; `Ok(None)` when the key is missing.
    pub fn opt_str_array(&self, key: &str) -> Result<Option<Vec<&str>>> {
        self.opt_with(key, |v| self.str_array_of(key, v))
    }

    fn f32_array_of(&self, key: &str, v: &Value) -> Result<Vec<f32>> {
        let expected = "array of f32 or f64";
        let a = v
            .as_array()
            .ok_or_else(|| self.wrong_type(key, v, expected))?;
        a.iter()
            .map(|e| e.as_f32().ok_or_else(|| self.wrong_type(key, v, expected)))
            .collect()
    }

    /// An array of `f32` (or `f64`, rounded) values (e.g. `tokenizer.ggml.scores`).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        let v = self.required(key)?;
        self.f32_array_of(key, v)
    }

    /// Like [`GgufModel::get_f32_array`]; `Ok(None)` when the key is missing.
    pub fn opt_f32_array(&self, key: &str) -> Result<Option<Vec<f32>>> {
        self.opt_with(key, |v| self.f32_array_of(key, v))
    }

    fn i32_array_of(&self, key: &str, v: &Value) -> Result<Vec<i32>> {
        let expected = "array of integers that fit in i32";
        let a = v
            .as_array()
            .ok_or_else(|| self.wrong_type(key, v, expected))?;
        a.iter()
            .map(|e| {
                e.as_i64()
                    .and_then(|x| i32::try_from(x).ok())
                    .ok_or_else(|| self.wrong_type(key, v, expected))
            })
            .collect()
    }

    /// An array of integers (any integer type) that each fit in `i32`
    /// (e.g. `tokenizer.ggml.token_type`).
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        let v = self.required(key)?;
        self.i32_array_of(key, v)
    }

    /// Like [`GgufModel::get_i32_array`]; `Ok(None)` when the key is missing.
    pub fn opt_i32_array(&self, key: &str) -> Result<Option<Vec<i32>>> {
        self.opt_with(key, |v| self.i32_array_of(key, v))
    }
}

/// Type description for messages: `u32`, `string`, `array of i32`, `empty array`...
fn describe(v: &Value) -> String {
    match v {
        Value::Array(a) => match a.first() {
            None => "empty array".to_string(),
            Some(e) => match a.iter().find(|x| x.type_name() != e.type_name()) {
                None => format!("array of {}", describe(e)),
                Some(_) => "array of mixed types".to_string(),
            },
        },
        other => other.type_name().to_string(),
    }
}
