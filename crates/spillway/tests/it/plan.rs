//! `spillway plan` from the command line: from a real bench run to files `spillway check` accepts,
//! the seed's figures printed with their arithmetic, and bad input as one line with exit code 2.

use std::path::PathBuf;
use std::process::Command;

use crate::bench::{bench, engine};
use crate::support::BIN;

fn plan(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN).arg("plan").args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("spillway-plan-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const SEED: [&str; 8] = [
    "--c-safe",
    "15",
    "--throughput",
    "6",
    "--replicas",
    "2",
    "--model",
    "corp-chat",
];

#[test]
fn a_bench_result_becomes_files_that_spillway_check_accepts() {
    let (_engine, port) = engine();
    let dir = scratch("bench");
    let json = dir.join("result.json");
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
        "8",
        "--output-len",
        "8",
        "--phases",
        "baseline,staircase",
        "--slo",
        "ttft_p95=2s,itl_p95=1s",
        "--metrics-url",
        &metrics,
        "--json",
        json.to_str().unwrap(),
        "--quiet",
    ]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let out = dir.join("plan");
    let (code, stdout, stderr) = plan(&[
        "--bench",
        json.to_str().unwrap(),
        "--replicas",
        "3",
        "--upstream",
        "http://127.0.0.1:9001",
        "--upstream",
        "http://127.0.0.1:9002",
        "--upstream",
        "http://127.0.0.1:9003",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    // The safe load of two engines' worth, times three replicas, times the headroom.
    assert!(
        stdout.contains("C = floor(C_safe × R × headroom) = floor(2 × 3 × 0.8) = floor(4.8) = 4"),
        "{stdout}"
    );
    assert!(
        stdout.contains("recovery after a burst was not checked"),
        "{stdout}"
    );
    for file in [
        "spillway.yaml",
        "envoy-backendtrafficpolicy.yaml",
        "litellm.yaml",
        "vllm-args.txt",
        "kserve-inferenceservice.yaml",
    ] {
        assert!(
            stdout.contains(&format!("wrote {}", out.join(file).display())),
            "{stdout}"
        );
    }
    let check = Command::new(BIN)
        .args(["check", out.join("spillway.yaml").to_str().unwrap()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(said.contains("class interactive: C = 4, Q = "), "{said}");
    assert!(said.contains("m → 3 replica(s)"), "{said}");

    // Without the deployment's names: what the bench measured, and the rest marked as a guess.
    let (code, stdout, stderr) = plan(&[
        "--bench",
        json.to_str().unwrap(),
        "--replicas",
        "2",
        "--emit",
        "spillway,kserve",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    // Wq from the bench's TTFT objective of 2 s (half of it, the engine's TTFT being far below).
    assert!(
        stdout.contains("Wq 1s: min(objective − TTFT p99, objective / 2) = min(2s − "),
        "{stdout}"
    );
    assert!(stdout.contains("max_tokens cap = 8: the total"), "{stdout}");
    let spillway = std::fs::read_to_string(out.join("spillway.yaml")).unwrap();
    for needle in [
        &format!("- {url}\n"),
        "- http://replica-2.invalid:8000\n",
        "# NOT MEASURED: replicas: 1 placeholder URL(s)",
        "# NOT MEASURED: listen: 0.0.0.0:8080 is the default",
        "queue_wait: 1s\n",
        "cap: 8\n",
    ] {
        assert!(spillway.contains(needle), "{needle:?} missing:\n{spillway}");
    }
    let kserve = std::fs::read_to_string(out.join("kserve-inferenceservice.yaml")).unwrap();
    assert!(
        kserve.starts_with("# NOT MEASURED: the model vLLM loads is written as the served name \"m\""),
        "{kserve}"
    );
    let check = Command::new(BIN)
        .args(["check", out.join("spillway.yaml").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_seeds_figures_print_their_arithmetic_and_every_file() {
    let (code, stdout, stderr) = plan(&SEED);
    assert_eq!(code, Some(0), "{stderr}");
    for needle in [
        "C = floor(C_safe × R × headroom) = floor(15 × 2 × 0.8) = floor(24) = 24",
        "Q = ceil(throughput × Wq) = ceil(6 × 2) = 12",
        "LiteLLM max_parallel_requests = C + Q = 24 + 12 = 36",
        "--max-num-seqs = ceil(C / R) = ceil(24 / 2) = 12",
        "Binding layer: the gateway binds",
        "# spillway.yaml (spillway)",
        "maxParallelRequests: 24",
        "max_parallel_requests: 36",
        "vllm serve corp-chat --served-model-name corp-chat --max-num-seqs 12",
        "- --max-num-seqs=12",
    ] {
        assert!(stdout.contains(needle), "{needle:?} missing:\n{stdout}");
    }
    let mut args = SEED.to_vec();
    args.extend(["--json", "--emit", "spillway,envoy"]);
    let (code, stdout, stderr) = plan(&args);
    assert_eq!(code, Some(0), "{stderr}");
    let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(doc["plan"]["schema"], "spillway-plan/1");
    assert_eq!(doc["plan"]["concurrency"], 24);
    assert_eq!(doc["plan"]["queue"], 12);
    assert_eq!(doc["plan"]["budgets"]["queue_wait"], 2.0);
    assert_eq!(doc["files"].as_array().unwrap().len(), 2);
    // Without LiteLLM's file, the plan neither sizes nor names it.
    assert_eq!(doc["plan"]["litellm"], false);
    assert!(
        !doc["plan"]["binding_why"].as_str().unwrap().contains("LiteLLM"),
        "{}",
        doc["plan"]["binding_why"]
    );
}

#[test]
fn bad_input_gets_one_line_and_exit_code_2() {
    let dir = scratch("bad");
    let other = dir.join("other.json");
    std::fs::write(&other, r#"{"schema": "guidellm/1", "benchmarks": []}"#).unwrap();
    let failing = dir.join("failing.json");
    std::fs::write(
        &failing,
        r#"{"schema":"spillway-bench/1","parameters":{"model":"m","slo":"ttft_p95=1s"},
            "levels":[],"bursts":[],"knee":{"concurrency":1},"safe":null}"#,
    )
    .unwrap();
    let (other, failing) = (other.to_str().unwrap(), failing.to_str().unwrap());
    let with_seed = |extra: &[&'static str]| {
        let mut v: Vec<&str> = SEED.to_vec();
        v.extend_from_slice(extra);
        v
    };
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--bench", other, "--replicas", "2"],
            "schema \"guidellm/1\" is not spillway-bench/1",
        ),
        (
            vec!["--bench", failing, "--replicas", "2"],
            "no level passed its SLOs",
        ),
        (
            with_seed(&["--headroom", "1.5"]),
            "--headroom 1.5: must be above 0 and at most 1",
        ),
        (with_seed(&["--headroom", "0"]), "--headroom 0: must be above 0"),
        (
            with_seed(&["--wait-budget", "2s", "--first-token", "1s"]),
            "--wait-budget 2s cannot fit the first-token budget 1s",
        ),
        (
            with_seed(&["--e2e-p99", "50s", "--caller-deadline", "30s"]),
            "deadlines cannot nest",
        ),
        (
            vec!["--c-safe", "15", "--throughput", "6", "--replicas", "2"],
            "--model",
        ),
    ];
    for (args, needle) in cases {
        let (code, stdout, stderr) = plan(&args);
        assert_eq!(code, Some(2), "{args:?}: {stdout}{stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "{args:?}: one line, not\n{stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
