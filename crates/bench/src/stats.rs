//! Statistics over a level's records: exact percentiles (no histogram rounding), throughput,
//! goodput and the SLO verdicts.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::request::Record;
use crate::spec::{Metric, Slo};

pub use bench_schema::stats::{Percentiles, percentile};

/// One SLO target against what a level measured.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// `ttft_p95<=1s`
    pub target: String,
    /// Seconds, or a share for the error rate; `None` when nothing was measured.
    pub observed: Option<f64>,
    pub limit: f64,
    pub pass: bool,
}

/// Everything a level is judged and charted by.
#[derive(Debug, Clone, Serialize)]
pub struct LevelStats {
    pub requests: usize,
    pub ok: usize,
    /// Failures by kind: `http_429`, `http_503`, `http_504`, `http_4xx`, `http_5xx`, `transport`,
    /// `timeout`, `stream_error`, `truncated`.
    pub errors: BTreeMap<&'static str, usize>,
    pub error_rate: f64,
    /// From the first scheduled send to the last answer, seconds.
    pub wall_seconds: f64,
    pub throughput_rps: f64,
    pub output_tokens_per_second: f64,
    /// Successful requests inside every latency SLO, per second.
    pub goodput_rps: f64,
    /// The same as a share of all requests.
    pub goodput_share: f64,
    pub ttft: Option<Percentiles>,
    pub itl: Option<Percentiles>,
    pub tpot: Option<Percentiles>,
    pub e2e: Option<Percentiles>,
    pub send_lag: Option<Percentiles>,
    /// TTFT split by the gateway's `Server-Timing`, over the successful requests that carried
    /// it: time in the gateway's queue, and the upstream's time to its first byte (absent when
    /// the server sent no `Server-Timing`). TTFT minus both is the gateway's own handling and
    /// the network.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway_queue: Option<Percentiles>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_first_byte: Option<Percentiles>,
    pub input_tokens_mean: Option<f64>,
    pub output_tokens_mean: Option<f64>,
    /// The prompt tokens asked for against the server's count of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<PromptTokens>,
    pub verdicts: Vec<Verdict>,
    /// Every target met.
    pub slo_pass: bool,
    /// Closed-loop clients that honoured `Retry-After` (`--honor-retry-after`) only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_waits: Option<RetryWaits>,
}

/// The waits of clients that honoured `Retry-After`: time between requests, in no latency, that
/// lowers the level's throughput as it would a real client's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RetryWaits {
    pub waits: usize,
    pub waited_seconds: f64,
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// The sorted values of one metric over the successful records.
pub fn values(records: &[&Record], metric: Metric) -> Vec<f64> {
    let ok = records.iter().filter(|r| r.ok());
    sorted(match metric {
        Metric::Ttft => ok.filter_map(|r| r.ttft).map(|d| d.as_secs_f64()).collect(),
        Metric::Itl => ok
            .flat_map(|r| r.itl_us.iter().map(|us| f64::from(*us) / 1e6))
            .collect(),
        Metric::Tpot => ok.filter_map(|r| r.tpot()).map(|d| d.as_secs_f64()).collect(),
        Metric::E2e => ok.map(|r| r.e2e.as_secs_f64()).collect(),
    })
}

/// Prompt tokens as the bench asked for them against the server's `usage.prompt_tokens`, summed
/// over the requests that had both: the server's tokenizer and chat template decide the real
/// length, which can be well above what the bench's words were meant to be.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PromptTokens {
    pub requests: usize,
    pub asked: u64,
    pub served: u64,
}

impl PromptTokens {
    pub fn of<'a>(records: impl IntoIterator<Item = &'a Record>) -> Option<PromptTokens> {
        let sum = records
            .into_iter()
            .filter_map(|r| Some((r.asked_input_tokens?, r.input_tokens?)))
            .fold(PromptTokens::default(), |t, (asked, served)| PromptTokens {
                requests: t.requests + 1,
                asked: t.asked + u64::from(asked),
                served: t.served + u64::from(served),
            });
        (sum.requests > 0).then_some(sum)
    }

    /// How many prompt tokens the server counts for each one asked, its chat template's own
    /// `overhead` tokens per request taken out first.
    pub fn ratio(&self, overhead: u32) -> Option<f64> {
        let served = self
            .served
            .saturating_sub(u64::from(overhead) * self.requests as u64);
        (self.asked > 0).then(|| served as f64 / self.asked as f64)
    }
}

impl std::ops::Add for PromptTokens {
    type Output = PromptTokens;

    fn add(self, other: PromptTokens) -> PromptTokens {
        PromptTokens {
            requests: self.requests + other.requests,
            asked: self.asked + other.asked,
            served: self.served + other.served,
        }
    }
}

/// Whether one request met every latency target, taken per request: its TTFT, its TPOT against the
/// ITL and TPOT limits, its end-to-end time. One whose first token was never seen (a stream of
/// deltas the client did not count) is inside nothing, whatever the targets.
pub fn within_slo(r: &Record, slo: &Slo) -> bool {
    let under = |v: Option<Duration>, limit: Option<Duration>| match (v, limit) {
        (_, None) => true,
        (Some(v), Some(l)) => v <= l,
        (None, Some(_)) => false,
    };
    let per_token = [slo.limit(Metric::Itl), slo.limit(Metric::Tpot)]
        .into_iter()
        .flatten()
        .min();
    r.ok()
        && r.ttft.is_some()
        && under(r.ttft, slo.limit(Metric::Ttft))
        && (per_token.is_none() || r.output_tokens < 2 || under(r.tpot(), per_token))
        && under(Some(r.e2e), slo.limit(Metric::E2e))
}

impl LevelStats {
    pub fn compute(records: &[&Record], wall: Duration, slo: &Slo) -> LevelStats {
        let requests = records.len();
        let ok = records.iter().filter(|r| r.ok()).count();
        let mut errors = BTreeMap::new();
        for r in records.iter().filter(|r| !r.ok()) {
            *errors.entry(r.outcome.kind()).or_insert(0) += 1;
        }
        let secs = wall.as_secs_f64().max(1e-9);
        let error_rate = if requests == 0 {
            0.0
        } else {
            (requests - ok) as f64 / requests as f64
        };
        let good = records.iter().filter(|r| within_slo(r, slo)).count();
        let out_tokens: u64 = records
            .iter()
            .filter(|r| r.ok())
            .map(|r| u64::from(r.output_tokens))
            .sum();
        let mean = |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        let series = [Metric::Ttft, Metric::Itl, Metric::Tpot, Metric::E2e].map(|m| values(records, m));
        let mut verdicts: Vec<Verdict> = slo
            .latency
            .iter()
            .map(|t| {
                let v = &series[t.metric as usize];
                let observed = percentile(v, t.percentile);
                let limit = t.limit.as_secs_f64();
                Verdict {
                    target: format!(
                        "{}_p{}<={}",
                        t.metric.name(),
                        t.percentile,
                        humantime::format_duration(t.limit)
                    ),
                    observed,
                    limit,
                    pass: observed.is_some_and(|o| o <= limit),
                }
            })
            .collect();
        if let Some(limit) = slo.error_rate {
            verdicts.push(Verdict {
                target: format!("error_rate<={}%", limit * 100.0),
                observed: Some(error_rate),
                limit,
                pass: requests > 0 && error_rate <= limit,
            });
        }
        let [ttft, itl, tpot, e2e] = series;
        LevelStats {
            requests,
            ok,
            errors,
            error_rate,
            wall_seconds: wall.as_secs_f64(),
            throughput_rps: ok as f64 / secs,
            output_tokens_per_second: out_tokens as f64 / secs,
            goodput_rps: good as f64 / secs,
            goodput_share: if requests == 0 {
                0.0
            } else {
                good as f64 / requests as f64
            },
            ttft: Percentiles::of(&ttft),
            itl: Percentiles::of(&itl),
            tpot: Percentiles::of(&tpot),
            e2e: Percentiles::of(&e2e),
            send_lag: Percentiles::of(&sorted(
                records.iter().map(|r| r.send_lag.as_secs_f64()).collect(),
            )),
            gateway_queue: Percentiles::of(&sorted(
                records
                    .iter()
                    .filter(|r| r.ok())
                    .filter_map(|r| r.gateway_queue)
                    .map(|d| d.as_secs_f64())
                    .collect(),
            )),
            upstream_first_byte: Percentiles::of(&sorted(
                records
                    .iter()
                    .filter(|r| r.ok())
                    .filter_map(|r| r.upstream_first_byte)
                    .map(|d| d.as_secs_f64())
                    .collect(),
            )),
            input_tokens_mean: mean(
                records
                    .iter()
                    .filter_map(|r| r.input_tokens)
                    .map(f64::from)
                    .collect(),
            ),
            output_tokens_mean: mean(
                records
                    .iter()
                    .filter(|r| r.ok())
                    .map(|r| f64::from(r.output_tokens))
                    .collect(),
            ),
            prompt_tokens: PromptTokens::of(records.iter().copied()),
            slo_pass: verdicts.iter().all(|v| v.pass),
            verdicts,
            retry_waits: {
                let waits: Vec<Duration> = records.iter().filter_map(|r| r.retry_wait).collect();
                (!waits.is_empty()).then(|| RetryWaits {
                    waits: waits.len(),
                    waited_seconds: waits.iter().map(Duration::as_secs_f64).sum(),
                })
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Outcome;

    fn rec(ttft_ms: u64, gaps_ms: &[u32], outcome: Outcome) -> Record {
        let ttft = Duration::from_millis(ttft_ms);
        let e2e = ttft + Duration::from_millis(gaps_ms.iter().map(|g| u64::from(*g)).sum());
        Record {
            scheduled: Duration::ZERO,
            send_lag: Duration::from_micros(50),
            ttft: (outcome == Outcome::Ok).then_some(ttft),
            e2e,
            itl_us: gaps_ms.iter().map(|g| g * 1000).collect(),
            input_tokens: Some(10),
            asked_input_tokens: None,
            output_tokens: gaps_ms.len() as u32 + 1,
            outcome,
            id: None,
            long: false,
            gateway_queue: None,
            upstream_first_byte: None,
            retry_after: None,
            retry_wait: None,
            tenant: None,
            slo_class: None,
            error_code: None,
            error: None,
        }
    }

    /// The server's count against the asked one, over the requests that have both, the chat
    /// template's tokens taken out of each.
    #[test]
    fn prompt_tokens_are_held_against_the_asked_ones() {
        let mut a = rec(10, &[5], Outcome::Ok);
        (a.asked_input_tokens, a.input_tokens) = (Some(100), Some(170));
        let mut b = rec(10, &[5], Outcome::Ok);
        (b.asked_input_tokens, b.input_tokens) = (Some(300), Some(490));
        let dataset = rec(10, &[5], Outcome::Ok);
        let t = PromptTokens::of([&a, &b, &dataset]).unwrap();
        assert_eq!((t.requests, t.asked, t.served), (2, 400, 660));
        assert_eq!(t.ratio(10), Some(1.6));
        assert_eq!(PromptTokens::of([&dataset]), None);
    }

    #[test]
    fn a_request_without_a_first_token_is_never_goodput() {
        let mut r = rec(10, &[5, 5], Outcome::Ok);
        let slo: Slo = "e2e_p95=10s".parse().unwrap();
        assert!(within_slo(&r, &slo));
        r.ttft = None;
        assert!(!within_slo(&r, &slo), "no TTFT target, yet no first token seen");
    }

    #[test]
    fn level_stats_count_errors_apart_and_judge_each_target() {
        let recs = [
            rec(10, &[5, 5, 5], Outcome::Ok),
            rec(20, &[5, 5, 5], Outcome::Ok),
            rec(300, &[5, 5, 5], Outcome::Ok),
            rec(10, &[50, 50, 50], Outcome::Ok),
            rec(0, &[], Outcome::Status { code: 429 }),
            rec(0, &[], Outcome::Status { code: 503 }),
            rec(0, &[], Outcome::Status { code: 503 }),
            rec(0, &[], Outcome::Transport),
        ];
        let refs: Vec<&Record> = recs.iter().collect();
        let slo: Slo = "ttft_p50=100ms,itl_p95=20ms,error_rate=10%".parse().unwrap();
        let s = LevelStats::compute(&refs, Duration::from_secs(2), &slo);
        assert_eq!((s.requests, s.ok), (8, 4));
        assert_eq!(s.errors.get("http_503"), Some(&2));
        assert_eq!(s.errors.get("http_429"), Some(&1));
        assert_eq!(s.errors.get("transport"), Some(&1));
        assert_eq!(s.error_rate, 0.5);
        assert_eq!(s.throughput_rps, 2.0);
        assert_eq!(s.output_tokens_per_second, 8.0);
        // Inside every SLO: the first two (the third's TTFT and the fourth's TPOT are over).
        assert_eq!(s.goodput_rps, 1.0);
        assert_eq!(s.ttft.unwrap().p50, 0.015);
        assert_eq!(s.itl.unwrap().count, 12);
        let pass: Vec<bool> = s.verdicts.iter().map(|v| v.pass).collect();
        assert_eq!(pass, [true, false, false], "{:?}", s.verdicts);
        assert!(!s.slo_pass);
    }
}
