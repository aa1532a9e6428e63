//! Active health checks: each replica's health path probed on an interval; a streak of failures
//! takes it out of the route and a streak of passes brings it back. A replica that passes while
//! its context length is unknown is asked for it (`/v1/models`).

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
            let unknown = self
                .replicas
                .iter()
                .zip(&results)
                .filter(|(r, ok)| **ok && r.max_model_len().is_none())
                .map(|(r, _)| self.read_max_model_len(r));
            futures::future::join_all(unknown).await;
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
                    r.set_max_model_len(None);
                    tracing::warn!(route = %self.config.model, replica = %r.url, "replica unhealthy: failed {} health checks", *bad);
                } else if !healthy && *good >= h.healthy_after.get() {
                    self.observe(r, Observation::Health(true));
                    tracing::info!(route = %self.config.model, replica = %r.url, "replica healthy again");
                }
            }
        }
    }

    /// Reads `replica`'s `max_model_len` for the route's upstream model from its `/v1/models`
    /// (the only card's, where it names the model otherwise), within the health timeout.
    async fn read_max_model_len(&self, replica: &super::replica::Replica) {
        let model = self
            .config
            .upstream_model
            .as_deref()
            .unwrap_or(&self.config.model);
        let uri = format!("{}/v1/models", replica.url);
        let read = async {
            let req = hyper::Request::get(uri).body(Full::new(Bytes::new())).ok()?;
            let resp = self.client.request(req).await.ok()?;
            if !resp.status().is_success() {
                return None;
            }
            let body =
                http_body_util::BodyExt::collect(http_body_util::Limited::new(resp.into_body(), 1 << 20))
                    .await
                    .ok()?
                    .to_bytes();
            max_model_len(&body, model)
        };
        if let Ok(Some(len)) = tokio::time::timeout(self.config.health.timeout, read).await {
            replica.set_max_model_len(Some(len));
        }
    }
}

/// `max_model_len` of `model`'s card in a `/v1/models` list, or of the only card there.
pub(crate) fn max_model_len(body: &[u8], model: &str) -> Option<u32> {
    let list: serde_json::Value = serde_json::from_slice(body).ok()?;
    let cards = list.get("data")?.as_array()?;
    let card = match cards
        .iter()
        .find(|c| c.get("id").and_then(|i| i.as_str()) == Some(model))
    {
        Some(c) => c,
        None if cards.len() == 1 => &cards[0],
        None => return None,
    };
    u32::try_from(card.get("max_model_len")?.as_u64()?)
        .ok()
        .filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_is_the_models_card_or_the_only_one() {
        let two =
            br#"{"object":"list","data":[{"id":"a","max_model_len":4096},{"id":"b","max_model_len":2048}]}"#;
        assert_eq!(max_model_len(two, "b"), Some(2048));
        assert_eq!(max_model_len(two, "c"), None);
        let one = br#"{"data":[{"id":"/models/tiny","max_model_len":2048}]}"#;
        assert_eq!(max_model_len(one, "tiny"), Some(2048));
        assert_eq!(max_model_len(br#"{"data":[{"id":"a"}]}"#, "a"), None);
        assert_eq!(max_model_len(b"not json", "a"), None);
    }
}
