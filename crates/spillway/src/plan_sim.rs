//! `spillway plan --simulate FILE`: the trace through every candidate of a grid in virtual time
//! (the `sim` crate), the grid as a table, and the best candidate handed to the plan as its
//! pinned limits and figures.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bench::spec::Slo;
use clap::Args;
use engine::{EngineConfig, Preset};
use plan::measure::{Figures, Measurement};
use sim::{Candidate, Outcome};

#[derive(Args, Debug)]
pub(crate) struct SimArgs {
    /// Simulate a trace (access log, Mooncake JSONL or Azure CSV) through a grid of candidates —
    /// the gateway's admission and the engine's scheduler in one process, in virtual time — and
    /// plan from the best one that holds --slo.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["bench", "c_safe"])]
    pub(crate) simulate: Option<PathBuf>,
    /// The trace's format; by default, told from its first line.
    #[arg(long, requires = "simulate")]
    trace_format: Option<trace::Format>,
    /// Prompt tokens per hash id of a Mooncake trace [default: 512].
    #[arg(long, requires = "simulate")]
    block_size: Option<u32>,
    /// Replay speed: 2 runs the trace in half its time (twice the load).
    #[arg(long, default_value_t = 1.0, requires = "simulate")]
    speed: f64,
    /// The objectives a candidate must hold (the bench's form).
    #[arg(long, default_value = "ttft_p95=1s,error_rate=1%", requires = "simulate")]
    slo: Slo,
    /// The simulated engine: a `spillway engine` preset.
    #[arg(long, default_value = "llama-3.1-8b-h100", requires = "simulate")]
    engine_preset: Preset,
    /// A cost-model file (`spillway engine fit` writes one) in place of the preset's step costs.
    #[arg(long, value_name = "FILE", requires = "simulate")]
    cost_model: Option<PathBuf>,
    /// The simulated engines' step budget, when it is not the preset's (a fitted engine's:
    /// vLLM's CPU build defaults to 2048).
    #[arg(long, requires = "simulate")]
    engine_max_num_batched_tokens: Option<u32>,
    /// The simulated engines' KV cache in tokens, when it is not the preset's (vLLM logs its own
    /// as "KV cache size").
    #[arg(long, requires = "simulate")]
    engine_kv_cache_tokens: Option<u32>,
    /// The simulated engines cache prompt prefixes (vLLM V1's default).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, requires = "simulate")]
    enable_prefix_caching: bool,
    /// The grid: the gateway's C values.
    #[arg(long, value_delimiter = ',', default_value = "8,16,32", requires = "simulate")]
    grid_concurrency: Vec<u32>,
    /// The grid: Q values.
    #[arg(long, value_delimiter = ',', default_value = "0,16", requires = "simulate")]
    grid_queue: Vec<u32>,
    /// The grid: Wq values.
    #[arg(long, value_delimiter = ',', default_value = "2s", value_parser = humantime::parse_duration, requires = "simulate")]
    grid_wait: Vec<Duration>,
    /// The grid: each replica's --max-num-seqs.
    #[arg(long, value_delimiter = ',', default_value = "16,64", requires = "simulate")]
    grid_max_num_seqs: Vec<u32>,
}

/// The grid's outcomes, the chosen one's index, and the wall time the grid took.
pub(crate) struct Simulated {
    pub(crate) outcomes: Vec<Outcome>,
    pub(crate) best: Option<usize>,
    pub(crate) wall: Duration,
    pub(crate) file: String,
    /// The model most of the trace's requests named, when it names any (an access log does).
    pub(crate) model: Option<String>,
}

pub(crate) fn run(a: &SimArgs, file: &std::path::Path, replicas: u32) -> Result<Simulated> {
    let t = crate::trace_cmd::load(file, a.trace_format, a.block_size).context("--simulate")?;
    if t.requests.is_empty() {
        bail!("--simulate {}: no request in the trace", file.display());
    }
    let mut engine = EngineConfig::preset(a.engine_preset);
    if let Some(path) = &a.cost_model {
        engine.use_cost_file(&crate::engine_cmd::cost_file(path)?);
    }
    if let Some(v) = a.engine_max_num_batched_tokens {
        engine.max_num_batched_tokens = v;
    }
    if let Some(v) = a.engine_kv_cache_tokens {
        engine.kv_cache_tokens = v;
    }
    engine.enable_prefix_caching = a.enable_prefix_caching;
    let grid = sim::grid(
        &a.grid_concurrency,
        &a.grid_queue,
        &a.grid_wait,
        replicas,
        &a.grid_max_num_seqs,
    );
    // Wall time of the whole grid, for the report: the point of virtual time.
    #[allow(clippy::disallowed_types)]
    let started = std::time::Instant::now();
    let mut outcomes = Vec::new();
    for c in grid {
        eprintln!("spillway: simulating {c}");
        outcomes.push(sim::simulate(&t, &engine, c, &a.slo, a.speed)?);
    }
    let wall = started.elapsed();
    let best = sim::best(&outcomes).and_then(|b| outcomes.iter().position(|o| std::ptr::eq(o, b)));
    let model = trace::Summary::of(&t)
        .by_model
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(m, _)| m);
    Ok(Simulated {
        outcomes,
        best,
        wall,
        file: file.display().to_string(),
        model,
    })
}

fn secs(p: &Option<bench::stats::Percentiles>, f: impl Fn(&bench::stats::Percentiles) -> f64) -> String {
    p.as_ref().map_or("-".into(), |p| format!("{:.3}", f(p)))
}

/// The grid as a table, the chosen row marked.
pub(crate) fn table(s: &Simulated) -> String {
    let mut out = format!(
        "{} candidates simulated over {} in {:.1} s of wall time ({:.0} s of trace each):\n",
        s.outcomes.len(),
        s.file,
        s.wall.as_secs_f64(),
        s.outcomes.first().map_or(0.0, |o| o.simulated_seconds)
    );
    out.push_str("  candidate                                   served  goodput  refused              TTFT p50/p95/p99 s     queue p95 s  holds\n");
    for (i, o) in s.outcomes.iter().enumerate() {
        let refused: Vec<String> = o.refused.iter().map(|(k, n)| format!("{k} {n}")).collect();
        out.push_str(&format!(
            "{} {:<43} {:>6}  {:>6.1}%  {:<20} {:>6}/{}/{}  {:>11}  {}\n",
            if Some(i) == s.best { "*" } else { " " },
            o.candidate.to_string(),
            o.served,
            o.goodput * 100.0,
            if refused.is_empty() {
                "-".into()
            } else {
                refused.join(", ")
            },
            secs(&o.ttft, |p| p.p50),
            secs(&o.ttft, |p| p.p95),
            secs(&o.ttft, |p| p.p99),
            secs(&o.queue_wait, |p| p.p95),
            if o.holds {
                "yes".into()
            } else {
                format!("no: {}", o.reasons.join("; "))
            },
        ));
    }
    match s.best {
        Some(i) => out.push_str(&format!("chosen (*): {}\n", s.outcomes[i].candidate)),
        None => out
            .push_str("no candidate holds the SLO: widen the grid (more replicas, a larger max-num-seqs)\n"),
    }
    out.push_str(
        "the simulation's error against a replay is measured in docs/plan.md (\"plan --simulate\"); it models no stream deadlines, retries, quotas or fair share\n",
    );
    out
}

/// The plan's figures from the chosen candidate: its C over R as the safe concurrency, what it
/// served per second, its tails.
pub(crate) fn measurement(s: &Simulated, replicas: u32) -> Result<(Measurement, Candidate)> {
    let Some(best) = s.best.map(|i| &s.outcomes[i]) else {
        bail!("--simulate: no candidate of the grid holds the SLO, so there is nothing to plan from")
    };
    let c = best.candidate;
    let p99 = |p: &Option<bench::stats::Percentiles>| p.as_ref().map(|p| Duration::from_secs_f64(p.p99));
    let mut m = Measurement::from_figures(
        &Figures {
            c_safe: c.concurrency.div_ceil(replicas.max(1)),
            throughput: best.served as f64 / best.simulated_seconds.max(1e-9),
            ttft_p99: p99(&best.ttft),
            itl_p99: p99(&best.tpot),
            e2e_p99: p99(&best.e2e),
        },
        replicas,
    )?;
    m.caveats.push(format!(
        "figures simulated, not measured: the best candidate of plan --simulate {} ({c}), its served rate and tails",
        s.file
    ));
    Ok((m, c))
}
