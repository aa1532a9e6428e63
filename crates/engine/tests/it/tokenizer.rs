//! `--tokenizer tokenizer.json`: prompts are counted with a real Hugging Face tokenizer.

use crate::support::{MODEL, post_json, start, tiny};
use serde_json::json;

#[tokio::test]
async fn prompts_are_counted_with_the_given_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny();
    cfg.tokenizer = Some(testkit::word_tokenizer(
        dir.path(),
        &["the", "queue", "drains", "<|user|>", "<|end|>"],
    ));
    let e = start(cfg).await;
    // Whitespace pre-tokenization: four words, whatever their length; the estimate would say 8.
    let body = json!({"model": MODEL, "prompt": "the queue drains slowly", "max_tokens": 1});
    let v: serde_json::Value = post_json(format!("{}/v1/completions", e.url()), &body).await;
    assert_eq!(v["usage"]["prompt_tokens"], 4, "{v}");
}

#[tokio::test]
async fn a_missing_tokenizer_file_is_a_clear_error() {
    let mut cfg = tiny();
    cfg.tokenizer = Some("/nonexistent/tokenizer.json".into());
    let err = spillway_engine::spawn_local(cfg).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("cannot load tokenizer /nonexistent/tokenizer.json"),
        "{err}"
    );
}
