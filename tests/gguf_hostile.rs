//! The GGUF reader on malformed and hostile files: every failure is an `Err` with a message
//! naming the file and the field or tensor; nothing panics or allocates what the file cannot
//! back with bytes.

mod common;

use std::path::PathBuf;

use common::gguf::open_bytes;
use deltafin::quant::GgmlType;
use deltafin::source::gguf::{GgufModel, Value};
use deltafin::write::gguf_writer::GgufWriter;
use proptest::prelude::*;

/// Hand-made GGUF bytes, so tests can write any field value.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    /// Magic, version, tensor count, metadata count.
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw::default();
        r.bytes(b"GGUF").u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn str(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64).bytes(s)
    }
    /// One tensor info: name, dims, ggml type id, relative offset.
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name.as_bytes()).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pads with zeros to a multiple of `a`.
    fn pad(&mut self, a: usize) -> &mut Self {
        let n = self.0.len().next_multiple_of(a);
        self.0.resize(n, 0);
        self
    }
    fn zeros(&mut self, n: usize) -> &mut Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
}

/// Writes `bytes` to `<tempdir>/hostile.gguf` and returns the reader's error message.
fn open_err(bytes: &[u8]) -> String {
    match open_bytes("hostile.gguf", bytes) {
        Ok(m) => panic!("accepted a bad file: {m:?}"),
        Err(e) => e.to_string(),
    }
}

fn open_ok(bytes: &[u8]) -> GgufModel {
    open_bytes("ok.gguf", bytes).unwrap()
}

/// A small valid file with several value types, nested arrays and two tensors.
fn small_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("tiny".into()))
        .add("a.u16", Value::U16(3))
        .add("a.bool", Value::Bool(true))
        .add("a.f64", Value::F64(2.5))
        .add(
            "a.nested",
            Value::Array(vec![
                Value::Array(vec![Value::String("ab".into())]),
                Value::Array(vec![Value::I8(-1), Value::I8(2)]),
            ]),
        )
        .add_f32_tensor("x", &[2], &[1.0, 2.0])
        .add_tensor("y", GgmlType::Q8_0, &[32], vec![7; 34]);
    w.to_bytes()
}

#[test]
fn small_file_is_valid() {
    let m = open_ok(&small_file());
    assert_eq!(m.tensors.len(), 2);
    assert_eq!(m.metadata.len(), 5);
}

#[test]
fn truncation_at_every_length_is_an_error() {
    let full = small_file();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    for len in 0..full.len() {
        std::fs::write(&path, &full[..len]).unwrap();
        let r = GgufModel::open(&path);
        assert!(
            r.is_err(),
            "truncated to {len} of {} bytes was accepted",
            full.len()
        );
    }
    std::fs::write(&path, &full[..2]).unwrap();
    assert_eq!(
        GgufModel::open(&path).unwrap_err().to_string(),
        "t.gguf: not a GGUF file (only 2 bytes, shorter than the magic)"
    );
    // Layout: 24-byte header, metadata up to byte 199, tensor infos 'x' and 'y' up to 265,
    // data from 288: 'x' (8 bytes) at 288, 'y' (34 bytes) at 320, ending the file at 354.
    assert_eq!(full.len(), 354);
    std::fs::write(&path, &full[..100]).unwrap();
    assert_eq!(
        GgufModel::open(&path).unwrap_err().to_string(),
        "t.gguf: metadata count 5 cannot fit in the remaining 76 bytes (with 2 tensor infos)"
    );
    std::fs::write(&path, &full[..261]).unwrap();
    assert_eq!(
        GgufModel::open(&path).unwrap_err().to_string(),
        "t.gguf: tensor 'y': unexpected end of file at byte 257 (needs 8 bytes, 4 remain)"
    );
    std::fs::write(&path, &full[..353]).unwrap();
    assert_eq!(
        GgufModel::open(&path).unwrap_err().to_string(),
        "t.gguf: tensor 'y': 34 data bytes at offset 32 lie outside the data section \
         (65 bytes from byte 288)"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Flipped bytes never panic; whatever is accepted keeps every tensor inside the file.
    #[test]
    fn flipped_bytes_never_panic(flips in prop::collection::vec((any::<usize>(), 1u8..=255), 1..8),
                                 cut in any::<usize>()) {
        let mut bytes = small_file();
        for (i, x) in flips {
            let i = i % bytes.len();
            bytes[i] ^= x;
        }
        if cut % 4 == 0 {
            bytes.truncate(cut % (bytes.len() + 1));
        }
        if let Ok(m) = open_bytes("f.gguf", &bytes) {
            for t in &m.tensors {
                prop_assert!(t.offset + t.n_bytes <= bytes.len() as u64);
                prop_assert_eq!(t.offset % m.alignment, 0);
            }
        }
    }
}

#[test]
fn huge_array_length_is_rejected_before_allocating() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"tokenizer.ggml.tokens")
        .u32(9)
        .u32(8)
        .u64(4_000_000_000)
        .zeros(812);
    assert_eq!(
        open_err(&r.0),
        "hostile.gguf: metadata key 'tokenizer.ggml.tokens': array of 4000000000 strings \
         cannot fit in the remaining 812 bytes"
    );
    // Lengths whose byte size overflows u64.
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k").u32(9).u32(10).u64(u64::MAX / 2).zeros(20);
    assert_eq!(
        open_err(&r.0),
        "hostile.gguf: metadata key 'k': array of 9223372036854775807 u64 values \
         cannot fit in the remaining 20 bytes"
    );
}

#[test]
fn huge_string_lengths_are_rejected() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"general.name").u32(8).u64(1 << 62).zeros(10);
    assert_eq!(
        open_err(&r.0),
        "hostile.gguf: metadata key 'general.name': string of 4611686018427387904 bytes \
         cannot fit in the remaining 10 bytes"
    );
    let mut r = Raw::header(3, 0, 1);
    r.u64(u64::MAX).zeros(40);
    assert_eq!(
        open_err(&r.0),
        "hostile.gguf: metadata entry #0 key: string of 18446744073709551615 bytes \
         cannot fit in the remaining 40 bytes"
    );
    let mut r = Raw::header(3, 0, 1);
    r.str(&[b'k'; 65_536]).u32(4).u32(1);
    assert_eq!(
        open_err(&r.0),
        "hostile.gguf: metadata entry #0 key: string of 65536 bytes is longer than the \
         65535-byte limit"
    );
    let mut r = Raw::header(3, 1, 0);
    r.tensor(&"n".repeat(65), &[1], 0, 0).pad(32).zeros(4);
    assert_eq!(
        open_err(&r.0),
        "hostile.gguf: tensor info #0 name: string of 65 bytes is longer than the 64-byte limit"
    );
}

#[test]
fn huge_counts_are_rejected() {
    let mut r = Raw::header(3, u64::MAX, 0);
    r.zeros(100);
    assert_eq!(
        open_err(&r.0),
        "hostile.gguf: tensor count 18446744073709551615 cannot fit in the remaining 100 bytes"
    );
    let mut r = Raw::header(2, 1, 1 << 40);
    r.zeros(100);
    assert_eq!(
        open_err(&r.0),
        "hostile.gguf: metadata count 1099511627776 cannot fit in the remaining 100 bytes \
         (with 1 tensor infos)"
    );
    // Each count fits alone but not both together: 4 * 24 + 1 * 13 > 100.
    let mut r = Raw::header(2, 4, 1);
    r.zeros(100);
    assert_eq!(
        open_err(&r.0),
        "hostile.gguf: metadata count 1 cannot fit in the remaining 100 bytes \
         (with 4 tensor infos)"
    );
}

#[test]
fn header_fields_are_checked() {
    let v1 = Raw::header(1, 0, 0).0;
    assert_eq!(
        open_err(&v1),
        "hostile.gguf: GGUF version 1 is not supported (only versions 2 and 3 are)"
    );
    assert_eq!(
        open_err(&Raw::header(4, 0, 0).0),
        "hostile.gguf: unsupported GGUF version 4 (only versions 2 and 3 are supported)"
    );
    assert_eq!(
        open_err(&Raw::header(3u32.swap_bytes(), 0, 0).0),
        "hostile.gguf: big-endian GGUF (version 3) is not supported"
    );
    let mut bad = Raw::header(3, 0, 0).0;
    bad[0] = b'X';
    assert_eq!(
        open_err(&bad),
        "hostile.gguf: not a GGUF file (magic \"XGUF\" instead of \"GGUF\")"
    );
    // The smallest valid file: a header with no metadata and no tensors.
    let m = open_ok(&Raw::header(2, 0, 0).0);
    assert_eq!((m.version, m.alignment, m.tensors.len()), (2, 32, 0));
}

#[test]
fn metadata_values_are_checked() {
    let cases: Vec<(Raw, &str)> = vec![
        (
            {
                let mut r = Raw::header(3, 0, 1);
                r.str(b"b").u32(7).bytes(&[2]);
                r
            },
            "hostile.gguf: metadata key 'b': bool value 2 is neither 0 nor 1",
        ),
        (
            {
                let mut r = Raw::header(3, 0, 1);
                r.str(b"u").u32(13).zeros(16);
                r
            },
            "hostile.gguf: metadata key 'u': unknown value type 13",
        ),
        (
            {
                let mut r = Raw::header(3, 0, 1);
                r.str(b"u").u32(9).u32(99).u64(0).zeros(8);
                r
            },
            "hostile.gguf: metadata key 'u': array of unknown value type 99",
        ),
        (
            {
                let mut r = Raw::header(3, 0, 1);
                r.str(b"s").u32(8).str(b"ok\xff\xfe");
                r
            },
            "hostile.gguf: metadata key 's': string is not valid UTF-8 (bad byte at index 2)",
        ),
        (
            {
                let mut r = Raw::header(3, 0, 1);
                r.str(b"\xc3k").u32(0).bytes(&[1]);
                r
            },
            "hostile.gguf: metadata entry #0 key: string is not valid UTF-8 (bad byte at index 0)",
        ),
        (
            {
                let mut r = Raw::header(3, 0, 2);
                r.str(b"d").u32(0).bytes(&[1]).str(b"d").u32(0).bytes(&[2]);
                r
            },
            "hostile.gguf: metadata key 'd' appears more than once",
        ),
    ];
    for (raw, want) in cases {
        assert_eq!(open_err(&raw.0), want);
    }
}

/// A value made of `levels` nested arrays, the innermost holding one u8.
fn nested(levels: usize) -> Raw {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"n").u32(9);
    for _ in 1..levels {
        r.u32(9).u64(1);
    }
    r.u32(0).u64(1).bytes(&[42]);
    r
}

#[test]
fn array_nesting_is_limited() {
    let m = open_ok(&nested(8).0);
    let mut v = m.get("n").unwrap();
    for _ in 0..8 {
        v = &v.as_array().unwrap()[0];
    }
    assert_eq!(v, &Value::U8(42));
    assert_eq!(
        open_err(&nested(9).0),
        "hostile.gguf: metadata key 'n': arrays nested deeper than 8 levels"
    );
    // Deep nesting fails at the limit, without deep recursion.
    assert_eq!(
        open_err(&nested(100_000).0),
        "hostile.gguf: metadata key 'n': arrays nested deeper than 8 levels"
    );
}

/// A file with `general.alignment` set to `v` (type `ty`) and no tensors.
fn with_alignment(ty: u32, v: &[u8]) -> Vec<u8> {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"general.alignment").u32(ty).bytes(v);
    r.0
}

#[test]
fn alignment_must_be_a_power_of_two() {
    for (v, shown) in [(0u32, 0u64), (3, 3), (48, 48)] {
        assert_eq!(
            open_err(&with_alignment(4, &v.to_le_bytes())),
            format!(
                "hostile.gguf: metadata key 'general.alignment': {shown} is not a nonzero \
                 power of two that fits in u32"
            )
        );
    }
    assert_eq!(
        open_err(&with_alignment(10, &(1u64 << 32).to_le_bytes())),
        "hostile.gguf: metadata key 'general.alignment': 4294967296 is not a nonzero power \
         of two that fits in u32"
    );
    assert_eq!(
        open_err(&with_alignment(6, &1.0f32.to_le_bytes())),
        "hostile.gguf: metadata key 'general.alignment' has type f32, expected u32"
    );
    assert_eq!(
        open_ok(&with_alignment(4, &16u32.to_le_bytes())).alignment,
        16
    );
}

/// A file with one metadata-free header and the given tensor infos, padded to 32, followed
/// by `data` zero bytes.
fn tensors_file(infos: &[(&str, &[u64], u32, u64)], data: usize) -> Vec<u8> {
    let mut r = Raw::header(3, infos.len() as u64, 0);
    for &(name, dims, ty, off) in infos {
        r.tensor(name, dims, ty, off);
    }
    r.pad(32).zeros(data);
    r.0
}

#[test]
fn tensor_infos_are_checked() {
    let f32_id = GgmlType::F32.id();
    let q8 = GgmlType::Q8_0.id();
    let cases: Vec<(Vec<u8>, String)> = vec![
        (
            tensors_file(&[("a", &[1, 1, 1, 1, 1], f32_id, 0)], 4),
            "tensor 'a': 5 dimensions (at most 4 are allowed)".into(),
        ),
        (
            tensors_file(&[("a", &[4], 4, 0)], 64),
            "tensor 'a': unknown ggml type id 4".into(),
        ),
        (
            tensors_file(&[("a", &[1 << 32, 1 << 32], f32_id, 0)], 4),
            "tensor 'a': shape [4294967296, 4294967296] has more than 2^63 - 1 elements".into(),
        ),
        (
            tensors_file(&[("a", &[u64::MAX], 0, 0)], 4),
            "tensor 'a': shape [18446744073709551615] has more than 2^63 - 1 elements".into(),
        ),
        (
            // Zero elements, but the row count alone overflows.
            tensors_file(&[("a", &[0, 1 << 40, 1 << 40], f32_id, 0)], 4),
            "tensor 'a': shape [0, 1099511627776, 1099511627776] has more than 2^63 - 1 \
             elements"
                .into(),
        ),
        (
            // 2^62 F32 elements fit in i64 but not their 2^64 bytes.
            tensors_file(&[("a", &[1 << 31, 1 << 31], f32_id, 0)], 4),
            "tensor 'a': byte size of shape [2147483648, 2147483648] overflows".into(),
        ),
        (
            tensors_file(&[("a", &[33], q8, 0)], 68),
            "tensor 'a': row length 33 is not a multiple of the Q8_0 block size 32".into(),
        ),
        (
            tensors_file(&[("a", &[4], f32_id, 16)], 64),
            "tensor 'a': data offset 16 is not a multiple of the alignment 32".into(),
        ),
        (
            tensors_file(&[("a", &[4], f32_id, 32)], 40),
            "tensor 'a': 16 data bytes at offset 32 lie outside the data section \
             (40 bytes from byte 64)"
                .into(),
        ),
        (
            tensors_file(&[("a", &[4], f32_id, u64::MAX - 31)], 40),
            format!(
                "tensor 'a': 16 data bytes at offset {} lie outside the data section \
                 (40 bytes from byte 64)",
                u64::MAX - 31
            ),
        ),
        (
            tensors_file(&[("a", &[16], f32_id, 0), ("b", &[4], f32_id, 32)], 64),
            "tensor 'a' and tensor 'b' have overlapping data".into(),
        ),
        (
            tensors_file(&[("a", &[4], f32_id, 0), ("a", &[4], f32_id, 32)], 64),
            "tensor 'a' appears more than once".into(),
        ),
        (
            tensors_file(
                &[("a", &[4], f32_id, 0), ("\u{0}\u{ff}", &[4], f32_id, 32)],
                64,
            ),
            String::new(), // valid UTF-8 (U+00FF), accepted: checked below
        ),
    ];
    for (bytes, want) in cases {
        if want.is_empty() {
            assert_eq!(open_ok(&bytes).tensors.len(), 2);
        } else {
            assert_eq!(open_err(&bytes), format!("hostile.gguf: {want}"));
        }
    }
    // Invalid UTF-8 in a tensor name.
    let mut r = Raw::header(3, 1, 0);
    r.str(b"\xff").u32(1).u64(1).u32(0).u64(0).pad(32).zeros(4);
    assert_eq!(
        open_err(&r.0),
        "hostile.gguf: tensor info #0 name: string is not valid UTF-8 (bad byte at index 0)"
    );
}

#[test]
fn edge_shapes_are_accepted() {
    // A zero dimension gives an empty tensor; zero dims give a scalar of one element.
    let bytes = tensors_file(&[("e", &[0, 5], 0, 0), ("s", &[], 0, 0)], 4);
    let m = open_ok(&bytes);
    let e = m.tensor("e").unwrap();
    assert_eq!(
        (e.n_bytes, e.n_elements(), e.cols(), e.rows()),
        (0, 0, 0, 5)
    );
    let s = m.tensor("s").unwrap();
    assert_eq!(
        (s.n_bytes, s.n_elements(), s.cols(), s.rows(), s.offset),
        (4, 1, 1, 1, 96)
    );
}

#[test]
fn split_names_with_bad_numbers_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let p: PathBuf = dir.path().join("m-00004-of-00003.gguf");
    std::fs::write(&p, Raw::header(3, 0, 0).0).unwrap();
    assert_eq!(
        GgufModel::open(&p).unwrap_err().to_string(),
        "m-00004-of-00003.gguf: split file name says part 4 of 3"
    );
}
