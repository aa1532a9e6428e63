//! Tenant quotas: `max_parallel`, `rpm` and `tpm` per team, 429 with `Retry-After` and OpenAI's
//! `x-ratelimit-*` headers, counted per team in the metrics, and keys revoked by a reload.

use crate::support::{Stack, TEAMS, engine, header, keyed, read_stream, stalling, tiny};
use serde_json::Value;
use spillway_gateway::Config;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpm_counts_down_in_the_headers_then_refuses_with_retry_after() {
    let stack = Stack::start(vec![engine(tiny()).await], TEAMS).await;
    for remaining in ["2", "1", "0"] {
        let r = keyed(&stack.url, "test", 4, false).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-ratelimit-limit-requests"), "3");
        assert_eq!(header(&r, "x-ratelimit-remaining-requests"), remaining);
        assert_eq!(header(&r, "x-ratelimit-limit-tokens"), "1000");
        assert!(header(&r, "x-ratelimit-reset-requests").ends_with('s'));
    }
    let r = keyed(&stack.url, "test", 4, false).await;
    assert_eq!(r.status(), 429);
    let after: u64 = header(&r, "retry-after").parse().unwrap();
    assert!(
        (50..=60).contains(&after),
        "the first request leaves the window in ~60 s: {after}"
    );
    assert_eq!(header(&r, "x-ratelimit-remaining-requests"), "0");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    testkit::assert_error_mentions(
        &v,
        "team 'search' is over its quota of 3 requests per minute (rpm)",
    );
    let m = stack.metrics().await;
    assert!(
        m.contains(
            r#"spillway_rejections_total{class="_none",reason="tenant_rpm",route="chat",team="search"} 1"#
        ) || m.contains(
            r#"spillway_rejections_total{class="default",reason="tenant_rpm",route="chat",team="search"} 1"#
        ),
        "{m}"
    );
    assert!(m.contains(r#"team="search"}"#));
    assert!(!m.contains("test"), "no key material in the metrics");
    assert_eq!(
        stack.engines[0].engine.records().len(),
        3,
        "the refused request reached nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_reserved_at_admission_and_settled_at_the_end() {
    let stack = Stack::start(vec![engine(tiny()).await], TEAMS).await;
    let r = keyed(&stack.url, "test", 600, false).await;
    assert_eq!(r.status(), 200);
    let remaining: u64 = header(&r, "x-ratelimit-remaining-tokens").parse().unwrap();
    let v: Value = r.json().await.unwrap();
    let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
    // The gateway's own count of the prompt (an estimate without a tokenizer) plus max_tokens.
    assert!(
        (1000 - 600 - 3 * prompt - 8..=1000 - 600).contains(&remaining),
        "{remaining}"
    );
    let r = keyed(&stack.url, "test", 600, false).await;
    assert_eq!(r.status(), 429, "600 more would pass the minute's 1000 tokens");
    let v: Value = r.json().await.unwrap();
    testkit::assert_error_mentions(&v, "1000 tokens per minute");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_parallel_holds_a_slot_to_the_end_of_the_stream() {
    let stack = Stack::start(vec![engine(stalling(2)).await], TEAMS).await;
    let mut first = keyed(&stack.url, "other", 50, true).await;
    assert_eq!(first.status(), 200);
    first.chunk().await.unwrap();
    let r = keyed(&stack.url, "other", 2, true).await;
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    testkit::assert_error_mentions(&v, "1 requests in flight (max_parallel)");
    drop(first);
    let freed = testkit::poll(
        std::time::Duration::from_secs(2),
        || async { keyed(&stack.url, "other", 2, false).await.status() != 429 },
        |freed| *freed,
    )
    .await;
    assert!(freed, "the slot comes back when the client leaves");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_removes_a_key_revokes_it_at_once() {
    let stack = Stack::start(vec![engine(tiny()).await], TEAMS).await;
    let r = keyed(&stack.url, "other", 2, true).await;
    assert_eq!(r.status(), 200);
    read_stream(r).await;
    let yaml = TEAMS.replace("{E0}", &stack.engines[0].url()).replace(
        "d9298a10d1b0735837dc4bd85dac641b0f3cef27a47e5d53a54f2f3f5b2fcffa",
        "1111111111111111111111111111111111111111111111111111111111111111",
    );
    stack.gateway.reload(Config::from_yaml(&yaml).unwrap()).unwrap();
    let r = keyed(&stack.url, "other", 2, true).await;
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_api_key");
    assert_eq!(
        keyed(&stack.url, "test", 2, false).await.status(),
        200,
        "other keys stay"
    );
}
