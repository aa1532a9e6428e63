//! Saved windows replayed into a real Prometheus: each target of a window served as one endpoint
//! that answers the window's first scrape, then its second, while Prometheus scrapes them; the
//! verdict read back through `--prometheus`'s queries must be the one the saved pair gives.

use super::{Window, load};
use crate::prometheus::{prometheus, scraped_after};
use spillway_diagnose::{Cluster, Snapshot, Verdict, diagnose, source};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One target's exposition at one end of a window, as it served it (without `instance`, which
/// Prometheus adds, and without `up`, which it records itself).
fn exposition(snap: &Snapshot, instance: &str) -> String {
    let mut out = String::new();
    for s in &snap.series {
        if s.name == "up" || s.label("instance") != Some(instance) {
            continue;
        }
        let labels: Vec<String> = s
            .labels
            .iter()
            .filter(|(k, _)| k != "instance")
            .map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"")))
            .collect();
        out.push_str(&format!("{}{{{}}} {}\n", s.name, labels.join(","), s.value));
    }
    out
}

/// An endpoint whose answer can be changed between scrapes; its URL.
async fn switchable(text: Arc<Mutex<String>>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let text = text.lock().unwrap().clone();
            tokio::spawn(async move {
                let mut head = [0u8; 4096];
                let _ = conn.read(&mut head).await;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                    text.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    url
}

fn first(v: &Verdict) -> Option<spillway_diagnose::Suspect> {
    v.findings.first().map(|f| f.suspect)
}

/// Windows of the engine-only scenarios (the gateway's join its replicas to the engines by
/// `host:port`, which a replay on other ports would not keep), one of each.
const REPLAYED: &[(&str, &str)] = &[
    ("flood-00", "onset"),
    ("backlog-00", "onset"),
    ("kv_few_long-01", "settled"),
    ("hung_replica-01", "onset"),
    ("gpu_fault-00", "mid"),
    ("long_prompts-00", "mid"),
    ("long_outputs-00", "before"),
    // From a real vLLM: its own label set (engine, model_name "tiny") and cache_config_info.
    ("vllm_hung-00", "onset"),
    ("vllm_kv_pressure-01", "mid"),
];

/// Endpoints for the most targets a replayed window has (three engines and their DCGM); one
/// Prometheus scrapes them all, those a window does not use answering nothing.
const ENDPOINTS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saved_windows_replayed_through_prometheus_are_judged_the_same() {
    let windows: Vec<Window> = load()
        .into_iter()
        .filter(|w| REPLAYED.contains(&(w.run.as_str(), w.phase.as_str())))
        .collect();
    assert_eq!(windows.len(), REPLAYED.len());
    let mut served = Vec::new();
    let mut urls = Vec::new();
    for _ in 0..ENDPOINTS {
        let text = Arc::new(Mutex::new(String::new()));
        urls.push(switchable(text.clone()).await);
        served.push(text);
    }
    let Some(p) = prometheus(&urls).await else {
        println!("skipped: the prometheus binary is not installed (scripts/test.sh installs it)");
        return;
    };
    let c = source::client(Duration::from_secs(5)).unwrap();
    let serve = |snap: &Snapshot| {
        let instances: BTreeSet<&str> = snap.up_instances().into_iter().collect();
        assert!(instances.len() <= ENDPOINTS);
        for (k, text) in served.iter().enumerate() {
            *text.lock().unwrap() = instances
                .iter()
                .nth(k)
                .map_or_else(String::new, |i| exposition(snap, i));
        }
    };
    for w in windows {
        serve(&w.start);
        // The first end: scraped by every target after it was served, then read at that moment.
        scraped_after(&c, &p.url, source::now_epoch()).await;
        let t_a = source::now_epoch();
        serve(&w.end);
        // The window's own length, so that rates are the saved window's.
        let t_b = t_a + (w.end.at - w.start.at);
        let wait = (t_b - source::now_epoch()).max(0.0);
        tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        scraped_after(&c, &p.url, t_a + 0.05).await;
        let a = source::prometheus_at(&c, &p.url, "", t_a).await.unwrap();
        let b = source::prometheus_at(&c, &p.url, "", t_b).await.unwrap();
        let direct = diagnose(&w.start, &w.end, &w.thresholds, &Cluster::default());
        let through = diagnose(&a, &b, &w.thresholds, &Cluster::default());
        println!(
            "| {} {} | {:?} {:?} | {:?} {:?} |",
            w.run,
            w.phase,
            direct.status,
            first(&direct),
            through.status,
            first(&through)
        );
        assert_eq!(direct.status, through.status, "{} {}", w.run, w.phase);
        assert_eq!(first(&direct), first(&through), "{} {}", w.run, w.phase);
    }
}
