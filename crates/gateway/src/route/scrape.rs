//! Reading each replica's own `/metrics` (vLLM's waiting queue and KV-cache usage) for the
//! engine-aware balancer.

use super::Route;
use super::replica::Observation;
use bytes::Bytes;
use http_body_util::Full;
use std::sync::Arc;
use std::time::Duration;

/// `vllm:num_requests_waiting` (summed over engines), `vllm:num_requests_running` (summed; 0 if
/// absent) and `vllm:kv_cache_usage_perc` (the highest) from a Prometheus text exposition; `None`
/// if the waiting count is missing.
pub(crate) fn parse_engine_load(text: &str) -> Option<(f64, f64, f64)> {
    let waiting = protocol::prom::sum(text, "vllm:num_requests_waiting")?;
    let running = protocol::prom::sum(text, "vllm:num_requests_running").unwrap_or(0.0);
    let kv = ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]
        .into_iter()
        .filter_map(|name| protocol::prom::max(text, name))
        .fold(0.0, f64::max);
    Some((waiting, running, kv))
}

impl Route {
    /// Reads each replica's `/metrics` about once a second for the engine-aware balancer.
    pub(crate) async fn scrape_engines(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let scrapes = self.replicas.iter().map(|r| {
                let client = self.client.clone();
                let uri = format!("{}/metrics", r.url);
                async move {
                    let req = hyper::Request::get(uri).body(Full::new(Bytes::new())).ok()?;
                    let resp = tokio::time::timeout(Duration::from_millis(800), client.request(req))
                        .await
                        .ok()?
                        .ok()?;
                    if !resp.status().is_success() {
                        return None;
                    }
                    let body = tokio::time::timeout(
                        Duration::from_millis(800),
                        http_body_util::BodyExt::collect(http_body_util::Limited::new(
                            resp.into_body(),
                            4 << 20,
                        )),
                    )
                    .await
                    .ok()?
                    .ok()?
                    .to_bytes();
                    parse_engine_load(&String::from_utf8_lossy(&body))
                }
            });
            let results = futures::future::join_all(scrapes).await;
            for (r, load) in self.replicas.iter().zip(results) {
                if let Some((waiting, running, kv)) = load {
                    self.observe(r, Observation::EngineLoad { waiting, running, kv });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_load_reads_current_and_old_names() {
        let text = "vllm:num_requests_waiting{engine=\"0\"} 3\nvllm:num_requests_waiting{engine=\"1\"} 2\nvllm:gpu_cache_usage_perc 0.5\n";
        assert_eq!(parse_engine_load(text), Some((5.0, 0.0, 0.5)));
        assert_eq!(parse_engine_load("vllm:kv_cache_usage_perc 0.2\n"), None);
    }
}
