//! `spillway serve` in front of real vLLM: relaying, cancellation reaching vLLM, deadlines,
//! vLLM's own queue limit, engine-aware balancing, reasoning deltas, `/v1/models`, error bodies.

use std::time::Duration;
use tokio::time::Instant;

use super::{Gateway, chat, get_body, open_stream, post, request, send_stream, servers};
use crate::support::wait_until;

/// The sum of every series of a family in an exposition (e.g. all `finished_reason`s).
fn family_sum(exposition: &str, name: &str) -> f64 {
    exposition
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Text carried by a chunk's delta (or a completion's `text`) under `field`.
fn delta<'a>(event: &'a serde_json::Value, field: &str) -> Option<&'a str> {
    let choice = event["choices"].get(0)?;
    choice["delta"][field].as_str()
}

#[test]
#[ignore = "real vLLM: scripts/test.sh runs it (scripts/vllm.sh installs it)"]
fn a_stream_and_a_whole_answer_pass_through() {
    let Some(s) = servers() else { return };
    let gw = Gateway::start(&[s.plain.port], "");

    let r = post(gw.port, "/v1/chat/completions", &chat(16, true));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.header("content-type")
            .is_some_and(|t| t.starts_with("text/event-stream")),
        "{}",
        r.head
    );
    assert!(r.body.trim_end().ends_with("data: [DONE]"), "{}", r.body);
    let events = r.events();
    // vLLM puts finish_reason on the last token's chunk, not on a chunk of its own.
    let last_token = events
        .iter()
        .rfind(|e| delta(e, "content").is_some())
        .expect("content deltas");
    assert_eq!(last_token["choices"][0]["finish_reason"], "length", "{}", r.body);

    let r = post(gw.port, "/v1/chat/completions", &chat(16, false));
    assert_eq!(r.status, 200, "{}", r.body);
    let answer = r.json();
    assert_eq!(answer["model"], super::MODEL);
    assert_eq!(answer["usage"]["completion_tokens"], 16, "{answer}");
    assert_eq!(answer["choices"][0]["finish_reason"], "length");

    let lines = gw.access_lines(2);
    for line in &lines {
        assert_eq!(line["status"], 200, "{line}");
        assert_eq!(line["outcome"], "ok", "{line}");
        assert_eq!(line["tokens_out"], 16, "{line}");
    }
    assert!(lines[0]["ttft_ms"].is_number(), "{}", lines[0]);
}

#[test]
#[ignore = "real vLLM: scripts/test.sh runs it (scripts/vllm.sh installs it)"]
fn a_client_that_leaves_aborts_the_request_in_vllm() {
    let Some(s) = servers() else { return };
    let v = s.plain;
    let gw = Gateway::start(&[v.port], "");
    let before = get_body(v.port, "/metrics");
    let finished = family_sum(&before, "vllm:request_success_total");
    let generated = family_sum(&before, "vllm:generation_tokens_total");

    let (conn, _) = open_stream(gw.port, &chat(1900, true));
    assert!(wait_until(250, || v.metric("vllm:num_requests_running") == 1.0));
    drop(conn);
    let left = Instant::now();
    assert!(
        wait_until(100, || v.metric("vllm:num_requests_running") == 0.0),
        "vLLM still runs the request 2 s after its client left"
    );
    eprintln!(
        "vLLM stopped the request {:?} after the client left",
        left.elapsed()
    );
    let after = get_body(v.port, "/metrics");
    let made = family_sum(&after, "vllm:generation_tokens_total") - generated;
    assert!(made < 1900.0, "{made} tokens generated: not aborted");
    // Where vLLM 0.32 shows the abort: its log (with --enable-log-requests) and the running
    // gauge. Not its counters: request_success_total{finished_reason="abort"} stays put, and
    // so does every other reason (issue 34, difference 3).
    assert!(
        wait_until(250, || v.log_text().contains(" aborted.")),
        "no abort in vLLM's log"
    );
    assert_eq!(
        family_sum(&after, "vllm:request_success_total"),
        finished,
        "vLLM counted the aborted request"
    );
    let line = &gw.access_lines(1)[0];
    assert_eq!(line["outcome"], "client_disconnect", "{line}");
    let gw_metrics = get_body(gw.port, "/metrics");
    assert!(family_sum(&gw_metrics, "spillway_cancellations_total") >= 1.0);
}

#[test]
#[ignore = "real vLLM: scripts/test.sh runs it (scripts/vllm.sh installs it)"]
fn the_total_deadline_cuts_a_stream_and_vllm_stops() {
    let Some(s) = servers() else { return };
    let v = s.plain;
    let gw = Gateway::start(
        &[v.port],
        "    timeouts: { connect: 500ms, first_token: 1s, stream_idle: 1s, total: 1500ms }\n",
    );
    let t = Instant::now();
    let r = post(gw.port, "/v1/chat/completions", &chat(1900, true));
    let took = t.elapsed();
    assert_eq!(r.status, 200);
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(4),
        "{took:?}"
    );
    let events = r.events();
    let last = events.last().expect("events");
    assert!(last.get("error").is_some(), "no SSE error event last: {last}");
    assert!(
        wait_until(100, || v.metric("vllm:num_requests_running") == 0.0),
        "vLLM still runs the request the deadline cut"
    );
    assert_eq!(gw.access_lines(1)[0]["outcome"], "deadline_exceeded");
}

#[test]
#[ignore = "real vLLM: scripts/test.sh runs it (scripts/vllm.sh installs it)"]
fn the_first_token_budget_answers_504_while_vllm_queues() {
    let Some(s) = servers() else { return };
    let v = s.plain;
    // Four long streams take vLLM's four sequences; the next request waits in vLLM's queue.
    let held: Vec<_> = (0..4).map(|_| open_stream(v.port, &chat(1900, true))).collect();
    assert!(wait_until(250, || v.metric("vllm:num_requests_running") == 4.0));
    let gw = Gateway::start(
        &[v.port],
        "    timeouts: { connect: 500ms, first_token: 800ms, stream_idle: 5s, total: 30s }\n    retry: { attempts: 1 }\n",
    );
    let t = Instant::now();
    let r = post(gw.port, "/v1/chat/completions", &chat(8, true));
    let took = t.elapsed();
    assert_eq!(r.status, 504, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "first_token_timeout", "{}", r.body);
    assert!(took < Duration::from_secs(3), "{took:?}");
    drop(held);
    // The request the gateway gave up on leaves vLLM's queue too.
    assert!(
        wait_until(150, || v.metric("vllm:num_requests_running") == 0.0
            && v.metric("vllm:num_requests_waiting") == 0.0),
        "vLLM kept requests whose clients left"
    );
}

/// Sends `n` copies of `body` at once; the answers in the order sent.
fn burst(port: u16, n: usize, body: &serde_json::Value) -> Vec<super::Reply> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|_| s.spawn(|| post(port, "/v1/chat/completions", body)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
#[ignore = "real vLLM: scripts/test.sh runs it (scripts/vllm.sh installs it)"]
fn vllms_queue_limit_reaches_the_client_as_503_with_retry_after() {
    let Some(s) = servers() else { return };
    let v = s.plain;
    let gw = Gateway::start(&[v.port], "");
    let rejected_before = family_sum(&get_body(v.port, "/metrics"), "vllm:admission_rejections_total");
    let replies = burst(gw.port, 24, &chat(64, false));
    let (ok, busy): (Vec<_>, Vec<_>) = replies.iter().partition(|r| r.status == 200);
    assert!(!ok.is_empty() && !busy.is_empty(), "{:?}", statuses(&replies));
    for r in &busy {
        assert_eq!(r.status, 503, "{}", r.body);
        assert!(r.header("retry-after").is_some(), "{}", r.head);
    }
    let rejected =
        family_sum(&get_body(v.port, "/metrics"), "vllm:admission_rejections_total") - rejected_before;
    assert!(rejected >= busy.len() as f64, "vLLM rejected {rejected}");
}

/// An event whose JSON carries a top-level `error`: vLLM's in-stream rejection. The body's text
/// is no test, since the dummy model's random tokens may spell "error".
fn has_error_event(body: &str) -> bool {
    testkit::sse_data(body)
        .iter()
        .any(|d| serde_json::from_str::<serde_json::Value>(d).is_ok_and(|v| v.get("error").is_some()))
}

fn statuses(replies: &[super::Reply]) -> Vec<u16> {
    replies.iter().map(|r| r.status).collect()
}

/// Needs issue 34's gateway fixes: vLLM rejects a streamed burst inside `200 text/event-stream`
/// (one `data: {"error": {.., "code": 503}}`); the gateway must answer 503 with Retry-After.
#[test]
#[ignore = "real vLLM: scripts/test.sh runs it (scripts/vllm.sh installs it)"]
fn a_streamed_rejection_inside_a_200_becomes_a_503() {
    let Some(s) = servers() else { return };
    let v = s.plain;
    // Straight to vLLM first: the form the gateway must recognise.
    let direct = burst(v.port, 24, &chat(64, true));
    let in_stream = direct
        .iter()
        .filter(|r| r.status == 200 && has_error_event(&r.body))
        .count();
    assert!(
        in_stream > 0,
        "vLLM gave no in-stream rejection: {:?}",
        statuses(&direct)
    );
    assert!(wait_until(1500, || v.metric("vllm:num_requests_running") == 0.0));

    let gw = Gateway::start(&[v.port], "");
    let replies = burst(gw.port, 24, &chat(64, true));
    for r in &replies {
        match r.status {
            200 => assert!(!has_error_event(&r.body), "relayed as 200: {}", r.body),
            503 => assert!(r.header("retry-after").is_some(), "{}", r.head),
            other => panic!("{other}: {}", r.body),
        }
    }
    assert!(
        replies.iter().any(|r| r.status == 503),
        "{:?}",
        statuses(&replies)
    );
}

#[test]
#[ignore = "real vLLM: scripts/test.sh runs it (scripts/vllm.sh installs it)"]
fn engine_aware_balancing_steers_around_a_queued_vllm() {
    let Some(s) = servers() else { return };
    let (busy, free) = (s.plain, s.think);
    // Six long streams straight to one replica: four run, two wait in its queue (their answers
    // start only when they run).
    let running: Vec<_> = (0..4)
        .map(|_| open_stream(busy.port, &chat(1900, true)))
        .collect();
    let waiting: Vec<_> = (0..2)
        .map(|_| send_stream(busy.port, &chat(1900, true)))
        .collect();
    assert!(wait_until(250, || busy.metric("vllm:num_requests_waiting") >= 2.0));
    let gw = Gateway::start(&[busy.port, free.port], "    balance: engine_aware\n");
    // The gateway scrapes every second: let it see the queue.
    std::thread::sleep(Duration::from_millis(2500));
    for _ in 0..4 {
        let r = post(gw.port, "/v1/chat/completions", &chat(4, false));
        assert_eq!(r.status, 200, "{}", r.body);
    }
    drop((running, waiting));
    let free_url = format!("http://127.0.0.1:{}", free.port);
    for line in gw.access_lines(4) {
        assert_eq!(line["replica"], free_url.as_str(), "{line}");
        assert_eq!(line["retries"], 0, "{line}");
    }
}

/// Needs issue 34's gateway fixes for the access log's TTFT (vLLM streams reasoning in
/// `delta.reasoning`, which the gateway did not count).
#[test]
#[ignore = "real vLLM: scripts/test.sh runs it (scripts/vllm.sh installs it)"]
fn reasoning_deltas_count_as_the_first_token() {
    let Some(s) = servers() else { return };
    let gw = Gateway::start(&[s.think.port], "");
    let r = post(gw.port, "/v1/chat/completions", &chat(16, true));
    assert_eq!(r.status, 200, "{}", r.body);
    let events = r.events();
    let reasoning = events.iter().filter(|e| delta(e, "reasoning").is_some()).count();
    assert!(reasoning > 0, "no delta.reasoning: {}", r.body);
    assert!(
        events.iter().all(|e| delta(e, "reasoning_content").is_none()),
        "vLLM 0.32 has no reasoning_content"
    );
    let line = &gw.access_lines(1)[0];
    assert!(line["ttft_ms"].is_number(), "no TTFT measured: {line}");
    assert_eq!(line["tokens_out"], 16, "{line}");
}

/// Needs issue 34's gateway fixes: the gateway's `/v1/models` dropped `max_model_len`.
#[test]
#[ignore = "real vLLM: scripts/test.sh runs it (scripts/vllm.sh installs it)"]
fn models_keeps_vllms_max_model_len() {
    let Some(s) = servers() else { return };
    let direct: serde_json::Value = serde_json::from_str(&get_body(s.plain.port, "/v1/models")).unwrap();
    assert_eq!(direct["data"][0]["max_model_len"], 2048, "{direct}");
    let gw = Gateway::start(&[s.plain.port], "");
    // The gateway reads the replica's context length from its /v1/models when it first checks
    // the replica, a moment after it starts: until then its own list has no `max_model_len`.
    let through = || -> serde_json::Value { serde_json::from_str(&get_body(gw.port, "/v1/models")).unwrap() };
    assert!(
        wait_until(500, || through()["data"][0]["max_model_len"] == 2048),
        "{}",
        through()
    );
    assert_eq!(through()["data"][0]["id"], super::MODEL);
}

#[test]
#[ignore = "real vLLM: scripts/test.sh runs it (scripts/vllm.sh installs it)"]
fn vllms_error_bodies() {
    let Some(s) = servers() else { return };
    let port = s.plain.port;
    let long_prompt: String = (0..3000).map(|i| format!("word{i} ")).collect();
    let cases: Vec<(String, u16, &str, &str)> = vec![
        ("{\"model\":".into(), 400, "Bad Request", "JSON decode error"),
        (
            chat(5000, false).to_string(),
            400,
            "BadRequestError",
            "cannot be greater than max_model_len",
        ),
        (
            serde_json::json!({"model": super::MODEL, "max_tokens": 4,
                "messages": [{"role": "user", "content": long_prompt}]})
            .to_string(),
            400,
            "BadRequestError",
            "maximum context length is 2048 tokens",
        ),
        (
            serde_json::json!({"model": "nope", "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}]})
            .to_string(),
            404,
            "NotFoundError",
            "does not exist",
        ),
    ];
    for (body, status, kind, needle) in cases {
        let r = request(port, "POST", "/v1/chat/completions", &body);
        assert_eq!(r.status, status, "{}", r.body);
        let e = &r.json()["error"];
        assert_eq!(e["type"], kind, "{e}");
        // vLLM's code is the status as a number; the gateway's own codes are strings.
        assert_eq!(e["code"], status, "{e}");
        assert!(e["message"].as_str().unwrap().contains(needle), "{e}");
    }
    // max_tokens past what is left of the context is clamped, not refused (difference 4).
    let prompt: String = (0..150).map(|i| format!("w{i} ")).collect();
    let r = post(
        port,
        "/v1/chat/completions",
        &serde_json::json!({"model": super::MODEL, "max_tokens": 2000, "ignore_eos": true,
            "messages": [{"role": "user", "content": prompt}]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let answer = r.json();
    let usage = &answer["usage"];
    assert_eq!(answer["choices"][0]["finish_reason"], "length");
    assert_eq!(usage["total_tokens"], 2048, "{usage}");
    // Through the gateway, vLLM's 400 is relayed with its status.
    let gw = Gateway::start(&[port], "");
    let r = post(gw.port, "/v1/chat/completions", &chat(5000, false));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("max_model_len"), "{}", r.body);
}
