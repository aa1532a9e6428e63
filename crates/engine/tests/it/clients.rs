//! The official `openai` Python client against the engine: streamed and whole answers, embeddings,
//! and errors.

use crate::support::{MODEL, start, tiny};

#[tokio::test]
async fn the_official_openai_client_streams_and_non_streams() {
    let e = start(tiny()).await;
    let report = testkit::run_python("openai_engine.py", &[&format!("{}/v1", e.url()), MODEL]).await;
    assert!(report.contains("ok: 6 checks"), "{report}");
}
