//! `spillway bench` from the command line: a short run writes its table, JSON and HTML; a target
//! that is down, a wrong model, a bad dataset or SLO each get one clear line and exit code 2.

use std::process::Command;

use crate::support::{BIN, get};
use testkit::Process;

/// An engine on free ports (the next port stays free: nothing listens there).
pub(crate) fn engine() -> (Process, u16) {
    let engine = Process::engine(BIN, &["--model", "m", "--max-num-seqs", "4"]);
    let port = engine.port;
    (engine, port)
}

pub(crate) fn bench(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN).arg("bench").args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_short_run_writes_the_table_json_and_html() {
    let (_engine, port) = engine();
    let dir = std::env::temp_dir().join(format!("spillway-bench-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (json, html) = (dir.join("r.json"), dir.join("r.html"));
    let url = format!("http://127.0.0.1:{port}");
    let metrics = format!("{url}/metrics");
    let (code, stdout, stderr) = bench(&[
        "--url",
        &url,
        "--model",
        "m",
        "--concurrency",
        "1,2",
        "--duration",
        "1s",
        "--input-len",
        "uniform:8-16",
        "--output-len",
        "8",
        "--phases",
        "baseline,staircase,burst",
        "--burst-length",
        "300ms",
        "--recovery-timeout",
        "2s",
        "--slo",
        "ttft_p95=2s,itl_p95=1s",
        "--metrics-url",
        &metrics,
        "--json",
        json.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
        "--quiet",
    ]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("ttft p95") && stdout.contains("staircase C=2"),
        "{stdout}"
    );
    assert!(stdout.contains("Safe load: C=2"), "{stdout}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["parameters"]["url"], url.as_str());
    assert_eq!(report["parameters"]["input_len"]["kind"], "uniform");
    // The baseline at C=1 is also the staircase's first step: run once.
    assert_eq!(report["levels"].as_array().unwrap().len(), 2);
    assert!(std::fs::read_to_string(&html).unwrap().contains("<svg"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_targets_and_inputs_get_one_clear_line() {
    let (_engine, port) = engine();
    let url = format!("http://127.0.0.1:{port}");
    let dir = std::env::temp_dir().join(format!("spillway-bench-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dataset = dir.join("prompts.jsonl");
    std::fs::write(&dataset, "{\"prompt\": \"hello\"}\n{\"prompt\": \n").unwrap();
    // Port + 1 was free when chosen and nothing listens there.
    let down = format!("http://127.0.0.1:{}", port + 1);
    let down_metrics = format!("{down}/metrics");
    let cases: Vec<(Vec<&str>, &[&str])> = vec![
        (
            vec!["--url", &down, "--model", "m"],
            &["unreachable", "Connection refused"],
        ),
        (
            vec!["--url", &url, "--model", "gpt-9"],
            &["404", "`gpt-9` does not exist", "the target serves: m"],
        ),
        (
            vec![
                "--url",
                &url,
                "--model",
                "m",
                "--dataset",
                dataset.to_str().unwrap(),
            ],
            &["prompts.jsonl", "line 2"],
        ),
        (
            vec!["--url", &url, "--model", "m", "--slo", "ttft_p95=soon"],
            &["--slo", "\"soon\" is not a duration"],
        ),
        (
            vec!["--url", &url, "--model", "m", "--slo", "latency_p95=1s"],
            &["unknown metric \"latency\""],
        ),
        (
            vec!["--url", &url, "--model", "m", "--input-len", "uniform:9-1"],
            &["MIN 9 is above MAX 1"],
        ),
        (
            vec![
                "--url",
                &url,
                "--model",
                "m",
                "--api-key-env",
                "SPILLWAY_TEST_UNSET_KEY",
            ],
            &["SPILLWAY_TEST_UNSET_KEY", "not set"],
        ),
        (
            vec!["--url", &url, "--model", "m", "--metrics-url", &down_metrics],
            &["--metrics-url", "cannot connect"],
        ),
    ];
    for (args, needles) in cases {
        let (code, stdout, stderr) = bench(&args);
        assert_eq!(code, Some(2), "{args:?}: {stdout}{stderr}");
        for n in needles {
            assert!(stderr.contains(n), "{args:?}: {n:?} not in {stderr}");
        }
        assert!(
            stderr.lines().count() <= 3,
            "one clear error, not a dump: {stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A counter's value in a `/metrics` text (the engine has one model and one engine).
fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `--api responses` and `--api messages` against `spillway engine`, which serves them as vLLM
/// 0.32 does: every request served, its TTFT before its end, a gap between each two of its tokens,
/// and the tokens the bench counted are the engine's own (its vLLM counters, less the bench's
/// one-word first request of 2 tokens). A trace replayed with `--api messages` is sent as Messages.
#[test]
fn the_agent_apis_are_driven_and_counted_as_the_engine_counted_them() {
    let dir = std::env::temp_dir().join(format!("spillway-bench-apis-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for api in ["responses", "messages"] {
        let (_engine, port) = engine();
        let url = format!("http://127.0.0.1:{port}");
        let json = dir.join(format!("{api}.json"));
        let (code, stdout, stderr) = bench(&[
            "--url",
            &url,
            "--model",
            "m",
            "--api",
            api,
            "--concurrency",
            "1,2",
            "--requests",
            "6",
            "--input-len",
            "32",
            "--output-len",
            "8",
            "--phases",
            "staircase",
            "--slo",
            "ttft_p95=5s",
            "--records",
            "--json",
            json.to_str().unwrap(),
            "--quiet",
        ]);
        assert_eq!(code, Some(0), "{api}: {stdout}{stderr}");
        assert!(stdout.contains(&format!("(m, {api} API)")), "{stdout}");
        let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        assert_eq!(report["parameters"]["api"], api);
        assert_eq!(report["parameters"]["endpoint"], api, "kept for older readers");
        let records: Vec<&serde_json::Value> = report["levels"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|l| l["records"].as_array().unwrap())
            .collect();
        assert_eq!(records.len(), 12, "{api}");
        let (mut input, mut output) = (0.0, 0.0);
        for r in &records {
            assert_eq!(r["outcome"]["kind"], "ok", "{api}: {r}");
            assert_eq!(r["output_tokens"], 8, "{api}: {r}");
            assert_eq!(r["itl_us"].as_array().unwrap().len(), 7, "{api}: {r}");
            // A busy machine may hand the client several events in one read (gaps of 0, the
            // first token at the end): what holds whatever the timing is the order of things.
            let (ttft, e2e) = (r["ttft"].as_f64().unwrap(), r["e2e"].as_f64().unwrap());
            let gaps: f64 = r["itl_us"]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| g.as_f64().unwrap() / 1e6)
                .sum();
            assert!(ttft > 0.0 && ttft + gaps <= e2e + 1e-6, "{api}: {r}");
            let prefix = if api == "responses" { "resp_" } else { "chatcmpl-" };
            assert!(r["id"].as_str().unwrap().starts_with(prefix), "{api}: {r}");
            input += r["input_tokens"].as_f64().unwrap();
            output += r["output_tokens"].as_f64().unwrap();
        }
        let template = records[0]["input_tokens"].as_f64().unwrap() - 32.0;
        let metrics = get(port, "/metrics");
        assert_eq!(
            counter(&metrics, "vllm:generation_tokens_total"),
            output + 2.0,
            "{api}"
        );
        assert_eq!(
            counter(&metrics, "vllm:prompt_tokens_total"),
            input + template + 1.0,
            "{api}"
        );
    }

    let (_engine, port) = engine();
    let url = format!("http://127.0.0.1:{port}");
    let trace = format!(
        "{}/../trace/tests/fixtures/access.log",
        env!("CARGO_MANIFEST_DIR")
    );
    let json = dir.join("trace.json");
    let (code, stdout, stderr) = bench(&[
        "--url",
        &url,
        "--model",
        "m",
        "--api",
        "messages",
        "--trace",
        &trace,
        "--speed",
        "4",
        "--slo",
        "ttft_p95=5s",
        "--records",
        "--json",
        json.to_str().unwrap(),
        "--quiet",
    ]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["parameters"]["api"], "messages");
    let records = report["levels"][0]["records"].as_array().unwrap();
    assert!(!records.is_empty());
    for r in records {
        assert_eq!(r["outcome"]["kind"], "ok", "{r}");
        assert!(r["id"].as_str().unwrap().starts_with("chatcmpl-"), "{r}");
        assert!(r["output_tokens"].as_u64().unwrap() > 0, "{r}");
    }
    assert_eq!(
        counter(&get(port, "/metrics"), "vllm:request_success_total"),
        records.len() as f64 + 1.0,
        "every replayed request reached the engine, and the first one"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
