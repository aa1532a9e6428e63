//! The same situations through a real Prometheus server scraping the engine, its DCGM listener
//! and the gateway: the verdict must not depend on the path the samples took.

use crate::support::{WARM_UP, busy_but_healthy, dcgm, gateway, open, tiny, verdict};
use spillway_diagnose::{Status, Suspect, Verdict, source};
use std::process::Stdio;
use std::time::Duration;

pub(crate) struct Prometheus {
    pub(crate) url: String,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Prometheus scraping `targets` every 250 ms, ready once every target is up; `None` (with the
/// reason printed) when the binary is not installed.
pub(crate) async fn prometheus(targets: &[String]) -> Option<Prometheus> {
    let found = std::process::Command::new("sh")
        .args(["-c", "command -v prometheus"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let bin = String::from_utf8_lossy(&found.stdout).trim().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let list: Vec<String> = targets
        .iter()
        .map(|t| format!("'{}'", source::instance_of(t)))
        .collect();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 250ms\n  scrape_timeout: 200ms\nscrape_configs:\n  - job_name: llm\n    static_configs:\n      - targets: [{}]\n",
            list.join(", ")
        ),
    )
    .unwrap();
    // Prometheus binds its own port: take a free one and hand it over (as the engine's test does).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = std::process::Command::new(bin)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let p = Prometheus {
        url: format!("http://127.0.0.1:{port}"),
        child,
        _dir: dir,
    };
    let c = source::client(Duration::from_secs(2)).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "Prometheus never scraped every target"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Ok(r) = c.get(format!("{}/api/v1/targets", p.url)).send().await else {
            continue;
        };
        let v: serde_json::Value = r.json().await.unwrap_or_default();
        let active = v["data"]["activeTargets"].as_array().cloned().unwrap_or_default();
        if active.len() == targets.len() && active.iter().all(|t| t["health"] == "up") {
            return Some(p);
        }
    }
}

/// Waits until Prometheus at `base` has scraped every target after `at` (seconds since the epoch):
/// the oldest of the targets' last scrapes, `min(timestamp(up))`, is later.
pub(crate) async fn scraped_after(c: &reqwest::Client, base: &str, at: f64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let oldest = async {
            let v: serde_json::Value = c
                .get(format!("{base}/api/v1/query"))
                .query(&[("query", "min(timestamp(up))")])
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            v["data"]["result"][0]["value"][1].as_str()?.parse::<f64>().ok()
        };
        let oldest = oldest.await;
        if oldest.is_some_and(|t| t > at) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "Prometheus did not scrape every target after {at} (oldest last scrape {oldest:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Diagnoses one window twice: from two direct scrapes, and from Prometheus at the same moments.
async fn both_ways(targets: &[String]) -> Option<(Verdict, Verdict)> {
    let Some(p) = prometheus(targets).await else {
        println!("skipped: the prometheus binary is not installed (scripts/test.sh installs it)");
        return None;
    };
    // Load for longer than the simulated DCGM's one-second activity window (see WARM_UP).
    tokio::time::sleep(WARM_UP).await;
    let c = source::client(Duration::from_secs(5)).unwrap();
    let (start, end, errors) = source::scrape_window(&c, targets, Duration::from_secs(2)).await;
    assert!(errors.is_empty(), "{errors:?}");
    // Prometheus has every sample up to the window's end once it has scraped every target after it.
    scraped_after(&c, &p.url, end.at).await;
    let from_prom_start = source::prometheus_at(&c, &p.url, "", start.at).await.unwrap();
    let from_prom_end = source::prometheus_at(&c, &p.url, "", end.at).await.unwrap();
    println!("== scraped directly");
    let direct = verdict(&start, &end);
    println!("== through Prometheus");
    let through = verdict(&from_prom_start, &from_prom_end);
    Some((direct, through))
}

fn suspects(v: &Verdict) -> Vec<Suspect> {
    v.findings.iter().map(|f| f.suspect).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arrivals_above_throughput_through_prometheus() {
    let mut cfg = tiny();
    cfg.max_num_seqs = 2;
    let e = crate::support::engine(cfg).await;
    let d = dcgm(&[&e]).await;
    let g = gateway(
        &[&e],
        "{ connect: 1s, first_token: 30s, stream_idle: 30s, total: 60s }",
        "{ name: interactive, concurrency: 256, queue: 16, queue_wait: 1s }",
    )
    .await;
    let _load = open(&g.url, 120.0, 16, 32);
    let targets = [g.url.clone(), e.url(), d.url.clone()];
    let Some((direct, through)) = both_ways(&targets).await else {
        return;
    };
    assert_eq!(
        direct.findings.first().map(|f| f.suspect),
        Some(Suspect::ArrivalsExceedThroughput)
    );
    assert_eq!(
        through.findings.first().map(|f| f.suspect),
        Some(Suspect::ArrivalsExceedThroughput)
    );
    assert_eq!(direct.status, through.status);
    assert_eq!(direct.saturation.declared, through.saturation.declared);
    assert!(
        through.discovery.iter().filter(|f| f.name.is_some()).count() >= 30,
        "every layer found"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_but_healthy_through_prometheus() {
    let busy = busy_but_healthy().await;
    let Some((direct, through)) = both_ways(&busy.targets()).await else {
        return;
    };
    assert_eq!(suspects(&direct), []);
    assert_eq!(suspects(&through), []);
    assert_eq!(direct.status, Status::BusyButHealthy);
    assert_eq!(through.status, Status::BusyButHealthy);
}
