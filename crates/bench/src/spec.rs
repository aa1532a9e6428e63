//! What a run is asked to do: load levels, length distributions, SLO targets, phases — parsed from
//! the command line's strings with errors that name the offending part.

use std::fmt;
use std::str::FromStr;

use rand::Rng;
use rand_distr::{Distribution, LogNormal, Normal};
use serde::Serialize;

pub use bench_schema::spec::{LatencyTarget, Load, Metric, Phase, Slo};
pub use bench_schema::units::{ser_opt_secs, ser_secs};

use crate::error::BenchError;

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

/// `baseline,staircase,long-mix,burst` (any subset, any order; `all` for every phase).
pub fn parse_phases(s: &str) -> Result<Vec<Phase>, BenchError> {
    Phase::parse_list(s).map_err(BenchError::Phases)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

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
            parse_phases("burst,baseline").unwrap(),
            vec![Phase::Baseline, Phase::Burst]
        );
        assert!(
            parse_phases("warmup")
                .unwrap_err()
                .to_string()
                .contains("--phases: phase \"warmup\"")
        );
        assert_eq!(
            "gamma:0.5".parse::<Arrivals>().unwrap(),
            Arrivals::Gamma { burstiness: 0.5 }
        );
        assert!("gamma:-1".parse::<Arrivals>().is_err());
    }
}
