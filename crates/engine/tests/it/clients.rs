//! The official `openai` Python client against the engine: streamed and whole answers, and errors.

use crate::support::{MODEL, start, tiny};
use std::path::PathBuf;

/// The Python with the `openai` package: `SPILLWAY_PYTHON`, else the venv scripts/test.sh makes.
fn python() -> PathBuf {
    if let Ok(p) = std::env::var("SPILLWAY_PYTHON") {
        return PathBuf::from(p);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let venv = root.join("target/venv/bin/python");
    assert!(
        venv.exists(),
        "{} missing: run scripts/test.sh, which makes it",
        venv.display()
    );
    venv
}

#[tokio::test]
async fn the_official_openai_client_streams_and_non_streams() {
    let e = start(tiny()).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/openai_engine.py");
    let out = tokio::process::Command::new(python())
        .arg(script)
        .arg(format!("{}/v1", e.url()))
        .arg(MODEL)
        .output()
        .await
        .unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{report}");
    assert!(report.contains("ok: 5 checks"), "{report}");
}
