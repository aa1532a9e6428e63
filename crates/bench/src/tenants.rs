//! Several tenants at once: each with its own key and load, all for one level, and what each got —
//! its counts, its share of the service, its latencies — with Jain's fairness index over them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::request::{Outcome, Record};
use crate::spec::Load;
use crate::stats::{Percentiles, RetryWaits, values, within_slo};

/// Table labels: long names would push the tenant tables past 80 columns.
pub const MAX_NAME: usize = 16;

/// A name a report's narrow table can show: 1 to [`MAX_NAME`] letters, digits, `-`, `_` or `.`
/// (tenants, and the classes of an SLO mix).
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().count() <= MAX_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A tenant as `--tenants FILE` lists it (YAML), or as `--tenant NAME=KEY_ENV:clients=N` says it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSpec {
    pub name: String,
    /// The variable holding the tenant's API key (sent as `Authorization: Bearer`).
    pub api_key_env: String,
    /// Closed loop: this many clients, each sending its next request when its last one ends.
    #[serde(default)]
    pub clients: Option<u32>,
    /// Open loop: this many requests per second.
    #[serde(default)]
    pub rate: Option<f64>,
}

impl TenantSpec {
    /// `NAME=KEY_ENV:clients=N` or `NAME=KEY_ENV:rate=R`.
    pub fn parse_flag(s: &str) -> Result<TenantSpec, String> {
        let form = "expected NAME=KEY_ENV:clients=N or NAME=KEY_ENV:rate=R";
        let (name, rest) = s.split_once('=').ok_or_else(|| format!("{s:?}: {form}"))?;
        let mut parts = rest.split(':');
        let api_key_env = parts.next().unwrap_or_default().trim().to_owned();
        let mut spec = TenantSpec {
            name: name.trim().to_owned(),
            api_key_env,
            clients: None,
            rate: None,
        };
        for part in parts {
            match part.split_once('=') {
                Some(("clients", n)) => {
                    spec.clients = Some(
                        n.trim()
                            .parse()
                            .map_err(|_| format!("{s:?}: clients={n:?} is not a whole number of clients"))?,
                    )
                }
                Some(("rate", r)) => {
                    spec.rate =
                        Some(r.trim().parse().map_err(|_| {
                            format!("{s:?}: rate={r:?} is not a number of requests per second")
                        })?)
                }
                _ => return Err(format!("{s:?}: unknown part {part:?}; {form}")),
            }
        }
        spec.load().map_err(|e| format!("{s:?}: {e}"))?;
        Ok(spec)
    }

    /// The tenant's load: exactly one of `clients` (at least 1) and `rate` (above zero).
    pub fn load(&self) -> Result<Load, String> {
        let name = &self.name;
        if !valid_name(name) {
            return Err(format!(
                "tenant name {name:?}: 1 to {MAX_NAME} letters, digits, '-', '_' or '.'"
            ));
        }
        if self.api_key_env.is_empty() {
            return Err(format!(
                "tenant {name}: api_key_env is empty: name the variable that holds its key"
            ));
        }
        match (self.clients, self.rate) {
            (Some(0), None) => Err(format!("tenant {name}: clients must be at least 1")),
            (Some(c), None) => Ok(Load::Concurrency(c)),
            (None, Some(r)) if r.is_finite() && r > 0.0 => Ok(Load::Rate(r)),
            (None, Some(r)) => Err(format!(
                "tenant {name}: rate {r} must be a positive number of requests per second"
            )),
            (Some(_), Some(_)) => Err(format!("tenant {name}: give clients or rate, not both")),
            (None, None) => Err(format!(
                "tenant {name}: give clients=N (closed loop) or rate=R (open loop)"
            )),
        }
    }
}

/// One tenant of a run, its key read.
#[derive(Clone)]
pub struct Tenant {
    pub name: String,
    pub api_key_env: String,
    pub api_key: String,
    pub load: Load,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant")
            .field("name", &self.name)
            .field("api_key_env", &self.api_key_env)
            .field("load", &self.load)
            .finish_non_exhaustive()
    }
}

/// What one tenant sent and got over the level (its warm-up left out, as for the level's totals).
#[derive(Debug, Clone, Serialize)]
pub struct TenantReport {
    pub name: String,
    pub api_key_env: String,
    pub load: Load,
    /// Requests sent and measured; `served + refused_429 + refused_503 + errors`.
    pub sent: usize,
    /// Answered with a complete 200 stream.
    pub served: usize,
    pub refused_429: usize,
    pub refused_503: usize,
    /// Of the refusals, how many carried `Retry-After`.
    pub refused_with_retry_after: usize,
    /// Every other failure (other statuses, transport, timeout, broken streams)…
    pub errors: usize,
    /// …by kind, as the level's `errors` names them.
    pub error_kinds: BTreeMap<&'static str, usize>,
    /// This tenant's served requests over every tenant's (0–1).
    pub served_share: f64,
    /// Prompt plus completion tokens of its served requests (the server's `usage`, else the
    /// lengths asked for and the chunks counted).
    pub served_input_tokens: u64,
    pub served_output_tokens: u64,
    pub served_tokens: u64,
    /// Its served tokens over every tenant's (0–1).
    pub token_share: f64,
    pub throughput_rps: f64,
    pub output_tokens_per_second: f64,
    /// Served requests inside every latency SLO, over all it sent (0–1).
    pub goodput_share: f64,
    pub ttft: Option<Percentiles>,
    pub itl: Option<Percentiles>,
    pub e2e: Option<Percentiles>,
    /// The gateway's `queue;dur` from `Server-Timing`, over the served requests that carried it.
    pub gateway_queue: Option<Percentiles>,
    /// Closed-loop clients that honoured `Retry-After` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_waits: Option<RetryWaits>,
    /// Sent during the warm-up and left out.
    pub warmup_requests: usize,
}

/// Jain's index over the tenants' service: 1 when every tenant got the same, 1/n when one got all.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Fairness {
    pub tenants: usize,
    /// Over served tokens (input + output); `null` when nothing was served.
    pub jain_served_tokens: Option<f64>,
    /// Over served requests.
    pub jain_served_requests: Option<f64>,
}

/// Jain's fairness index, J = (Σx)² / (n·Σx²); `None` for no values or all zero.
pub fn jain(xs: &[f64]) -> Option<f64> {
    let sum: f64 = xs.iter().sum();
    let squares: f64 = xs.iter().map(|x| x * x).sum();
    (!xs.is_empty() && squares > 0.0).then(|| sum * sum / (xs.len() as f64 * squares))
}

fn served_tokens(r: &Record) -> (u64, u64) {
    let input = r.input_tokens.or(r.asked_input_tokens).unwrap_or(0);
    (u64::from(input), u64::from(r.output_tokens))
}

/// Each tenant's report, in the order given, over `records` (already without the warm-up; each
/// tagged with its tenant) and the level's `wall` time; and the fairness over them.
pub fn reports(
    tenants: &[Tenant],
    records: &[&Record],
    warmup: &[&Record],
    wall: Duration,
    slo: &crate::spec::Slo,
) -> (Vec<TenantReport>, Fairness) {
    let secs = wall.as_secs_f64().max(1e-9);
    let of = |name: &str| -> Vec<&Record> {
        records
            .iter()
            .copied()
            .filter(|r| r.tenant.as_deref() == Some(name))
            .collect()
    };
    let mut out: Vec<TenantReport> = tenants
        .iter()
        .map(|t| {
            let mine = of(&t.name);
            let served: Vec<&&Record> = mine.iter().filter(|r| r.ok()).collect();
            let status = |code| {
                mine.iter()
                    .filter(|r| r.outcome == Outcome::Status { code })
                    .count()
            };
            let refused_with_retry_after = mine
                .iter()
                .filter(|r| matches!(r.outcome, Outcome::Status { code: 429 | 503 }))
                .filter(|r| r.retry_after.is_some())
                .count();
            let mut error_kinds = BTreeMap::new();
            for r in mine
                .iter()
                .filter(|r| !r.ok() && !matches!(r.outcome, Outcome::Status { code: 429 | 503 }))
            {
                *error_kinds.entry(r.outcome.kind()).or_insert(0) += 1;
            }
            let (input, output) = served
                .iter()
                .map(|r| served_tokens(r))
                .fold((0, 0), |(a, b), (i, o)| (a + i, b + o));
            let pct = |v: Vec<f64>| Percentiles::of(&v);
            let mut queue: Vec<f64> = served
                .iter()
                .filter_map(|r| r.gateway_queue)
                .map(|d| d.as_secs_f64())
                .collect();
            queue.sort_by(f64::total_cmp);
            let waits: Vec<Duration> = mine.iter().filter_map(|r| r.retry_wait).collect();
            let good = mine.iter().filter(|r| within_slo(r, slo)).count();
            TenantReport {
                name: t.name.clone(),
                api_key_env: t.api_key_env.clone(),
                load: t.load,
                sent: mine.len(),
                served: served.len(),
                refused_429: status(429),
                refused_503: status(503),
                refused_with_retry_after,
                errors: error_kinds.values().sum(),
                error_kinds,
                served_share: 0.0,
                served_input_tokens: input,
                served_output_tokens: output,
                served_tokens: input + output,
                token_share: 0.0,
                throughput_rps: served.len() as f64 / secs,
                output_tokens_per_second: output as f64 / secs,
                goodput_share: if mine.is_empty() {
                    0.0
                } else {
                    good as f64 / mine.len() as f64
                },
                ttft: pct(values(&mine, crate::spec::Metric::Ttft)),
                itl: pct(values(&mine, crate::spec::Metric::Itl)),
                e2e: pct(values(&mine, crate::spec::Metric::E2e)),
                gateway_queue: pct(queue),
                retry_waits: (!waits.is_empty()).then(|| RetryWaits {
                    waits: waits.len(),
                    waited_seconds: waits.iter().map(Duration::as_secs_f64).sum(),
                }),
                warmup_requests: warmup
                    .iter()
                    .filter(|r| r.tenant.as_deref() == Some(t.name.as_str()))
                    .count(),
            }
        })
        .collect();
    let all_served: usize = out.iter().map(|t| t.served).sum();
    let all_tokens: u64 = out.iter().map(|t| t.served_tokens).sum();
    for t in &mut out {
        t.served_share = share(t.served as f64, all_served as f64);
        t.token_share = share(t.served_tokens as f64, all_tokens as f64);
    }
    let fairness = Fairness {
        tenants: out.len(),
        jain_served_tokens: jain(&out.iter().map(|t| t.served_tokens as f64).collect::<Vec<_>>()),
        jain_served_requests: jain(&out.iter().map(|t| t.served as f64).collect::<Vec<_>>()),
    };
    (out, fairness)
}

fn share(part: f64, whole: f64) -> f64 {
    if whole > 0.0 { part / whole } else { 0.0 }
}

/// The load of a level that runs every tenant at once, for its row: their clients added up when all
/// are closed-loop, their rates when all are open-loop; a mix shows its clients (each tenant's own
/// load is in its row of the tenants' table).
pub fn level_load(tenants: &[Tenant]) -> Load {
    let clients: u32 = tenants
        .iter()
        .filter_map(|t| match t.load {
            Load::Concurrency(c) => Some(c),
            Load::Rate(_) => None,
        })
        .sum();
    let rate: f64 = tenants
        .iter()
        .filter_map(|t| match t.load {
            Load::Rate(r) => Some(r),
            Load::Concurrency(_) => None,
        })
        .sum();
    if clients > 0 {
        Load::Concurrency(clients)
    } else {
        Load::Rate(rate)
    }
}

/// The name shared by the records of one tenant.
pub(crate) fn tag(name: &str) -> Arc<str> {
    Arc::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_index_of_known_shares() {
        // Equal shares: 1.
        assert_eq!(jain(&[5.0, 5.0, 5.0, 5.0]), Some(1.0));
        // One of n takes all: 1/n.
        assert_eq!(jain(&[12.0, 0.0, 0.0]), Some(1.0 / 3.0));
        // 85% and 15% (the FIFO flood): (100)² / (2 × (85² + 15²)) = 10000 / 14900.
        let j = jain(&[85.0, 15.0]).unwrap();
        assert!((j - 10_000.0 / 14_900.0).abs() < 1e-12, "{j}");
        // 3:1 by hand: 16 / (2 × 10) = 0.8.
        assert_eq!(jain(&[3.0, 1.0]), Some(0.8));
        // 1, 2, 3: 36 / (3 × 14).
        assert!((jain(&[1.0, 2.0, 3.0]).unwrap() - 36.0 / 42.0).abs() < 1e-12);
        assert_eq!(jain(&[0.0, 0.0]), None);
        assert_eq!(jain(&[]), None);
        assert_eq!(jain(&[7.0]), Some(1.0));
    }

    #[test]
    fn flags_name_a_key_variable_and_one_load() {
        assert_eq!(
            TenantSpec::parse_flag("team-a=TEAM_A_KEY:clients=24").unwrap(),
            TenantSpec {
                name: "team-a".into(),
                api_key_env: "TEAM_A_KEY".into(),
                clients: Some(24),
                rate: None
            }
        );
        let b = TenantSpec::parse_flag("b=KB:rate=2.5").unwrap();
        assert_eq!(b.load(), Ok(Load::Rate(2.5)));
        for (bad, needle) in [
            ("a", "expected NAME=KEY_ENV:clients=N"),
            ("a=K", "give clients=N (closed loop) or rate=R"),
            ("a=K:clients=0", "at least 1"),
            ("a=K:clients=x", "clients=\"x\" is not a whole number"),
            ("a=K:rate=-1", "positive number"),
            ("a=K:clients=2:rate=1", "not both"),
            ("a=K:weight=3", "unknown part \"weight=3\""),
            ("=K:clients=1", "tenant name \"\""),
            ("a b=K:clients=1", "tenant name \"a b\""),
            ("a=:clients=1", "api_key_env is empty"),
            ("a-very-long-tenant-name=K:clients=1", "1 to 16"),
        ] {
            let e = TenantSpec::parse_flag(bad).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }

    fn rec(tenant: &str, outcome: Outcome, ttft_ms: u64, input: u32, output: u32) -> Record {
        let mut r = Record::unanswered(Duration::ZERO, Duration::ZERO, false);
        r.tenant = Some(tag(tenant));
        r.outcome = outcome;
        if r.ok() {
            r.ttft = Some(Duration::from_millis(ttft_ms));
            r.e2e = Duration::from_millis(ttft_ms * 2);
            r.itl_us = vec![1000; output.saturating_sub(1) as usize];
        }
        r.input_tokens = Some(input);
        r.output_tokens = output;
        r
    }

    fn tenant(name: &str, clients: u32) -> Tenant {
        Tenant {
            name: name.into(),
            api_key_env: format!("{}_KEY", name.to_uppercase()),
            api_key: "secret".into(),
            load: Load::Concurrency(clients),
        }
    }

    #[test]
    fn each_tenant_counts_its_own_records_and_shares_add_up() {
        let mut refused = rec("b", Outcome::Status { code: 429 }, 0, 10, 0);
        refused.retry_after = Some(Duration::from_secs(1));
        let recs = [
            rec("a", Outcome::Ok, 10, 10, 4),
            rec("a", Outcome::Ok, 20, 10, 4),
            rec("a", Outcome::Ok, 30, 10, 4),
            rec("b", Outcome::Ok, 40, 10, 4),
            refused,
            rec("b", Outcome::Status { code: 429 }, 0, 10, 0),
            rec("b", Outcome::Status { code: 503 }, 0, 10, 0),
            rec("b", Outcome::Transport, 0, 10, 0),
            rec("a", Outcome::Ok, 5, 10, 4),
        ];
        let (measured, warm) = recs.split_at(8);
        let measured: Vec<&Record> = measured.iter().collect();
        let warm: Vec<&Record> = warm.iter().collect();
        let slo: crate::spec::Slo = "ttft_p95=25ms".parse().unwrap();
        let (t, f) = reports(
            &[tenant("a", 3), tenant("b", 1)],
            &measured,
            &warm,
            Duration::from_secs(2),
            &slo,
        );
        let (a, b) = (&t[0], &t[1]);
        assert_eq!((a.sent, a.served, a.refused_429, a.errors), (3, 3, 0, 0));
        assert_eq!(
            (b.sent, b.served, b.refused_429, b.refused_503, b.errors),
            (5, 1, 2, 1, 1)
        );
        assert_eq!(b.refused_with_retry_after, 1);
        assert_eq!(b.error_kinds.get("transport"), Some(&1));
        assert_eq!(a.sent + b.sent, measured.len());
        assert_eq!((a.served_share, b.served_share), (0.75, 0.25));
        assert_eq!((a.served_tokens, b.served_tokens), (42, 14));
        assert_eq!(a.token_share + b.token_share, 1.0);
        assert_eq!(a.ttft.unwrap().p50, 0.02);
        assert_eq!(b.ttft.unwrap().count, 1);
        assert_eq!(a.goodput_share, 2.0 / 3.0);
        assert_eq!((a.warmup_requests, b.warmup_requests), (1, 0));
        assert_eq!(a.throughput_rps, 1.5);
        // Served requests 3 and 1: 16 / (2 × 10).
        assert_eq!(f.jain_served_requests, Some(0.8));
        assert_eq!(f.jain_served_tokens, Some(0.8));
        assert_eq!(f.tenants, 2);
    }

    #[test]
    fn the_level_shows_the_clients_or_the_rates_added_up() {
        assert_eq!(
            level_load(&[tenant("a", 3), tenant("b", 1)]),
            Load::Concurrency(4)
        );
        let mut open = tenant("c", 1);
        open.load = Load::Rate(2.5);
        let mut open2 = open.clone();
        open2.load = Load::Rate(1.0);
        assert_eq!(level_load(&[open.clone(), open2]), Load::Rate(3.5));
        assert_eq!(level_load(&[tenant("a", 3), open]), Load::Concurrency(3));
        assert!(!format!("{:?}", tenant("a", 1)).contains("secret"));
    }
}
