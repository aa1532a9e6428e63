//! Mixed objectives (`--slo-mix`): each request draws a class by its share and carries that class's
//! TTFT (and TPOT) objective in `x-spillway-slo-ttft-ms` / `x-spillway-slo-tpot-ms`, as a gateway
//! that routes by each request's objectives (`balance: slo`) reads them; each class is then
//! reported against its own objectives.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use serde::Serialize;

use crate::request::{Outcome, Record};
use crate::spec::{Metric, ser_opt_secs, ser_secs};
use crate::stats::{Percentiles, values};

/// The request headers the objectives travel in, in milliseconds (Spillway's gateway reads them,
/// and llm-d's `x-llm-d-slo-*-ms` too).
pub const TTFT_HEADER: &str = "x-spillway-slo-ttft-ms";
pub const TPOT_HEADER: &str = "x-spillway-slo-tpot-ms";
/// The request header a class's priority travels in: Spillway refuses only `sheddable` requests
/// when no replica is predicted to meet their objectives.
pub const PRIORITY_HEADER: &str = "x-spillway-priority";
const PRIORITIES: [&str; 3] = ["critical", "standard", "sheddable"];
pub use crate::tenants::MAX_NAME;
/// The largest objective a gateway takes (an hour); above it Spillway answers 400 `invalid_slo`.
pub const MAX_OBJECTIVE: Duration = Duration::from_secs(3600);
/// The error code of a refusal because no replica is predicted to meet the objectives.
pub const UNATTAINABLE: &str = "slo_unattainable";
/// How far the shares may sum from 1 (they are written with a few decimals).
const SHARE_TOLERANCE: f64 = 0.001;

/// One objective class of a mix.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SloClass {
    pub name: Arc<str>,
    /// The share of requests that draw it (0–1).
    pub share: f64,
    #[serde(serialize_with = "ser_secs")]
    pub ttft: Duration,
    #[serde(serialize_with = "ser_opt_secs")]
    pub tpot: Option<Duration>,
    /// Sent as `x-spillway-priority` when given: `critical`, `standard` or `sheddable`.
    pub priority: Option<&'static str>,
}

impl SloClass {
    /// The headers a request of this class carries: milliseconds, with the decimals they need.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let ms = |d: Duration| bench_schema::units::number(d.as_secs_f64() * 1e3);
        let mut h = vec![(TTFT_HEADER, ms(self.ttft))];
        if let Some(tpot) = self.tpot {
            h.push((TPOT_HEADER, ms(tpot)));
        }
        if let Some(p) = self.priority {
            h.push((PRIORITY_HEADER, p.to_owned()));
        }
        h
    }

    /// Whether one request was served within this class's own objectives: its TTFT, and its TPOT
    /// (as [`Record::tpot`] measures it; a request of fewer than two tokens has none to miss).
    pub fn met(&self, r: &Record) -> bool {
        let Some(ttft) = r.ttft.filter(|_| r.ok()) else {
            return false;
        };
        ttft <= self.ttft
            && match (self.tpot, r.tpot()) {
                (None, _) | (Some(_), None) => true,
                (Some(limit), Some(tpot)) => tpot <= limit,
            }
    }
}

/// The classes of `--slo-mix`, in the order given.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct SloMix {
    pub classes: Vec<SloClass>,
}

impl SloMix {
    /// A class drawn by share, from the caller's seeded generator so that runs repeat.
    pub fn draw<R: Rng + ?Sized>(&self, rng: &mut R) -> &SloClass {
        let total: f64 = self.classes.iter().map(|c| c.share).sum();
        let mut x = rng.random_range(0.0..total.max(f64::MIN_POSITIVE));
        for c in &self.classes {
            if x < c.share {
                return c;
            }
            x -= c.share;
        }
        // Rounding left a sliver past the last share.
        self.classes.last().expect("a mix has at least one class")
    }
}

impl FromStr for SloMix {
    type Err = String;

    /// `NAME:SHARE:ttft=DUR[:tpot=DUR],...`, e.g. `tight:0.3:ttft=100ms,loose:0.7:ttft=2s`.
    fn from_str(s: &str) -> Result<SloMix, String> {
        let form =
            "expected NAME:SHARE:ttft=DURATION[:tpot=DURATION][:priority=P], e.g. tight:0.3:ttft=100ms";
        let mut classes: Vec<SloClass> = Vec::new();
        for part in s.split(',').map(str::trim) {
            if part.is_empty() {
                return Err(format!("{s:?}: an empty class; {form}"));
            }
            let mut fields = part.split(':').map(str::trim);
            let name = fields.next().unwrap_or_default();
            if !crate::tenants::valid_name(name) {
                return Err(format!(
                    "class {part:?}: the name {name:?} must be 1 to {MAX_NAME} letters, digits, '-', '_' or '.'"
                ));
            }
            if classes.iter().any(|c| &*c.name == name) {
                return Err(format!(
                    "class {name}: named twice; each class needs a name of its own"
                ));
            }
            let share = fields
                .next()
                .ok_or_else(|| format!("class {name}: no share; {form}"))?;
            let share = share
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0 && *v <= 1.0)
                .ok_or_else(|| {
                    format!("class {name}: share {share:?} must be a number above 0 and at most 1")
                })?;
            let (mut ttft, mut tpot, mut priority) = (None, None, None);
            for field in fields {
                let (key, value) = field
                    .split_once('=')
                    .ok_or_else(|| format!("class {name}: {field:?}: {form}"))?;
                if key.trim() == "priority" {
                    let p = PRIORITIES
                        .into_iter()
                        .find(|p| *p == value.trim())
                        .ok_or_else(|| {
                            format!("class {name}: priority {value:?}: critical, standard or sheddable")
                        })?;
                    if priority.replace(p).is_some() {
                        return Err(format!("class {name}: priority given twice"));
                    }
                    continue;
                }
                let slot = match key.trim() {
                    "ttft" => &mut ttft,
                    "tpot" => &mut tpot,
                    other => {
                        return Err(format!(
                            "class {name}: unknown objective {other:?} (ttft, tpot, priority)"
                        ));
                    }
                };
                if slot.is_some() {
                    return Err(format!("class {name}: {key} given twice"));
                }
                let d = humantime::parse_duration(value.trim()).map_err(|e| {
                    format!("class {name}: {key}={value:?} is not a duration ({e}); e.g. 100ms or 2s")
                })?;
                if d.is_zero() || d > MAX_OBJECTIVE {
                    return Err(format!(
                        "class {name}: {key}={value} must be above zero and at most an hour"
                    ));
                }
                *slot = Some(d);
            }
            let ttft = ttft.ok_or_else(|| format!("class {name}: no ttft objective; {form}"))?;
            classes.push(SloClass {
                name: Arc::from(name),
                share,
                ttft,
                tpot,
                priority,
            });
        }
        let sum: f64 = classes.iter().map(|c| c.share).sum();
        if (sum - 1.0).abs() > SHARE_TOLERANCE {
            return Err(format!(
                "{s:?}: the shares add up to {}, not 1",
                bench_schema::units::number(sum)
            ));
        }
        Ok(SloMix { classes })
    }
}

/// What one class's requests got over a level (its warm-up left out, as for the level's totals).
#[derive(Debug, Clone, Serialize)]
pub struct SloClassReport {
    pub name: Arc<str>,
    /// The class's objectives, seconds.
    #[serde(serialize_with = "ser_secs")]
    pub ttft_objective: Duration,
    #[serde(serialize_with = "ser_opt_secs")]
    pub tpot_objective: Option<Duration>,
    /// The priority its requests were sent with, if any.
    pub priority: Option<&'static str>,
    /// Requests sent and measured: `served + refused_429 + refused_503 + errors`.
    pub sent: usize,
    /// Answered with a complete 200 stream.
    pub served: usize,
    pub refused_429: usize,
    pub refused_503: usize,
    /// Of the refusals, those whose OpenAI-shaped error said `slo_unattainable`: the gateway
    /// predicted that no replica could meet the objectives.
    pub slo_unattainable: usize,
    /// Every other failure…
    pub errors: usize,
    /// …by kind, as the level's `errors` names them.
    pub error_kinds: BTreeMap<&'static str, usize>,
    /// Served within the class's own TTFT (and TPOT) objective.
    pub goodput: usize,
    /// `goodput` over `sent` (0–1).
    pub goodput_share: f64,
    pub goodput_rps: f64,
    /// Over served requests.
    pub ttft: Option<Percentiles>,
    pub tpot: Option<Percentiles>,
}

/// Each class's report over `records` (a level's, without its warm-up) in `wall` time, in the
/// mix's order. Records carry their class's name.
pub fn reports(mix: &SloMix, records: &[&Record], wall: Duration) -> Vec<SloClassReport> {
    let secs = wall.as_secs_f64().max(1e-9);
    mix.classes
        .iter()
        .map(|class| {
            let mine: Vec<&Record> = records
                .iter()
                .copied()
                .filter(|r| r.slo_class.as_deref() == Some(&*class.name))
                .collect();
            let status = |code| {
                mine.iter()
                    .filter(|r| r.outcome == Outcome::Status { code })
                    .count()
            };
            let refused = |r: &Record| matches!(r.outcome, Outcome::Status { code: 429 | 503 });
            let mut error_kinds = BTreeMap::new();
            for r in mine.iter().filter(|r| !r.ok() && !refused(r)) {
                *error_kinds.entry(r.outcome.kind()).or_insert(0) += 1;
            }
            let goodput = mine.iter().filter(|r| class.met(r)).count();
            SloClassReport {
                name: class.name.clone(),
                ttft_objective: class.ttft,
                tpot_objective: class.tpot,
                priority: class.priority,
                sent: mine.len(),
                served: mine.iter().filter(|r| r.ok()).count(),
                refused_429: status(429),
                refused_503: status(503),
                slo_unattainable: mine
                    .iter()
                    .filter(|r| refused(r))
                    .filter(|r| r.error_code.as_deref() == Some(UNATTAINABLE))
                    .count(),
                errors: error_kinds.values().sum(),
                error_kinds,
                goodput,
                goodput_share: if mine.is_empty() {
                    0.0
                } else {
                    goodput as f64 / mine.len() as f64
                },
                goodput_rps: goodput as f64 / secs,
                ttft: Percentiles::of(&values(&mine, Metric::Ttft)),
                tpot: Percentiles::of(&values(&mine, Metric::Tpot)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_mix_parses_with_its_objectives_and_headers() {
        let mix: SloMix = "tight:0.3:ttft=100ms:tpot=20ms, loose:0.7:ttft=2s"
            .parse()
            .unwrap();
        assert_eq!(mix.classes.len(), 2);
        let (tight, loose) = (&mix.classes[0], &mix.classes[1]);
        assert_eq!(
            (&*tight.name, tight.share, tight.ttft, tight.tpot),
            ("tight", 0.3, ms(100), Some(ms(20)))
        );
        assert_eq!((&*loose.name, loose.ttft, loose.tpot), ("loose", ms(2000), None));
        assert_eq!(
            tight.headers(),
            [(TTFT_HEADER, "100".to_owned()), (TPOT_HEADER, "20".to_owned())]
        );
        assert_eq!(loose.headers(), [(TTFT_HEADER, "2000".to_owned())]);
        let fine: SloMix = "a:1:ttft=1500us".parse().unwrap();
        assert_eq!(fine.classes[0].headers()[0].1, "1.5");
        // Shares written with a few decimals: within 0.001 of 1.
        assert!(
            "a:0.333:ttft=1s,b:0.333:ttft=1s,c:0.333:ttft=1s"
                .parse::<SloMix>()
                .is_ok()
        );
        // The order of the objectives does not matter.
        let swapped: SloMix = "a:1:tpot=5ms:ttft=1s".parse().unwrap();
        assert_eq!(swapped.classes[0].tpot, Some(ms(5)));
        // A priority goes with the objectives: only sheddable requests are refused for them.
        let shed: SloMix = "a:1:ttft=50ms:priority=sheddable".parse().unwrap();
        assert_eq!(
            shed.classes[0].headers(),
            [
                (TTFT_HEADER, "50".to_owned()),
                (PRIORITY_HEADER, "sheddable".to_owned())
            ]
        );
    }

    #[test]
    fn bad_mixes_say_what_is_wrong() {
        for (bad, needle) in [
            ("tight:0.3:ttft=100ms,loose:0.6:ttft=2s", "add up to 0.9, not 1"),
            ("a:0.5:ttft=1s,a:0.5:ttft=2s", "class a: named twice"),
            ("a:0:ttft=1s,b:1:ttft=1s", "share \"0\" must be a number above 0"),
            ("a:-0.5:ttft=1s,b:1.5:ttft=1s", "share \"-0.5\""),
            ("a:x:ttft=1s", "share \"x\""),
            ("a:1", "class a: no ttft objective"),
            ("a", "class a: no share"),
            ("a:1:ttft=0ms", "ttft=0ms must be above zero"),
            ("a:1:ttft=2h", "at most an hour"),
            ("a:1:ttft=soon", "ttft=\"soon\" is not a duration"),
            ("a:1:ttft=1s:tpot=0s", "tpot=0s must be above zero"),
            ("a:1:ttft=1s:ttft=2s", "ttft given twice"),
            ("a:1:ttft=1s:e2e=5s", "unknown objective \"e2e\""),
            (
                "a:1:ttft=1s:priority=low",
                "priority \"low\": critical, standard or sheddable",
            ),
            (
                "a:1:ttft=1s:priority=sheddable:priority=critical",
                "priority given twice",
            ),
            ("a:1:100ms", "\"100ms\": expected NAME:SHARE"),
            ("a b:1:ttft=1s", "the name \"a b\""),
            ("a-name-far-too-long:1:ttft=1s", "1 to 16"),
            (":1:ttft=1s", "the name \"\""),
            ("a:1:ttft=1s,", "an empty class"),
        ] {
            let e = bad.parse::<SloMix>().unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }

    #[test]
    fn draws_follow_the_shares_and_repeat_with_the_seed() {
        let mix: SloMix = "tight:0.3:ttft=100ms,loose:0.7:ttft=2s".parse().unwrap();
        let draws = |seed| {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            (0..10_000)
                .map(|_| mix.draw(&mut rng).name.clone())
                .collect::<Vec<_>>()
        };
        let a = draws(7);
        assert_eq!(a, draws(7), "the same seed draws the same classes");
        assert_ne!(a, draws(8));
        let tight = a.iter().filter(|n| &***n == "tight").count();
        // 3,000 expected; the standard deviation is about 46.
        assert!((2_800..3_200).contains(&tight), "{tight}");
    }

    /// A record of `class`: served with this TTFT and TPOT over `tokens` tokens, or refused.
    fn rec(class: &str, outcome: Outcome, ttft_ms: u64, tpot_ms: u64, tokens: u32) -> Record {
        let mut r = Record::unanswered(Duration::ZERO, Duration::ZERO, false);
        r.slo_class = Some(Arc::from(class));
        if outcome == Outcome::Ok {
            r.ttft = Some(ms(ttft_ms));
            r.e2e = ms(ttft_ms + tpot_ms * u64::from(tokens.saturating_sub(1)));
            r.itl_us = vec![tpot_ms as u32 * 1000; tokens.saturating_sub(1) as usize];
            r.output_tokens = tokens;
        }
        r.outcome = outcome;
        r
    }

    #[test]
    fn each_class_is_judged_by_its_own_objectives() {
        let mix: SloMix = "tight:0.4:ttft=100ms:tpot=10ms,loose:0.6:ttft=2s"
            .parse()
            .unwrap();
        let mut unattainable = rec("tight", Outcome::Status { code: 429 }, 0, 0, 0);
        unattainable.error_code = Some(UNATTAINABLE.into());
        let mut full = rec("loose", Outcome::Status { code: 503 }, 0, 0, 0);
        full.error_code = Some("queue_full".into());
        let recs = [
            // tight: met; TTFT over; TPOT over; one token (no TPOT to miss); refused twice.
            rec("tight", Outcome::Ok, 50, 5, 9),
            rec("tight", Outcome::Ok, 150, 5, 9),
            rec("tight", Outcome::Ok, 80, 20, 9),
            rec("tight", Outcome::Ok, 100, 0, 1),
            unattainable,
            rec("tight", Outcome::Status { code: 429 }, 0, 0, 0),
            // loose: 150 ms and 1.9 s met (no TPOT objective, however slow), 2.5 s not; a
            // timeout and a refusal that was no SLO verdict.
            rec("loose", Outcome::Ok, 150, 5, 9),
            rec("loose", Outcome::Ok, 1900, 500, 9),
            rec("loose", Outcome::Ok, 2500, 5, 9),
            rec("loose", Outcome::Timeout, 0, 0, 0),
            full,
        ];
        let refs: Vec<&Record> = recs.iter().collect();
        let r = reports(&mix, &refs, Duration::from_secs(2));
        let (tight, loose) = (&r[0], &r[1]);
        assert_eq!(
            (
                tight.sent,
                tight.served,
                tight.refused_429,
                tight.refused_503,
                tight.errors
            ),
            (6, 4, 2, 0, 0)
        );
        assert_eq!(tight.slo_unattainable, 1);
        assert_eq!(tight.goodput, 2, "the first and the one-token answer");
        assert_eq!(tight.goodput_share, 2.0 / 6.0);
        assert_eq!(tight.goodput_rps, 1.0);
        assert_eq!(
            (tight.ttft_objective, tight.tpot_objective),
            (ms(100), Some(ms(10)))
        );
        assert_eq!(tight.ttft.unwrap().count, 4);
        assert_eq!(tight.ttft.unwrap().p50, 0.09);
        // The one-token answer has no TPOT.
        assert_eq!(tight.tpot.unwrap().count, 3);
        assert_eq!(tight.tpot.unwrap().p50, 0.005);
        assert_eq!(
            (
                loose.sent,
                loose.served,
                loose.refused_503,
                loose.slo_unattainable,
                loose.errors
            ),
            (5, 3, 1, 0, 1)
        );
        assert_eq!(loose.error_kinds.get("timeout"), Some(&1));
        assert_eq!(loose.goodput, 2);
        assert_eq!(loose.ttft.unwrap().max, 2.5);
        // Every record in one class: the classes add up to the level.
        assert_eq!(tight.sent + loose.sent, recs.len());
        for c in &r {
            assert_eq!(c.sent, c.served + c.refused_429 + c.refused_503 + c.errors);
        }
    }
}
