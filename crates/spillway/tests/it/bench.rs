//! `spillway bench` from the command line: a short run writes its table, JSON and HTML; a target
//! that is down, a wrong model, a bad dataset or SLO each get one clear line and exit code 2.

use std::process::Command;

use crate::support::BIN;
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
