//! What was measured: a `spillway bench` result read for the figures a plan needs, or the same
//! figures measured with another tool (`vllm bench serve`, GuideLLM, AIPerf).

use std::time::Duration;

use bench_schema::spec::{Api, Load, Metric, Phase, Slo};
use bench_schema::stats::Percentiles;
use serde::Deserialize;

use crate::PlanError;

/// The schema `spillway bench --json` writes.
pub const BENCH_SCHEMA: &str = "spillway-bench/1";

/// A figure and where it came from, so that every line of arithmetic can say so.
#[derive(Debug, Clone, PartialEq)]
pub struct Sourced<T> {
    pub value: T,
    pub from: String,
}

impl<T> Sourced<T> {
    pub fn new(value: T, from: impl Into<String>) -> Self {
        Sourced {
            value,
            from: from.into(),
        }
    }
}

/// The figures a plan is made from.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// One replica's safe concurrency: its SLOs hold and its queue recovers after a burst.
    pub c_safe: Sourced<u32>,
    /// Stable requests per second at the safe load, over `throughput_replicas` replicas.
    pub throughput: Sourced<f64>,
    pub throughput_replicas: u32,
    /// One replica's knee: the first concurrency that failed, when one was measured.
    pub knee: Option<Sourced<f64>>,
    /// The 99th percentiles at the safe load, for the timeouts.
    pub ttft_tail: Option<Sourced<Duration>>,
    pub itl_tail: Option<Sourced<Duration>>,
    pub e2e_tail: Option<Sourced<Duration>>,
    /// The objectives the measurement was judged by.
    pub slo: Option<Objectives>,
    /// The model name the measurement sent.
    pub model: Option<String>,
    /// The URL the bench sent its requests to: a replica, or whatever balanced them.
    pub target_url: Option<String>,
    /// The model's context as the measured server published it.
    pub max_model_len: Option<u32>,
    /// The API the bench drove (`--api`): its figures hold for traffic of that API.
    pub api: Option<Api>,
    /// The longest answer the measurement asked for, when its lengths had a maximum: the budgets
    /// derived from its tails hold for answers up to this many tokens.
    pub output_cap: Option<Sourced<u32>>,
    /// What a reader of the plan should doubt about the measurement.
    pub caveats: Vec<String>,
}

/// The latency objectives of the measurement (the smallest limit given for each metric).
#[derive(Debug, Clone, PartialEq)]
pub struct Objectives {
    /// As written, e.g. `ttft_p95=1s,itl_p95=50ms`.
    pub text: String,
    pub ttft: Option<Duration>,
    pub itl: Option<Duration>,
}

impl Objectives {
    pub(crate) fn parse(text: &str) -> Result<Objectives, String> {
        let slo: Slo = text.parse()?;
        Ok(Objectives {
            text: text.to_owned(),
            ttft: slo.limit(Metric::Ttft),
            itl: slo.limit(Metric::Itl),
        })
    }
}

/// Figures measured with another tool, as `spillway plan --c-safe 15 --throughput 6` gives them.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    /// One replica's safe concurrency.
    pub c_safe: u32,
    /// Stable requests per second of the whole backend (every replica) at that load.
    pub throughput: f64,
    pub ttft_p99: Option<Duration>,
    pub itl_p99: Option<Duration>,
    pub e2e_p99: Option<Duration>,
}

impl Measurement {
    /// From figures measured elsewhere; `replicas` is the backend the throughput was measured on.
    pub fn from_figures(f: &Figures, replicas: u32) -> Result<Measurement, PlanError> {
        if f.c_safe == 0 {
            return Err(PlanError::Input(
                "--c-safe 0: a replica that cannot hold one request safely cannot be planned for".into(),
            ));
        }
        if !(f.throughput.is_finite() && f.throughput > 0.0) {
            return Err(PlanError::Input(format!(
                "--throughput {}: must be a positive number of requests per second",
                f.throughput
            )));
        }
        let tail = |d: Option<Duration>, flag: &str| d.map(|d| Sourced::new(d, flag.to_owned()));
        Ok(Measurement {
            c_safe: Sourced::new(f.c_safe, "--c-safe"),
            throughput: Sourced::new(f.throughput, "--throughput, the whole backend"),
            throughput_replicas: replicas.max(1),
            knee: None,
            ttft_tail: tail(f.ttft_p99, "--ttft-p99"),
            itl_tail: tail(f.itl_p99, "--itl-p99"),
            e2e_tail: tail(f.e2e_p99, "--e2e-p99"),
            slo: None,
            model: None,
            target_url: None,
            max_model_len: None,
            api: None,
            output_cap: None,
            caveats: Vec::new(),
        })
    }

    /// From the JSON `spillway bench --json` wrote (`file` names it in messages), measured against
    /// `measured_replicas` replicas behind the bench's target.
    pub fn from_bench_json(text: &str, file: &str, measured_replicas: u32) -> Result<Measurement, PlanError> {
        let not_bench = |detail: String| PlanError::NotBench {
            file: file.to_owned(),
            detail,
        };
        let probe: Probe = serde_json::from_str(text).map_err(|e| not_bench(e.to_string()))?;
        if probe.schema != BENCH_SCHEMA {
            return Err(PlanError::Schema {
                file: file.to_owned(),
                found: probe.schema,
            });
        }
        let run: BenchView = serde_json::from_str(text).map_err(|e| not_bench(e.to_string()))?;
        if measured_replicas == 0 {
            return Err(PlanError::Input("--measured-replicas must be at least 1".into()));
        }
        let Some(safe) = run.safe else {
            return Err(PlanError::NoSafeLoad {
                file: file.to_owned(),
                knee: run.knee.map_or(String::new(), |k| {
                    format!(" (the first, {}, already failed)", show(k))
                }),
            });
        };
        let level = run
            .levels
            .iter()
            .rev()
            .find(|l| l.load == safe && l.pass && l.phase != Phase::LongMix)
            .ok_or_else(|| not_bench(format!("the safe load {} has no passing level", show(safe))))?;
        let m = measured_replicas;
        let at = format!("{file} at {}", show(safe));
        let over = if m == 1 {
            "one measured replica".to_owned()
        } else {
            format!("{m} measured replicas")
        };
        let throughput = level.stats.throughput_rps;
        let c_total = match safe {
            Load::Concurrency(c) => Sourced::new(c, format!("{file}: safe load {} over {over}", show(safe))),
            Load::Rate(_) => {
                // Little's law with the rate actually served, which an open loop can fall short of.
                let e2e = level.stats.e2e.map_or(0.0, |p| p.mean);
                let raw = crate::units::littles_law(throughput, Duration::from_secs_f64(e2e.max(0.0)));
                let in_flight = crate::units::floor(raw);
                Sourced::new(
                    in_flight,
                    format!(
                        "{file}: at the safe rate {}, measured {} req/s × mean e2e {} s = {} → {in_flight} in flight (Little's law) over {over}",
                        show(safe),
                        crate::units::num(throughput),
                        crate::units::num(e2e),
                        crate::units::num(raw),
                    ),
                )
            }
        };
        let c_safe = c_total.value / m;
        if c_safe == 0 {
            return Err(PlanError::Input(format!(
                "{file}: the safe load {} over {m} measured replicas is under one request per replica",
                show(safe)
            )));
        }
        let mut caveats = Vec::new();
        if let Some(d) = &level.distorted {
            caveats.push(format!(
                "the bench flagged its safe level as distorted by the client's own lag ({d}): its latencies are suspect"
            ));
        }
        if let Some(t) = &level.too_short {
            caveats.push(format!(
                "the bench's safe level was too short to be a steady state ({t})"
            ));
        }
        if !run.bursts.iter().any(|b| b.load == safe && b.recovered) {
            caveats.push(
                "no burst phase confirmed the safe load: it held the SLOs, but recovery after a burst was not checked"
                    .into(),
            );
        }
        let tail = |p: Option<Percentiles>, what: &str| {
            p.map(|p| {
                Sourced::new(
                    Duration::from_secs_f64(p.p99.max(0.0)),
                    format!("{what} p99, {at}"),
                )
            })
        };
        let slo = match run.parameters.as_ref().map(|p| p.slo.as_str()) {
            Some(text) => {
                Some(Objectives::parse(text).map_err(|e| not_bench(format!("parameters.slo: {e}")))?)
            }
            None => None,
        };
        Ok(Measurement {
            c_safe: Sourced::new(
                c_safe,
                if m == 1 {
                    c_total.from
                } else {
                    format!("{}; floor({} ÷ {m}) = {c_safe}", c_total.from, c_total.value)
                },
            ),
            throughput: Sourced::new(throughput, format!("{at}, {over}")),
            throughput_replicas: m,
            knee: match run.knee {
                Some(Load::Concurrency(k)) => Some(Sourced::new(
                    f64::from(k) / f64::from(m),
                    format!("{file}: knee {} over {over}", show(Load::Concurrency(k))),
                )),
                _ => None,
            },
            ttft_tail: tail(level.stats.ttft, "TTFT"),
            itl_tail: tail(level.stats.itl, "ITL"),
            e2e_tail: tail(level.stats.e2e, "e2e"),
            slo,
            output_cap: run.parameters.as_ref().and_then(|p| p.output_cap(file)),
            target_url: run.parameters.as_ref().map(|p| p.url.clone()),
            max_model_len: run.parameters.as_ref().and_then(|p| p.max_model_len),
            api: run.parameters.as_ref().and_then(|p| p.api.or(p.endpoint)),
            model: run.parameters.map(|p| p.model),
            caveats,
        })
    }
}

fn show(load: Load) -> String {
    match load {
        Load::Concurrency(c) => format!("C={c}"),
        Load::Rate(r) => format!("{r} req/s"),
    }
}

/// The schema alone, read first so that another file gets the schema error, not a field error.
#[derive(Deserialize)]
struct Probe {
    schema: String,
}

/// The parts of `spillway-bench/1` a plan reads. The bench's own `Report` keeps `&'static str`s
/// and custom serializers made for writing; the leaf types (`Load`, `Phase`, `Percentiles`) and the
/// SLO parser are the bench crate's own.
#[derive(Deserialize)]
struct BenchView {
    #[serde(default)]
    parameters: Option<ParametersView>,
    #[serde(default)]
    levels: Vec<LevelView>,
    #[serde(default)]
    bursts: Vec<BurstView>,
    knee: Option<Load>,
    safe: Option<Load>,
}

#[derive(Deserialize)]
struct ParametersView {
    model: String,
    slo: String,
    #[serde(default)]
    url: String,
    #[serde(default)]
    max_model_len: Option<u32>,
    /// Absent from results written before `--api`, which said `endpoint` (chat or completions).
    #[serde(default)]
    api: Option<Api>,
    #[serde(default)]
    endpoint: Option<Api>,
    #[serde(default)]
    output_len: Option<LengthView>,
    #[serde(default)]
    dataset: Option<String>,
}

/// `LengthDist` as the bench writes it; only fixed and uniform lengths have a maximum.
#[derive(Deserialize)]
struct LengthView {
    kind: String,
    #[serde(default)]
    tokens: Option<u32>,
    #[serde(default)]
    max: Option<u32>,
}

impl ParametersView {
    /// The longest answer the bench asked for, when it had one: dataset prompts carry their own
    /// lengths and normal or lognormal lengths have no maximum.
    fn output_cap(&self, file: &str) -> Option<Sourced<u32>> {
        let len = self.output_len.as_ref().filter(|_| self.dataset.is_none())?;
        let cap = match len.kind.as_str() {
            "fixed" => len.tokens?,
            "uniform" => len.max?,
            _ => return None,
        };
        Some(Sourced::new(
            cap,
            format!("{file}: the longest answer the bench asked for (--output-len)"),
        ))
    }
}

#[derive(Deserialize)]
struct LevelView {
    phase: Phase,
    load: Load,
    stats: StatsView,
    pass: bool,
    #[serde(default)]
    distorted: Option<String>,
    #[serde(default)]
    too_short: Option<String>,
}

#[derive(Deserialize)]
struct StatsView {
    throughput_rps: f64,
    ttft: Option<Percentiles>,
    itl: Option<Percentiles>,
    e2e: Option<Percentiles>,
}

#[derive(Deserialize)]
struct BurstView {
    load: Load,
    recovered: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench_json(safe: &str, knee: &str, bursts: &str) -> String {
        format!(
            r#"{{"schema":"spillway-bench/1","parameters":{{"model":"m","slo":"ttft_p95=1s,itl_p95=50ms"}},
            "levels":[
              {{"phase":"baseline","load":{{"concurrency":1}},"pass":true,
                "stats":{{"throughput_rps":1.0,"ttft":null,"itl":null,"e2e":null}}}},
              {{"phase":"staircase","load":{{"concurrency":16}},"pass":true,
                "stats":{{"throughput_rps":12.5,
                  "ttft":{{"count":10,"mean":0.1,"p50":0.1,"p90":0.2,"p95":0.25,"p99":0.3,"max":0.4}},
                  "itl":{{"count":10,"mean":0.01,"p50":0.01,"p90":0.02,"p95":0.02,"p99":0.03,"max":0.05}},
                  "e2e":{{"count":10,"mean":1.0,"p50":1.0,"p90":1.1,"p95":1.2,"p99":1.3,"max":1.5}}}}}}
            ],
            "bursts":{bursts},"knee":{knee},"safe":{safe}}}"#
        )
    }

    #[test]
    fn reads_the_safe_level_and_its_tails() {
        let text = bench_json(
            r#"{"concurrency":16}"#,
            r#"{"concurrency":17}"#,
            r#"[{"load":{"concurrency":16},"recovered":true}]"#,
        );
        let m = Measurement::from_bench_json(&text, "r.json", 2).unwrap();
        assert_eq!(m.c_safe.value, 8);
        assert_eq!(m.throughput.value, 12.5);
        assert_eq!(m.throughput_replicas, 2);
        assert_eq!(m.knee.as_ref().map(|k| k.value), Some(8.5));
        assert_eq!(
            m.ttft_tail.as_ref().map(|t| t.value),
            Some(Duration::from_millis(300))
        );
        assert_eq!(
            m.e2e_tail.as_ref().map(|t| t.value),
            Some(Duration::from_millis(1300))
        );
        assert_eq!(
            m.slo.as_ref().and_then(|s| s.itl),
            Some(Duration::from_millis(50))
        );
        assert_eq!(m.model.as_deref(), Some("m"));
        assert!(m.caveats.is_empty(), "{:?}", m.caveats);
    }

    #[test]
    fn an_open_loop_safe_rate_becomes_a_concurrency_by_littles_law() {
        let text = r#"{"schema":"spillway-bench/1","parameters":{"model":"m","slo":"ttft_p95=1s"},
            "levels":[{"phase":"staircase","load":{"rate":6.0},"pass":true,
              "stats":{"throughput_rps":6.0,"ttft":null,"itl":null,
                "e2e":{"count":10,"mean":2.5,"p50":2.4,"p90":3.0,"p95":3.1,"p99":3.2,"max":3.5}}}],
            "bursts":[],"knee":{"rate":8.0},"safe":{"rate":6.0}}"#;
        let m = Measurement::from_bench_json(text, "r.json", 1).unwrap();
        // 6 req/s × 2.5 s in the system = 15 in flight.
        assert_eq!(m.c_safe.value, 15);
        assert!(m.c_safe.from.contains("Little's law"), "{}", m.c_safe.from);
        assert_eq!(m.knee, None, "a rate knee says nothing about concurrency");
    }

    #[test]
    fn an_open_loop_line_multiplies_the_numbers_it_prints() {
        // An open loop that served less than it offered: the rate served is what Little's law takes.
        let text = r#"{"schema":"spillway-bench/1","parameters":{"model":"m","slo":"ttft_p95=1s"},
            "levels":[{"phase":"staircase","load":{"rate":16.0},"pass":true,
              "stats":{"throughput_rps":14.04,"ttft":null,"itl":null,
                "e2e":{"count":10,"mean":0.993,"p50":0.9,"p90":1.0,"p95":1.1,"p99":1.2,"max":1.3}}}],
            "bursts":[],"knee":null,"safe":{"rate":16.0}}"#;
        let m = Measurement::from_bench_json(text, "r.json", 1).unwrap();
        assert_eq!(m.c_safe.value, 13);
        assert!(
            m.c_safe.from.contains(
                "at the safe rate 16 req/s, measured 14.04 req/s × mean e2e 0.993 s = 13.942 → 13 in flight"
            ),
            "{}",
            m.c_safe.from
        );
    }

    /// The API the bench drove: `api` since there were four, `endpoint` in results from before,
    /// nothing when the result says neither.
    #[test]
    fn the_api_driven_is_read_from_api_or_from_the_older_endpoint() {
        let with = |fields: &str| {
            let text = bench_json(r#"{"concurrency":16}"#, "null", "[]").replace(
                r#""slo":"ttft_p95=1s,itl_p95=50ms""#,
                &format!(r#""slo":"ttft_p95=1s,itl_p95=50ms"{fields}"#),
            );
            Measurement::from_bench_json(&text, "r.json", 1).unwrap().api
        };
        assert_eq!(
            with(r#","api":"messages","endpoint":"messages""#),
            Some(Api::Messages)
        );
        assert_eq!(with(r#","endpoint":"completions""#), Some(Api::Completions));
        assert_eq!(with(""), None);
    }

    #[test]
    fn the_longest_answer_asked_for_is_the_output_cap() {
        let with = |output_len: &str, dataset: &str| {
            bench_json(r#"{"concurrency":16}"#, "null", "[]").replace(
                r#""slo":"ttft_p95=1s,itl_p95=50ms""#,
                &format!(
                    r#""slo":"ttft_p95=1s,itl_p95=50ms","url":"http://10.0.0.5:8000","max_model_len":4096,"output_len":{output_len},"dataset":{dataset}"#
                ),
            )
        };
        let m = Measurement::from_bench_json(&with(r#"{"kind":"fixed","tokens":32}"#, "null"), "r.json", 1)
            .unwrap();
        assert_eq!(m.output_cap.map(|c| c.value), Some(32));
        assert_eq!(m.target_url.as_deref(), Some("http://10.0.0.5:8000"));
        assert_eq!(m.max_model_len, Some(4096));
        let uniform = with(r#"{"kind":"uniform","min":16,"max":64}"#, "null");
        let m = Measurement::from_bench_json(&uniform, "r.json", 1).unwrap();
        assert_eq!(m.output_cap.map(|c| c.value), Some(64));
        let normal = with(r#"{"kind":"normal","mean":200.0,"sd":50.0}"#, "null");
        assert_eq!(
            Measurement::from_bench_json(&normal, "r.json", 1)
                .unwrap()
                .output_cap,
            None
        );
        let dataset = with(r#"{"kind":"fixed","tokens":32}"#, r#""sharegpt.json""#);
        assert_eq!(
            Measurement::from_bench_json(&dataset, "r.json", 1)
                .unwrap()
                .output_cap,
            None
        );
    }

    #[test]
    fn a_safe_load_no_burst_confirmed_is_a_caveat() {
        let text = bench_json(r#"{"concurrency":16}"#, "null", "[]");
        let m = Measurement::from_bench_json(&text, "r.json", 1).unwrap();
        assert!(m.caveats[0].contains("recovery after a burst was not checked"));
    }

    #[test]
    fn another_schema_and_no_safe_load_are_named() {
        let other = r#"{"schema":"guidellm/2"}"#;
        let e = Measurement::from_bench_json(other, "x.json", 1).unwrap_err();
        assert!(
            e.to_string()
                .contains(r#"schema "guidellm/2" is not spillway-bench/1"#),
            "{e}"
        );
        let none = bench_json("null", r#"{"concurrency":1}"#, "[]");
        let e = Measurement::from_bench_json(&none, "x.json", 1).unwrap_err();
        assert!(
            e.to_string()
                .contains("no level passed its SLOs (the first, C=1, already failed)"),
            "{e}"
        );
        let e = Measurement::from_bench_json("[1, 2]", "x.json", 1).unwrap_err();
        assert!(
            e.to_string().starts_with("x.json: not a spillway bench result"),
            "{e}"
        );
    }
}
