//! The shipped Prometheus rules and Grafana dashboard: promtool passes them, and every series they
//! name is one that a gateway in front of an engine (with DCGM metrics on) really exposes.

use crate::support::{Stack, engine, http, read_stream, tiny};
use serde_json::Value as Json;
use serde_yaml_ng::Value as Yaml;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

const ROUTE: &str = r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    classes:
      - name: interactive
        concurrency: 8
        queue: 8
        queue_wait: 1s
        slo: { ttft: 2s, itl: 500ms }
"#;

fn prometheus_dir() -> PathBuf {
    testkit::repo_root().join("deploy/prometheus")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no YAML in {}", dir.display());
    files
}

fn rule_files() -> Vec<PathBuf> {
    yaml_files(&prometheus_dir())
}

fn test_files() -> Vec<PathBuf> {
    yaml_files(&prometheus_dir().join("tests"))
}

fn dashboard() -> Json {
    let path = testkit::repo_root().join("deploy/grafana/spillway.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn yaml(path: &Path) -> Yaml {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs promtool with `args` in `dir`; panics with its output unless it succeeds.
async fn promtool(dir: &Path, args: &[&str], files: &[PathBuf]) -> String {
    let out = tokio::process::Command::new(testkit::tool("promtool"))
        .current_dir(dir)
        .args(args)
        .args(files)
        .output()
        .await
        .expect("promtool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

/// Every rule of every group in the rule files: (record or alert name, expr).
fn rules() -> Vec<(Option<String>, Option<String>, String)> {
    let mut all = Vec::new();
    for file in rule_files() {
        let doc = yaml(&file);
        for group in doc["groups"].as_sequence().expect("groups") {
            for rule in group["rules"].as_sequence().expect("rules") {
                let s = |k: &str| rule[k].as_str().map(str::to_owned);
                all.push((
                    s("record"),
                    s("alert"),
                    s("expr").expect("every rule has an expr"),
                ));
            }
        }
    }
    all
}

/// Every PromQL query of the dashboard: panel targets, and the metric queries of its variables.
fn dashboard_queries(d: &Json) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![d["panels"].clone()];
    while let Some(v) = stack.pop() {
        for p in v.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                out.push(t["expr"].as_str().expect("a target has an expr").to_owned());
            }
            stack.push(p["panels"].clone());
        }
    }
    for var in d["templating"]["list"].as_array().expect("templating.list") {
        if var["type"] == "query" {
            let q = var["query"]["query"]
                .as_str()
                .expect("a query variable has a query");
            // label_values(<series selector>, <label>): the selector is the query.
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|s| s.strip_suffix(')'))
                .and_then(|s| s.rsplit_once(','))
                .map(|(sel, _)| sel.to_owned());
            out.push(inner.unwrap_or_else(|| q.to_owned()));
        }
    }
    out
}

/// Grafana's variables replaced by values Prometheus accepts.
fn grafana_to_promql(q: &str) -> String {
    q.replace("$__rate_interval", "5m")
        .replace("$__interval", "1m")
        .replace("$route", ".*")
        .replace("$class", ".*")
        .replace("$model", ".*")
}

/// Operators and aggregations, which read as identifiers (`sum by (x) (...)` is not a call).
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "Inf",
    "NaN",
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
];
const GROUPING: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];

/// The metric names a PromQL expression reads: identifiers that are not functions, keywords,
/// label names (in `{}` or a grouping clause), strings, numbers, durations or Grafana variables.
fn series_names(expr: &str) -> BTreeSet<String> {
    let c: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let skip_to = |i: usize, open: char, close: char| {
        let mut depth = 0;
        let mut j = i;
        while j < c.len() {
            if c[j] == '"' || c[j] == '\'' || c[j] == '`' {
                let q = c[j];
                j += 1;
                while j < c.len() && c[j] != q {
                    j += if c[j] == '\\' { 2 } else { 1 };
                }
            } else if c[j] == open {
                depth += 1;
            } else if c[j] == close {
                depth -= 1;
                if depth == 0 {
                    return j + 1;
                }
            }
            j += 1;
        }
        panic!("unbalanced {open} in {expr}");
    };
    let ident = |ch: char| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':';
    while i < c.len() {
        let ch = c[i];
        if ch == '"' || ch == '\'' || ch == '`' {
            i += 1;
            while i < c.len() && c[i] != ch {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if ch == '{' {
            i = skip_to(i, '{', '}');
        } else if ch == '[' {
            i = skip_to(i, '[', ']');
        } else if ch == '$' {
            i += 1;
            while i < c.len() && (ident(c[i]) || c[i] == '{' || c[i] == '}') {
                i += 1;
            }
        } else if ch.is_ascii_digit() || ch == '.' {
            while i < c.len() && (ident(c[i]) || c[i] == '.') {
                i += 1;
            }
        } else if ident(ch) {
            let start = i;
            while i < c.len() && ident(c[i]) {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let mut j = i;
            while j < c.len() && c[j].is_whitespace() {
                j += 1;
            }
            let call = j < c.len() && c[j] == '(';
            if GROUPING.contains(&word.as_str()) {
                if call {
                    i = skip_to(j, '(', ')');
                }
            } else if !call && !KEYWORDS.contains(&word.as_str()) {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// The sample names of a text exposition (histograms as their `_bucket`, `_sum`, `_count`).
fn exposed(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn promtool_checks_the_rules_and_passes_their_unit_tests() {
    let dir = prometheus_dir();
    let checked = promtool(&dir, &["check", "rules"], &rule_files()).await;
    println!("{checked}");
    let tested = promtool(&dir.join("tests"), &["test", "rules"], &test_files()).await;
    println!("{tested}");
    assert!(!tested.contains("FAILED"), "{tested}");
}

#[test]
fn every_alert_fires_in_a_unit_test_and_stays_quiet_in_another() {
    let alerts: BTreeSet<String> = rules().into_iter().filter_map(|(_, a, _)| a).collect();
    assert!(alerts.len() >= 10, "{alerts:?}");
    let (mut fired, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for file in test_files() {
        let doc = yaml(&file);
        for test in doc["tests"].as_sequence().expect("tests") {
            for case in test["alert_rule_test"].as_sequence().into_iter().flatten() {
                let name = case["alertname"].as_str().expect("alertname").to_owned();
                let expected = case["exp_alerts"].as_sequence().map_or(0, Vec::len);
                if expected > 0 {
                    // An expectation without its annotations would not check the first response.
                    for a in case["exp_alerts"].as_sequence().into_iter().flatten() {
                        let ann = &a["exp_annotations"];
                        for key in ["summary", "first_response"] {
                            assert!(ann[key].as_str().is_some(), "{name}: no {key} expected");
                        }
                    }
                    fired.insert(name);
                } else {
                    quiet.insert(name);
                }
            }
        }
    }
    let never_fired: Vec<_> = alerts.difference(&fired).collect();
    let never_quiet: Vec<_> = alerts.difference(&quiet).collect();
    assert!(
        never_fired.is_empty(),
        "alerts no unit test fires: {never_fired:?}"
    );
    assert!(
        never_quiet.is_empty(),
        "alerts no unit test keeps quiet: {never_quiet:?}"
    );
}

#[tokio::test]
async fn the_dashboard_has_the_four_rows_and_promql_that_promtool_parses() {
    let d = dashboard();
    let rows: Vec<&str> = d["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .filter(|p| p["type"] == "row")
        .map(|p| p["title"].as_str().expect("a row has a title"))
        .collect();
    assert_eq!(rows, ["User impact", "Generation", "Engine", "Infrastructure"]);
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .map(|v| v["name"].as_str().expect("a variable has a name"))
        .collect();
    for v in ["model", "route", "class"] {
        assert!(vars.contains(&v), "no ${v} variable: {vars:?}");
    }
    // Grafana places panels by gridPos: unique ids, inside the 24 columns, no two overlapping.
    let panels = d["panels"].as_array().expect("panels");
    let cells: Vec<(u64, [u64; 4])> = panels
        .iter()
        .map(|p| {
            let g = &p["gridPos"];
            let n = |k: &str| g[k].as_u64().unwrap_or_else(|| panic!("gridPos.{k} of {p}"));
            (p["id"].as_u64().expect("an id"), [n("x"), n("y"), n("w"), n("h")])
        })
        .collect();
    for (i, (id, [x, y, w, h])) in cells.iter().enumerate() {
        assert!(x + w <= 24, "panel {id} is wider than the grid");
        for (other, [x2, y2, w2, h2]) in &cells[i + 1..] {
            assert_ne!(id, other, "two panels with id {id}");
            let apart = x + w <= *x2 || x2 + w2 <= *x || y + h <= *y2 || y2 + h2 <= *y;
            assert!(apart, "panels {id} and {other} overlap");
        }
    }
    for p in panels.iter().filter(|p| p["type"] != "row") {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
    }
    let queries = dashboard_queries(&d);
    assert!(queries.len() > 30, "{} queries", queries.len());
    // promtool parses PromQL only inside rule files: each query becomes a recording rule.
    let mut file = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, q) in queries.iter().enumerate() {
        let q = serde_json::to_string(&grafana_to_promql(q)).expect("a string");
        file.push_str(&format!(
            "      - record: dashboard_query_{i}\n        expr: {q}\n"
        ));
    }
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("dashboard.yml");
    std::fs::write(&path, file).expect("written");
    promtool(dir.path(), &["check", "rules"], &[path]).await;
}

#[test]
fn series_names_are_found_and_labels_functions_and_variables_are_not() {
    let q = r#"histogram_quantile(0.95, sum by (le, class) (rate(spillway_x_bucket{route=~"$route",a="b}"}[$__rate_interval]))) / on (route) group_left (team) vllm:y offset 5m > bool 1e3 and DCGM_Z"#;
    let found: Vec<String> = series_names(q).into_iter().collect();
    assert_eq!(found, ["DCGM_Z", "spillway_x_bucket", "vllm:y"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_the_dashboard_and_rules_name_is_exposed() {
    let mut config = tiny();
    config.dcgm = true;
    let stack = Stack::start(vec![engine(config).await], ROUTE).await;
    for _ in 0..3 {
        assert!(read_stream(stack.stream("chat", 5).await).await.2);
    }
    // A refusal and a client that leaves mid-stream, so their counters have series.
    assert_eq!(stack.stream("no-such-model", 5).await.status(), 404);
    let mut r = stack.stream("chat", 3000).await;
    for _ in 0..3 {
        r.chunk().await.expect("a chunk");
    }
    drop(r);
    let gateway = testkit::poll(
        Duration::from_secs(10),
        || stack.metrics(),
        |m| m.contains("spillway_wasted_tokens_total{"),
    )
    .await;
    let engine_text = http()
        .get(format!("{}/metrics", stack.engines[0].url()))
        .send()
        .await
        .expect("the engine answers")
        .text()
        .await
        .expect("a body");

    let mut known = exposed(&gateway);
    known.extend(exposed(&engine_text));
    let rules = rules();
    known.extend(rules.iter().filter_map(|(record, _, _)| record.clone()));

    let mut used: Vec<(String, String)> = Vec::new();
    for (record, alert, expr) in &rules {
        let owner = record.clone().or(alert.clone()).unwrap_or_default();
        used.extend(
            series_names(expr)
                .into_iter()
                .map(|n| (n, format!("rule {owner}"))),
        );
    }
    for q in dashboard_queries(&dashboard()) {
        used.extend(
            series_names(&q)
                .into_iter()
                .map(|n| (n, format!("dashboard: {q}"))),
        );
    }
    let names: BTreeSet<&str> = used.iter().map(|(n, _)| n.as_str()).collect();
    println!("{} names used, {} exposed or recorded", names.len(), known.len());
    for family in ["spillway_", "vllm:", "DCGM_"] {
        assert!(
            names.iter().any(|n| n.starts_with(family)),
            "nothing uses {family}*"
        );
    }
    let missing: Vec<String> = used
        .iter()
        .filter(|(n, _)| !known.contains(n))
        .map(|(n, w)| format!("{n} (in {w})"))
        .collect();
    assert!(
        missing.is_empty(),
        "series neither the gateway nor the engine exposes:\n{}\n\ngateway:\n{gateway}\nengine:\n{engine_text}",
        missing.join("\n")
    );
}

/// A child process killed when the test ends, however it ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn prom_query(api: &str, q: &str) -> Vec<Json> {
    let v: Json = match http()
        .get(format!("{api}/query"))
        .query(&[("query", q)])
        .send()
        .await
    {
        Ok(r) => r.json().await.unwrap_or_default(),
        Err(_) => return Vec::new(),
    };
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

fn value(sample: &Json) -> f64 {
    sample["value"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::NAN)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_evaluates_every_rule_without_error_and_a_healthy_stack_raises_no_alert() {
    let prometheus = testkit::tool("prometheus");
    let mut config = tiny();
    config.dcgm = true;
    let stack = Stack::start(vec![engine(config).await], ROUTE).await;
    let dir = tempfile::tempdir().expect("a temp dir");
    let files: Vec<String> = rule_files()
        .iter()
        .map(|p| format!("'{}'", p.display()))
        .collect();
    let gateway_target = stack.url.trim_start_matches("http://").to_owned();
    let engine_target = stack.engines[0].addr.to_string();
    let file = dir.path().join("prometheus.yml");
    std::fs::write(
        &file,
        format!(
            "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\nrule_files: [{}]\nscrape_configs:\n  - job_name: spillway\n    static_configs: [{{ targets: ['{gateway_target}'] }}]\n  - job_name: engine\n    static_configs: [{{ targets: ['{engine_target}'] }}]\n",
            files.join(", ")
        ),
    )
    .expect("written");
    // Prometheus takes no listener from us: a port the OS just handed out is the best there is.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let _server = Child(
        std::process::Command::new(prometheus)
            .arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("prometheus starts"),
    );
    let api = format!("http://127.0.0.1:{port}/api/v1");

    // Steady, healthy traffic until the recorded rates of both layers have values.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let wanted = [
        "route_class:spillway_requests:rate5m",
        "route_class:spillway_goodput_ratio:rate5m",
        "route_class:spillway_saturation_signals:sum",
        "model:vllm_generation_tokens:rate5m",
    ];
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no recorded values within 60 s"
        );
        assert!(read_stream(stack.stream("chat", 5).await).await.2);
        let mut all = true;
        for name in wanted {
            all &= !prom_query(&api, name).await.is_empty();
        }
        if all {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let v: Json = http()
        .get(format!("{api}/rules"))
        .send()
        .await
        .expect("prometheus answers")
        .json()
        .await
        .expect("JSON");
    let groups = v["data"]["groups"].as_array().expect("rule groups");
    let mut evaluated = 0;
    for g in groups {
        for r in g["rules"].as_array().expect("rules") {
            let name = r["name"].as_str().unwrap_or_default();
            assert_eq!(r["health"], "ok", "{name}: {}", r["lastError"]);
            evaluated += 1;
        }
    }
    assert_eq!(evaluated, rules().len(), "every rule loaded");

    let requests = prom_query(&api, "route_class:spillway_requests:rate5m{route=\"chat\"}").await;
    assert!(value(&requests[0]) > 0.0, "{requests:?}");
    let goodput = prom_query(&api, "route_class:spillway_goodput_ratio:rate5m").await;
    assert_eq!(value(&goodput[0]), 1.0, "every request met the SLO: {goodput:?}");
    let signals = prom_query(&api, "route_class:spillway_saturation_signals:sum").await;
    assert_eq!(
        value(&signals[0]),
        0.0,
        "healthy: no saturation signal: {signals:?}"
    );
    let tokens = prom_query(&api, "model:vllm_generation_tokens:rate5m").await;
    assert!(value(&tokens[0]) > 0.0, "{tokens:?}");
    let alerts = prom_query(&api, "ALERTS").await;
    assert!(alerts.is_empty(), "a healthy stack raises no alert: {alerts:?}");
}
