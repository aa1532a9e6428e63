//! The words a bench result is written in: SLO targets, load levels and phases, parsed from the
//! command line's strings with errors that name the offending part.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::units::ser_secs;

/// The latency a target applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    /// Send to the first content token.
    Ttft,
    /// Every gap between content tokens, pooled over the requests of a level.
    Itl,
    /// Per request: (end-to-end − TTFT) / (output tokens − 1).
    Tpot,
    /// Send to the last byte.
    E2e,
}

impl Metric {
    pub fn name(self) -> &'static str {
        match self {
            Metric::Ttft => "ttft",
            Metric::Itl => "itl",
            Metric::Tpot => "tpot",
            Metric::E2e => "e2e",
        }
    }
}

/// `ttft_p95=1s`: the 95th percentile of TTFT over a level must be at most one second.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencyTarget {
    pub metric: Metric,
    pub percentile: f64,
    #[serde(serialize_with = "ser_secs")]
    pub limit: Duration,
}

/// The service-level objectives a level must meet, e.g. `ttft_p95=1s,itl_p95=50ms,error_rate=1%`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Slo {
    pub latency: Vec<LatencyTarget>,
    /// Largest allowed share of failed requests (any non-success: 429, 503, 504, transport, ...).
    pub error_rate: Option<f64>,
}

impl Slo {
    /// The TTFT limit a single request is held to for goodput and burst recovery.
    pub fn limit(&self, metric: Metric) -> Option<Duration> {
        self.latency
            .iter()
            .filter(|t| t.metric == metric)
            .map(|t| t.limit)
            .min()
    }
}

impl FromStr for Slo {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut slo = Slo {
            latency: Vec::new(),
            error_rate: None,
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("SLO {part:?}: expected KEY=VALUE, e.g. ttft_p95=1s"))?;
            if key == "error_rate" {
                let pct = value
                    .strip_suffix('%')
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .filter(|v| (0.0..=100.0).contains(v))
                    .ok_or_else(|| {
                        format!("SLO {part:?}: error_rate takes a percentage from 0% to 100%, e.g. 1%")
                    })?;
                slo.error_rate = Some(pct / 100.0);
                continue;
            }
            let (metric, pct) = key.split_once("_p").ok_or_else(|| {
                format!("SLO {part:?}: expected METRIC_pNN (ttft, itl, tpot, e2e), e.g. ttft_p95")
            })?;
            let metric = match metric {
                "ttft" => Metric::Ttft,
                "itl" => Metric::Itl,
                "tpot" => Metric::Tpot,
                "e2e" => Metric::E2e,
                other => {
                    return Err(format!(
                        "SLO {part:?}: unknown metric {other:?} (ttft, itl, tpot, e2e, error_rate)"
                    ));
                }
            };
            let percentile = pct
                .parse::<f64>()
                .ok()
                .filter(|p| *p > 0.0 && *p < 100.0)
                .ok_or_else(|| {
                    format!("SLO {part:?}: percentile {pct:?} must be between 0 and 100, e.g. p95 or p99.9")
                })?;
            let limit = humantime::parse_duration(value)
                .map_err(|e| format!("SLO {part:?}: {value:?} is not a duration ({e}); e.g. 500ms or 1s"))?;
            if limit.is_zero() {
                return Err(format!("SLO {part:?}: a zero limit can never be met"));
            }
            slo.latency.push(LatencyTarget {
                metric,
                percentile,
                limit,
            });
        }
        if slo.latency.is_empty() && slo.error_rate.is_none() {
            return Err(format!(
                "SLO {s:?}: no targets; e.g. ttft_p95=1s,itl_p95=50ms,error_rate=1%"
            ));
        }
        Ok(slo)
    }
}

impl fmt::Display for Slo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = self
            .latency
            .iter()
            .map(|t| {
                format!(
                    "{}_p{}={}",
                    t.metric.name(),
                    t.percentile,
                    humantime::format_duration(t.limit)
                )
            })
            .collect();
        if let Some(e) = self.error_rate {
            parts.push(format!("error_rate={}%", e * 100.0));
        }
        f.write_str(&parts.join(","))
    }
}

/// One load level: closed-loop concurrency or open-loop rate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Load {
    Concurrency(u32),
    /// Requests per second.
    Rate(f64),
}

impl Load {
    /// The level as one number, for charts and comparisons.
    pub fn value(self) -> f64 {
        match self {
            Load::Concurrency(c) => f64::from(c),
            Load::Rate(r) => r,
        }
    }

    /// The same kind of load at `value`.
    pub fn with_value(self, value: f64) -> Load {
        match self {
            Load::Concurrency(_) => Load::Concurrency(value.round().max(1.0) as u32),
            Load::Rate(_) => Load::Rate(value.max(0.001)),
        }
    }

    /// The name of the axis, for tables and charts.
    pub fn axis(self) -> &'static str {
        match self {
            Load::Concurrency(_) => "concurrency",
            Load::Rate(_) => "rate (req/s)",
        }
    }
}

impl fmt::Display for Load {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Load::Concurrency(c) => write!(f, "C={c}"),
            // At most three decimals, and none that say nothing: `16 req/s`, `12.5 req/s`.
            Load::Rate(r) => write!(f, "{} req/s", crate::units::number(*r)),
        }
    }
}

/// The seed's four phases, run in this order; and the one level of several tenants at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Baseline,
    Staircase,
    LongMix,
    Burst,
    /// Every tenant's load at once (`--tenant`), in place of the others: not a `--phases` name.
    Tenants,
    /// A trace sent on its timestamps (`--trace`), in place of the others: not a `--phases` name.
    Replay,
}

impl Phase {
    pub const ALL: [Phase; 4] = [Phase::Baseline, Phase::Staircase, Phase::LongMix, Phase::Burst];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Baseline => "baseline",
            Phase::Staircase => "staircase",
            Phase::LongMix => "long-mix",
            Phase::Burst => "burst",
            Phase::Tenants => "tenants",
            Phase::Replay => "replay",
        }
    }

    /// `baseline,staircase,long-mix,burst` (any subset, any order; `all` for every phase).
    pub fn parse_list(s: &str) -> Result<Vec<Phase>, String> {
        let mut out = Vec::new();
        for p in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if p == "all" {
                out.extend(Phase::ALL);
                continue;
            }
            let phase = Phase::ALL
                .into_iter()
                .find(|ph| ph.name() == p || ph.name().replace('-', "_") == p)
                .ok_or_else(|| format!("phase {p:?}: expected baseline, staircase, long-mix or burst"))?;
            out.push(phase);
        }
        if out.is_empty() {
            return Err("--phases: name at least one phase".into());
        }
        out.sort();
        out.dedup();
        Ok(out)
    }
}

/// The API a run drives: its path, its request's shape and the events its stream is read by.
/// Results written before it existed say `endpoint` (chat or completions) instead.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// OpenAI's `/v1/chat/completions`.
    #[default]
    Chat,
    /// OpenAI's `/v1/completions`.
    Completions,
    /// OpenAI's Responses API, `/v1/responses` (the agents SDK, Codex).
    Responses,
    /// Anthropic's Messages API, `/v1/messages` (Claude Code, the `anthropic` SDK).
    Messages,
}

impl Api {
    pub const ALL: [Api; 4] = [Api::Chat, Api::Completions, Api::Responses, Api::Messages];

    pub fn name(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "completions",
            Api::Responses => "responses",
            Api::Messages => "messages",
        }
    }

    /// The path a request of this API is posted to.
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
            Api::Responses => "/v1/responses",
            Api::Messages => "/v1/messages",
        }
    }
}

impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Api {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Api::ALL
            .into_iter()
            .find(|a| a.name() == s.trim())
            .ok_or_else(|| format!("API {s:?}: expected chat, completions, responses or messages"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slo_parses_every_target_and_names_bad_parts() {
        let slo: Slo = "ttft_p95=1s, itl_p99.9=50ms,error_rate=1%".parse().unwrap();
        assert_eq!(slo.latency.len(), 2);
        assert_eq!(slo.latency[1].percentile, 99.9);
        assert_eq!(slo.limit(Metric::Itl), Some(Duration::from_millis(50)));
        assert_eq!(slo.error_rate, Some(0.01));
        for (bad, names) in [
            ("ttft=1s", "METRIC_pNN"),
            ("ttfb_p95=1s", "unknown metric \"ttfb\""),
            ("ttft_p100=1s", "between 0 and 100"),
            ("ttft_p95=fast", "not a duration"),
            ("ttft_p95=0s", "never be met"),
            ("error_rate=2", "percentage"),
            ("error_rate=150%", "percentage"),
            ("ttft_p95", "KEY=VALUE"),
            ("", "no targets"),
        ] {
            let err = bad.parse::<Slo>().unwrap_err();
            assert!(err.contains(names), "{bad:?} -> {err}");
        }
    }

    #[test]
    fn phases_parse() {
        assert_eq!(
            Phase::parse_list("burst,baseline").unwrap(),
            vec![Phase::Baseline, Phase::Burst]
        );
        assert_eq!(Phase::parse_list("all").unwrap(), Phase::ALL.to_vec());
        assert!(Phase::parse_list("warmup").unwrap_err().contains("warmup"));
    }

    #[test]
    fn rates_print_without_empty_decimals() {
        assert_eq!(Load::Rate(16.0).to_string(), "16 req/s");
        assert_eq!(Load::Rate(12.5).to_string(), "12.5 req/s");
        assert_eq!(Load::Rate(2.0 / 3.0).to_string(), "0.667 req/s");
        assert_eq!(Load::Rate(10.0004).to_string(), "10 req/s");
        assert_eq!(Load::Concurrency(16).to_string(), "C=16");
    }

    #[test]
    fn apis_read_and_write_their_names() {
        for api in Api::ALL {
            assert_eq!(api.name().parse::<Api>(), Ok(api));
            assert_eq!(api.to_string(), api.name());
        }
        assert_eq!(Api::Messages.path(), "/v1/messages");
        assert!("anthropic".parse::<Api>().unwrap_err().contains("messages"));
    }
}
