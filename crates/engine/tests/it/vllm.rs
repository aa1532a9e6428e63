//! Where vLLM 0.32 answers differently from what the simulator once did, the simulator follows:
//! a long `max_tokens` is clamped to the context, the finish reason rides on the last token,
//! a full `--max-num-queued-reqs` queue refuses a stream inside a 200 stream.

use crate::support::{MODEL, http, sse_data, start, tiny};
use serde_json::{Value, json};
use std::time::Duration;

async fn post(url: String, body: Value) -> reqwest::Response {
    http().post(url).json(&body).send().await.unwrap()
}

/// Prompt 60 + max_tokens 10 in a 64-token context: vLLM answers 200 with the 4 tokens that fit
/// and `finish_reason: length`; it refuses only max_tokens over the context, or a prompt that
/// leaves no room.
#[tokio::test]
async fn max_tokens_past_the_context_is_clamped_not_refused() {
    let mut cfg = tiny();
    cfg.max_model_len = 64;
    let e = start(cfg).await;
    let url = format!("{}/v1/completions", e.url());
    let prompt: Vec<u32> = (1..=60).collect();
    let r = post(
        url.clone(),
        json!({"model": MODEL, "prompt": prompt, "max_tokens": 10}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 4, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let r = post(
        url.clone(),
        json!({"model": MODEL, "prompt": [1, 2], "max_tokens": 65}),
    )
    .await;
    assert_eq!(r.status(), 400, "max_tokens alone over the context");
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (v["error"]["code"].clone(), v["error"]["param"].clone()),
        (json!(400), json!("max_tokens"))
    );
    let whole: Vec<u32> = (1..=64).collect();
    let r = post(url, json!({"model": MODEL, "prompt": whole, "max_tokens": 1})).await;
    assert_eq!(r.status(), 400, "a prompt that fills the context");
}

/// vLLM puts `finish_reason` (and `stop_reason`) on the chunk of the last token, not on an
/// empty chunk after it.
#[tokio::test]
async fn the_finish_reason_rides_on_the_last_token() {
    let e = start(tiny()).await;
    for (path, body) in [
        (
            "chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": true}),
        ),
        (
            "completions",
            json!({"model": MODEL, "prompt": "hi", "max_tokens": 5, "stream": true}),
        ),
    ] {
        let r = post(format!("{}/v1/{path}", e.url()), body).await;
        let data = sse_data(&r.text().await.unwrap());
        assert_eq!(data.last().unwrap(), "[DONE]");
        let chunks: Vec<Value> = data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let finished: Vec<&Value> = chunks
            .iter()
            .filter(|c| !c["choices"][0]["finish_reason"].is_null())
            .collect();
        assert_eq!(finished.len(), 1, "{path}: {data:?}");
        let choice = &finished[0]["choices"][0];
        let text = choice["delta"]["content"].as_str().or(choice["text"].as_str());
        assert!(text.is_some_and(|t| !t.is_empty()), "{path}: {choice}");
        assert_eq!(choice["finish_reason"], "length");
        assert!(choice["stop_reason"].is_null() && choice.get("stop_reason").is_some());
        let tokens = chunks
            .iter()
            .filter(|c| {
                let ch = &c["choices"][0];
                ch["delta"]["content"]
                    .as_str()
                    .or(ch["text"].as_str())
                    .is_some_and(|t| !t.is_empty())
            })
            .count();
        assert_eq!(tokens, 5, "{path}");
    }
}

/// With `--max-num-queued-reqs 1`, one running (a long one) and one waiting: the next streamed
/// request gets vLLM's in-stream refusal (200, one error event with an integer `code`,
/// `[DONE]`), a non-streamed one a real 503 with vLLM's error body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_a_stream_inside_a_200_stream() {
    let mut cfg = tiny();
    cfg.max_num_seqs = 1;
    // vLLM counts what it holds, running and waiting: one of each fills a limit of two.
    cfg.max_num_queued_reqs = Some(2);
    let e = start(cfg).await;
    let url = format!("{}/v1/chat/completions", e.url());
    let chat = |stream: bool, max_tokens: u32| json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "stream": stream});
    // One running, one waiting, each for seconds: sent, then left.
    let (a, b) = (url.clone(), url.clone());
    let held = [
        tokio::spawn(async move { post(a, chat(true, 4000)).await }),
        tokio::spawn(async move { post(b, chat(true, 4000)).await }),
    ];
    let engine = e.engine.clone();
    assert!(
        crate::support::eventually(Duration::from_secs(5), || {
            let s = engine.snapshot();
            s.running == 1 && s.waiting == 1
        })
        .await,
        "{:?}",
        e.engine.snapshot()
    );
    // vLLM 0.32 says why they wait: here always for capacity.
    let text = String::from_utf8(e.engine.metrics_text()).unwrap();
    assert!(
        text.contains(
            "vllm:num_requests_waiting_by_reason{engine=\"0\",model_name=\"sim\",reason=\"capacity\"} 1"
        ),
        "{text}"
    );
    assert!(text.contains(
        "vllm:num_requests_waiting_by_reason{engine=\"0\",model_name=\"sim\",reason=\"deferred\"} 0"
    ));
    let r = post(url.clone(), chat(true, 5)).await;
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let data = sse_data(&r.text().await.unwrap());
    assert_eq!(data.len(), 2, "{data:?}");
    assert_eq!(data[1], "[DONE]");
    let v: Value = serde_json::from_str(&data[0]).unwrap();
    assert_eq!(v["error"]["code"], 503, "{v}");
    assert_eq!(v["error"]["type"], "Service Unavailable");
    let r = post(url, chat(false, 5)).await;
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], 503);
    // Both refusals counted as vLLM 0.32 counts them: by model and reason, no `engine` label.
    let text = String::from_utf8(e.engine.metrics_text()).unwrap();
    assert!(
        text.contains("vllm:admission_rejections_total{model_name=\"sim\",reason=\"max_num_queued_reqs\"} 2"),
        "{text}"
    );
    assert!(
        text.contains(
            "vllm:admission_rejections_total{model_name=\"sim\",reason=\"max_num_queued_tokens\"} 0"
        )
    );
    for h in held {
        h.abort();
    }
}
