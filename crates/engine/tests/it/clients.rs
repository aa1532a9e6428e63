//! The official `openai` Python client against the engine: streamed and whole answers, embeddings,
//! and errors.

use crate::support::{MODEL, start, tiny};

#[tokio::test]
async fn the_official_openai_client_streams_and_non_streams() {
    let e = start(tiny()).await;
    let report = testkit::run_python("openai_engine.py", &[&format!("{}/v1", e.url()), MODEL]).await;
    assert!(report.contains("ok: 6 checks"), "{report}");
}

/// The client's Responses calls on the store (`responses.retrieve`, `cancel`, `background`,
/// `previous_response_id`): each parses the simulator's answers as it parses vLLM's.
#[tokio::test]
async fn the_official_openai_client_uses_the_response_store() {
    let mut cfg = tiny();
    cfg.responses_store = Some(spillway_engine::StoreLimit::default());
    let e = start(cfg).await;
    let report = testkit::run_python("openai_store.py", &[&format!("{}/v1", e.url()), MODEL]).await;
    assert!(report.contains("ok: 6 checks"), "{report}");
}
