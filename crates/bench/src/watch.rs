//! What the bench watches beside its own requests: the server's queue through `/metrics`, and its
//! own event loop's lateness, which would distort every timestamp it takes.

use crate::error::BenchError;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::spec::ser_secs;

/// One reading of the server's scheduler.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QueueSample {
    /// Since the start of the run.
    #[serde(serialize_with = "ser_secs")]
    pub at: Duration,
    /// Requests waiting: `vllm:num_requests_waiting` summed over engines, or a Spillway gateway's
    /// `spillway_queued` when no engine series is there.
    pub waiting: f64,
    pub running: Option<f64>,
}

fn queue_from(text: &str) -> Option<(f64, Option<f64>)> {
    let waiting = protocol::prom::sum(text, "vllm:num_requests_waiting");
    let running = protocol::prom::sum(text, "vllm:num_requests_running");
    match waiting {
        Some(w) => Some((w, running)),
        None => Some((
            protocol::prom::sum(text, "spillway_queued")?,
            protocol::prom::sum(text, "spillway_in_flight"),
        )),
    }
}

/// Polls `/metrics` URLs in the background and keeps every sample, summed over the URLs.
pub struct QueueWatch {
    samples: Arc<Mutex<Vec<QueueSample>>>,
    task: JoinHandle<()>,
}

impl QueueWatch {
    /// Checks each URL once (so a wrong one fails the run at the start), then polls them every
    /// `every` ± 20%, at random: a fixed period can alias with a closed loop's own rhythm and see
    /// the same moment of every cycle. A sample sums what every URL answered in that round (each
    /// replica's queue: one replica of several is not the service's); a round where one did not
    /// answer is skipped rather than read low.
    pub async fn start(
        urls: &[String],
        every: Duration,
        epoch: Instant,
        ca_cert: Option<&std::path::Path>,
    ) -> Result<QueueWatch, BenchError> {
        let client = HyperClient::builder(TokioExecutor::new()).build(crate::client::connector(ca_cert)?);
        let mut uris: Vec<hyper::Uri> = Vec::with_capacity(urls.len());
        for url in urls {
            let bad = |reason: String| BenchError::Metrics {
                url: url.to_owned(),
                reason,
            };
            if !url.contains("://") {
                return Err(bad(format!(
                    "the scheme is missing; write http://{url} (or https://)"
                )));
            }
            let uri: hyper::Uri = url.parse().map_err(|e| bad(format!("{e}")))?;
            let first = scrape(&client, &uri).await.map_err(bad)?;
            if queue_from(&first).is_none() {
                return Err(bad(
                    "no vllm:num_requests_waiting (nor spillway_queued) series there".into(),
                ));
            }
            // The same URL twice would count its queue twice.
            if !uris.contains(&uri) {
                uris.push(uri);
            }
        }
        let samples = Arc::new(Mutex::new(Vec::new()));
        let sink = samples.clone();
        let task = tokio::spawn(async move {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(0x5eed);
            'rounds: loop {
                tokio::time::sleep(every.mul_f64(rng.random_range(0.8..1.2))).await;
                // The round's moment is when it began: later scrapes wait on earlier ones.
                let at = epoch.elapsed();
                let (mut waiting, mut running) = (0.0, None::<f64>);
                for uri in &uris {
                    let Ok(text) = scrape(&client, uri).await else {
                        continue 'rounds;
                    };
                    let Some((w, r)) = queue_from(&text) else {
                        continue 'rounds;
                    };
                    waiting += w;
                    if let Some(r) = r {
                        *running.get_or_insert(0.0) += r;
                    }
                }
                let s = QueueSample { at, waiting, running };
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(s);
            }
        });
        Ok(QueueWatch { samples, task })
    }

    /// The samples taken between two offsets from the run's start.
    pub fn between(&self, from: Duration, to: Duration) -> Vec<QueueSample> {
        self.samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|s| s.at >= from && s.at <= to)
            .copied()
            .collect()
    }
}

impl Drop for QueueWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn scrape(
    client: &HyperClient<crate::client::Connector, Full<Bytes>>,
    uri: &hyper::Uri,
) -> Result<String, String> {
    let req = hyper::Request::get(uri.clone())
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(2), client.request(req))
        .await
        .map_err(|_| "no answer within 2s".to_string())?
        .map_err(|e| format!("cannot connect ({e})"))?;
    if !resp.status().is_success() {
        return Err(format!("answered {}", resp.status()));
    }
    let body = tokio::time::timeout(
        Duration::from_secs(2),
        Limited::new(resp.into_body(), 16 << 20).collect(),
    )
    .await
    .map_err(|_| "body not read within 2s".to_string())?
    .map_err(|e| e.to_string())?
    .to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// Whether a level's queue drained.
///
/// An engine that steps like vLLM always shows a few requests waiting for its next step, even far
/// from capacity, so "someone is waiting" is no sign of saturation. A queue counts as not draining
/// when it grows over the level (its last third above its first by more than 2 requests and 25%) or,
/// in a closed loop of C clients, when even its 25th percentile holds at least max(2, C/10)
/// requests: a backlog that persists, not arrivals waiting one step. The backlog rule needs at least
/// [`BACKLOG_SAMPLES`] samples: a closed loop's clients can fall into waves that all arrive at one
/// step, and a handful of samples that happen to meet those waves is no persistent backlog.
#[derive(Debug, Clone, Serialize)]
pub struct QueueSummary {
    pub samples: usize,
    pub waiting_mean: f64,
    pub waiting_max: f64,
    pub waiting_min: f64,
    pub waiting_p25: f64,
    pub drains: bool,
}

/// The fewest samples the backlog rule judges by (about 1.5 s of a level at 10 samples a second).
pub const BACKLOG_SAMPLES: usize = 10;

impl QueueSummary {
    /// `concurrency`: the closed loop's C (`None` for open loop, where only growth counts).
    pub fn of(samples: &[QueueSample], concurrency: Option<u32>) -> Option<QueueSummary> {
        if samples.len() < 3 {
            return None;
        }
        let w: Vec<f64> = samples.iter().map(|s| s.waiting).collect();
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        let third = w.len() / 3;
        let (first, last) = (mean(&w[..third.max(1)]), mean(&w[w.len() - third.max(1)..]));
        let growing = last > first + 2.0_f64.max(first * 0.25);
        let mut sorted = w.clone();
        sorted.sort_by(f64::total_cmp);
        let p25 = crate::stats::percentile(&sorted, 25.0).unwrap_or(0.0);
        let backlog =
            w.len() >= BACKLOG_SAMPLES && concurrency.is_some_and(|c| p25 >= (f64::from(c) / 10.0).max(2.0));
        Some(QueueSummary {
            samples: w.len(),
            waiting_mean: mean(&w),
            waiting_max: sorted[sorted.len() - 1],
            waiting_min: sorted[0],
            waiting_p25: p25,
            drains: !growing && !backlog,
        })
    }
}

/// Measures how long a ready task waits before this process's runtime polls it: every 5 ms a probe
/// yields to the scheduler and times its way back. A client whose runtime is that busy reads its
/// sockets that late too, and every timestamp it takes is late by as much.
pub struct LoopLag {
    lateness: Arc<Mutex<Vec<(Duration, Duration)>>>,
    task: JoinHandle<()>,
}

impl LoopLag {
    pub fn start(epoch: Instant) -> LoopLag {
        let lateness = Arc::new(Mutex::new(Vec::new()));
        let sink = lateness.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let before = Instant::now();
                tokio::task::yield_now().await;
                let late = before.elapsed();
                let mut v = sink.lock().unwrap_or_else(|e| e.into_inner());
                if v.len() < 4_000_000 {
                    v.push((epoch.elapsed(), late));
                }
            }
        });
        LoopLag { lateness, task }
    }

    /// Lateness samples (seconds) between two offsets from the run's start, sorted.
    pub fn between(&self, from: Duration, to: Duration) -> Vec<f64> {
        let mut v: Vec<f64> = self
            .lateness
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(at, _)| *at >= from && *at <= to)
            .map(|(_, l)| l.as_secs_f64())
            .collect();
        v.sort_by(f64::total_cmp);
        v
    }
}

impl Drop for LoopLag {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_summed_over_labels() {
        let text = "# HELP vllm:num_requests_waiting x\n# TYPE vllm:num_requests_waiting gauge\n\
            vllm:num_requests_waiting{engine=\"0\",model_name=\"a b\"} 3.0\n\
            vllm:num_requests_waiting{engine=\"1\",model_name=\"a b\"} 2 1700000000000\n\
            vllm:num_requests_waiting_total 99\n\
            vllm:num_requests_running{engine=\"0\"} 16\n";
        assert_eq!(queue_from(text), Some((5.0, Some(16.0))));
        assert_eq!(
            queue_from("spillway_queued{route=\"m\",class=\"c\"} 4\n"),
            Some((4.0, None))
        );
        assert_eq!(queue_from("up 1\n"), None);
    }

    fn at(waiting: &[f64]) -> Vec<QueueSample> {
        waiting
            .iter()
            .enumerate()
            .map(|(i, w)| QueueSample {
                at: Duration::from_millis(i as u64 * 100),
                waiting: *w,
                running: None,
            })
            .collect()
    }

    #[test]
    fn a_queue_drains_unless_it_grows_or_holds_a_backlog() {
        let drains = |w: &[f64], c| QueueSummary::of(&at(w), c).unwrap().drains;
        assert!(drains(&[0.0, 2.0, 0.0, 1.0, 0.0, 0.0], Some(8)));
        assert!(
            drains(&[1.0, 1.0, 2.0, 1.0, 1.0, 1.0], Some(8)),
            "arrivals waiting one step"
        );
        let backlog = [16.0, 15.0, 0.0, 16.0, 17.0, 16.0, 15.0, 16.0, 16.0, 17.0];
        assert!(!drains(&backlog, Some(32)), "a backlog of C/2");
        assert!(
            drains(&backlog[..6], Some(32)),
            "six samples are too few to call a backlog"
        );
        assert!(
            drains(&[16.0, 15.0, 0.0, 16.0, 17.0, 16.0], None),
            "open loop: only growth counts"
        );
        assert!(!drains(&[0.0, 2.0, 5.0, 9.0, 14.0, 20.0], None), "growing");
        assert!(QueueSummary::of(&at(&[0.0]), None).is_none());
    }
}
