//! `spillway bench --tenant`: two tenants at once through a gateway that knows their keys. Each
//! request carries its own tenant's key (the gateway's access log names the team of every one, and
//! the quota of one team refuses that team only), and the per-tenant counts add up to the totals.

use std::process::{Command, Stdio};

use crate::bench::{bench, engine};
use crate::support::{BIN, Kill, PORTS, free_port_pair, try_get, wait_until};

const KEY_A: &str = "sk-tenant-a-test-key";
const KEY_B: &str = "sk-tenant-b-test-key";

fn sha256(key: &str) -> String {
    let out = Command::new(BIN)
        .args(["key", "--hash"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(key.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// One access-log line's team and status.
fn team_status(line: &str) -> Option<(String, u64)> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    Some((v["team"].as_str()?.to_owned(), v["status"].as_u64()?))
}

#[test]
fn each_tenant_sends_its_own_key_and_the_counts_add_up() {
    let (_engine, engine_port) = engine();
    let dir = std::env::temp_dir().join(format!("spillway-bench-tenants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (config, log, tenants, json, html) = (
        dir.join("gw.yaml"),
        dir.join("access.log"),
        dir.join("tenants.yaml"),
        dir.join("r.json"),
        dir.join("r.html"),
    );
    let ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port_pair();
    // Team b may have one request in flight: its other clients are refused, with Retry-After.
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:{port}
routes:
  - model: m
    replicas: [http://127.0.0.1:{engine_port}]
    classes:
      - {{ name: default, concurrency: 8, queue: 8, queue_wait: 2s }}
tenants:
  - {{ team: a, key_sha256: [\"{}\"] }}
  - {{ team: b, key_sha256: [\"{}\"], max_parallel: 1 }}
",
            sha256(KEY_A),
            sha256(KEY_B)
        ),
    )
    .unwrap();
    let gateway = Kill(
        Command::new(BIN)
            .args(["serve", "--config", config.to_str().unwrap()])
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(
        wait_until(1000, || try_get(port, "/ready")
            .is_ok_and(|r| r.starts_with("HTTP/1.1 200"))),
        "the gateway starts"
    );
    drop(ports);
    // Tenant a from the file, b from the flag.
    std::fs::write(
        &tenants,
        "- { name: a, api_key_env: BENCH_TEST_KEY_A, clients: 2 }\n",
    )
    .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let out = Command::new(BIN)
        .arg("bench")
        .args(["--url", &url, "--model", "m"])
        .args(["--tenants", tenants.to_str().unwrap()])
        .args(["--tenant", "b=BENCH_TEST_KEY_B:clients=3", "--honor-retry-after"])
        .args(["--duration", "2s", "--input-len", "8", "--output-len", "4"])
        .args([
            "--json",
            json.to_str().unwrap(),
            "--html",
            html.to_str().unwrap(),
            "--quiet",
        ])
        .env("BENCH_TEST_KEY_A", KEY_A)
        .env("BENCH_TEST_KEY_B", KEY_B)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("equal-share fairness (Jain's index over 2 tenants"),
        "{stdout}"
    );
    for secret in [KEY_A, KEY_B] {
        assert!(!stdout.contains(secret));
    }
    let json_text = std::fs::read_to_string(&json).unwrap();
    assert!(!json_text.contains(KEY_A) && !json_text.contains(KEY_B));
    let r: serde_json::Value = serde_json::from_str(&json_text).unwrap();
    assert_eq!(r["parameters"]["phases"], serde_json::json!(["tenants"]));
    let levels = r["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 1, "one level, not a staircase");
    assert_eq!(levels[0]["load"]["concurrency"], 5);
    let stats = &levels[0]["stats"];
    let t = r["tenants"].as_array().unwrap();
    let (a, b) = (&t[0], &t[1]);
    assert_eq!((a["name"].as_str(), b["name"].as_str()), (Some("a"), Some("b")));
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}: {v}"));
    let sum = |k: &str| n(a, k) + n(b, k);
    // Per tenant, every request is served, refused or an error; and the tenants make the totals.
    for x in [a, b] {
        assert_eq!(
            n(x, "sent"),
            n(x, "served") + n(x, "refused_429") + n(x, "refused_503") + n(x, "errors"),
            "{x}"
        );
    }
    assert_eq!(sum("sent"), n(stats, "requests"));
    assert_eq!(sum("served"), n(stats, "ok"));
    assert_eq!(
        sum("refused_429"),
        stats["errors"]["http_429"].as_u64().unwrap_or(0)
    );
    // Only b is over a quota, and every refusal said when to come back.
    assert_eq!(n(a, "refused_429"), 0, "{a}");
    assert!(n(b, "refused_429") > 0, "{b}");
    assert_eq!(n(b, "refused_with_retry_after"), n(b, "refused_429"));
    assert!(b["retry_waits"]["waits"].as_u64().unwrap() > 0, "{b}");
    assert!(n(a, "served") > 0 && n(b, "served") > 0);
    let share = |k: &str| a[k].as_f64().unwrap() + b[k].as_f64().unwrap();
    assert!((share("served_share") - 1.0).abs() < 1e-9);
    assert!((share("token_share") - 1.0).abs() < 1e-9);
    assert_eq!(
        n(a, "served_tokens"),
        n(a, "served_input_tokens") + n(a, "served_output_tokens")
    );
    assert!(a["ttft"]["p95"].as_f64().unwrap() > 0.0 && b["itl"]["p50"].as_f64().is_some());
    // Jain's index from the tenants' own numbers.
    let (x, y) = (n(a, "served_tokens") as f64, n(b, "served_tokens") as f64);
    let jain = (x + y).powi(2) / (2.0 * (x * x + y * y));
    let reported = r["fairness"]["jain_served_tokens"].as_f64().unwrap();
    assert!((reported - jain).abs() < 1e-9, "{reported} against {jain}");
    // The gateway saw each tenant's key: its access log names the team of every request (each
    // tenant's first request checks its key before the run, hence the + 1), and b's refusals.
    let expected = |x: &serde_json::Value| n(x, "sent") + n(x, "warmup_requests") + 1;
    let lines = || -> Vec<(String, u64)> {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(team_status)
            .collect()
    };
    let count = |team: &str| lines().iter().filter(|(t, _)| t == team).count() as u64;
    assert!(
        wait_until(500, || count("a") == expected(a) && count("b") == expected(b)),
        "access log: a {} of {}, b {} of {}",
        count("a"),
        expected(a),
        count("b"),
        expected(b)
    );
    let refused_b = lines().iter().filter(|(t, s)| t == "b" && *s == 429).count() as u64;
    assert_eq!(refused_b, n(b, "refused_429"));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<h2>Tenants</h2>") && page.contains("fairness (Jain"));
    // A wrong key stops the run before it starts, naming its tenant, once.
    let out = Command::new(BIN)
        .arg("bench")
        .args(["--url", &url, "--model", "m", "--duration", "1s", "--quiet"])
        .args(["--tenant", "a=BENCH_TEST_KEY_A:clients=1"])
        .args(["--tenant", "b=BENCH_TEST_KEY_B:clients=1"])
        .env("BENCH_TEST_KEY_A", KEY_A)
        .env("BENCH_TEST_KEY_B", "sk-not-a-key-of-b")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("tenant b: target") && stderr.contains("(401)"),
        "{stderr}"
    );
    assert_eq!(stderr.matches("refused the first request").count(), 1, "{stderr}");
    drop(gateway);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn flags_that_make_no_sense_with_tenants_are_refused() {
    let dir = std::env::temp_dir().join(format!("spillway-bench-tenants-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let weighted = dir.join("weighted.yaml");
    std::fs::write(
        &weighted,
        "- { name: a, api_key_env: HOME, clients: 2, weight: 3 }\n",
    )
    .unwrap();
    let empty = dir.join("empty.yaml");
    std::fs::write(&empty, "[]\n").unwrap();
    let url = "http://127.0.0.1:9";
    let t = ["--url", url, "--model", "m", "--tenant", "a=HOME:clients=2"];
    let cases: Vec<(Vec<&str>, &[&str])> = vec![
        (
            [&t[..], &["--concurrency", "4"]].concat(),
            &["--concurrency cannot be used with --tenant", "clients="],
        ),
        (
            [&t[..], &["--rate", "4"]].concat(),
            &["--rate cannot be used with --tenant"],
        ),
        (
            [&t[..], &["--requests", "10"]].concat(),
            &["--requests cannot be used", "--duration"],
        ),
        (
            [&t[..], &["--phases", "staircase"]].concat(),
            &["--phases cannot be used", "one level, not a staircase"],
        ),
        (
            [&t[..], &["--api-key-env", "HOME"]].concat(),
            &["--api-key-env cannot be used", "its own key"],
        ),
        (
            [&t[..], &["--tenant", "a=HOME:rate=1"]].concat(),
            &["tenant a: named twice"],
        ),
        (
            vec![
                "--url",
                url,
                "--model",
                "m",
                "--tenant",
                "a=SPILLWAY_TEST_UNSET_KEY:clients=1",
            ],
            &["tenant a", "SPILLWAY_TEST_UNSET_KEY", "not set"],
        ),
        (
            vec!["--url", url, "--model", "m", "--tenant", "a=HOME:clients=0"],
            &["--tenant", "clients must be at least 1"],
        ),
        (
            vec![
                "--url",
                url,
                "--model",
                "m",
                "--tenants",
                weighted.to_str().unwrap(),
            ],
            &["weighted.yaml", "unknown field `weight`", "api_key_env"],
        ),
        (
            vec!["--url", url, "--model", "m", "--tenants", empty.to_str().unwrap()],
            &["empty.yaml", "the list is empty"],
        ),
    ];
    for (args, needles) in cases {
        let (code, stdout, stderr) = bench(&args);
        assert_eq!(code, Some(2), "{args:?}: {stdout}{stderr}");
        for needle in needles {
            assert!(stderr.contains(needle), "{args:?}: {needle:?} not in {stderr}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
