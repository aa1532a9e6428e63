//! The edge: scrape `/metrics` endpoints, or ask Prometheus for the same series at two moments.

use crate::Error;
use crate::catalog;
use crate::window::Snapshot;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch, the clock snapshots and Kubernetes timestamps share.
pub fn now_epoch() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `host:port` of a URL, the `instance` label Prometheus would give the target.
pub fn instance_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

/// The URL to GET: `/metrics` unless the URL names a path.
pub fn metrics_url(url: &str) -> String {
    let with_scheme = if url.contains("://") {
        url.to_owned()
    } else {
        format!("http://{url}")
    };
    let after = with_scheme.split_once("://").map_or("", |(_, r)| r);
    if after.trim_end_matches('/').contains('/') {
        with_scheme
    } else {
        format!("{}/metrics", with_scheme.trim_end_matches('/'))
    }
}

pub fn client(timeout: Duration) -> Result<reqwest::Client, Error> {
    reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .map_err(|e| Error::Fetch {
            url: String::new(),
            message: e.to_string(),
        })
}

/// Scrapes every target once. A target that does not answer is `up 0` in the snapshot and its
/// error is returned beside it; the verdict then says what it could not see.
pub async fn scrape(client: &reqwest::Client, targets: &[String]) -> (Snapshot, Vec<Error>) {
    let mut set = tokio::task::JoinSet::new();
    for (i, target) in targets.iter().enumerate() {
        let client = client.clone();
        let url = metrics_url(target);
        set.spawn(async move {
            let got = async {
                let resp = client.get(&url).send().await?.error_for_status()?;
                resp.text().await
            }
            .await;
            (i, url, got)
        });
    }
    let mut results = Vec::with_capacity(targets.len());
    while let Some(joined) = set.join_next().await {
        if let Ok(r) = joined {
            results.push(r);
        }
    }
    results.sort_by_key(|(i, _, _)| *i);
    let mut snap = Snapshot::new(now_epoch());
    let mut errors = Vec::new();
    for (i, url, got) in results {
        let instance = instance_of(&targets[i]);
        match got {
            Ok(text) => snap.add_exposition(&instance, &text),
            Err(e) => {
                snap.add_down(&instance);
                errors.push(Error::Fetch {
                    url,
                    message: e.to_string(),
                });
            }
        }
    }
    (snap, errors)
}

/// Two scrapes `interval` apart: the window's start and end.
pub async fn scrape_window(
    client: &reqwest::Client,
    targets: &[String],
    interval: Duration,
) -> (Snapshot, Snapshot, Vec<Error>) {
    let (start, _) = scrape(client, targets).await;
    tokio::time::sleep(interval).await;
    let (end, errors) = scrape(client, targets).await;
    (start, end, errors)
}

/// The catalogue's series as Prometheus holds them at `at` (epoch seconds), narrowed by
/// `selector` (PromQL label matchers such as `namespace="llm"`).
pub async fn prometheus_at(
    client: &reqwest::Client,
    base: &str,
    selector: &str,
    at: f64,
) -> Result<Snapshot, Error> {
    let base = base.trim_end_matches('/');
    let url = format!("{base}/api/v1/query");
    let matchers = if selector.trim().is_empty() {
        String::new()
    } else {
        format!(",{selector}")
    };
    let query = format!("{{__name__=~\"{}\"{matchers}}}", catalog::name_regex());
    let err = |message: String| Error::Prometheus {
        url: base.to_owned(),
        message,
    };
    let resp = client
        .get(&url)
        .query(&[("query", query.as_str()), ("time", &format!("{at:.3}"))])
        .send()
        .await
        .map_err(|e| err(e.to_string()))?;
    let status = resp.status();
    let body: serde_json::Value = resp.json().await.map_err(|e| err(e.to_string()))?;
    if !status.is_success() || body["status"] != "success" {
        return Err(err(format!(
            "{status}: {}",
            body["error"].as_str().unwrap_or("query failed")
        )));
    }
    let mut snap = Snapshot::new(at);
    for item in body["data"]["result"].as_array().into_iter().flatten() {
        let Some(metric) = item["metric"].as_object() else {
            continue;
        };
        let Some(name) = metric.get("__name__").and_then(|v| v.as_str()) else {
            continue;
        };
        let value = item["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN);
        let labels = metric
            .iter()
            .filter(|(k, _)| k.as_str() != "__name__")
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
            .collect();
        snap.push(name, labels, value);
    }
    Ok(snap)
}

/// The window `[now - window, now]` from Prometheus: the same raw series at both ends, so the
/// verdict is computed exactly as from two scrapes.
pub async fn prometheus_window(
    client: &reqwest::Client,
    base: &str,
    selector: &str,
    window: Duration,
) -> Result<(Snapshot, Snapshot), Error> {
    let end = now_epoch();
    let start = end - window.as_secs_f64();
    let s = prometheus_at(client, base, selector, start).await?;
    let e = prometheus_at(client, base, selector, end).await?;
    Ok((s, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_instances() {
        assert_eq!(metrics_url("127.0.0.1:8000"), "http://127.0.0.1:8000/metrics");
        assert_eq!(metrics_url("http://h:1/"), "http://h:1/metrics");
        assert_eq!(metrics_url("http://h:1/custom"), "http://h:1/custom");
        assert_eq!(instance_of("http://h:1/metrics"), "h:1");
        assert_eq!(instance_of("h:1"), "h:1");
    }
}
