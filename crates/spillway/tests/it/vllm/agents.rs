//! The agents' APIs through `spillway serve` in front of real vLLM 0.32: the official `openai`
//! (Responses) and `anthropic` (Messages) SDKs, a client that leaves aborting the request in
//! vLLM, and a second turn by `previous_response_id` landing on the vLLM that stored the first.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::OnceLock;
use std::time::Duration;

use super::{Gateway, MODEL, Vllm, get_body, installed, post, request, servers};
use crate::support::wait_until;

/// The official SDKs' script (tests/python/agents_gateway.py) against `base`, its transcript.
fn sdk_script(args: &[&str]) -> String {
    let out = std::process::Command::new(testkit::python())
        .arg(super::repo_root().join("tests/python/agents_gateway.py"))
        .args(args)
        .output()
        .expect("python runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    text
}

#[test]
#[ignore = "real vLLM: scripts/test.sh runs it (scripts/vllm.sh installs it)"]
fn the_official_sdks_through_the_gateway_to_vllm() {
    let Some(s) = servers() else { return };
    let port = s.plain.port;
    // `tight` is the same vLLM behind one slot and no queue: a held stream makes an overload.
    let gw = Gateway::with_config(&format!(
        "routes:\n  - model: {MODEL}\n    replicas: [http://127.0.0.1:{port}]\n  - model: tight\n    upstream_model: {MODEL}\n    replicas: [http://127.0.0.1:{port}]\n    classes: [ {{ name: only, concurrency: 1, queue: 0, queue_wait: 0s }} ]\n"
    ));
    let base = format!("http://127.0.0.1:{}", gw.port);
    let transcript = sdk_script(&[&base, MODEL, &base]);
    println!("{transcript}");
    assert!(transcript.contains("ok: 8 checks"), "{transcript}");
    let lines = gw.access_lines(8);
    let agents: Vec<_> = lines
        .iter()
        .filter(|l| matches!(l["api"].as_str(), Some("responses" | "messages")) && l["status"] == 200)
        .collect();
    assert!(agents.len() >= 6, "{lines:?}");
    for line in &agents {
        println!("access log: {line}");
    }
    for line in agents.iter().filter(|l| l["stream"] == true) {
        assert!(
            line["ttft_ms"].is_number() && line["tokens_out"].as_u64() > Some(0),
            "{line}"
        );
    }
    let metrics = get_body(gw.port, "/metrics");
    for series in metrics.lines().filter(|l| {
        l.starts_with("spillway_api_requests_total") || l.starts_with("spillway_ttft_seconds_count")
    }) {
        println!("metrics: {series}");
    }
    assert!(
        metrics.contains(&format!(
            "spillway_api_requests_total{{api=\"messages\",route=\"{MODEL}\",status=\"200\"}}"
        )),
        "{metrics}"
    );
}

#[test]
#[ignore = "real vLLM: scripts/test.sh runs it (scripts/vllm.sh installs it)"]
fn a_client_that_leaves_a_messages_stream_aborts_it_in_vllm() {
    let Some(s) = servers() else { return };
    let v = s.plain;
    let gw = Gateway::start(&[v.port], "");
    let body = serde_json::json!({
        "model": MODEL, "max_tokens": 1900, "stream": true,
        "messages": [{"role": "user", "content": "Tell me about spillways."}],
    })
    .to_string();
    let mut conn = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        conn,
        "POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("content_block_delta") {
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(wait_until(250, || v.metric("vllm:num_requests_running") == 1.0));
    drop(conn);
    assert!(
        wait_until(100, || v.metric("vllm:num_requests_running") == 0.0),
        "vLLM still runs the Messages request after its client left"
    );
    let line = &gw.access_lines(1)[0];
    assert_eq!(
        (line["api"].as_str(), line["outcome"].as_str()),
        (Some("messages"), Some("client_disconnect")),
        "{line}"
    );
}

/// A second vLLM with the Responses API's store on (`VLLM_ENABLE_RESPONSES_API_STORE=1`), beside
/// the shared `plain` one (which stores too): two replicas, each holding its own responses.
fn storing() -> Option<&'static Vllm> {
    static CELL: OnceLock<Result<Vllm, String>> = OnceLock::new();
    if !installed() {
        return None;
    }
    match CELL.get_or_init(|| Vllm::start("store", false, &["--store", "--max-num-seqs", "4"])) {
        Ok(v) => Some(v),
        Err(e) => panic!("{e}"),
    }
}

#[test]
#[ignore = "real vLLM: scripts/test.sh runs it (scripts/vllm.sh installs it)"]
fn a_second_turn_lands_on_the_vllm_that_stored_the_first() {
    let Some(s) = servers() else { return };
    let Some(store) = storing() else { return };
    // Two replicas balanced by load, each with a store of its own: a turn sent to the one that
    // did not make the response would be answered 404.
    let gw = Gateway::start(&[store.port, s.plain.port], "");
    let first =
        serde_json::json!({"model": MODEL, "input": "Tell me about spillways.", "max_output_tokens": 4});
    let mut stored = None;
    for made in 1..=8 {
        let r = post(gw.port, "/v1/responses", &first);
        assert_eq!(r.status, 200, "{}", r.body);
        let id = r.json()["id"].as_str().unwrap().to_owned();
        let line = gw.access_lines(made)[made - 1].clone();
        if line["replica"] == format!("http://127.0.0.1:{}", store.port) {
            stored = Some(id);
            break;
        }
    }
    let id = stored.expect("a response made on the storing vLLM in eight");
    let before = gw.access_log().len();
    for turn in 0..4 {
        let next = serde_json::json!({"model": MODEL, "input": "And then?", "max_output_tokens": 4, "previous_response_id": id});
        let r = post(gw.port, "/v1/responses", &next);
        assert_eq!(r.status, 200, "turn {turn}: {}", r.body);
        assert_eq!(r.json()["previous_response_id"], id.as_str(), "{}", r.body);
    }
    let read = request(gw.port, "GET", &format!("/v1/responses/{id}"), "");
    assert_eq!(read.status, 200, "{}", read.body);
    assert_eq!(read.json()["id"], id.as_str());
    let lines = gw.access_lines(before + 5);
    for line in &lines[before..] {
        assert_eq!(
            line["replica"],
            format!("http://127.0.0.1:{}", store.port),
            "{line}"
        );
    }
    let unknown = post(
        gw.port,
        "/v1/responses",
        &serde_json::json!({"model": MODEL, "input": "x", "previous_response_id": "resp_0000"}),
    );
    assert_eq!(unknown.status, 404, "{}", unknown.body);
}

#[test]
#[ignore = "real vLLM: scripts/test.sh runs it (scripts/vllm.sh installs it)"]
fn a_background_response_holds_its_slot_until_vllm_finishes_it() {
    let Some(_serial) = servers() else { return };
    let Some(store) = storing() else { return };
    let gw = Gateway::start(
        &[store.port],
        "    agents: { background: hold }\n    classes: [ { name: only, concurrency: 1, queue: 0, queue_wait: 0s } ]\n",
    );
    let asked = serde_json::json!({
        "model": MODEL, "input": "Tell me about spillways.", "max_output_tokens": 400,
        "ignore_eos": true, "background": true,
    });
    let r = post(gw.port, "/v1/responses", &asked);
    assert_eq!(r.status, 200, "{}", r.body);
    let answer = r.json();
    assert!(
        matches!(answer["status"].as_str(), Some("queued" | "in_progress")),
        "{answer}"
    );
    let id = answer["id"].as_str().unwrap().to_owned();
    // Its slot is held while vLLM generates with nobody connected.
    let small = serde_json::json!({"model": MODEL, "input": "x", "max_output_tokens": 2});
    let busy = post(gw.port, "/v1/responses", &small);
    assert_eq!(
        busy.status, 503,
        "the background response holds the only slot: {}",
        busy.body
    );
    let mut done = serde_json::Value::Null;
    assert!(
        wait_until(2400, || {
            done = request(gw.port, "GET", &format!("/v1/responses/{id}"), "").json();
            // At its cap vLLM says `incomplete` (max_output_tokens), else `completed`.
            matches!(done["status"].as_str(), Some("completed" | "incomplete"))
        }),
        "{done}"
    );
    assert_eq!(done["usage"]["output_tokens"], 400, "{done}");
    // Given back once vLLM reports it finished (the gateway asks every 250 ms).
    assert!(wait_until(40, || post(gw.port, "/v1/responses", &small).status == 200));
    let lines = gw.access_log();
    let held = lines
        .iter()
        .find(|l| l["tokens_out"] == 400)
        .expect("the background response's line");
    assert_eq!(
        (held["status"].as_u64(), held["outcome"].as_str()),
        (Some(200), Some("ok")),
        "{held}"
    );
    assert!(
        held["duration_ms"].as_f64()
            > lines
                .iter()
                .find(|l| l["status"] == 503)
                .and_then(|l| l["duration_ms"].as_f64()),
        "{held}"
    );
}
