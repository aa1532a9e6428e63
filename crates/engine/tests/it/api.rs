//! The OpenAI HTTP surface, as vLLM answers it: streams, whole answers, and every bad input.

use crate::support::{MODEL, eventually, http, post_json, sse_data, start, tiny};
use protocol::openai::{
    ChatCompletionChunk, ChatCompletionResponse, CompletionChunk, CompletionResponse, ModelList,
};
use serde_json::{Value, json};
use std::time::Duration;

#[tokio::test]
async fn streamed_chat_has_role_tokens_finish_usage_and_done() {
    let e = start(tiny()).await;
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 6, "stream": true, "stream_options": {"include_usage": true}});
    let r = http()
        .post(format!("{}/v1/chat/completions", e.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let data = sse_data(&r.text().await.unwrap());
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<ChatCompletionChunk> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0].choices[0].delta.role.as_deref(), Some("assistant"));
    let content: Vec<_> = chunks
        .iter()
        .flat_map(|c| &c.choices)
        .filter_map(|c| c.delta.content.clone())
        .filter(|s| !s.is_empty())
        .collect();
    assert_eq!(content.len(), 6, "one chunk per token");
    let finish = chunks
        .iter()
        .flat_map(|c| &c.choices)
        .find_map(|c| c.finish_reason.clone());
    assert_eq!(finish.as_deref(), Some("length"));
    let usage = chunks.last().unwrap().usage.unwrap();
    assert!(chunks.last().unwrap().choices.is_empty());
    assert_eq!(
        (usage.completion_tokens, usage.total_tokens),
        (6, usage.prompt_tokens + 6)
    );
}

#[tokio::test]
async fn streamed_completion_without_usage_has_no_usage_chunk() {
    let e = start(tiny()).await;
    let body = json!({"model": MODEL, "prompt": "once upon a time", "max_tokens": 4, "stream": true});
    let r = http()
        .post(format!("{}/v1/completions", e.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    let data = sse_data(&r.text().await.unwrap());
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<CompletionChunk> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(chunks.iter().all(|c| c.usage.is_none()));
    assert_eq!(chunks.iter().filter(|c| !c.choices[0].text.is_empty()).count(), 4);
}

#[tokio::test]
async fn whole_answers_with_n_choices_and_usage() {
    let e = start(tiny()).await;
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5, "n": 2});
    let r: ChatCompletionResponse = post_json(format!("{}/v1/chat/completions", e.url()), &body).await;
    assert_eq!(r.object, "chat.completion");
    assert_eq!(r.choices.len(), 2);
    assert!(
        r.choices
            .iter()
            .all(|c| c.finish_reason.as_deref() == Some("length"))
    );
    assert_eq!(r.usage.unwrap().completion_tokens, 10);
    let body = json!({"model": MODEL, "prompt": [1, 2, 3, 4], "max_tokens": 3});
    let r: CompletionResponse = post_json(format!("{}/v1/completions", e.url()), &body).await;
    assert_eq!(
        r.usage.unwrap().prompt_tokens,
        4,
        "token-id prompts are taken as they are"
    );
    assert!(!r.choices[0].text.is_empty());
}

#[tokio::test]
async fn models_health_and_request_id() {
    let e = start(tiny()).await;
    let m: ModelList = http()
        .get(format!("{}/v1/models", e.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(m.data[0].id, MODEL);
    assert_eq!(m.data[0].max_model_len, Some(4096));
    assert_eq!(
        http()
            .get(format!("{}/health", e.url()))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let r = http()
        .post(format!("{}/v1/completions", e.url()))
        .header("x-request-id", "req-42")
        .json(&json!({"model": MODEL, "prompt": "x", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "req-42");
}

#[tokio::test]
async fn every_bad_input_gets_its_status_and_an_openai_error_body() {
    let e = start(tiny()).await;
    let chat = format!("{}/v1/chat/completions", e.url());
    let comp = format!("{}/v1/completions", e.url());
    let long = "word ".repeat(5000);
    let cases: Vec<(&str, String, u16, Option<&str>, &str)> = vec![
        (&chat, "{\"model\":".into(), 400, None, "invalid JSON"),
        (
            &chat,
            json!({"model": MODEL, "messages": "hi"}).to_string(),
            400,
            Some("messages"),
            "messages",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": "5"})
                .to_string(),
            400,
            Some("max_tokens"),
            "max_tokens",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": -1})
                .to_string(),
            400,
            Some("max_tokens"),
            "max_tokens",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0})
                .to_string(),
            400,
            Some("max_tokens"),
            "at least 1",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 0}).to_string(),
            400,
            Some("n"),
            "n must",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": []}).to_string(),
            400,
            Some("messages"),
            "empty",
        ),
        (
            &chat,
            json!({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}).to_string(),
            404,
            Some("model"),
            "does not exist",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": [{"role": "user", "content": long}]}).to_string(),
            400,
            Some("messages"),
            "maximum context length is 4096",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 5000})
                .to_string(),
            400,
            Some("max_tokens"),
            "maximum context length",
        ),
        (
            &comp,
            json!({"model": MODEL, "prompt": ""}).to_string(),
            400,
            Some("prompt"),
            "empty",
        ),
        (
            &comp,
            json!({"model": MODEL, "prompt": ["a", "b"]}).to_string(),
            400,
            Some("prompt"),
            "one prompt",
        ),
        (&comp, json!({"model": MODEL}).to_string(), 400, None, "prompt"),
    ];
    for (url, body, status, param, needle) in cases {
        let r = http()
            .post(url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{body:.80}");
        let v: Value = r.json().await.unwrap();
        let err = &v["error"];
        assert_eq!(err["code"], status, "{v}");
        assert!(err["type"].is_string());
        testkit::assert_error_mentions(&v, needle);
        if let Some(p) = param {
            assert_eq!(err["param"], p, "{v}");
        }
    }
    let huge = vec![b'x'; 33 * 1024 * 1024];
    let r = http().post(&comp).body(huge).send().await.unwrap();
    assert_eq!(r.status(), 413);
    let v: Value = r.json().await.unwrap();
    testkit::assert_error_mentions(&v, "limit");
    let r = http()
        .get(format!("{}/v2/nothing", e.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.json::<Value>().await.unwrap()["error"]["message"].is_string());
    assert_eq!(e.engine.snapshot().running, 0, "nothing reached the scheduler");
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_is_aborted() {
    let e = start(tiny()).await;
    let body = json!({"model": MODEL, "prompt": "x", "max_tokens": 3000, "stream": true});
    let mut r = http()
        .post(format!("{}/v1/completions", e.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    for _ in 0..3 {
        r.chunk().await.unwrap();
    }
    let left = tokio::time::Instant::now();
    drop(r);
    let aborted = eventually(Duration::from_secs(5), || e.engine.snapshot().aborts == 1).await;
    assert!(aborted, "the engine counts the abort");
    let took = left.elapsed();
    assert!(took < Duration::from_secs(1), "abort took {took:?}");
    assert_eq!(
        e.engine.snapshot().kv_blocks_free,
        e.engine.snapshot().kv_blocks_total
    );
}

#[tokio::test]
async fn a_client_that_leaves_a_non_streamed_request_is_aborted() {
    let e = start(tiny()).await;
    let body = json!({"model": MODEL, "prompt": "x", "max_tokens": 3000});
    let client = http();
    let req = client
        .post(format!("{}/v1/completions", e.url()))
        .json(&body)
        .send();
    let _ = tokio::time::timeout(Duration::from_millis(200), req).await;
    let aborted = eventually(Duration::from_secs(5), || e.engine.snapshot().aborts == 1).await;
    assert!(
        aborted,
        "hyper drops the handler when the connection closes, and the engine aborts"
    );
}

/// `/v1/embeddings` in OpenAI's shape: one vector per input (a text, texts, token ids or batches
/// of them), in order, the usage counting the input alone; float or base64; bad input named.
#[tokio::test]
async fn embeddings_answer_each_input_in_order_with_its_usage() {
    let e = start(tiny()).await;
    let url = format!("{}/v1/embeddings", e.url());
    let v: Value = post_json(&url, &json!({"model": MODEL, "input": [[1, 2, 3], [4, 5]]})).await;
    assert_eq!(
        (v["object"].as_str(), v["model"].as_str()),
        (Some("list"), Some(MODEL))
    );
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    for (i, d) in data.iter().enumerate() {
        assert_eq!(
            (d["object"].as_str(), d["index"].as_u64()),
            (Some("embedding"), Some(i as u64))
        );
        assert_eq!(d["embedding"].as_array().unwrap().len(), 32);
    }
    assert_eq!(v["usage"], json!({"prompt_tokens": 5, "total_tokens": 5}));
    let one: Value = post_json(
        &url,
        &json!({"model": MODEL, "input": [1, 2, 3], "dimensions": 8}),
    )
    .await;
    assert_eq!(one["data"][0]["embedding"].as_array().unwrap().len(), 8);
    let text: Value = post_json(
        &url,
        &json!({"model": MODEL, "input": "hello there", "encoding_format": "base64"}),
    )
    .await;
    let b64 = text["data"][0]["embedding"].as_str().unwrap();
    // 32 little-endian f32s: 128 bytes, 172 characters of base64.
    assert_eq!(b64.len(), 172, "{b64}");
    for (body, status, param) in [
        (json!({"model": MODEL, "input": []}), 400, "input"),
        (
            json!({"model": MODEL, "input": "x", "encoding_format": "hex"}),
            400,
            "encoding_format",
        ),
        (json!({"model": "other", "input": "x"}), 404, "model"),
    ] {
        let r = http().post(&url).json(&body).send().await.unwrap();
        assert_eq!(r.status(), status, "{body}");
        let err: Value = r.json().await.unwrap();
        assert_eq!(err["error"]["param"], param, "{err}");
    }
}
