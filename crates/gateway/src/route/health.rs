//! Active health checks: each replica's health path probed on an interval; a streak of failures
//! takes it out of the route and a streak of passes brings it back.

use super::Route;
use super::replica::Observation;
use bytes::Bytes;
use http_body_util::Full;
use std::sync::Arc;

impl Route {
    /// Probes every replica's health path forever (until the task is dropped).
    pub(crate) async fn probe_health(self: Arc<Self>) {
        let h = self.config.health.clone();
        let mut streaks = vec![(0u32, 0u32); self.replicas.len()];
        let mut tick = tokio::time::interval(h.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let probes = self.replicas.iter().map(|r| {
                let uri = format!("{}{}", r.url, h.path);
                let client = self.client.clone();
                async move {
                    let Ok(req) = hyper::Request::get(uri).body(Full::new(Bytes::new())) else {
                        return false;
                    };
                    matches!(
                        tokio::time::timeout(h.timeout, client.request(req)).await,
                        Ok(Ok(resp)) if resp.status().is_success()
                    )
                }
            });
            let results = futures::future::join_all(probes).await;
            for (i, ok) in results.into_iter().enumerate() {
                let (good, bad) = &mut streaks[i];
                if ok {
                    *good += 1;
                    *bad = 0;
                } else {
                    *bad += 1;
                    *good = 0;
                }
                let r = &self.replicas[i];
                let healthy = r.is_healthy();
                if healthy && *bad >= h.unhealthy_after.get() {
                    self.observe(r, Observation::Health(false));
                    tracing::warn!(route = %self.config.model, replica = %r.url, "replica unhealthy: failed {} health checks", *bad);
                } else if !healthy && *good >= h.healthy_after.get() {
                    self.observe(r, Observation::Health(true));
                    tracing::info!(route = %self.config.model, replica = %r.url, "replica healthy again");
                }
            }
        }
    }
}
