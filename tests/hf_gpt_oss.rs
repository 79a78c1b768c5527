//! GPT-OSS Hugging Face checkpoints against transformers 5.24 (float32, eager): the committed
//! fixtures `tests/fixtures/hf/gpt_oss` (BF16 experts) and `gpt_oss_mxfp4` (MXFP4 experts,
//! whose reference runs the same dequantized values); see tools/reference/README.md.

mod common;

use common::hf::*;

#[test]
fn gpt_oss_logits_match_transformers() {
    let (_, last, worst) = check_logits("gpt_oss", None);
    eprintln!("gpt_oss: last rel {last:e}, top-10 worst rel {worst:e}");
}

#[test]
fn gpt_oss_mxfp4_logits_match_transformers() {
    let (_, last, worst) = check_logits("gpt_oss_mxfp4", None);
    eprintln!("gpt_oss_mxfp4: last rel {last:e}, top-10 worst rel {worst:e}");
}
