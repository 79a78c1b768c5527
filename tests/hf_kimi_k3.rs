//! Kimi K3 from Hugging Face folders, against llama.cpp. There is no transformers
//! implementation of K3: `tools/reference/k3_hf_fixtures.py` writes two tiny random-weight
//! folders in the layout llama.cpp's converter (`conversion/kimi_k3.py`, llama-cpp-python
//! 0.3.36) reads, `KimiK3ForConditionalGeneration` with the text model under `language_model.`
//! and a stand-in vision tower (`tests/fixtures/hf/kimi_k3`: BF16; `kimi_k3_mxfp4`: the routed
//! experts as compressed-tensors MXFP4), converts each with that converter
//! (`tests/fixtures/gguf/kimi_k3_hf/kimi_k3_hf-{f32,mxfp4}.gguf`) and records llama-cpp-python's
//! logits over the converted files at every prompt position (the MXFP4 file also dequantized to
//! F32 by llama.cpp, which removes its 8-bit activation rounding: `mxfp4.dequant.logits.f32`).
//!
//! Tolerance: max |ours − llama.cpp| over the vocabulary ÷ max |llama.cpp|, at every position,
//! at most [`TOL`] (1e-4), for the folders and for the converted files alike.

mod common;

use std::path::{Path, PathBuf};

use common::gguf::{dir, load_path, opts, prompt_logits, reference, worst_rel};
use common::hf::{f32s, fixture, rel_diff, u32s};
use deltafin::engine::Session;
use deltafin::models::Logits;
use serde_json::Value;

const REF: &str = "kimi_k3_hf";
const TOL: f32 = 1e-4;

fn session(path: &Path, ram_budget: Option<u64>) -> Session {
    let (m, s) = load_path(path, &opts(ram_budget)).unwrap();
    Session::new(m, s, 128, 128)
}

fn logits(path: &Path, ram_budget: Option<u64>) -> (Vec<f32>, usize) {
    let mut s = session(path, ram_budget);
    prompt_logits(&mut s, &u32s(&reference(REF)["prompt_ids"]))
}

fn converted(v: &str) -> PathBuf {
    dir(REF).join(format!("{REF}-{v}.gguf"))
}

/// The smallest budget (4 KiB steps) under which `path` loads with no weight resident.
fn smallest_budget(path: &Path) -> u64 {
    let mut b = 4 << 10;
    loop {
        match load_path(path, &opts(Some(b))) {
            Ok((m, _)) => {
                assert_eq!(m.placement().resident_bytes, 0, "{}", m.placement().summary);
                return b;
            }
            Err(e) => assert!(e.to_string().contains("is too small"), "{e}"),
        }
        b += 4 << 10;
        assert!(b < 64 << 20, "no budget works");
    }
}

fn variant(v: &str) -> Value {
    reference(REF)["variants"][v].clone()
}

#[test]
fn kimi_k3_folder_matches_llama_cpp_on_its_conversion_at_every_position() {
    let rv = variant("f32");
    for path in [fixture("kimi_k3"), converted("f32")] {
        let (ours, vocab) = logits(&path, None);
        assert_eq!((ours.len(), vocab), (37 * 512, 512));
        let rel = worst_rel(
            &ours,
            vocab,
            &dir(REF).join(rv["logits_file"].as_str().unwrap()),
        );
        eprintln!("{}: worst position rel {rel:e}", path.display());
        assert!(rel <= TOL, "{}: rel {rel:e}", path.display());
    }
}

#[test]
fn kimi_k3_mxfp4_folder_matches_llama_cpp_dequantized_at_every_position() {
    let rv = variant("mxfp4");
    // the converted file holds the experts as GGML MXFP4, the folder as compressed-tensors
    assert_eq!(rv["tensor_type_counts"]["MXFP4"], 9);
    for path in [fixture("kimi_k3_mxfp4"), converted("mxfp4")] {
        let (ours, vocab) = logits(&path, None);
        let rel = worst_rel(
            &ours,
            vocab,
            &dir(REF).join(rv["dequant_logits_file"].as_str().unwrap()),
        );
        eprintln!("{}: worst position rel {rel:e}", path.display());
        assert!(rel <= TOL, "{}: rel {rel:e}", path.display());
    }
}

#[test]
fn kimi_k3_folders_greedy_continuations_match_llama_cpp() {
    let ids = u32s(&reference(REF)["prompt_ids"]);
    for (folder, v, key) in [
        ("kimi_k3", "f32", "continuation"),
        ("kimi_k3_mxfp4", "mxfp4", "dequant_continuation"),
    ] {
        let rv = variant(v);
        let want = u32s(&rv[format!("{key}_ids")]);
        assert_eq!(want.len(), 16);
        let gap = f32s(&rv[format!("{key}_gaps")])
            .into_iter()
            .fold(f32::INFINITY, f32::min);
        let max = rv["max_abs_logit"].as_f64().unwrap() as f32;
        assert!(
            gap > 10.0 * TOL * max,
            "{folder}: min gap {gap} too close to call"
        );
        let mut s = session(&fixture(folder), None);
        assert_eq!(
            common::greedy_ids(&mut s, &ids, want.len()),
            want,
            "{folder}"
        );
    }
}

#[test]
fn kimi_k3_folders_streamed_equal_resident_and_prefill_equals_token_at_a_time() {
    // bit for bit: every pass runs the delta rule in its recurrent form, whatever the CPU
    // (src/models/layers/kda.rs; a 1e-5 bound on a chunked prefill failed on AVX-512 BF16)
    let ids = u32s(&reference(REF)["prompt_ids"]);
    for folder in ["kimi_k3", "kimi_k3_mxfp4"] {
        let path = fixture(folder);
        let (resident, vocab) = logits(&path, None);
        let (streamed, _) = logits(&path, Some(smallest_budget(&path)));
        assert!(resident == streamed, "{folder}: streamed logits differ");
        let mut s = session(&path, None);
        for (i, &t) in ids.iter().enumerate() {
            let l = s
                .model
                .forward(&mut s.store, &mut s.cache, &[t], Logits::Last)
                .unwrap();
            assert!(
                l[..] == resident[i * vocab..(i + 1) * vocab],
                "{folder}: position {i}"
            );
        }
    }
}

#[test]
fn kimi_k3_mxfp4_folder_repacks_to_the_converters_bytes() {
    // resident, the folder's experts are repacked once at load into exactly the GGML MXFP4
    // blocks llama.cpp's converter writes: the same logits bit for bit as the converted file
    let (a, _) = logits(&fixture("kimi_k3_mxfp4"), None);
    let (b, _) = logits(&converted("mxfp4"), None);
    assert!(rel_diff(&a, &b) < 1e-6, "rel {}", rel_diff(&a, &b));
}

fn copy_of(folder: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture(folder)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), d.path().join(e.file_name())).unwrap();
    }
    d
}

fn edit_config(d: &Path, f: impl FnOnce(&mut Value)) {
    let p = d.join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut c);
    std::fs::write(&p, c.to_string()).unwrap();
}

fn load_err(d: &Path) -> String {
    match load_path(d, &opts(None)) {
        Ok(_) => panic!("{} should not load", d.display()),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn kimi_k3_folder_errors_name_the_field_or_tensor() {
    let d = copy_of("kimi_k3");
    let cfg = d.path().join("config.json").display().to_string();
    edit_config(d.path(), |c| c["text_config"]["hidden_act"] = "silu".into());
    assert_eq!(
        load_err(d.path()),
        format!("{cfg}: 'hidden_act' = \"silu\" is not supported (Kimi K3 needs situ)")
    );
    edit_config(d.path(), |c| {
        c["text_config"]["hidden_act"] = "situ".into();
        c["text_config"]["linear_attn_config"]["num_heads"] = 8.into();
    });
    assert_eq!(
        load_err(d.path()),
        format!("{cfg}: 'linear_attn_config.num_heads' = 8 differs from 'num_attention_heads' = 4")
    );
    edit_config(d.path(), |c| {
        c["text_config"]["linear_attn_config"]["num_heads"] = 4.into();
        c["quantization_config"] =
            serde_json::json!({"quant_method": "fp8", "format": "float-quantized"});
    });
    assert_eq!(
        load_err(d.path()),
        format!(
            "{cfg}: 'quantization_config' (quant_method 'fp8', format 'float-quantized') is not supported for kimi_k3 (only compressed-tensors mxfp4-pack-quantized routed experts)"
        )
    );
    // what llama.cpp's converter requires has no default here either
    edit_config(d.path(), |c| {
        c.as_object_mut().unwrap().remove("quantization_config");
        c["text_config"]
            .as_object_mut()
            .unwrap()
            .remove("num_shared_experts");
    });
    assert_eq!(
        load_err(d.path()),
        format!("{cfg}: missing field 'num_shared_experts'")
    );
    edit_config(d.path(), |c| {
        c["text_config"]["num_shared_experts"] = 2.into();
        c["text_config"]["activation_situ_beta"] = serde_json::json!(1e39);
    });
    assert_eq!(
        load_err(d.path()),
        format!("{cfg}: 'activation_situ_beta' = 1e+39 is not a finite f32 number")
    );
    edit_config(d.path(), |c| {
        c["text_config"]["activation_situ_beta"] = serde_json::json!(1.0);
        c["text_config"]["latent_moe_use_norm"] = "true".into();
    });
    assert_eq!(
        load_err(d.path()),
        format!("{cfg}: 'latent_moe_use_norm' = \"true\" is not a boolean")
    );
    edit_config(d.path(), |c| {
        c["text_config"]["latent_moe_use_norm"] = true.into();
        c["text_config"] = serde_json::json!("oops");
    });
    assert_eq!(
        load_err(d.path()),
        format!("{cfg}: 'text_config' = \"oops\" is not an object")
    );
    // the BF16 folder declared MXFP4: the packed expert tensors are missing
    let original: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("kimi_k3").join("config.json")).unwrap(),
    )
    .unwrap();
    edit_config(d.path(), |c| {
        *c = original;
        c["quantization_config"] = serde_json::json!({"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized"})
    });
    assert_eq!(
        load_err(d.path()),
        format!(
            "{}: tensor 'model.layers.1.block_sparse_moe.experts.0.w1.weight_packed' is missing",
            d.path().display()
        )
    );
    let m = copy_of("kimi_k3_mxfp4");
    let mcfg = m.path().join("config.json").display().to_string();
    edit_config(m.path(), |c| {
        c["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 64.into()
    });
    assert_eq!(
        load_err(m.path()),
        format!("{mcfg}: 'quantization_config.config_groups.group_0.weights.group_size' = 64 is not MXFP4's 32")
    );
    // the MXFP4 folder declared unquantized: its float expert tensors are missing
    let m = copy_of("kimi_k3_mxfp4");
    edit_config(m.path(), |c| {
        c.as_object_mut()
            .unwrap()
            .remove("quantization_config")
            .map(drop)
            .unwrap()
    });
    assert_eq!(
        load_err(m.path()),
        format!(
            "{}: tensor 'model.layers.1.block_sparse_moe.experts.0.w1.weight' is missing",
            m.path().display()
        )
    );
}

#[test]
fn kimi_k3_folder_runs_from_the_cli_and_packs() {
    let bin = env!("CARGO_BIN_EXE_deltafin");
    let run = |m: &Path| {
        let o = std::process::Command::new(bin)
            .args(["run", "-m"])
            .arg(m)
            .args([
                "-p",
                "Hello world, this is",
                "-n",
                "8",
                "--temp",
                "0",
                "--heat-file",
                "none",
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let tmp = tempfile::tempdir().unwrap();
    for folder in ["kimi_k3", "kimi_k3_mxfp4"] {
        let text = run(&fixture(folder));
        assert!(text.starts_with("Hello world, this is"), "{text}");
        let pack = tmp.path().join(format!("{folder}.pack"));
        let drive = tmp.path().join(format!("{folder}.drive"));
        std::fs::create_dir(&drive).unwrap();
        let o = std::process::Command::new(bin)
            .args(["pack", "-m"])
            .arg(fixture(folder))
            .arg("--out")
            .arg(&pack)
            .arg("--drives")
            .arg(&drive)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(
            run(&pack),
            text,
            "{folder}: the pack generates what the folder does"
        );
        // and the logits, streamed from the pack, are the folder's bit for bit
        let (a, _) = logits(&fixture(folder), None);
        let (b, _) = logits(&pack, Some(smallest_budget(&pack)));
        assert!(a == b, "{folder}: pack logits differ");
    }
}

#[test]
fn kimi_k3_folder_reads_the_layer_kinds_and_the_latent_norm_as_llama_cpp_does() {
    let (want, _) = logits(&fixture("kimi_k3"), None);
    // `full_attn_layers` alone (llama.cpp's converter reads no other list): KDA elsewhere
    let d = copy_of("kimi_k3");
    edit_config(d.path(), |c| {
        c["text_config"]["linear_attn_config"]
            .as_object_mut()
            .unwrap()
            .remove("kda_layers");
        // `routed_expert_norm` is used when present, whatever the flag says (kimi-k3.cpp)
        c["text_config"]
            .as_object_mut()
            .unwrap()
            .remove("latent_moe_use_norm");
    });
    let (got, _) = logits(d.path(), None);
    assert!(got == want, "the same model read differently");
}
