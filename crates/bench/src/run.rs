//! The seed's four phases as one run — baseline, staircase with bisection, long mix, sustained load
//! with a burst — and the safe load they find: the largest level whose SLOs hold *and* whose queue
//! and TTFT recover after a burst.

mod burst;
mod fit;
mod replay;
mod tenants;

pub use burst::recovery;
pub use fit::{DEFAULT_LONG_INPUT, DEFAULT_LONG_OUTPUT, Fitted, fit, refit};

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::client::{Client, Record, Target};
pub use crate::error::BenchError;
use crate::load::{Driver, LevelRun, Sink, Stop};
use crate::progress::Progress;
pub use crate::result::{
    BurstReport, DRIFT_WARNING, LevelReport, Parameters, PromptDrift, Report, TimelinePoint, Tool,
};
use crate::spec::{Arrivals, LengthDist, Load, Phase, Slo};
use crate::stats::{LevelStats, Percentiles};
use crate::watch::{LoopLag, QueueSummary, QueueWatch};
use crate::workload::Workload;

/// Everything a run is asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    pub target: Target,
    /// The name of the variable the key came from, for the report (never the key).
    pub api_key_env: Option<String>,
    /// Staircase levels; empty: 1, 2, 4, … up to `max_concurrency`.
    pub loads: Vec<Load>,
    pub arrivals: Arrivals,
    pub stop: Stop,
    /// Requests scheduled this early in a level are sent but left out of its statistics (the first
    /// wave opens connections and fills an empty server).
    pub warmup: Duration,
    pub workload: Workload,
    pub input_len: LengthDist,
    pub output_len: LengthDist,
    pub dataset: Option<String>,
    pub slo: Slo,
    /// Each replica's `/metrics` (vLLM's or Spillway's), watched together: their queues summed.
    pub metrics_urls: Vec<String>,
    pub phases: Vec<Phase>,
    pub long_share: f64,
    /// The long mix's lengths; `None`: [`DEFAULT_LONG_INPUT`] and [`DEFAULT_LONG_OUTPUT`], shortened
    /// to fit the served model's context when the server publishes it.
    pub long_input: Option<LengthDist>,
    pub long_output: Option<LengthDist>,
    pub burst_factor: f64,
    pub burst_length: Duration,
    /// How long after a burst the queue and TTFT may take to recover.
    pub recovery_timeout: Duration,
    pub max_concurrency: u32,
    pub max_in_flight: usize,
    pub seed: u64,
    pub keep_records: bool,
    pub quiet: bool,
}

struct Ctx {
    opts: Options,
    max_model_len: Option<u32>,
    fitted: Fitted,
    /// Tokens the server's chat template adds to a prompt, from the first request.
    template_tokens: Option<u32>,
    driver: Driver,
    watch: Option<QueueWatch>,
    lag: LoopLag,
    progress: Progress,
    sink: Sink,
    levels: Vec<LevelReport>,
    extras: Extras,
    /// One client per tenant, each with its key, and its load (a multi-tenant run only).
    tenant_clients: Vec<(Client, Load)>,
}

/// What a run does beyond [`Options`]; apart from it so that code which builds `Options` field by
/// field keeps compiling.
#[derive(Default)]
pub struct Extras {
    /// Closed loop: after an answer with `Retry-After`, a client waits that long before its next
    /// request, as a well-behaved client does; the waits are reported apart from the latencies.
    pub honor_retry_after: bool,
    /// Called with each level's report as the level ends (a burst's level too, judged by its
    /// recovery): for a caller that shows the table growing, as the demo does.
    pub on_level: Option<OnLevel>,
    /// Several tenants at once, each with its own key and load: the run is then one level of
    /// [`Options::stop`]'s length with every tenant's load together, reported per tenant, instead
    /// of the phases (`loads`, `phases` and the target's key are not used). With
    /// [`Stop::Requests`], each tenant sends that many.
    pub tenants: Vec<crate::tenants::Tenant>,
    /// Each request draws an objective class by share and sends its objectives as
    /// `x-spillway-slo-ttft-ms` / `x-spillway-slo-tpot-ms`; each level reports every class
    /// against its own objectives ([`LevelReport::slo_classes`]).
    pub slo_mix: Option<crate::slo_mix::SloMix>,
    /// A trace sent on its timestamps: the run is then that one level, in place of the phases
    /// (`loads`, `stop` and `phases` are not used), judged by the SLOs like any level.
    pub replay: Option<crate::replay::Replay>,
}

/// See [`Extras::on_level`].
pub type OnLevel = Box<dyn Fn(&LevelReport) + Send + Sync>;

/// Runs every requested phase against the target and reports.
pub async fn run(opts: Options) -> Result<Report, BenchError> {
    run_with(opts, Extras::default()).await
}

/// [`run`], with [`Extras`].
pub async fn run_with(mut opts: Options, extras: Extras) -> Result<Report, BenchError> {
    if !extras.tenants.is_empty() {
        // One level of every tenant at once, in place of the phases (and of their long mix).
        opts.phases = vec![Phase::Tenants];
        opts.loads = vec![crate::tenants::level_load(&extras.tenants)];
    }
    if let Some(replay) = &extras.replay {
        opts.phases = vec![Phase::Replay];
        opts.loads = vec![Load::Rate(replay.info().rate)];
    }
    let started_at = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let epoch = Instant::now();
    let client = Client::new(opts.target.clone())?
        .honoring_retry_after(extras.honor_retry_after)
        .with_slo_mix(extras.slo_mix.clone());
    let tenant_clients = tenants::clients(&client, &extras.tenants)?;
    let template_tokens = match tenant_clients.first() {
        None => preflight(&client).await?,
        Some(_) => {
            // Every key first: a wrong one stops the run at once, naming its tenant.
            let mut template_tokens = None;
            for ((c, _), t) in tenant_clients.iter().zip(&extras.tenants) {
                let tokens = preflight(c).await.map_err(|e| BenchError::Tenant {
                    name: t.name.clone(),
                    error: Box::new(e),
                })?;
                template_tokens = template_tokens.or(tokens);
            }
            template_tokens
        }
    };
    let max_model_len = tenant_clients
        .first()
        .map_or(&client, |(c, _)| c)
        .max_model_len()
        .await;
    let fitted = fit(&opts, max_model_len)?;
    let watch = if opts.metrics_urls.is_empty() {
        None
    } else {
        Some(
            QueueWatch::start(
                &opts.metrics_urls,
                Duration::from_millis(100),
                epoch,
                opts.target.ca_cert.as_deref(),
            )
            .await?,
        )
    };
    let driver = Driver {
        client,
        epoch,
        arrivals: opts.arrivals,
        max_in_flight: opts.max_in_flight,
        seed: opts.seed,
        levels: Arc::new(AtomicU64::new(0)),
    };
    let progress = Progress::new(opts.quiet);
    for note in &fitted.notes {
        progress.println(format!("note: {note}"));
    }
    let mut ctx = Ctx {
        max_model_len,
        fitted,
        template_tokens,
        progress,
        lag: LoopLag::start(epoch),
        sink: Sink::default(),
        levels: Vec::new(),
        extras,
        watch,
        driver,
        opts,
        tenant_clients,
    };
    let report = ctx.phases(started_at).await;
    ctx.progress.finish();
    Ok(report)
}

/// One small request first, so a target that is down or a wrong model fails the run at once with
/// the server's own words. Its one-word prompt's count says how many tokens the server's chat
/// template adds to every prompt.
async fn preflight(client: &Client) -> Result<Option<u32>, BenchError> {
    let url = client.target().url.clone();
    let prompt = crate::workload::Prompt {
        text: "the".into(),
        max_tokens: 2,
        long: false,
        input_tokens: Some(1),
    };
    let now = Instant::now();
    let rec = client.send(&prompt, now, now).await;
    let detail = rec.error.clone().unwrap_or_default();
    match rec.outcome {
        crate::client::Outcome::Ok => Ok(rec.input_tokens.map(|n| n.saturating_sub(1))),
        crate::client::Outcome::Transport => Err(BenchError::Unreachable { url, detail }),
        crate::client::Outcome::Status { code } if code != 429 && code != 503 => {
            let mut message = detail;
            if code == 404
                && let Some(models) = client.models().await.filter(|m| !m.is_empty())
            {
                message.push_str(&format!(" (the target serves: {})", models.join(", ")));
            }
            Err(BenchError::Rejected {
                url,
                status: code,
                message,
            })
        }
        // A busy target is a state to measure, not a reason to stop.
        _ => Ok(None),
    }
}

impl Ctx {
    /// The prompts' drift over the levels run so far.
    fn prompt_drift(&self) -> Option<PromptDrift> {
        let tokens = self
            .levels
            .iter()
            .filter_map(|l| l.stats.prompt_tokens)
            .reduce(std::ops::Add::add)?;
        PromptDrift::of(tokens, self.template_tokens)
    }

    fn default_loads(&self) -> Vec<Load> {
        if !self.opts.loads.is_empty() {
            return self.opts.loads.clone();
        }
        std::iter::successors(Some(1u32), |c| c.checked_mul(2))
            .take_while(|c| *c <= self.opts.max_concurrency)
            .map(Load::Concurrency)
            .collect()
    }

    async fn level(&mut self, phase: Phase, load: Load, workload: Option<Workload>) -> LevelReport {
        let workload = workload.unwrap_or_else(|| self.opts.workload.clone());
        let ticker = self.progress.level(phase, load, self.sink.clone());
        let run = self
            .driver
            .run(load, self.opts.stop, &workload, None, self.sink.clone())
            .await;
        drop(ticker);
        let report = self.judge(phase, load, run, phase == Phase::LongMix);
        self.kept(report)
    }

    /// Tells [`Extras::on_level`], if set, that a level ended.
    /// A level judged: its line on the terminal, the caller's hook, and kept for the report.
    fn kept(&mut self, report: LevelReport) -> LevelReport {
        self.progress.println(crate::report::one_line_for(
            &report,
            crate::report::Width::of_stderr(),
        ));
        self.level_done(&report);
        self.levels.push(report.clone());
        report
    }

    pub(crate) fn level_done(&self, report: &LevelReport) {
        if let Some(on_level) = &self.extras.on_level {
            on_level(report);
        }
    }

    fn judge(&self, phase: Phase, load: Load, run: LevelRun, split: bool) -> LevelReport {
        let slo = &self.opts.slo;
        let warm = self.opts.warmup;
        let all: Vec<&Record> = run.records.iter().filter(|r| r.scheduled >= warm).collect();
        let warmup_requests = run.records.len() - all.len();
        let wall = run.end.saturating_sub(run.start + warm);
        let stats = LevelStats::compute(&all, wall, slo);
        let slo_classes = self
            .extras
            .slo_mix
            .as_ref()
            .map(|mix| crate::slo_mix::reports(mix, &all, wall))
            .unwrap_or_default();
        let (short, long) = if split {
            let (l, s): (Vec<&Record>, Vec<&Record>) = all.iter().partition(|r| r.long);
            (
                Some(LevelStats::compute(&s, wall, slo)),
                Some(LevelStats::compute(&l, wall, slo)),
            )
        } else {
            (None, None)
        };
        // Skip the first half second: the queue of the level before may still be draining.
        let queue = self.watch.as_ref().and_then(|w| {
            let from = (run.start + Duration::from_millis(500)).min(run.end);
            QueueSummary::of(
                &w.between(from, run.end),
                match load {
                    Load::Concurrency(c) => Some(c),
                    Load::Rate(_) => None,
                },
            )
        });
        let lag = Percentiles::of(&self.lag.between(run.start, run.end));
        let distorted = distortion(&stats, lag.as_ref(), run.unsent);
        // A closed loop needs each client to have gone round a few times; fewer, and the level
        // measured its first wave, not its steady state.
        let too_short = match load {
            Load::Concurrency(c) if stats.requests < 2 * c as usize => Some(format!(
                "only {} requests measured for {c} clients: lengthen --duration (or shorten --warmup) for a steady state",
                stats.requests
            )),
            _ => None,
        };
        // The long mix asks what long requests do to the others: its latency targets are judged on
        // the short requests alone (a long prompt's own prefill is expected to take longer), its
        // error rate on every request.
        let is_error_rate = |v: &&crate::stats::Verdict| v.target.starts_with("error_rate");
        let judged: Vec<(&str, &crate::stats::Verdict)> = match &short {
            Some(short) => short
                .verdicts
                .iter()
                .filter(|v| !is_error_rate(v))
                .map(|v| ("short requests: ", v))
                .chain(stats.verdicts.iter().filter(is_error_rate).map(|v| ("", v)))
                .collect(),
            None => stats.verdicts.iter().map(|v| ("", v)).collect(),
        };
        let mut reasons: Vec<String> = judged
            .into_iter()
            .filter(|(_, v)| !v.pass)
            .map(|(whose, v)| match v.observed {
                Some(o) if v.target.starts_with("error_rate") => format!(
                    "{whose}{} (observed {})",
                    v.target,
                    crate::report::percent_against(o, v.limit)
                ),
                Some(o) => format!(
                    "{whose}{} (observed {})",
                    v.target,
                    crate::report::secs_against(o, v.limit).0
                ),
                None => format!("{whose}{} (nothing measured)", v.target),
            })
            .collect();
        if stats.ok == 0 {
            reasons.push("no request succeeded".into());
        }
        if queue.as_ref().is_some_and(|q| !q.drains) {
            reasons.push("the server's waiting queue did not drain".into());
        }
        let mut error_examples = std::collections::BTreeMap::new();
        for r in run.records.iter().filter(|r| !r.ok()) {
            if let Some(e) = &r.error {
                error_examples
                    .entry(r.outcome.kind())
                    .or_insert_with(|| e.clone());
            }
        }
        LevelReport {
            error_examples,
            slo_classes,
            phase,
            load,
            start: run.start,
            end: run.end,
            stats,
            short,
            long,
            queue,
            client_loop_lag: lag,
            unsent: run.unsent,
            warmup_requests,
            distorted,
            too_short,
            pass: reasons.is_empty(),
            reasons,
            records: self.opts.keep_records.then_some(run.records),
        }
    }

    /// The phases asked for, in the seed's order, and the report over them; or the tenants' one
    /// level, or a trace's replay, in their place.
    async fn phases(&mut self, started_at: String) -> Report {
        let loads = self.default_loads();
        if let Some(replay) = self.extras.replay.clone() {
            let level = self.replay_level(&replay).await;
            let summary = replay::summarize(&replay, &level);
            let found = Found {
                loads,
                summary,
                ..Found::default()
            };
            return self.finish(started_at, found);
        }
        // Several tenants run one level together, in place of the phases.
        let tenant_run = !self.tenant_clients.is_empty();
        let phases = self.opts.phases.clone();
        let (tenants, fairness) = if tenant_run {
            let (tenants, fairness) = self.tenants_level(loads[0]).await;
            (tenants, Some(fairness))
        } else {
            (Vec::new(), None)
        };
        let lowest = loads
            .iter()
            .copied()
            .min_by(|a, b| a.value().total_cmp(&b.value()))
            .unwrap_or(Load::Concurrency(1));
        let mut passed: Vec<Load> = Vec::new();
        let baseline = if phases.contains(&Phase::Baseline) {
            Some(self.baseline(lowest, &mut passed).await)
        } else {
            None
        };
        let knee = if phases.contains(&Phase::Staircase) {
            self.staircase(&loads, baseline, &mut passed).await
        } else {
            None
        };
        let highest_first = |v: &mut Vec<Load>| {
            v.sort_by(|a, b| b.value().total_cmp(&a.value()));
            v.dedup();
        };
        highest_first(&mut passed);
        // Only a level whose SLOs were judged and held may be named safe. Without a staircase the
        // loads asked for are still where the long mix and the burst run: running there is no pass.
        let candidate = passed.first().copied();
        let mut tries = passed.clone();
        if !phases.contains(&Phase::Staircase) {
            tries.extend(loads.iter().copied());
            highest_first(&mut tries);
        }
        if phases.contains(&Phase::LongMix) {
            self.long_mix(tries.first().copied().unwrap_or(lowest)).await;
        }
        let (bursts, safe) = if phases.contains(&Phase::Burst) {
            self.bursts(&tries, &passed).await
        } else {
            (Vec::new(), candidate)
        };
        let summary = match &fairness {
            Some(f) => tenants::summarize(&tenants, f),
            None => summarize(&phases, baseline, candidate, knee, safe, &bursts),
        };
        let (knee, safe) = if tenant_run { (None, None) } else { (knee, safe) };
        let found = Found {
            loads,
            bursts,
            knee,
            safe,
            summary,
            tenants,
            fairness,
        };
        self.finish(started_at, found)
    }

    /// The baseline: one client (or the lowest rate) alone. Its load, and whether it passed.
    async fn baseline(&mut self, lowest: Load, passed: &mut Vec<Load>) -> (Load, bool) {
        let base = match lowest {
            Load::Concurrency(_) => Load::Concurrency(1),
            rate => rate,
        };
        let r = self.level(Phase::Baseline, base, None).await;
        if r.pass {
            passed.push(base);
        }
        (base, r.pass)
    }

    /// The staircase up to its first failure, then bisection between the last pass and it: the
    /// knee, if one was found.
    async fn staircase(
        &mut self,
        loads: &[Load],
        baseline: Option<(Load, bool)>,
        passed: &mut Vec<Load>,
    ) -> Option<Load> {
        let mut knee = None;
        let mut last_pass = None;
        for load in loads.iter().copied() {
            // The staircase's first step is often the baseline's level: that run counts for both.
            let pass = match baseline {
                Some((base, pass)) if base == load => pass,
                _ => self.level(Phase::Staircase, load, None).await.pass,
            };
            if !pass {
                knee = Some(load);
                break;
            }
            last_pass = Some(load);
            passed.push(load);
        }
        if let (Some(mut lo), Some(mut hi)) = (last_pass, knee) {
            while let Some(mid) = midpoint(lo, hi) {
                let r = self.level(Phase::Staircase, mid, None).await;
                if r.pass {
                    passed.push(mid);
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            knee = Some(hi);
        }
        knee
    }

    /// The long mix at `at`, its long lengths refitted to the prompts' measured drift.
    async fn long_mix(&mut self, at: Load) {
        if let Some(ratio) = self.prompt_drift().map(|d| 1.0 + d.drift) {
            let (input, note) = refit(&self.fitted, &self.opts, self.max_model_len, ratio);
            self.fitted.long_input = input;
            if let Some(note) = note {
                self.progress.println(format!("note: {note}"));
                self.fitted.notes.push(note);
            }
        }
        let mixed = self.opts.workload.with_long(
            self.opts.long_share,
            self.fitted.long_input,
            self.fitted.long_output,
        );
        self.level(Phase::LongMix, at, Some(mixed)).await;
    }

    /// Bursts at the highest loads first until one recovers: the bursts and the safe load.
    async fn bursts(&mut self, tries: &[Load], passed: &[Load]) -> (Vec<BurstReport>, Option<Load>) {
        let mut bursts = Vec::new();
        let mut safe = None;
        for load in tries.iter().copied().take(3) {
            let b = self.burst(load).await;
            let recovered = b.recovered;
            bursts.push(b);
            if recovered {
                safe = passed.contains(&load).then_some(load);
                break;
            }
        }
        (bursts, safe)
    }

    /// The report over every level run.
    fn finish(&mut self, started_at: String, found: Found) -> Report {
        let Found {
            loads,
            bursts,
            knee,
            safe,
            summary,
            tenants,
            fairness,
        } = found;
        let distorted_levels = self
            .levels
            .iter()
            .chain(bursts.iter().map(|b| &b.level))
            .filter(|l| l.distorted.is_some())
            .count();
        let prompt_tokens = self
            .levels
            .iter()
            .chain(bursts.iter().map(|b| &b.level))
            .filter_map(|l| l.stats.prompt_tokens)
            .reduce(std::ops::Add::add)
            .and_then(|t| PromptDrift::of(t, self.template_tokens));
        let mut notes = self.fitted.notes.clone();
        if let Some(w) = prompt_tokens.as_ref().and_then(PromptDrift::warning) {
            notes.push(w);
        }
        let o = &self.opts;
        Report {
            schema: "spillway-bench/1",
            tool: Tool {
                name: "spillway bench",
                version: env!("CARGO_PKG_VERSION"),
            },
            parameters: Parameters {
                url: o.target.url.clone(),
                model: o.target.model.clone(),
                max_model_len: self.max_model_len,
                api: o.target.api,
                endpoint: o.target.api,
                api_key_env: o.api_key_env.clone(),
                ignore_eos: o.target.ignore_eos,
                request_timeout: o.target.timeout,
                ca_cert: o.target.ca_cert.as_ref().map(|p| p.display().to_string()),
                loads,
                arrivals: o.arrivals,
                duration_per_level: match o.stop {
                    Stop::After(d) => Some(d),
                    Stop::Requests(_) => None,
                },
                requests_per_level: match o.stop {
                    Stop::Requests(n) => Some(n),
                    Stop::After(_) => None,
                },
                warmup: o.warmup,
                input_len: o.input_len,
                output_len: o.output_len,
                dataset: o.dataset.clone(),
                workload: o.workload.info(),
                slo: o.slo.to_string(),
                metrics_urls: o.metrics_urls.clone(),
                phases: o.phases.clone(),
                long_share: o.long_share,
                long_input_len: self.fitted.long_input,
                long_output_len: self.fitted.long_output,
                burst_factor: o.burst_factor,
                burst_length: o.burst_length,
                recovery_timeout: o.recovery_timeout,
                max_concurrency: o.max_concurrency,
                max_in_flight: o.max_in_flight,
                seed: o.seed,
                trace: self.extras.replay.as_ref().map(crate::replay::Replay::info),
                honor_retry_after: self.extras.honor_retry_after,
                slo_mix: self
                    .extras
                    .slo_mix
                    .as_ref()
                    .map(|m| m.classes.clone())
                    .unwrap_or_default(),
            },
            started_at,
            finished_at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            machine: crate::machine::Machine::this(),
            levels: std::mem::take(&mut self.levels),
            bursts,
            knee,
            safe,
            summary,
            prompt_tokens,
            tenants,
            fairness,
            notes,
            distorted_levels,
            slo: o.slo.clone(),
        }
    }
}

/// What the phases found, for the report.
#[derive(Default)]
struct Found {
    loads: Vec<Load>,
    bursts: Vec<BurstReport>,
    knee: Option<Load>,
    safe: Option<Load>,
    summary: String,
    tenants: Vec<crate::tenants::TenantReport>,
    fairness: Option<crate::tenants::Fairness>,
}

/// The next level to try between a pass and a failure; `None` when they are adjacent (concurrency)
/// or within 10% (rate).
pub fn midpoint(lo: Load, hi: Load) -> Option<Load> {
    match (lo, hi) {
        (Load::Concurrency(lo), Load::Concurrency(hi)) => {
            (hi > lo + 1).then(|| Load::Concurrency(lo + (hi - lo) / 2))
        }
        (Load::Rate(lo), Load::Rate(hi)) => (hi > lo * 1.1).then(|| Load::Rate((lo + hi) / 2.0)),
        _ => None,
    }
}

/// How late tokio's timer sends an arrival by itself on an idle client: a deadline is rounded up
/// to the next millisecond, and the runtime parks for whole milliseconds. A send that late moves
/// the arrival, not a latency (TTFT and e2e count from the send).
const TIMER_SLACK: f64 = 0.002;

/// The self-check: a level is flagged when the client polled ready tasks late by more than 1 ms or
/// 5% of the median TTFT, whichever is larger, or sent late by more than that plus the timer's own
/// [`TIMER_SLACK`], or when it could not send every arrival.
fn distortion(stats: &LevelStats, lag: Option<&Percentiles>, unsent: u64) -> Option<String> {
    let ttft = stats.ttft.map_or(0.0, |t| t.p50);
    self_check(ttft, stats.send_lag.map(|s| s.p95), lag.map(|l| l.p99), unsent)
}

fn self_check(
    ttft_p50: f64,
    send_lag_p95: Option<f64>,
    delay_p99: Option<f64>,
    unsent: u64,
) -> Option<String> {
    let allowed = (0.05 * ttft_p50).max(0.001);
    let mut why = Vec::new();
    // Printed with the precision they were compared at: rounded alike, they read as "1.2ms
    // exceeds 1.2ms".
    let exceeds = |what: &str, v: f64, bound: f64| {
        let (v, bound) = crate::report::secs_against(v, bound);
        format!("{what} {v} exceeds {bound}")
    };
    if let Some(p95) = send_lag_p95.filter(|p95| *p95 > allowed + TIMER_SLACK) {
        why.push(exceeds("send lag p95", p95, allowed + TIMER_SLACK));
    }
    if let Some(p99) = delay_p99.filter(|p99| *p99 > allowed) {
        why.push(exceeds("client scheduling delay p99", p99, allowed));
    }
    if unsent > 0 {
        why.push(format!("{unsent} arrivals not sent: --max-in-flight reached"));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// What the run can say about the safe load, from the phases that ran: a load is named only where
/// a level at it passed the SLOs (and, with the burst phase, recovered from the burst).
fn summarize(
    phases: &[Phase],
    baseline: Option<(Load, bool)>,
    candidate: Option<Load>,
    knee: Option<Load>,
    safe: Option<Load>,
    bursts: &[BurstReport],
) -> String {
    let mut s = String::new();
    let staircase = phases.contains(&Phase::Staircase);
    match (knee, candidate) {
        (Some(k), Some(c)) => s.push_str(&format!("SLOs hold up to {c}; first breach at {k}. ")),
        (Some(k), None) => s.push_str(&format!("SLOs breached already at {k}. ")),
        (None, Some(c)) if staircase => s.push_str(&format!(
            "SLOs held at every level tried, up to {c}; the knee is higher ({}). ",
            match c {
                Load::Concurrency(_) => "raise --max-concurrency or add --concurrency levels",
                Load::Rate(_) => "add higher --rate levels",
            }
        )),
        _ => {}
    }
    if !staircase {
        match baseline {
            Some((b, true)) => s.push_str(&format!("The baseline at {b} passed the SLOs. ")),
            Some((b, false)) => s.push_str(&format!("The baseline at {b} failed the SLOs. ")),
            None => {}
        }
    }
    if baseline.is_none() && !staircase {
        s.push_str(
            "No phase judged the SLOs at a steady load (baseline or staircase), so no safe load is named",
        );
        match bursts.iter().find(|b| b.recovered) {
            Some(b) => s.push_str(&format!(
                " (the burst at {} recovered, which says nothing of its SLOs).",
                b.load
            )),
            None => s.push('.'),
        }
        return s;
    }
    if phases.contains(&Phase::Burst) {
        match (safe, bursts.iter().find(|b| b.recovered)) {
            (Some(l), _) => s.push_str(&format!(
                "Safe load: {l} (passes the SLOs and recovers after a burst)."
            )),
            (None, Some(b)) => s.push_str(&format!(
                "The burst at {} recovered, but no level at {} passed the SLOs, so no safe load is named.",
                b.load, b.load
            )),
            (None, None) if bursts.is_empty() => s.push_str("No level passed the SLOs, so no burst was run."),
            (None, None) => {
                s.push_str("No level tried recovered from the burst within the recovery timeout.")
            }
        }
    } else if let Some(l) = safe {
        s.push_str(&format!(
            "Candidate safe load: {l} (burst recovery not checked; add the burst phase)."
        ));
    } else {
        s.push_str("No level passed the SLOs, so no safe load is named.");
    }
    s.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bisection_narrows_to_adjacent_levels() {
        let (mut lo, mut hi) = (Load::Concurrency(16), Load::Concurrency(32));
        let truth = 19;
        let mut tried = Vec::new();
        while let Some(mid) = midpoint(lo, hi) {
            tried.push(mid.value() as u32);
            if mid.value() as u32 <= truth {
                lo = mid
            } else {
                hi = mid
            }
        }
        assert_eq!(tried, [24, 20, 18, 19]);
        assert_eq!((lo, hi), (Load::Concurrency(19), Load::Concurrency(20)));
        assert!(midpoint(Load::Rate(10.0), Load::Rate(10.5)).is_none());
    }

    #[test]
    fn the_timer_lateness_of_a_send_is_not_distortion() {
        // A fast server (TTFT 0.2 ms): 1 ms allowed, and the timer's 2 ms on sends.
        assert_eq!(self_check(0.0002, Some(0.0021), Some(0.0004), 0), None);
        let late = self_check(0.0002, Some(0.0035), Some(0.0004), 0).unwrap();
        assert!(late.starts_with("send lag p95 3.5ms exceeds 3.0ms"), "{late}");
        // Scheduling delay has no slack: it delays every timestamp the client takes.
        let busy = self_check(0.0002, Some(0.001), Some(0.0015), 0).unwrap();
        assert!(
            busy.starts_with("client scheduling delay p99 1.5ms exceeds 1.0ms"),
            "{busy}"
        );
        // Two values that [`secs`] rounds alike are printed as far as they differ.
        let close = self_check(0.024, None, Some(0.001_24), 0).unwrap();
        assert_eq!(
            close, "client scheduling delay p99 1.24ms exceeds 1.20ms",
            "{close}"
        );
        // A slow server allows 5% of its TTFT.
        assert_eq!(self_check(0.2, Some(0.011), Some(0.009), 0), None);
        assert!(
            self_check(0.2, None, None, 3)
                .unwrap()
                .contains("3 arrivals not sent")
        );
    }
}
