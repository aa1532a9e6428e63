//! `spillway trace` and `spillway bench --trace` from the command line: an access log summarised,
//! converted to Mooncake JSONL, and replayed against an engine; a file of no known format refused.

use std::process::Command;

use crate::bench::{bench, engine};
use crate::support::BIN;

fn fixture(name: &str) -> String {
    format!("{}/../trace/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn spillway_trace(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN).arg("trace").args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_access_log_is_summarised_converted_and_replayed() {
    let (code, out, err) = spillway_trace(&["summary", &fixture("access.log")]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with("4 requests over 2.1 s: 1.90 arrivals/s on average, 3 in the busiest second"),
        "{out}"
    );
    assert!(out.contains("by refused or cut: queue_full 1"), "{out}");

    let dir = std::env::temp_dir().join(format!("spillway-trace-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (jsonl, report) = (dir.join("t.jsonl"), dir.join("r.json"));
    let (code, _, err) = spillway_trace(&[
        "convert",
        &fixture("access.log"),
        "--to",
        "mooncake",
        "-o",
        jsonl.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("left out: 1 line: no tokens_in"), "{err}");
    let text = std::fs::read_to_string(&jsonl).unwrap();
    assert_eq!(text.lines().count(), 4);
    assert!(
        text.lines().nth(2).unwrap().contains("\"hash_ids\":[0,1,5,6,7]"),
        "{text}"
    );

    let (_engine, port) = engine();
    let url = format!("http://127.0.0.1:{port}");
    let (code, stdout, stderr) = bench(&[
        "--url",
        &url,
        "--model",
        "m",
        "--trace",
        jsonl.to_str().unwrap(),
        "--speed",
        "4",
        "--slo",
        "ttft_p95=5s",
        "--json",
        report.to_str().unwrap(),
        "--quiet",
    ]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(v["levels"][0]["phase"], "replay");
    assert_eq!(v["levels"][0]["stats"]["requests"], 4);
    assert_eq!(v["parameters"]["trace"]["speed"], 4.0);
    assert!(
        v["summary"].as_str().unwrap().starts_with("replayed 4 requests"),
        "{}",
        v["summary"]
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_file_of_no_known_format_is_refused_with_the_flag_to_give() {
    let dir = std::env::temp_dir().join(format!("spillway-trace-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("what.txt");
    std::fs::write(&file, "hello\n").unwrap();
    let (code, _, err) = spillway_trace(&["summary", file.to_str().unwrap()]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("cannot tell its format from the first line; give --format"),
        "{err}"
    );
    let (code, _, err) = spillway_trace(&["summary", file.to_str().unwrap(), "--format", "mooncake"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("line 1: not a Mooncake trace line"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn plan_simulates_a_trace_over_a_grid_and_plans_from_the_best() {
    let out = Command::new(BIN)
        .args([
            "plan",
            "--simulate",
            &fixture("mooncake.jsonl"),
            "--model",
            "m",
            "--replicas",
            "1",
            "--engine-preset",
            "llama-3.1-8b-h100",
            "--speed",
            "1000",
            "--grid-concurrency",
            "1,4",
            "--grid-queue",
            "0",
            "--grid-max-num-seqs",
            "4",
            "--slo",
            "ttft_p95=10s,error_rate=1%",
            "--json",
        ])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // At 1000× the four arrive within 31 ms, each answer taking longer: C = 1 without a queue
    // serves the first and refuses three; C = 4 serves all.
    assert!(stderr.contains("2 candidates simulated"), "{stderr}");
    assert!(stderr.contains("chosen (*): C=4 Q=0"), "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let sim = &v["simulation"]["candidates"];
    assert_eq!(sim[0]["refused"]["queue_full"], 3, "{sim}");
    assert_eq!(sim[1]["served"], 4);
    assert_eq!(v["plan"]["concurrency"], 4);
    assert_eq!(v["plan"]["max_num_seqs"], 4);
}

#[test]
fn plan_simulates_with_a_cost_model_file_in_place_of_the_presets() {
    let dir = std::env::temp_dir().join(format!("spillway-sim-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("slow.json");
    // Every step 3 s whatever it holds: a first token takes at least one step.
    std::fs::write(
        &model,
        r#"{"schema":"spillway-cost-model/1","cost":{"overhead":"3s","prefill_token":"0s",
            "decode_seq":"0s","context_token":"0s"}}"#,
    )
    .unwrap();
    let ttft_p50 = |extra: &[&str]| {
        let out = Command::new(BIN)
            .args(["plan", "--simulate", &fixture("mooncake.jsonl"), "--model", "m"])
            .args([
                "--replicas",
                "1",
                "--engine-preset",
                "llama-3.1-8b-h100",
                "--speed",
                "1000",
            ])
            .args([
                "--grid-concurrency",
                "4",
                "--grid-queue",
                "0",
                "--grid-max-num-seqs",
                "4",
            ])
            .args([
                "--slo",
                "ttft_p95=1000s,error_rate=1%",
                "--caller-deadline",
                "1h",
                "--json",
            ])
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["simulation"]["candidates"][0]["ttft"]["p50"].as_f64().unwrap()
    };
    let preset = ttft_p50(&[]);
    let fitted = ttft_p50(&["--cost-model", model.to_str().unwrap()]);
    assert!(preset < 3.0, "the preset's first token: {preset} s");
    assert!(fitted >= 3.0, "a 3 s step's first token: {fitted} s");

    std::fs::write(&model, r#"{"schema":"spillway-cost-model/9","cost":{}}"#).unwrap();
    let out = Command::new(BIN)
        .args(["plan", "--simulate", &fixture("mooncake.jsonl"), "--model", "m"])
        .args(["--replicas", "1", "--cost-model", model.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--cost-model") && stderr.contains("spillway-cost-model/9"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
