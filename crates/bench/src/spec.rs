//! What a run is asked to do: load levels, length distributions, SLO targets, phases — parsed from
//! the command line's strings with errors that name the offending part.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::Rng;
use rand_distr::{Distribution, LogNormal, Normal};
use serde::{Deserialize, Serialize};

/// A request-length distribution in tokens: `128`, `fixed:128`, `uniform:64,256` (`uniform:64-256`
/// is read the same, see [`LengthDist::hint`]), `normal:200,50` (mean, standard deviation) or
/// `lognormal:200,100` (the mean and standard deviation of the lengths themselves, not of their
/// logarithm). The grammar is `spillway engine`'s too. Samples are clamped to at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum LengthDist {
    Fixed { tokens: u32 },
    Uniform { min: u32, max: u32 },
    Normal { mean: f64, sd: f64 },
    LogNormal { mean: f64, sd: f64 },
}

impl LengthDist {
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> u32 {
        let v = match *self {
            LengthDist::Fixed { tokens } => return tokens.max(1),
            LengthDist::Uniform { min, max } => return rng.random_range(min..=max).max(1),
            LengthDist::Normal { mean, sd } => Normal::new(mean, sd).map_or(mean, |d| d.sample(rng)),
            LengthDist::LogNormal { mean, sd } => {
                // Moments of the lengths -> parameters of their logarithm.
                let sigma2 = (1.0 + (sd * sd) / (mean * mean)).ln();
                let mu = mean.ln() - sigma2 / 2.0;
                LogNormal::new(mu, sigma2.sqrt()).map_or(mean, |d| d.sample(rng))
            }
        };
        v.round().clamp(1.0, f64::from(u32::MAX)) as u32
    }

    /// The longest length it can produce, where there is one (fixed, uniform); for normal and
    /// lognormal, whose tails have no end, the mean.
    pub fn bound(&self) -> f64 {
        match *self {
            LengthDist::Fixed { tokens } => f64::from(tokens),
            LengthDist::Uniform { max, .. } => f64::from(max),
            LengthDist::Normal { mean, .. } | LengthDist::LogNormal { mean, .. } => mean,
        }
    }

    /// A note for `uniform:A-B`, which is accepted but spelt `uniform:A,B` like every other
    /// two-number form (and like `spillway engine --output-len`).
    pub fn hint(s: &str) -> Option<String> {
        let args = s.trim().strip_prefix("uniform:")?;
        let (a, b) = args.split_once('-')?;
        Some(format!(
            "{s:?} is read as \"uniform:{a},{b}\"; write it that way (MIN,MAX, like normal:MEAN,SD)"
        ))
    }

    /// The expected length, for sizing and for reports.
    pub fn mean(&self) -> f64 {
        match *self {
            LengthDist::Fixed { tokens } => f64::from(tokens),
            LengthDist::Uniform { min, max } => (f64::from(min) + f64::from(max)) / 2.0,
            LengthDist::Normal { mean, .. } | LengthDist::LogNormal { mean, .. } => mean,
        }
    }
}

impl FromStr for LengthDist {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, args) = s.split_once(':').unwrap_or(("fixed", s));
        let int = |v: &str| {
            v.trim()
                .parse::<u32>()
                .map_err(|_| format!("length distribution {s:?}: {v:?} is not a whole number of tokens"))
        };
        let pair = |sep: char| {
            let (a, b) = args.split_once(sep).ok_or_else(|| {
                format!("length distribution {s:?}: expected two numbers separated by {sep:?}")
            })?;
            let num = |v: &str| {
                v.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .ok_or_else(|| format!("length distribution {s:?}: {v:?} is not a non-negative number"))
            };
            Ok::<_, String>((num(a)?, num(b)?))
        };
        let dist = match kind {
            "fixed" => LengthDist::Fixed { tokens: int(args)? },
            "uniform" => {
                let (a, b) = args
                    .split_once(',')
                    .or_else(|| args.split_once('-'))
                    .ok_or_else(|| {
                        format!("length distribution {s:?}: uniform takes MIN,MAX, e.g. uniform:64,256")
                    })?;
                let (min, max) = (int(a)?, int(b)?);
                if min > max {
                    return Err(format!("length distribution {s:?}: MIN {min} is above MAX {max}"));
                }
                LengthDist::Uniform { min, max }
            }
            "normal" => {
                let (mean, sd) = pair(',')?;
                LengthDist::Normal { mean, sd }
            }
            "lognormal" => {
                let (mean, sd) = pair(',')?;
                if mean <= 0.0 {
                    return Err(format!(
                        "length distribution {s:?}: lognormal needs a positive mean"
                    ));
                }
                LengthDist::LogNormal { mean, sd }
            }
            other => {
                return Err(format!(
                    "length distribution {s:?}: unknown kind {other:?} (fixed, uniform, normal, lognormal)"
                ));
            }
        };
        if dist.mean() < 1.0 {
            return Err(format!(
                "length distribution {s:?}: lengths must be at least 1 token"
            ));
        }
        Ok(dist)
    }
}

impl fmt::Display for LengthDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LengthDist::Fixed { tokens } => write!(f, "{tokens}"),
            LengthDist::Uniform { min, max } => write!(f, "uniform:{min},{max}"),
            LengthDist::Normal { mean, sd } => write!(f, "normal:{mean},{sd}"),
            LengthDist::LogNormal { mean, sd } => write!(f, "lognormal:{mean},{sd}"),
        }
    }
}

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

/// How open-loop arrivals are spaced.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Arrivals {
    /// Exponential gaps: independent users.
    Poisson,
    /// Equal gaps.
    Constant,
    /// Gamma gaps with shape `burstiness` (< 1 burstier than Poisson, 1 = Poisson, > 1 smoother).
    Gamma { burstiness: f64 },
}

impl FromStr for Arrivals {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "poisson" => Ok(Arrivals::Poisson),
            "constant" => Ok(Arrivals::Constant),
            _ => {
                let b = s
                    .strip_prefix("gamma:")
                    .ok_or_else(|| format!("arrivals {s:?}: expected poisson, constant or gamma:B"))?;
                let burstiness = b
                    .parse::<f64>()
                    .ok()
                    .filter(|b| b.is_finite() && *b > 0.0)
                    .ok_or_else(|| format!("arrivals {s:?}: gamma's burstiness must be a positive number"))?;
                Ok(Arrivals::Gamma { burstiness })
            }
        }
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
            Load::Rate(r) => write!(f, "{} req/s", crate::report::number(*r)),
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
        }
    }

    /// `baseline,staircase,long-mix,burst` (any subset, any order; `all` for every phase).
    pub fn parse_list(s: &str) -> Result<Vec<Phase>, crate::BenchError> {
        Self::parse_names(s).map_err(crate::BenchError::Phases)
    }

    fn parse_names(s: &str) -> Result<Vec<Phase>, String> {
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

/// Serialises a duration as seconds, the unit of every time in the JSON output.
pub fn ser_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// [`ser_secs`] for an optional duration (`null` when absent).
pub fn ser_opt_secs<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => ser_secs(d, s),
        None => s.serialize_none(),
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
    fn length_distributions_parse_and_sample_in_range() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        assert_eq!(
            "128".parse::<LengthDist>().unwrap(),
            LengthDist::Fixed { tokens: 128 }
        );
        let u: LengthDist = "uniform:10,20".parse().unwrap();
        assert_eq!(
            "uniform:10-20".parse::<LengthDist>(),
            Ok(u),
            "the dash form is accepted"
        );
        let hint = LengthDist::hint("uniform:10-20").unwrap();
        assert!(hint.contains("\"uniform:10,20\""), "{hint}");
        assert_eq!(LengthDist::hint("uniform:10,20"), None);
        assert!(
            (0..1000)
                .map(|_| u.sample(&mut rng))
                .all(|v| (10..=20).contains(&v))
        );
        let ln: LengthDist = "lognormal:200,100".parse().unwrap();
        let n = 20_000;
        let mean = (0..n).map(|_| f64::from(ln.sample(&mut rng))).sum::<f64>() / f64::from(n);
        assert!((mean - 200.0).abs() < 10.0, "lognormal mean {mean}");
        let norm: LengthDist = "normal:5,50".parse().unwrap();
        assert!((0..1000).all(|_| norm.sample(&mut rng) >= 1));
        for bad in [
            "uniform:30,10",
            "uniform:30-10",
            "uniform:30",
            "gauss:1,2",
            "normal:1",
            "fixed:x",
            "lognormal:0,1",
            "0",
        ] {
            assert!(bad.parse::<LengthDist>().is_err(), "{bad}");
        }
    }

    #[test]
    fn phases_and_arrivals_parse() {
        assert_eq!(
            Phase::parse_list("burst,baseline").unwrap(),
            vec![Phase::Baseline, Phase::Burst]
        );
        assert_eq!(Phase::parse_list("all").unwrap(), Phase::ALL.to_vec());
        assert!(
            Phase::parse_list("warmup")
                .unwrap_err()
                .to_string()
                .contains("warmup")
        );
        assert_eq!(
            "gamma:0.5".parse::<Arrivals>().unwrap(),
            Arrivals::Gamma { burstiness: 0.5 }
        );
        assert!("gamma:-1".parse::<Arrivals>().is_err());
    }

    use rand::SeedableRng;

    #[test]
    fn rates_print_without_empty_decimals() {
        assert_eq!(Load::Rate(16.0).to_string(), "16 req/s");
        assert_eq!(Load::Rate(12.5).to_string(), "12.5 req/s");
        assert_eq!(Load::Rate(2.0 / 3.0).to_string(), "0.667 req/s");
        assert_eq!(Load::Rate(10.0004).to_string(), "10 req/s");
        assert_eq!(Load::Concurrency(16).to_string(), "C=16");
    }
}
