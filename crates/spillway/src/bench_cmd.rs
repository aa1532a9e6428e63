//! `spillway bench`: the SLO load tester, from command-line flags to the table, JSON and HTML.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bench::load::Stop;
use bench::replay::Replay;
use bench::slo_mix::SloMix;
use bench::spec::{Arrivals, LengthDist, Load, Slo};
use bench::tenants::{Tenant, TenantSpec};
use bench::workload::{Source, Workload, load_dataset};
use bench::{Api, Extras, Options, Target};
use clap::{Args, ValueEnum};

#[derive(Args, Debug)]
pub(crate) struct BenchArgs {
    /// The server's base URL with its scheme (e.g. http://127.0.0.1:8000; a trailing /v1 is fine).
    #[arg(long)]
    url: String,
    /// The model name to send.
    #[arg(long)]
    model: String,
    /// Read the API key from this environment variable (sent as a bearer token, never printed).
    #[arg(long, value_name = "VAR")]
    api_key_env: Option<String>,
    /// The API to drive: chat (/v1/chat/completions), completions (/v1/completions), responses
    /// (OpenAI's Responses API, /v1/responses) or messages (Anthropic's Messages API,
    /// /v1/messages). TTFT and ITL are timed from every event that carries generated tokens in
    /// that API's stream. `--endpoint` is its older name.
    #[arg(long, alias = "endpoint", value_enum, default_value_t = ApiArg::Chat)]
    api: ApiArg,
    /// For https://: also trust the certificates in this PEM file (a private CA, a self-signed
    /// server); the Mozilla roots are always trusted.
    #[arg(long, value_name = "PEM")]
    ca_cert: Option<PathBuf>,
    /// Closed loop: the staircase levels, e.g. 1,2,4,8 (default: doubling from 1 to
    /// --max-concurrency).
    #[arg(long, value_delimiter = ',', conflicts_with = "rate")]
    concurrency: Vec<u32>,
    /// Open loop: the staircase levels in requests per second, e.g. 2,4,6.
    #[arg(long, value_delimiter = ',')]
    rate: Vec<f64>,
    /// Open-loop arrival process: poisson, constant or gamma:B (B < 1 is burstier).
    #[arg(long, default_value = "poisson")]
    arrivals: Arrivals,
    /// How long each level sends for (requests in flight then finish).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, conflicts_with = "requests")]
    duration: Duration,
    /// Leave requests sent this early in each level out of its statistics (connection set-up, an
    /// empty server filling up).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Instead of --duration: how many requests each level sends.
    #[arg(long)]
    requests: Option<u64>,
    /// Prompt lengths in tokens: N, fixed:N, uniform:MIN,MAX, normal:MEAN,SD or lognormal:MEAN,SD
    /// (the forms `spillway engine --output-len` takes).
    #[arg(long, default_value = "512", value_parser = length_dist)]
    input_len: LengthDist,
    /// Output lengths in tokens (sent as max_tokens, with ignore_eos), same forms as --input-len.
    #[arg(long, default_value = "128", value_parser = length_dist)]
    output_len: LengthDist,
    /// Prompts from a file: ShareGPT JSON, or JSONL of {"prompt": .., "output_len": N} or strings.
    #[arg(long)]
    dataset: Option<PathBuf>,
    /// A shared-prefix workload, N,L: N prefixes of L tokens, each prompt one of them (drawn at
    /// random) followed by a unique suffix of --input-len tokens, as a system prompt or a few-shot
    /// template makes; a prefix cache serves the shared part.
    #[arg(long, value_name = "N,L", value_parser = shared_prefix, conflicts_with = "dataset")]
    shared_prefix: Option<(u32, u32)>,
    /// The objectives every level is judged by: METRIC_pNN=DURATION (ttft, itl, tpot, e2e) and
    /// error_rate=N%.
    #[arg(long, default_value = "ttft_p95=1s,itl_p95=50ms,error_rate=1%")]
    slo: Slo,
    /// The server's Prometheus /metrics (vLLM's or Spillway's), to watch its waiting queue;
    /// repeat it for each replica (their queues are summed).
    #[arg(long)]
    metrics_url: Vec<String>,
    /// Which phases to run: baseline, staircase, long-mix, burst, or all [default: all].
    #[arg(long)]
    phases: Option<String>,
    /// A tenant with its own key and load, all tenants sending at once: NAME=KEY_ENV:clients=N
    /// (closed loop) or NAME=KEY_ENV:rate=R (open loop, --arrivals), its key read from the
    /// variable KEY_ENV. Repeat it for each tenant. A multi-tenant run is ONE level of --duration
    /// (no phases, no staircase) with the same workload (lengths, dataset) for every tenant, each
    /// drawing its own prompts, reported per
    /// tenant (served, refused, shares, TTFT/ITL) with Jain's fairness index; it takes no
    /// --concurrency, --rate, --requests, --phases or --api-key-env.
    #[arg(long, value_name = "NAME=KEY_ENV:clients=N|rate=R", value_parser = TenantSpec::parse_flag)]
    tenant: Vec<TenantSpec>,
    /// Mixed per-request objectives, NAME:SHARE:ttft=DURATION[:tpot=DURATION],... (e.g.
    /// tight:0.3:ttft=100ms,loose:0.7:ttft=2s): each request draws a class by its share (from
    /// --seed) and sends its objectives in milliseconds as x-spillway-slo-ttft-ms and
    /// x-spillway-slo-tpot-ms, as a gateway with `balance: slo` reads them; every level then
    /// reports each class against its own objectives (sent, served, refused, slo_unattainable,
    /// goodput, TTFT and TPOT). Shares add up to 1; works with the staircase and with --tenant.
    /// A class may add :priority=sheddable (or critical, standard), sent as x-spillway-priority:
    /// the gateway refuses only sheddable requests it predicts it cannot serve in time.
    #[arg(long, value_name = "NAME:SHARE:ttft=DUR[:tpot=DUR][:priority=P],...", value_parser = slo_mix)]
    slo_mix: Option<SloMix>,
    /// Tenants from a YAML file, a list of {name, api_key_env, clients: N | rate: R}; with any
    /// --tenant, both are run.
    #[arg(long, value_name = "FILE")]
    tenants: Option<PathBuf>,
    /// Long mix: the share of long requests.
    #[arg(long, default_value_t = 0.1)]
    long_share: f64,
    /// Long mix: prompt lengths of the long requests [default: 4096, shortened to fit the model's
    /// context when the server publishes max_model_len in /v1/models, as vLLM does].
    #[arg(long, value_parser = length_dist)]
    long_input_len: Option<LengthDist>,
    /// Long mix: output lengths of the long requests [default: 512, or an eighth of the context when
    /// that is smaller].
    #[arg(long, value_parser = length_dist)]
    long_output_len: Option<LengthDist>,
    /// Burst: k × the load ...
    #[arg(long, default_value_t = 2.0)]
    burst_factor: f64,
    /// ... for this long, after a sustained period as long as one level.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    burst_length: Duration,
    /// How long after the burst the queue and TTFT may take to recover.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    recovery_timeout: Duration,
    /// The top of the default staircase.
    #[arg(long, default_value_t = 1024)]
    max_concurrency: u32,
    /// Open loop: the most requests in flight before arrivals are dropped (and the level flagged).
    #[arg(long, default_value_t = 10_000)]
    max_in_flight: usize,
    /// Abandon a request after this long (counted as a timeout).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Closed loop: after a refusal with Retry-After (a 429 or 503), a client waits that long before
    /// its next request, as a well-behaved client does, instead of sending at once; the waits are
    /// reported apart from the latencies. With --tenant, each tenant's closed-loop clients wait for
    /// their own refusals.
    #[arg(long)]
    honor_retry_after: bool,
    /// Send vLLM's ignore_eos so every output runs to its length (false for servers that reject it).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    ignore_eos: bool,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write the result as JSON (its schema: docs/bench.md, "JSON schema").
    #[arg(long)]
    json: Option<PathBuf>,
    /// Include every request's record in the JSON.
    #[arg(long)]
    records: bool,
    /// Write a self-contained HTML report with charts.
    #[arg(long)]
    html: Option<PathBuf>,
    /// No live progress line.
    #[arg(long, short)]
    quiet: bool,
    /// Replay a trace on its timestamps instead of the phases: the gateway's access log, Mooncake
    /// JSONL or the Azure CSV (see `spillway trace`). Each request is sent when the trace says
    /// (over --speed) with a prompt of its input length, whose blocks are shared where its hash ids
    /// are, asking for its output length; one level, judged by --slo like any other.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["concurrency", "rate", "requests", "phases", "dataset", "shared_prefix", "tenant", "tenants", "slo_mix"])]
    trace: Option<PathBuf>,
    /// The trace's format (access-log, mooncake or azure); by default, told from its first line.
    #[arg(long, value_name = "FORMAT", requires = "trace")]
    trace_format: Option<trace::Format>,
    /// Replay speed: 2 sends the trace in half its time, 0.5 in twice.
    #[arg(long, default_value_t = 1.0, requires = "trace")]
    speed: f64,
    /// Prompt tokens per hash id of a Mooncake trace [default: 512].
    #[arg(long, value_name = "TOKENS", requires = "trace")]
    block_size: Option<u32>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ApiArg {
    Chat,
    Completions,
    Responses,
    Messages,
}

impl From<ApiArg> for Api {
    fn from(a: ApiArg) -> Api {
        match a {
            ApiArg::Chat => Api::Chat,
            ApiArg::Completions => Api::Completions,
            ApiArg::Responses => Api::Responses,
            ApiArg::Messages => Api::Messages,
        }
    }
}

/// Parses a length distribution, with a note on stderr for a form that is accepted but spelt
/// otherwise (`uniform:A-B`).
fn length_dist(s: &str) -> Result<LengthDist, String> {
    let d = s.parse()?;
    if let Some(hint) = LengthDist::hint(s) {
        eprintln!("spillway: note: {hint}");
    }
    Ok(d)
}

fn slo_mix(s: &str) -> Result<SloMix, String> {
    s.parse()
}

/// `N,L`: N prefixes (at least 1) of L tokens (at least 1).
fn shared_prefix(s: &str) -> Result<(u32, u32), String> {
    let parsed = s
        .split_once(',')
        .and_then(|(n, l)| Some((n.trim().parse::<u32>().ok()?, l.trim().parse::<u32>().ok()?)));
    match parsed {
        Some((n, l)) if n > 0 && l > 0 => Ok((n, l)),
        _ => Err(format!(
            "{s:?}: expected N,L — how many prefixes and their length in tokens, both at least 1 (e.g. 4,1024)"
        )),
    }
}

type Outputs = (Options, Extras, Option<PathBuf>, Option<PathBuf>);

/// The tenants from `--tenants FILE` then `--tenant`, each key read from its variable; and the
/// flags that make no sense with them refused.
fn tenants(a: &BenchArgs) -> Result<Vec<Tenant>> {
    let mut specs = Vec::new();
    if let Some(path) = &a.tenants {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--tenants {}: cannot read it", path.display()))?;
        let listed: Vec<TenantSpec> = serde_yaml_ng::from_str(&text).map_err(|e| {
            anyhow::anyhow!(
                "--tenants {}: {e} (expected a list of {{name, api_key_env, clients: N | rate: R}})",
                path.display()
            )
        })?;
        if listed.is_empty() {
            bail!("--tenants {}: the list is empty", path.display());
        }
        for (i, spec) in listed.iter().enumerate() {
            spec.load()
                .map_err(|e| anyhow::anyhow!("--tenants {}: item {}: {e}", path.display(), i + 1))?;
        }
        specs.extend(listed);
    }
    specs.extend(a.tenant.iter().cloned());
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let refused = [
        (
            !a.concurrency.is_empty(),
            "--concurrency",
            "each tenant's clients= sets its load",
        ),
        (!a.rate.is_empty(), "--rate", "each tenant's rate= sets its load"),
        (
            a.requests.is_some(),
            "--requests",
            "every tenant sends for the same --duration",
        ),
        (
            a.phases.is_some(),
            "--phases",
            "a multi-tenant run is one level, not a staircase",
        ),
        (
            a.api_key_env.is_some(),
            "--api-key-env",
            "each tenant sends its own key",
        ),
    ];
    if let Some((_, flag, why)) = refused.iter().find(|(given, _, _)| *given) {
        bail!("{flag} cannot be used with --tenant/--tenants: {why}");
    }
    let mut names = std::collections::BTreeSet::new();
    specs
        .into_iter()
        .map(|spec| {
            let load = spec.load().map_err(anyhow::Error::msg)?;
            if !names.insert(spec.name.clone()) {
                bail!(
                    "tenant {}: named twice; each tenant needs a name of its own",
                    spec.name
                );
            }
            let api_key = std::env::var(&spec.api_key_env).with_context(|| {
                format!(
                    "tenant {}: {}: the variable is not set",
                    spec.name, spec.api_key_env
                )
            })?;
            Ok(Tenant {
                name: spec.name,
                api_key_env: spec.api_key_env,
                api_key,
                load,
            })
        })
        .collect()
}

fn options(a: BenchArgs) -> Result<Outputs> {
    let tenants = tenants(&a)?;
    let api_key = match &a.api_key_env {
        Some(var) => Some(
            std::env::var(var).with_context(|| format!("--api-key-env {var}: the variable is not set"))?,
        ),
        None => None,
    };
    if let Some(bad) = a.rate.iter().find(|r| !(r.is_finite() && **r > 0.0)) {
        bail!("--rate {bad}: rates must be positive numbers of requests per second");
    }
    if a.concurrency.contains(&0) {
        bail!("--concurrency: levels must be at least 1");
    }
    if !(0.0..=1.0).contains(&a.long_share) {
        bail!("--long-share {}: a share between 0 and 1", a.long_share);
    }
    if !(a.burst_factor.is_finite() && a.burst_factor >= 1.0) {
        bail!("--burst-factor {}: at least 1", a.burst_factor);
    }
    if a.requests == Some(0) || a.duration.is_zero() {
        bail!("each level must send something: --duration and --requests must be above zero");
    }
    let mut loads: Vec<Load> = if a.rate.is_empty() {
        a.concurrency.iter().map(|c| Load::Concurrency(*c)).collect()
    } else {
        a.rate.iter().map(|r| Load::Rate(*r)).collect()
    };
    loads.sort_by(|x, y| x.value().total_cmp(&y.value()));
    loads.dedup();
    let source = match (&a.dataset, a.shared_prefix) {
        (Some(path), _) => load_dataset(path, a.output_len)?,
        (None, Some((count, tokens))) => {
            Source::shared_prefix(count, tokens, a.input_len, a.output_len, a.seed)
        }
        (None, None) => Source::Synthetic {
            input: a.input_len,
            output: a.output_len,
        },
    };
    let phases = bench::spec::parse_phases(a.phases.as_deref().unwrap_or("all"))?;
    let replay = match &a.trace {
        Some(path) => Some(replay(path, a.trace_format, a.block_size, a.speed)?),
        None => None,
    };
    let opts = Options {
        target: Target {
            url: a.url,
            model: a.model,
            api_key,
            api: a.api.into(),
            ignore_eos: a.ignore_eos,
            timeout: a.timeout,
            ca_cert: a.ca_cert,
        },
        api_key_env: a.api_key_env,
        loads,
        arrivals: a.arrivals,
        stop: match a.requests {
            Some(n) => Stop::Requests(n),
            None => Stop::After(a.duration),
        },
        warmup: a.warmup,
        workload: Workload { source, long: None },
        input_len: a.input_len,
        output_len: a.output_len,
        dataset: a.dataset.map(|d| d.display().to_string()),
        slo: a.slo,
        metrics_urls: a.metrics_url,
        phases,
        long_share: a.long_share,
        long_input: a.long_input_len,
        long_output: a.long_output_len,
        burst_factor: a.burst_factor,
        burst_length: a.burst_length,
        recovery_timeout: a.recovery_timeout,
        max_concurrency: a.max_concurrency.max(1),
        max_in_flight: a.max_in_flight.max(1),
        seed: a.seed,
        keep_records: a.records,
        quiet: a.quiet,
    };
    let extras = Extras {
        honor_retry_after: a.honor_retry_after,
        on_level: None,
        tenants,
        slo_mix: a.slo_mix,
        replay,
    };
    Ok((opts, extras, a.json, a.html))
}

/// The trace to replay, read whole (bounded by the trace crate's limits).
fn replay(
    path: &std::path::Path,
    format: Option<trace::Format>,
    block: Option<u32>,
    speed: f64,
) -> Result<Replay> {
    if !(speed.is_finite() && speed > 0.0) {
        bail!("--speed {speed}: a positive factor (2 replays twice as fast)");
    }
    let t = crate::trace_cmd::load(path, format, block).context("--trace")?;
    if t.requests.is_empty() {
        bail!("--trace {}: no request to replay", path.display());
    }
    for s in &t.skipped {
        eprintln!("spillway: note: --trace left out {s}");
    }
    Ok(Replay {
        trace: std::sync::Arc::new(t),
        speed,
        file: path.display().to_string(),
    })
}

pub(crate) async fn run(args: BenchArgs) -> Result<()> {
    let (opts, extras, json, html) = options(args)?;
    let report = bench::run_with(opts, extras).await?;
    print!(
        "{}",
        bench::report::table_for(&report, bench::report::Width::of_stdout())
    );
    if let Some(path) = json {
        let file =
            std::fs::File::create(&path).with_context(|| format!("cannot write {}", path.display()))?;
        serde_json::to_writer_pretty(std::io::BufWriter::new(file), &report)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = html {
        let page = bench::html::render(&report)?;
        std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
