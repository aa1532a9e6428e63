//! `--tokenizer tokenizer.json`: prompts are counted with a real Hugging Face tokenizer.

use crate::support::{MODEL, http, start, tiny};
use serde_json::json;
use std::collections::HashMap;
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::pre_tokenizers::whitespace::Whitespace;

/// A word-level tokenizer built in code and saved as the `tokenizer.json` a model would ship.
fn save_tokenizer(dir: &std::path::Path) -> std::path::PathBuf {
    let vocab: HashMap<String, u32> = ["[UNK]", "the", "queue", "drains", "<|user|>", "<|end|>"]
        .iter()
        .zip(0u32..)
        .map(|(w, i)| (w.to_string(), i))
        .collect();
    let model = WordLevel::builder()
        .vocab(vocab.into_iter().collect())
        .unk_token("[UNK]".into())
        .build()
        .unwrap();
    let mut tokenizer = tokenizers::Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(Whitespace {}));
    let path = dir.join("tokenizer.json");
    tokenizer.save(&path, false).unwrap();
    path
}

#[tokio::test]
async fn prompts_are_counted_with_the_given_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny();
    cfg.tokenizer = Some(save_tokenizer(dir.path()));
    let e = start(cfg).await;
    // Whitespace pre-tokenization: four words, whatever their length; the estimate would say 8.
    let body = json!({"model": MODEL, "prompt": "the queue drains slowly", "max_tokens": 1});
    let v: serde_json::Value = http()
        .post(format!("{}/v1/completions", e.url()))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], 4, "{v}");
}

#[tokio::test]
async fn a_missing_tokenizer_file_is_a_clear_error() {
    let mut cfg = tiny();
    cfg.tokenizer = Some("/nonexistent/tokenizer.json".into());
    let err = spillway_engine::spawn_local(cfg).await.unwrap_err();
    assert!(
        err.contains("cannot load tokenizer /nonexistent/tokenizer.json"),
        "{err}"
    );
}
