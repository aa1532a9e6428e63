//! The response store as vLLM 0.32 runs it with `VLLM_ENABLE_RESPONSES_API_STORE=1`, against its
//! own answers (`tests/fixtures/vllm-0.32/responses-*`): GET, cancel, `previous_response_id`,
//! `store: false`, `background` (alone and streamed), and the bound vLLM's store does not have.

use crate::agents::{events, fixture, post, shape, stream_shape};
use crate::support::{MODEL, eventually, http, start, tiny};
use serde_json::{Value, json};
use spillway_engine::{EngineConfig, StoreLimit};
use std::time::Duration;

fn stored() -> EngineConfig {
    let mut cfg = tiny();
    cfg.responses_store = Some(StoreLimit::default());
    cfg
}

fn real(name: &str) -> Value {
    serde_json::from_str(&fixture(name)).unwrap()
}

fn turn(input: &str, max: u32) -> Value {
    json!({"model": MODEL, "input": input, "max_output_tokens": max, "ignore_eos": true})
}

async fn get(url: String) -> (u16, String) {
    let r = http().get(url).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

fn parse(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// An answer is kept and read back as it was; a second turn by `previous_response_id` carries
/// the first's conversation and output, so its prompt is longer than the first's whole exchange.
#[tokio::test]
async fn a_stored_response_is_read_back_and_continued() {
    let e = start(stored()).await;
    let url = format!("{}/v1/responses", e.url());
    let (status, first) = post(url.clone(), turn("hello there", 4)).await;
    assert_eq!(status, 200, "{first}");
    let first = parse(&first);
    let id = first["id"].as_str().unwrap();
    let (status, got) = get(format!("{url}/{id}")).await;
    assert_eq!(status, 200, "{got}");
    let got = parse(&got);
    assert_eq!(got, first, "GET answers the object the POST answered");
    assert_eq!(shape(&got), shape(&real("responses-get.json")));

    let mut next = turn("and then?", 4);
    next["previous_response_id"] = json!(id);
    let (status, second) = post(url.clone(), next).await;
    assert_eq!(status, 200, "{second}");
    let second = parse(&second);
    assert_eq!(shape(&second), shape(&real("responses-previous.json")));
    assert_eq!(second["previous_response_id"], json!(id));
    let grown = second["usage"]["input_tokens"].as_u64().unwrap();
    let before = first["usage"]["total_tokens"].as_u64().unwrap();
    assert!(
        grown > before,
        "{grown} input tokens after a first turn of {before}"
    );

    // A third turn carries both before it: longer again.
    let mut third = turn("more", 4);
    third["previous_response_id"] = second["id"].clone();
    third["stream"] = json!(true);
    let (status, text) = post(url.clone(), third).await;
    assert_eq!(status, 200, "{text}");
    let all = events(&text);
    let completed = &all.last().unwrap().1["response"];
    assert!(completed["usage"]["input_tokens"].as_u64().unwrap() > grown + 4);
    // A streamed answer is kept too.
    let (status, _) = get(format!("{url}/{}", completed["id"].as_str().unwrap())).await;
    assert_eq!(status, 200);
}

/// vLLM's refusals: an unknown id (GET, cancel, previous), `store: false` (answered, not kept),
/// a finished response cancelled, background without store.
#[tokio::test]
async fn the_store_refuses_as_vllm_does() {
    let e = start(stored()).await;
    let url = format!("{}/v1/responses", e.url());
    let unknown = real("responses-previous-unknown.json");
    let (status, body) = get(format!("{url}/resp_0")).await;
    assert_eq!((status, parse(&body)), (404, unknown.clone()));
    let (status, body) = post(format!("{url}/resp_0/cancel"), json!({})).await;
    assert_eq!((status, parse(&body)), (404, unknown));

    let mut kept_not = turn("hello", 2);
    kept_not["store"] = json!(false);
    let (status, body) = post(url.clone(), kept_not).await;
    assert_eq!(status, 200, "{body}");
    let id = parse(&body)["id"].as_str().unwrap().to_owned();
    assert_eq!(
        get(format!("{url}/{id}")).await.0,
        404,
        "store: false is not kept"
    );

    let (_, body) = post(url.clone(), turn("hello", 2)).await;
    let id = parse(&body)["id"].as_str().unwrap().to_owned();
    let (status, body) = post(format!("{url}/{id}/cancel"), json!({})).await;
    assert_eq!(status, 400);
    assert_eq!(parse(&body), real("responses-cancel-finished.json"));

    let mut bad = turn("hello", 2);
    bad["background"] = json!(true);
    bad["store"] = json!(false);
    let (status, body) = post(url.clone(), bad.clone()).await;
    assert_eq!(status, 400);
    assert_eq!(parse(&body), real("responses-background-no-store.json"));
    // vLLM's request model refuses it before the model's name is looked at.
    bad["model"] = json!("nope");
    let (status, body) = post(url.clone(), bad).await;
    assert_eq!(status, 400, "{body}");
}

/// `background: true` answers `queued` at once and generates with no client: the sequence runs
/// in the scheduler (a slot, KV blocks) and GET shows it queued until it ends. Cancelled while it
/// runs, it is aborted in the scheduler and stays `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_response_runs_without_a_client_and_cancels() {
    let e = start(stored()).await;
    let url = format!("{}/v1/responses", e.url());
    let mut long = turn("hello there", 3000);
    long["background"] = json!(true);
    let (status, body) = post(url.clone(), long).await;
    assert_eq!(status, 200, "{body}");
    let queued = parse(&body);
    assert_eq!(shape(&queued), shape(&real("responses-background.json")));
    assert_eq!(
        (&queued["status"], &queued["background"]),
        (&json!("queued"), &json!(true))
    );
    let id = queued["id"].as_str().unwrap().to_owned();
    let engine = e.engine.clone();
    assert!(
        eventually(Duration::from_secs(5), || {
            let s = engine.snapshot();
            s.running == 1 && s.kv_blocks_free < s.kv_blocks_total
        })
        .await,
        "no client, yet it runs: {:?}",
        e.engine.snapshot()
    );
    let (_, body) = get(format!("{url}/{id}")).await;
    assert_eq!(parse(&body)["status"], "queued", "vLLM's word while it runs");

    let (status, body) = post(format!("{url}/{id}/cancel"), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let cancelled = parse(&body);
    assert_eq!(shape(&cancelled), shape(&real("responses-cancel.json")));
    assert_eq!(cancelled["status"], "cancelled");
    assert!(
        eventually(Duration::from_secs(5), || {
            let s = engine.snapshot();
            s.running == 0 && s.aborts == 1
        })
        .await,
        "aborted in the scheduler: {:?}",
        e.engine.snapshot()
    );
    let (_, body) = get(format!("{url}/{id}")).await;
    let after = parse(&body);
    assert_eq!(
        (&after["status"], &after["output"]),
        (&json!("cancelled"), &json!([]))
    );
    assert_eq!(shape(&after), shape(&real("responses-get-cancelled.json")));
    let (status, _) = post(format!("{url}/{id}/cancel"), json!({})).await;
    assert_eq!(status, 400, "cancelled once");

    let mut short = turn("hello there", 8);
    short["background"] = json!(true);
    let (_, body) = post(url.clone(), short).await;
    let id = parse(&body)["id"].as_str().unwrap().to_owned();
    let done = || async {
        let (_, body) = get(format!("{url}/{id}")).await;
        parse(&body)
    };
    let mut last = done().await;
    for _ in 0..100 {
        if last["status"] != "queued" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        last = done().await;
    }
    assert_eq!(last["status"], "incomplete", "cut at its 8 tokens: {last}");
    assert_eq!(last["usage"]["output_tokens"], 8);
    assert_eq!(shape(&last), shape(&real("responses-get.json")));
}

/// A background stream: vLLM's events (the object says `background: true`), a client that leaves
/// does not stop it, and `GET …?stream=true&starting_after=N` replays from event N + 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_stream_outlives_its_client_and_replays() {
    let e = start(stored()).await;
    let url = format!("{}/v1/responses", e.url());
    let mut body = turn("hello there", 4);
    body["background"] = json!(true);
    body["stream"] = json!(true);
    let (status, text) = post(url.clone(), body.clone()).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        stream_shape(&text),
        stream_shape(&fixture("responses-background-stream.sse"))
    );
    let all = events(&text);
    assert_eq!(all[0].1["response"]["background"], true);
    let id = all[0].1["response"]["id"].as_str().unwrap().to_owned();
    let (status, replay) = get(format!("{url}/{id}?stream=true&starting_after=3")).await;
    assert_eq!(status, 200);
    let replayed = events(&replay);
    assert_eq!(replayed[0].1["sequence_number"], 4, "{replay}");
    assert_eq!(replayed.len(), all.len() - 4);
    let (names, _) = stream_shape(&replay);
    let (real_names, _) = stream_shape(&fixture("responses-get-stream.sse"));
    assert_eq!(names, real_names);

    // The client leaves after the first bytes; the generation goes on to its end.
    body["max_output_tokens"] = json!(400);
    let r = http().post(url.clone()).json(&body).send().await.unwrap();
    let mut r = r;
    let first = r.chunk().await.unwrap().unwrap();
    let first = String::from_utf8_lossy(&first).into_owned();
    let id = events(&first)[0].1["response"]["id"].as_str().unwrap().to_owned();
    drop(r);
    let engine = e.engine.clone();
    assert!(
        eventually(Duration::from_secs(10), || engine.snapshot().generated_tokens
            >= 4 + 400)
        .await,
        "{:?}",
        e.engine.snapshot()
    );
    assert_eq!(
        e.engine.snapshot().aborts,
        0,
        "leaving a background stream aborts nothing"
    );
    let (_, got) = get(format!("{url}/{id}")).await;
    assert_eq!(parse(&got)["usage"]["output_tokens"], 400);
}

/// Without the store (vLLM's default) there is nothing to read: GET and cancel are 404.
#[tokio::test]
async fn without_the_store_nothing_is_kept() {
    let e = start(tiny()).await;
    let url = format!("{}/v1/responses", e.url());
    let (_, body) = post(url.clone(), turn("hello", 2)).await;
    let id = parse(&body)["id"].as_str().unwrap().to_owned();
    assert_eq!(get(format!("{url}/{id}")).await.0, 404);
    assert_eq!(post(format!("{url}/{id}/cancel"), json!({})).await.0, 404);
}

/// vLLM's store never forgets; this one keeps at most its limit's bytes, the oldest going first.
#[tokio::test]
async fn the_store_is_bounded() {
    let mut cfg = tiny();
    cfg.responses_store = Some(StoreLimit { max_bytes: 8 * 1024 });
    let e = start(cfg).await;
    let url = format!("{}/v1/responses", e.url());
    let mut ids = Vec::new();
    for _ in 0..20 {
        let (_, body) = post(url.clone(), turn("hello there", 8)).await;
        ids.push(parse(&body)["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(get(format!("{url}/{}", ids[0])).await.0, 404, "the oldest went");
    assert_eq!(get(format!("{url}/{}", ids[19])).await.0, 200, "the newest stays");
}
