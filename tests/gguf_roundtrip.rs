//! GGUF reader round trips through the test writer: every value type (v2 and v3), alignment,
//! split models, folders, and the typed accessors.

mod common;

use std::collections::BTreeMap;

use common::gguf::tensor_bytes;
use deltafin::quant::GgmlType;
use deltafin::source::gguf::{GgufModel, Value};
use deltafin::write::gguf_writer::GgufWriter;
use proptest::prelude::*;

fn s(x: &str) -> Value {
    Value::String(x.to_string())
}

/// Metadata holding every value type, nested arrays and edge values.
fn every_type() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", s("tiny")),
        ("t.u8", Value::U8(255)),
        ("t.i8", Value::I8(-128)),
        ("t.u16", Value::U16(65535)),
        ("t.i16", Value::I16(-32768)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f32", Value::F32(-1.5e-6)),
        ("t.f64", Value::F64(std::f64::consts::PI)),
        ("t.true", Value::Bool(true)),
        ("t.false", Value::Bool(false)),
        ("t.str", s("héllo ▁wörld 🦀")),
        ("t.empty_str", s("")),
        ("t.arr_u8", Value::Array(vec![Value::U8(0), Value::U8(7)])),
        ("t.arr_i8", Value::Array(vec![Value::I8(-1)])),
        (
            "t.arr_u16",
            Value::Array(vec![Value::U16(1), Value::U16(2)]),
        ),
        ("t.arr_i16", Value::Array(vec![Value::I16(-3)])),
        ("t.arr_u32", Value::Array(vec![Value::U32(9)])),
        (
            "t.arr_i32",
            Value::Array(vec![Value::I32(-9), Value::I32(3)]),
        ),
        ("t.arr_u64", Value::Array(vec![Value::U64(1 << 40)])),
        ("t.arr_i64", Value::Array(vec![Value::I64(-(1 << 40))])),
        (
            "t.arr_f32",
            Value::Array(vec![Value::F32(0.25), Value::F32(-2.0)]),
        ),
        ("t.arr_f64", Value::Array(vec![Value::F64(1e300)])),
        (
            "t.arr_bool",
            Value::Array(vec![Value::Bool(true), Value::Bool(false)]),
        ),
        ("t.arr_str", Value::Array(vec![s("a"), s(""), s("<bos>")])),
        ("t.arr_empty", Value::Array(vec![])),
        (
            "t.nested",
            Value::Array(vec![
                Value::Array(vec![s("x"), s("y")]),
                Value::Array(vec![]),
                Value::Array(vec![s("z")]),
            ]),
        ),
        (
            "t.nested3",
            Value::Array(vec![Value::Array(vec![Value::Array(vec![
                Value::I64(5),
                Value::I64(-5),
            ])])]),
        ),
    ]
}

fn q8_0_row(seed: u8) -> Vec<u8> {
    (0..34u8)
        .map(|i| i.wrapping_mul(7).wrapping_add(seed))
        .collect()
}

fn writer_with_tensors() -> GgufWriter {
    let mut w = GgufWriter::new();
    for (k, v) in every_type() {
        w.add(k, v);
    }
    w.add_f32_tensor("norm.weight", &[3], &[1.0, -2.0, 0.5]);
    let mut q = q8_0_row(1);
    q.extend(q8_0_row(2));
    w.add_tensor("blk.0.w", GgmlType::Q8_0, &[32, 2], q);
    w.add_tensor("blk.0.k", GgmlType::Q4_K, &[256, 1, 1], vec![0xab; 144]);
    w
}

#[test]
fn every_value_type_round_trips_in_v2_and_v3() {
    let dir = tempfile::tempdir().unwrap();
    for version in [2u32, 3] {
        let path = dir.path().join(format!("v{version}.gguf"));
        let mut w = writer_with_tensors();
        w.version(version);
        w.write(&path).unwrap();
        let m = GgufModel::open(&path).unwrap();
        assert_eq!(m.version, version);
        assert_eq!(m.alignment, 32);
        assert_eq!(m.files, vec![path.clone()]);
        let expected: BTreeMap<String, Value> = every_type()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(m.metadata, expected);

        let names: Vec<&str> = m.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["norm.weight", "blk.0.w", "blk.0.k"]);
        let n = m.tensor("norm.weight").unwrap();
        assert_eq!(
            (n.ty, n.shape.clone(), n.n_bytes),
            (GgmlType::F32, vec![3], 12)
        );
        let q = m.tensor("blk.0.w").unwrap();
        assert_eq!(
            (q.ty, q.shape.clone(), q.n_bytes),
            (GgmlType::Q8_0, vec![32, 2], 68)
        );
        assert_eq!((q.cols(), q.rows(), q.n_elements()), (32, 2, 64));
        let k = m.tensor("blk.0.k").unwrap();
        assert_eq!(
            (k.ty, k.n_bytes, k.cols(), k.rows()),
            (GgmlType::Q4_K, 144, 256, 1)
        );
        for t in &m.tensors {
            assert_eq!(t.offset % 32, 0, "{}", t.name);
            assert_eq!(t.file, 0);
        }
        let f: Vec<u8> = [1.0f32, -2.0, 0.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(tensor_bytes(&m, "norm.weight"), f);
        assert_eq!(tensor_bytes(&m, "blk.0.w")[..34], q8_0_row(1));
        assert_eq!(tensor_bytes(&m, "blk.0.w")[34..], q8_0_row(2));
        assert_eq!(tensor_bytes(&m, "blk.0.k"), vec![0xab; 144]);
        // The last tensor ends the file exactly (the writer adds no trailing padding).
        assert_eq!(k.offset + 144, std::fs::metadata(&path).unwrap().len());
        assert!(m.tensor("missing").is_none());
    }
}

#[test]
fn other_alignments_place_data_on_their_boundary() {
    let dir = tempfile::tempdir().unwrap();
    for align in [1u64, 8, 64, 4096] {
        let path = dir.path().join(format!("a{align}.gguf"));
        let mut w = writer_with_tensors();
        w.alignment(align);
        w.write(&path).unwrap();
        let m = GgufModel::open(&path).unwrap();
        assert_eq!(m.alignment, align);
        assert_eq!(m.get("general.alignment"), Some(&Value::U32(align as u32)));
        for t in &m.tensors {
            assert_eq!(t.offset % align, 0, "{} at {}", t.name, t.offset);
        }
        assert_eq!(tensor_bytes(&m, "blk.0.k"), vec![0xab; 144]);
        let f: Vec<u8> = [1.0f32, -2.0, 0.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(tensor_bytes(&m, "norm.weight"), f);
    }
    // With 4096-byte alignment the three tensors sit on consecutive pages.
    let m = GgufModel::open(&dir.path().join("a4096.gguf")).unwrap();
    let offs: Vec<u64> = m.tensors.iter().map(|t| t.offset).collect();
    assert_eq!(offs, [4096, 8192, 12288]);
}

#[test]
fn typed_getters_convert_and_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("acc.gguf");
    let mut w = writer_with_tensors();
    w.add("t.small_u64", Value::U64(7))
        .add("t.neg", Value::I32(-1))
        .add("t.mixed_ints", Value::Array(vec![Value::U8(1)]))
        .add("t.f64_arr", Value::Array(vec![Value::F64(0.5)]));
    w.write(&path).unwrap();
    let m = GgufModel::open(&path).unwrap();
    assert_eq!(m.architecture().unwrap(), "tiny");
    assert_eq!(m.file_name(), "acc.gguf");
    assert_eq!(m.get_u32("t.u8").unwrap(), 255);
    assert_eq!(m.get_u32("t.u16").unwrap(), 65535);
    assert_eq!(m.get_u32("t.small_u64").unwrap(), 7);
    assert_eq!(m.get_u64("t.u64").unwrap(), u64::MAX);
    assert_eq!(m.get_u64("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(m.get_i64("t.i64").unwrap(), i64::MIN);
    assert_eq!(m.get_f32("t.f32").unwrap(), -1.5e-6);
    assert_eq!(m.get_f32("t.f64").unwrap(), std::f32::consts::PI);
    assert!(m.get_bool("t.true").unwrap());
    assert!(!m.get_bool("t.false").unwrap());
    assert_eq!(m.get_str("t.str").unwrap(), "héllo ▁wörld 🦀");
    assert_eq!(m.get_str_array("t.arr_str").unwrap(), ["a", "", "<bos>"]);
    assert_eq!(m.get_f32_array("t.arr_f32").unwrap(), [0.25, -2.0]);
    assert_eq!(m.get_f32_array("t.f64_arr").unwrap(), [0.5]);
    assert_eq!(m.get_i32_array("t.arr_i32").unwrap(), [-9, 3]);
    assert_eq!(m.get_i32_array("t.mixed_ints").unwrap(), [1]);
    assert_eq!(m.get_str_array("t.arr_empty").unwrap(), Vec::<&str>::new());
    assert_eq!(m.opt_u32("t.absent").unwrap(), None);
    assert_eq!(m.opt_u32("t.u8").unwrap(), Some(255));
    assert_eq!(m.opt_f32("t.f32").unwrap(), Some(-1.5e-6));
    assert_eq!(m.opt_str("t.absent").unwrap(), None);
    assert_eq!(m.opt_bool("t.true").unwrap(), Some(true));
    assert_eq!(m.opt_str_array("t.absent").unwrap(), None);
    assert_eq!(m.opt_i32_array("t.arr_i32").unwrap(), Some(vec![-9, 3]));
    assert_eq!(m.opt_f32_array("t.absent").unwrap(), None);
    assert_eq!(m.opt_u64("t.u64").unwrap(), Some(u64::MAX));

    let err = |r: Result<_, _>| -> String {
        let e: deltafin::source::gguf::GgufError = r.err().unwrap();
        e.to_string()
    };
    assert_eq!(
        err(m.get_u32("nope").map(|_| ())),
        "acc.gguf: metadata key 'nope' is missing"
    );
    assert_eq!(
        err(m.get_u32("t.u64").map(|_| ())),
        "acc.gguf: metadata key 't.u64' value 18446744073709551615 does not fit in u32"
    );
    assert_eq!(
        err(m.get_u32("t.neg").map(|_| ())),
        "acc.gguf: metadata key 't.neg' value -1 does not fit in u32"
    );
    assert_eq!(
        err(m.get_u32("t.str").map(|_| ())),
        "acc.gguf: metadata key 't.str' has type string, expected an integer that fits in u32"
    );
    assert_eq!(
        err(m.opt_u32("t.f32").map(|_| ())),
        "acc.gguf: metadata key 't.f32' has type f32, expected an integer that fits in u32"
    );
    assert_eq!(
        err(m.get_f32("t.u8").map(|_| ())),
        "acc.gguf: metadata key 't.u8' has type u8, expected f32 or f64"
    );
    assert_eq!(
        err(m.get_bool("t.u8").map(|_| ())),
        "acc.gguf: metadata key 't.u8' has type u8, expected bool"
    );
    assert_eq!(
        err(m.get_str("t.arr_str").map(|_| ())),
        "acc.gguf: metadata key 't.arr_str' has type array of string, expected string"
    );
    assert_eq!(
        err(m.get_str_array("t.nested").map(|_| ())),
        "acc.gguf: metadata key 't.nested' has type array of array of string, \
         expected array of strings"
    );
    assert_eq!(
        err(m.get_i32_array("t.arr_u64").map(|_| ())),
        "acc.gguf: metadata key 't.arr_u64' has type array of u64, \
         expected array of integers that fit in i32"
    );
    assert_eq!(
        err(m.get_f32_array("t.arr_i8").map(|_| ())),
        "acc.gguf: metadata key 't.arr_i8' has type array of i8, expected array of f32 or f64"
    );

    assert_eq!(Value::I16(7).as_u64(), Some(7));
    assert_eq!(Value::I16(-7).as_u64(), None);
    assert_eq!(Value::Bool(true).as_u64(), None);
    assert_eq!(Value::F64(0.5).as_f32(), Some(0.5));
    assert_eq!(Value::U8(1).as_f32(), None);
    assert_eq!(s("x").as_str(), Some("x"));
    assert_eq!(Value::Array(vec![]).as_array(), Some(&[][..]));
    assert_eq!(Value::Bool(false).as_bool(), Some(false));
    assert_eq!(
        Value::Array((0..10).map(Value::U8).collect()).to_string(),
        "[0, 1, 2, 3, 4, 5, 6, 7, ... (10 items)]"
    );
}

/// Five tensors cut into three parts: 1, 2 and 2 tensors.
fn split_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add("general.architecture", s("tiny"))
        .add("tiny.block_count", Value::U32(2));
    for i in 0..5u8 {
        w.add_f32_tensor(format!("t{i}"), &[2], &[i as f32, -(i as f32)]);
    }
    w
}

#[test]
fn split_model_opens_from_any_part() {
    let dir = tempfile::tempdir().unwrap();
    let paths = split_writer().write_split(dir.path(), "tiny", 3).unwrap();
    let names: Vec<String> = paths
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "tiny-00001-of-00003.gguf",
            "tiny-00002-of-00003.gguf",
            "tiny-00003-of-00003.gguf"
        ]
    );
    for given in &paths {
        let m = GgufModel::open(given).unwrap();
        assert_eq!(m.files, paths);
        assert_eq!(m.get_u32("tiny.block_count").unwrap(), 2);
        assert_eq!(m.get_u32("split.count").unwrap(), 3);
        assert_eq!(m.get_u32("split.no").unwrap(), 0);
        let placed: Vec<(&str, usize)> = m
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t.file))
            .collect();
        assert_eq!(
            placed,
            [("t0", 0), ("t1", 1), ("t2", 1), ("t3", 2), ("t4", 2)]
        );
        for i in 0..5u8 {
            let want: Vec<u8> = [i as f32, -(i as f32)]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            assert_eq!(tensor_bytes(&m, &format!("t{i}")), want);
        }
    }
    // The folder holds one model: the split set.
    let m = GgufModel::open_model_path(dir.path()).unwrap();
    assert_eq!(m.tensors.len(), 5);
}

#[test]
fn missing_split_part_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let paths = split_writer().write_split(dir.path(), "tiny", 3).unwrap();
    std::fs::remove_file(&paths[1]).unwrap();
    let e = GgufModel::open(&paths[0]).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "split part 2 of 3 is missing: {} does not exist",
            paths[1].display()
        )
    );
}

#[test]
fn split_metadata_must_match_the_file_names() {
    let dir = tempfile::tempdir().unwrap();
    let paths = split_writer().write_split(dir.path(), "tiny", 2).unwrap();
    // A part renamed out of its set: its split.count says 2, the name says nothing.
    let lone = dir.path().join("lone.gguf");
    std::fs::rename(&paths[1], &lone).unwrap();
    let e = GgufModel::open(&lone).unwrap_err().to_string();
    assert_eq!(
        e,
        "lone.gguf: metadata key 'split.count' is 2 but the model has 1 part(s)"
    );
    // Parts swapped: part 1 holds split.no 1.
    let dir = tempfile::tempdir().unwrap();
    let paths = split_writer().write_split(dir.path(), "tiny", 2).unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::rename(&paths[0], &tmp).unwrap();
    std::fs::rename(&paths[1], &paths[0]).unwrap();
    std::fs::rename(&tmp, &paths[1]).unwrap();
    let e = GgufModel::open(&paths[0]).unwrap_err().to_string();
    assert_eq!(
        e,
        "tiny-00001-of-00002.gguf: metadata key 'split.no' is 1 but this is part 1 (split.no 0)"
    );
}

#[test]
fn duplicate_tensor_across_parts_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = GgufWriter::new();
    w.add_f32_tensor("same", &[1], &[1.0]);
    w.add_f32_tensor("other", &[1], &[2.0]);
    let paths = w.write_split(dir.path(), "d", 2).unwrap();
    // Overwrite part 2 with a part that holds "same" again.
    let mut w2 = GgufWriter::new();
    w2.add("split.no", Value::U16(1))
        .add("split.count", Value::U16(2))
        .add_f32_tensor("same", &[1], &[3.0]);
    w2.write(&paths[1]).unwrap();
    let e = GgufModel::open(&paths[0]).unwrap_err().to_string();
    assert_eq!(
        e,
        "d-00002-of-00002.gguf: tensor 'same' also appears in an earlier part"
    );
}

#[test]
fn open_model_path_accepts_a_file_or_a_folder_with_one_model() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("only.gguf");
    split_writer().write(&p).unwrap();
    std::fs::write(dir.path().join("README.md"), "not a model").unwrap();
    assert_eq!(
        GgufModel::open_model_path(dir.path()).unwrap().files,
        std::slice::from_ref(&p)
    );
    assert_eq!(GgufModel::open_model_path(&p).unwrap().tensors.len(), 5);

    split_writer().write_split(dir.path(), "more", 2).unwrap();
    let e = GgufModel::open_model_path(dir.path())
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!(
            "{}: folder contains 2 models (more-00001-of-00002.gguf, only.gguf); \
             give the path of one file",
            dir.path().display()
        )
    );

    let empty = tempfile::tempdir().unwrap();
    let e = GgufModel::open_model_path(empty.path())
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!("{}: folder contains no .gguf file", empty.path().display())
    );

    let missing = empty.path().join("absent.gguf");
    let e = GgufModel::open_model_path(&missing)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(&format!("{}: No such file", missing.display())),
        "{e}"
    );
}

#[test]
fn writer_output_is_stable() {
    // Exact bytes of a minimal file: header, one u32 key, one 1-element F32 tensor.
    let mut w = GgufWriter::new();
    w.add("a", Value::U32(5)).add_f32_tensor("x", &[1], &[1.0]);
    let b = w.to_bytes();
    let mut want = Vec::new();
    want.extend_from_slice(b"GGUF");
    want.extend_from_slice(&3u32.to_le_bytes());
    want.extend_from_slice(&1u64.to_le_bytes()); // tensors
    want.extend_from_slice(&1u64.to_le_bytes()); // kv
    want.extend_from_slice(&1u64.to_le_bytes());
    want.push(b'a');
    want.extend_from_slice(&4u32.to_le_bytes());
    want.extend_from_slice(&5u32.to_le_bytes());
    want.extend_from_slice(&1u64.to_le_bytes());
    want.push(b'x');
    want.extend_from_slice(&1u32.to_le_bytes());
    want.extend_from_slice(&1u64.to_le_bytes());
    want.extend_from_slice(&0u32.to_le_bytes());
    want.extend_from_slice(&0u64.to_le_bytes());
    want.resize(want.len().next_multiple_of(32), 0);
    want.extend_from_slice(&1.0f32.to_le_bytes());
    assert_eq!(b, want);
}

/// Any value of one GGUF type `t` (0..=12 minus 9, the array type).
fn scalar(t: u8) -> BoxedStrategy<Value> {
    match t {
        0 => any::<u8>().prop_map(Value::U8).boxed(),
        1 => any::<i8>().prop_map(Value::I8).boxed(),
        2 => any::<u16>().prop_map(Value::U16).boxed(),
        3 => any::<i16>().prop_map(Value::I16).boxed(),
        4 => any::<u32>().prop_map(Value::U32).boxed(),
        5 => any::<i32>().prop_map(Value::I32).boxed(),
        6 => prop::num::f32::NORMAL.prop_map(Value::F32).boxed(),
        7 => any::<bool>().prop_map(Value::Bool).boxed(),
        8 => ".{0,12}".prop_map(Value::String).boxed(),
        10 => any::<u64>().prop_map(Value::U64).boxed(),
        11 => any::<i64>().prop_map(Value::I64).boxed(),
        _ => prop::num::f64::NORMAL.prop_map(Value::F64).boxed(),
    }
}

/// Values whose arrays hold one element type each (as GGUF requires), nested up to 3 deep.
fn value() -> impl Strategy<Value = Value> {
    let leaf =
        prop::sample::select(vec![0u8, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12]).prop_flat_map(scalar);
    leaf.prop_recursive(3, 64, 6, |inner| {
        // One element shape per array: repeat a prototype's type by generating from it.
        (inner, 0usize..5).prop_flat_map(|(proto, n)| {
            let t = proto.type_name();
            let elem: BoxedStrategy<Value> = match proto {
                Value::Array(_) => Just(proto.clone()).boxed(),
                _ => scalar(type_code(t)),
            };
            prop::collection::vec(elem, n).prop_map(Value::Array)
        })
    })
}

fn type_code(name: &str) -> u8 {
    match name {
        "u8" => 0,
        "i8" => 1,
        "u16" => 2,
        "i16" => 3,
        "u32" => 4,
        "i32" => 5,
        "f32" => 6,
        "bool" => 7,
        "string" => 8,
        "u64" => 10,
        "i64" => 11,
        _ => 12,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random metadata written by the writer reads back equal, in v2 and v3.
    #[test]
    fn random_metadata_round_trips(values in prop::collection::vec(value(), 0..6),
                                   v3 in any::<bool>()) {
        let mut w = GgufWriter::new();
        w.version(if v3 { 3 } else { 2 });
        let mut expected = BTreeMap::new();
        for (i, v) in values.into_iter().enumerate() {
            w.add(format!("k.{i}"), v.clone());
            expected.insert(format!("k.{i}"), v);
        }
        w.add_f32_tensor("t", &[1], &[9.0]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.gguf");
        w.write(&path).unwrap();
        let m = GgufModel::open(&path).unwrap();
        prop_assert_eq!(m.metadata, expected);
        prop_assert_eq!(m.tensors.len(), 1);
    }
}
