//! vLLM's response store (`VLLM_ENABLE_RESPONSES_API_STORE=1`, on the plain server) beside
//! `spillway engine` with the same variable: one script of requests against each (GET,
//! `previous_response_id`, `store: false`, cancel, `background` alone and streamed, a replay), and
//! every step's status and shape (the paths of every field at every level; for a stream the event
//! names in order and each one's shape) must be the same. Values differ (ids, text).

use super::{Reply, post, request, servers};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use testkit::Process;

use crate::support::BIN;

use testkit::json_shape as shape;

/// A stream's `event:` names (runs written once) and each name's first data's shape.
fn stream_shape(body: &str) -> (Vec<String>, BTreeMap<String, Vec<String>>) {
    let mut names: Vec<String> = Vec::new();
    let mut shapes = BTreeMap::new();
    for e in body.split("\n\n").filter(|e| !e.trim().is_empty()) {
        let name = e
            .lines()
            .find_map(|l| l.strip_prefix("event: "))
            .unwrap_or_default();
        let data = e
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .unwrap_or_default();
        let data: Value = serde_json::from_str(data).unwrap_or_else(|err| panic!("{err}: {data}"));
        if names.last().is_none_or(|n| n != name) {
            names.push(name.to_owned());
        }
        shapes.entry(name.to_owned()).or_insert_with(|| shape(&data));
    }
    (names, shapes)
}

/// One step of the script as a server answered it: what is compared, and what the later steps read.
#[derive(Debug)]
struct Step {
    name: &'static str,
    status: u16,
    /// The body's shape, or a stream's.
    shape: String,
    body: String,
}

impl Step {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{}: {e}: {}", self.name, self.body))
    }
}

fn step(name: &'static str, r: Reply) -> Step {
    let streamed = r
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream"));
    let shape = if streamed {
        format!("{:?}", stream_shape(&r.body))
    } else if r.body.is_empty() {
        String::new()
    } else {
        format!("{:?}", shape(&r.json()))
    };
    Step {
        name,
        status: r.status,
        shape,
        body: r.body,
    }
}

fn turn(input: &str, max: u32) -> Value {
    json!({"model": super::MODEL, "input": input, "max_output_tokens": max, "ignore_eos": true})
}

fn running(port: u16) -> f64 {
    testkit::vllm::metric_in(&super::get_body(port, "/metrics"), "vllm:num_requests_running").unwrap_or(-1.0)
}

/// The script, against the server on `port`; each step also checks what must hold of its answer
/// on either server (so that a step whose timing went wrong says so, not just "shapes differ").
fn script(port: u16) -> Vec<Step> {
    let mut out = Vec::new();
    let first = step("first turn", post(port, "/v1/responses", &turn("hello there", 4)));
    let id = first.json()["id"].as_str().unwrap().to_owned();
    let got = step("GET it", request(port, "GET", &format!("/v1/responses/{id}"), ""));
    assert_eq!(got.json(), first.json(), "GET answers what the POST did");
    let mut next = turn("and then?", 4);
    next["previous_response_id"] = json!(id);
    let second = step(
        "second turn by previous_response_id",
        post(port, "/v1/responses", &next),
    );
    let (grown, whole) = (
        second.json()["usage"]["input_tokens"].as_u64().unwrap(),
        first.json()["usage"]["total_tokens"].as_u64().unwrap(),
    );
    assert!(
        grown > whole,
        "port {port}: the second prompt ({grown}) holds the first exchange ({whole})"
    );
    assert_eq!(second.json()["previous_response_id"], json!(id));
    out.extend([first, got, second]);
    out.push(step(
        "GET unknown",
        request(port, "GET", "/v1/responses/resp_0", ""),
    ));
    out.push(step(
        "cancel finished",
        post(port, &format!("/v1/responses/{id}/cancel"), &json!({})),
    ));
    out.push(step(
        "cancel unknown",
        post(port, "/v1/responses/resp_0/cancel", &json!({})),
    ));
    let mut unkept = turn("hello", 2);
    unkept["store"] = json!(false);
    let unkept = step("store: false", post(port, "/v1/responses", &unkept));
    let uid = unkept.json()["id"].as_str().unwrap().to_owned();
    out.push(unkept);
    out.push(step(
        "GET store: false",
        request(port, "GET", &format!("/v1/responses/{uid}"), ""),
    ));
    let mut bad = turn("hello", 2);
    bad["background"] = json!(true);
    bad["store"] = json!(false);
    out.push(step(
        "background, store: false",
        post(port, "/v1/responses", &bad),
    ));
    out.extend(background(port));
    out
}

/// A long background response: queued, running with no client, cancelled (aborted), read back;
/// a short one to its end; a background stream and its replay.
fn background(port: u16) -> Vec<Step> {
    let mut out = Vec::new();
    // 2,000 tokens: about 3 s on vLLM's CPU, 2 s on the tiny preset; time to see it run.
    let mut long = turn("hello there", 2000);
    long["background"] = json!(true);
    let queued = step("background", post(port, "/v1/responses", &long));
    assert_eq!(queued.json()["status"], "queued", "{}", queued.body);
    let id = queued.json()["id"].as_str().unwrap().to_owned();
    out.push(queued);
    assert!(
        crate::support::wait_until(400, || running(port) == 1.0),
        "port {port}: the background response never ran"
    );
    out.push(step(
        "GET running background",
        request(port, "GET", &format!("/v1/responses/{id}"), ""),
    ));
    assert_eq!(out.last().unwrap().json()["status"], "queued", "port {port}");
    let cancel = step(
        "cancel running",
        post(port, &format!("/v1/responses/{id}/cancel"), &json!({})),
    );
    assert_eq!(cancel.status, 200, "port {port}: {}", cancel.body);
    assert_eq!(cancel.json()["status"], "cancelled");
    out.push(cancel);
    assert!(
        crate::support::wait_until(400, || running(port) == 0.0),
        "port {port}: the cancelled response still runs"
    );
    out.push(step(
        "GET cancelled",
        request(port, "GET", &format!("/v1/responses/{id}"), ""),
    ));
    assert_eq!(out.last().unwrap().json()["status"], "cancelled");
    out.push(step(
        "cancel again",
        post(port, &format!("/v1/responses/{id}/cancel"), &json!({})),
    ));

    let mut short = turn("hello there", 8);
    short["background"] = json!(true);
    let sid = step("background, short", post(port, "/v1/responses", &short)).json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let read = || {
        step(
            "GET ended background",
            request(port, "GET", &format!("/v1/responses/{sid}"), ""),
        )
    };
    assert!(crate::support::wait_until(400, || read().json()["status"] != "queued"));
    let ended = read();
    assert_eq!(ended.json()["status"], "incomplete", "cut at 8: {}", ended.body);
    out.push(ended);

    let mut streamed = turn("hello there", 4);
    streamed["background"] = json!(true);
    streamed["stream"] = json!(true);
    let stream = step("background stream", post(port, "/v1/responses", &streamed));
    let bid = stream
        .body
        .split("\"id\":\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap()
        .to_owned();
    out.push(stream);
    let replay = request(
        port,
        "GET",
        &format!("/v1/responses/{bid}?stream=true&starting_after=3"),
        "",
    );
    assert!(
        replay.body.contains("\"sequence_number\":4,"),
        "port {port}: {}",
        replay.body
    );
    out.push(step("GET stream from 4", replay));
    out
}

#[test]
#[ignore = "real vLLM: scripts/test.sh runs it (scripts/vllm.sh installs it)"]
fn the_response_store_answers_as_vllms() {
    let Some(s) = servers() else { return };
    let sim = Process::engine_with(BIN, &["--model", super::MODEL, "--max-model-len", "2048"], |c| {
        c.env("VLLM_ENABLE_RESPONSES_API_STORE", "1");
    });
    let real = script(s.plain.port);
    let ours = script(sim.port);
    assert_eq!(real.len(), ours.len());
    for (r, o) in real.iter().zip(&ours) {
        // The transcript in the test's output: what was compared, step by step.
        eprintln!(
            "{:<38} vLLM {} | spillway engine {} | {} fields",
            r.name,
            r.status,
            o.status,
            r.shape.matches(',').count() + 1
        );
        assert_eq!(
            (r.status, &r.shape),
            (o.status, &o.shape),
            "{}: vLLM answered {} {}\nspillway engine answered {} {}",
            r.name,
            r.status,
            r.body,
            o.status,
            o.body
        );
        // Errors say the same words (ids differ inside them).
        if r.status >= 400 {
            let (re, oe) = (&r.json()["error"], &o.json()["error"]);
            assert_eq!(
                (&re["type"], &re["param"], &re["code"]),
                (&oe["type"], &oe["param"], &oe["code"]),
                "{}",
                r.name
            );
        }
    }
}
