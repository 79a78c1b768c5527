//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// Path of the demo model (Gemma 3 270M Q4_K_M GGUF), fetched into the model cache on first use.
pub fn demo_gguf() -> PathBuf {
    // Placeholder until `source::pull` lands: an explicit path or the session's download.
    if let Ok(p) = std::env::var("DELTAFIN_DEMO_GGUF") {
        return PathBuf::from(p);
    }
    let p = PathBuf::from("/work/dl/gemma.gguf");
    assert!(p.exists(), "demo model not found at {}", p.display());
    p
}
