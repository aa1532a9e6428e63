//! `spillway demo`: the seed's story on one machine without a GPU — measure the safe concurrency
//! through the gateway, plan the limits, apply them by a reload, and show the same overload burst
//! without and with them, with `diagnose` naming the bottleneck of the unprotected one.

mod burst;
mod page;
mod steps;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use bench::load::Stop;
use bench::spec::{Arrivals, LengthDist, Load, Phase, Slo};
use bench::workload::{Source, Workload};
use bench::{Api, Options, Target};
use clap::Args;
use engine::{EngineConfig, Preset, RunningEngine};
use gateway::Gateway;
use gateway::access_log::AccessLog;
use tokio::sync::oneshot;

use burst::{Outcomes, Shape};
use steps::Steps;

/// The public model the gateway serves, and its one admission class.
pub(crate) const MODEL: &str = "demo";
pub(crate) const CLASS: &str = "interactive";
const SERVED: &str = "sim";

#[derive(Args, Debug)]
pub(crate) struct DemoArgs {
    /// A shorter run (about 20 s): fewer staircase levels and a shorter burst. The test suite runs it.
    #[arg(long)]
    quick: bool,
    /// Where the HTML report, the gateway's config files and the plan go.
    #[arg(long, value_name = "DIR", default_value = "target/demo")]
    out: PathBuf,
}

/// The sizes of one run; `--quick` shrinks the time spent, not the story.
struct Settings {
    replicas: usize,
    max_num_seqs: usize,
    /// Every engine step takes this many times the calibrated cost: fewer tokens a second, so the
    /// engines, the gateway and the load generator fit on two cores together.
    slow: f64,
    staircase: Vec<u32>,
    level: Duration,
    bench_burst: Duration,
    recovery: Duration,
    burst: Duration,
    /// The burst's rate, in multiples of the most throughput a passing staircase level measured
    /// (what the engines can serve inside the SLO).
    overload: f64,
    ttft_slo: Duration,
    input: u32,
    output: u32,
}

impl Settings {
    fn new(quick: bool) -> Settings {
        let full = Settings {
            replicas: 2,
            max_num_seqs: 16,
            slow: 2.0,
            staircase: vec![4, 8, 16, 24, 32, 40, 48],
            level: Duration::from_millis(1500),
            bench_burst: Duration::from_secs(1),
            recovery: Duration::from_secs(3),
            burst: Duration::from_secs(4),
            overload: 2.0,
            ttft_slo: Duration::from_millis(250),
            input: 64,
            output: 32,
        };
        if quick {
            Settings {
                staircase: vec![8, 24, 32, 40],
                level: Duration::from_millis(800),
                bench_burst: Duration::from_millis(500),
                burst: Duration::from_secs(2),
                ..full
            }
        } else {
            full
        }
    }

    fn slo(&self) -> Result<Slo> {
        format!("ttft_p99={}ms,error_rate=1%", self.ttft_slo.as_millis())
            .parse()
            .map_err(|e| anyhow!("the demo's SLO: {e}"))
    }
}

/// Runs the demo; on Ctrl-C or SIGTERM stops the gateway and the engines it started and exits 130.
pub(crate) async fn run(args: DemoArgs) -> Result<()> {
    let steps = Steps::new();
    let mut stack: Option<Stack> = None;
    let result = tokio::select! {
        r = demo(&args, &steps, &mut stack) => r,
        () = crate::engine_cmd::shutdown_signal() => Err(Interrupted.into()),
    };
    steps.finish();
    if let Some(s) = stack.take() {
        s.stop().await;
    }
    match result {
        Err(e) if e.is::<Interrupted>() => {
            eprintln!("spillway demo: interrupted; the gateway and the engines are stopped");
            Err(crate::Exit(130).into())
        }
        r => r,
    }
}

/// Ctrl-C or SIGTERM arrived while the demo ran.
#[derive(Debug)]
struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted")
    }
}

impl std::error::Error for Interrupted {}

async fn demo(args: &DemoArgs, steps: &Steps, slot: &mut Option<Stack>) -> Result<()> {
    let s = Settings::new(args.quick);
    let out = &args.out;
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let config_path = out.join("spillway.yaml");
    steps.say(&format!(
        "spillway demo{}: measure, plan, protect, diagnose — on simulated vLLM replicas, no GPU\n",
        if args.quick { " --quick" } else { "" }
    ));
    steps.step("starting the engines and the gateway");
    let stack = slot.insert(Stack::start(&s, &config_path).await?);
    let setup = format!(
        "{} simulated vLLM replicas (preset llama-3.1-8b-h100 slowed {}×, --max-num-seqs {}) at {}\n   \
         and the gateway at {} with admission effectively off (C = {OPEN_C}, no queue)",
        s.replicas,
        s.slow,
        s.max_num_seqs,
        stack
            .engines
            .iter()
            .map(RunningEngine::url)
            .collect::<Vec<_>>()
            .join(", "),
        stack.url,
    );
    steps.say(&format!("== 1. {setup}"));
    let measured = measure(&s, stack, steps).await?;
    let p = plan_limits(&s, stack, &measured.report, steps)?;
    let shown = protect(&s, stack, &measured, &p, &config_path, steps).await?;
    tell_verdict(&shown.verdict, steps);
    steps.step("writing the report");
    let html = page::render(
        &measured.report,
        &page::Story {
            setup: &setup,
            staircase: &measured.heading,
            plan: &plan::report::text(&p),
            burst: &shown.heading,
            reload: &shown.reload,
            table: &shown.table,
            conclusion: &shown.conclusion,
            verdict: &diagnose::render::text(&shown.verdict, diagnose::render::Style { colour: false }),
        },
    )?;
    let path = out.join("report.html");
    std::fs::write(&path, html).with_context(|| format!("cannot write {}", path.display()))?;
    steps.say(&format!(
        "\nreport: {} (the staircase's charts, the plan, the side-by-side and the verdict)\n\
         done in {:.0} s; the gateway and the engines stop now.",
        path.display(),
        steps.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// What the staircase found, and how to send more of the same requests.
struct Measured {
    heading: String,
    report: bench::Report,
    target: Target,
    workload: Workload,
    /// The most requests per second a passing level served: what the engines hold inside the SLO.
    capacity: f64,
}

/// Step 2: the staircase through the gateway, its table and C_safe.
async fn measure(s: &Settings, stack: &Stack, steps: &Steps) -> Result<Measured> {
    let slo = s.slo()?;
    steps.step("staircase through the gateway (spillway bench)");
    let heading = format!(
        "staircase through the gateway: {} clients, {} s each, {}-token prompts, {}-token answers; SLO {slo}",
        s.staircase
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        s.level.as_secs_f64(),
        s.input,
        s.output,
    );
    steps.say(&format!("\n== 2. {heading}\n"));
    let workload = Workload {
        source: Source::Synthetic {
            input: LengthDist::Fixed { tokens: s.input },
            output: LengthDist::Fixed { tokens: s.output },
        },
        long: None,
    };
    let target = Target {
        url: stack.url.clone(),
        model: MODEL.into(),
        api_key: None,
        api: Api::Chat,
        ignore_eos: true,
        timeout: Duration::from_secs(60),
        ca_cert: None,
    };
    // Each level's row as it ends, so the staircase grows on the screen instead of appearing at once.
    let width = table_width();
    steps.say(&indent(&bench::report::table_header(width)));
    let say = steps.printer();
    let extras = bench::Extras {
        on_level: Some(Box::new(move |l| {
            say(&indent(&bench::report::table_level(l, width)))
        })),
        ..bench::Extras::default()
    };
    let report = bench::run_with(bench_options(s, &target, &workload, slo, stack), extras).await?;
    steps.say(&indent(&bench::report::table_tail(&report, width)));
    let Some(safe) = report.safe else {
        bail!(
            "the staircase found no safe load ({}): this machine may be too busy for the demo's timing; try again when it is idle",
            report.summary
        );
    };
    let safe_level = report
        .levels
        .iter()
        .rev()
        .find(|l| l.load == safe && l.pass)
        .context("the bench named a safe load without a passing level")?;
    let capacity = report
        .levels
        .iter()
        .filter(|l| l.pass && l.phase != Phase::Burst)
        .map(|l| l.stats.throughput_rps)
        .fold(0.0, f64::max);
    steps.say(&format!(
        "   C_safe = {} concurrent requests through the gateway ({} per replica), {:.0} req/s there; \
         at most {capacity:.0} req/s inside the SLO",
        safe.value(),
        safe.value() / s.replicas as f64,
        safe_level.stats.throughput_rps,
    ));
    Ok(Measured {
        heading,
        report,
        target,
        workload,
        capacity,
    })
}

/// Step 3: the planner on the staircase's result, its limits and why.
fn plan_limits(s: &Settings, stack: &Stack, report: &bench::Report, steps: &Steps) -> Result<plan::Plan> {
    steps.step("planning the limits (spillway plan)");
    let bench_json = serde_json::to_string(report).context("cannot serialize the bench result")?;
    let measured = plan::Measurement::from_bench_json(&bench_json, "the staircase", s.replicas as u32)?;
    let p = plan::plan(&measured, &deployment(s, stack))?;
    steps.say("\n== 3. the plan (spillway plan, from the staircase's result)");
    for line in p
        .lines
        .iter()
        .filter(|l| ["throughput", "C", "Q"].contains(&l.name))
    {
        steps.say(&format!("   {}\n      from: {}", line.text, line.from));
    }
    steps.say(&format!(
        "   budgets: Wq {}, first_token {}, stream_idle {}, total {}; binding layer: {}",
        plan::arith::dur(p.budgets.queue_wait),
        plan::arith::dur(p.budgets.first_token),
        plan::arith::dur(p.budgets.stream_idle),
        plan::arith::dur(p.budgets.total),
        p.binding_why
    ));
    for w in &p.warnings {
        steps.say(&format!("   warning: {w}"));
    }
    Ok(p)
}

/// The two bursts as the terminal and the report show them, and what diagnose saw.
struct Shown {
    heading: String,
    reload: String,
    table: Vec<(String, String, String)>,
    conclusion: String,
    verdict: diagnose::Verdict,
}

/// Step 4: the burst with admission off (diagnose watching), the plan applied by a reload, the
/// same burst with the planned limits, side by side.
async fn protect(
    s: &Settings,
    stack: &Stack,
    measured: &Measured,
    p: &plan::Plan,
    config_path: &Path,
    steps: &Steps,
) -> Result<Shown> {
    let planned_yaml = plan::emit::render_all(p, &[plan::Target::Spillway])?
        .first()
        .map(|f| format!("{}{SERVER}", f.text))
        .context("the planner wrote no Spillway config")?;
    let shape = Shape {
        target: measured.target.clone(),
        workload: measured.workload.clone(),
        rate: measured.capacity * s.overload,
        length: s.burst,
        ttft_slo: s.ttft_slo,
    };
    steps.step("the burst with admission off; diagnose is watching");
    let heading = format!(
        "the same burst twice: {:.0} req/s ({}× the most the staircase served inside the SLO) for {} s",
        shape.rate,
        s.overload,
        s.burst.as_secs_f64()
    );
    steps.say(&format!("\n== 4. {heading}"));
    let engines: Vec<engine::Engine> = stack.engines.iter().map(|e| e.engine.clone()).collect();
    let watcher = tokio::spawn(watch(stack.metrics_urls(), s.burst, s.ttft_slo));
    let open = burst::run(&shape, &engines, &stack.gateway, None).await?;
    let verdict = watcher.await.context("the diagnosis task failed")??;

    steps.step("applying the plan by a reload");
    std::fs::write(config_path, &planned_yaml)
        .with_context(|| format!("cannot write {}", config_path.display()))?;
    gateway::admin::reload_file(&stack.gateway, config_path, "spillway demo")
        .map_err(|e| anyhow!("the gateway refused the planned config: {e}"))?;
    let limits = stack
        .gateway
        .admission(MODEL, CLASS)
        .context("the reloaded gateway has no demo class")?
        .limits();
    let (c, q, wq) = (
        limits.concurrency,
        limits.queue,
        plan::arith::dur(limits.queue_wait),
    );
    let reload = format!(
        "reloaded {} (the path SIGHUP and POST /admin/reload take): the gateway now enforces C = {c}, Q = {q}, Wq = {wq}",
        config_path.display(),
    );
    steps.say(&format!("   {reload}"));
    steps.step("the burst with the planned limits");
    settle(&engines).await;
    let planned = burst::run(&shape, &engines, &stack.gateway, Some(stack.addr)).await?;
    let table = side_by_side(
        &open,
        &planned,
        &format!("planned (C={c}, Q={q}, Wq={wq})"),
        s.ttft_slo,
    );
    steps.say(&indent(&columns(&table)));
    let conclusion = conclusion(&open, &planned);
    steps.say(&format!("   {conclusion}"));
    Ok(Shown {
        heading,
        reload,
        table,
        conclusion,
        verdict,
    })
}

/// Step 5: diagnose's verdict on the unprotected burst, and its first suspects.
fn tell_verdict(verdict: &diagnose::Verdict, steps: &Steps) {
    steps.say(&format!(
        "\n== 5. spillway diagnose, scraping the gateway and the engines during the unprotected burst\n   verdict: {:?} — {}",
        verdict.status, verdict.summary
    ));
    for f in verdict.findings.iter().take(2) {
        steps.say(&format!(
            "   suspect: {} ({}); first response: {}",
            f.suspect_text, f.signals, f.first_response
        ));
    }
}

/// "Admission effectively off": more in flight than the burst can ever open.
const OPEN_C: u32 = 1_000_000;

/// Both configs carry the same `server` section: a reload may not change it, and the demo's
/// gateway stops at once rather than after the default drain delay.
const SERVER: &str = "server: { drain_delay: 0s, drain_timeout: 2s }\n";

/// The engines and the gateway, all in this process on ephemeral loopback ports.
struct Stack {
    engines: Vec<RunningEngine>,
    gateway: Arc<Gateway>,
    addr: std::net::SocketAddr,
    url: String,
    stop: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Stack {
    async fn start(s: &Settings, config_path: &Path) -> Result<Stack> {
        let mut engines = Vec::new();
        for i in 0..s.replicas {
            let mut c = EngineConfig::preset(Preset::Llama31_8bH100);
            c.model = SERVED.into();
            c.max_num_seqs = s.max_num_seqs;
            c.seed = i as u64;
            c.faults.slow_factor = s.slow;
            engines.push(
                engine::spawn_local(c)
                    .await
                    .context("cannot start a simulated engine")?,
            );
        }
        let listener = gateway::bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
            .context("cannot listen on 127.0.0.1 for the gateway")?;
        let addr = listener.local_addr()?;
        let replicas: Vec<String> = engines.iter().map(RunningEngine::url).collect();
        let yaml = format!(
            "listen: {addr}\n{SERVER}routes:\n  - model: {MODEL}\n    upstream_model: {SERVED}\n    replicas: [{}]\n    \
             timeouts: {{ connect: 1s, first_token: 60s, stream_idle: 30s, total: 120s }}\n    classes:\n      \
             - {{ name: {CLASS}, concurrency: {OPEN_C}, queue: 0, queue_wait: 1s, slo: {{ ttft: {}ms }} }}\n",
            replicas.join(", "),
            s.ttft_slo.as_millis()
        );
        std::fs::write(config_path, &yaml)
            .with_context(|| format!("cannot write {}", config_path.display()))?;
        let config =
            gateway::Config::from_yaml(&yaml).map_err(|e| anyhow!("the demo's gateway config: {e}"))?;
        let gateway = Gateway::new(config, AccessLog::discard())?;
        gateway.set_config_path(config_path.to_owned());
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(gateway::run(listener, gateway.clone(), async move {
            let _ = stopped.await;
        }));
        let stack = Stack {
            engines,
            gateway,
            addr,
            url: format!("http://{addr}"),
            stop: Some(stop),
            server: Some(server),
        };
        stack.ready().await?;
        Ok(stack)
    }

    /// Waits until the gateway's health checks see every replica, as `/ready` reports it.
    async fn ready(&self) -> Result<()> {
        let client = diagnose::source::client(Duration::from_secs(1))?;
        for _ in 0..100 {
            if let Ok(r) = client.get(format!("{}/ready", self.url)).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("the gateway at {} was not ready within 5 s", self.url)
    }

    fn metrics_urls(&self) -> Vec<String> {
        std::iter::once(format!("{}/metrics", self.url))
            .chain(self.engines.iter().map(|e| format!("{}/metrics", e.url())))
            .collect()
    }

    /// Stops the gateway (its listener, health checks and admin tasks), then the engines.
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            let _ = tokio::time::timeout(Duration::from_secs(3), server).await;
        }
        for e in std::mem::take(&mut self.engines) {
            let _ = tokio::time::timeout(Duration::from_secs(2), e.shutdown()).await;
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if let Some(server) = &self.server {
            server.abort();
        }
    }
}

fn bench_options(s: &Settings, target: &Target, workload: &Workload, slo: Slo, stack: &Stack) -> Options {
    Options {
        target: target.clone(),
        api_key_env: None,
        loads: s.staircase.iter().map(|c| Load::Concurrency(*c)).collect(),
        arrivals: Arrivals::Poisson,
        stop: Stop::After(s.level),
        warmup: Duration::ZERO,
        workload: workload.clone(),
        input_len: LengthDist::Fixed { tokens: s.input },
        output_len: LengthDist::Fixed { tokens: s.output },
        dataset: None,
        slo,
        // Every replica: the waiting column sums them.
        metrics_urls: stack
            .engines
            .iter()
            .map(|e| format!("{}/metrics", e.url()))
            .collect(),
        phases: vec![Phase::Baseline, Phase::Staircase, Phase::Burst],
        long_share: 0.0,
        long_input: None,
        long_output: None,
        burst_factor: 2.0,
        burst_length: s.bench_burst,
        recovery_timeout: s.recovery,
        max_concurrency: s.staircase.iter().copied().max().unwrap_or(1),
        max_in_flight: 10_000,
        seed: 0,
        keep_records: false,
        quiet: true,
    }
}

fn deployment(s: &Settings, stack: &Stack) -> plan::Deployment {
    plan::Deployment {
        replicas: s.replicas as u32,
        gateway_replicas: 1,
        // From the staircase's TTFT objective: a request that waits all of it can still meet it.
        wait_budget: None,
        headroom: 0.8,
        caller_deadline: Duration::from_secs(60),
        // The demo's engines run a sequence cap of their own, and no LiteLLM or Envoy stands in
        // front: the plan reasons from what runs.
        pinned: plan::arith::Pinned {
            max_num_seqs: Some(s.max_num_seqs as u32),
            ..plan::arith::Pinned::default()
        },
        tenant_quotas: Vec::new(),
        names: plan::Names {
            model: MODEL.into(),
            served_model: SERVED.into(),
            hf_model: SERVED.into(),
            namespace: "default".into(),
            route: MODEL.into(),
            listen: stack.addr.to_string(),
            upstreams: stack.engines.iter().map(RunningEngine::url).collect(),
            api_base: format!("{}/v1", stack.url),
            class: CLASS.into(),
            max_model_len: None,
            max_num_batched_tokens: None,
            unmeasured: Vec::new(),
        },
        litellm: false,
        envoy: false,
    }
}

/// Scrapes the gateway and the engines at the start and the end of the burst and diagnoses the
/// window between, as `spillway diagnose --scrape` does.
async fn watch(targets: Vec<String>, window: Duration, ttft_slo: Duration) -> Result<diagnose::Verdict> {
    let client = diagnose::source::client(Duration::from_secs(2))?;
    let (start, _) = diagnose::source::scrape(&client, &targets).await;
    tokio::time::sleep(window).await;
    let (end, errors) = diagnose::source::scrape(&client, &targets).await;
    if let Some(e) = errors.first() {
        bail!("diagnose could not scrape: {e}");
    }
    let slo = ttft_slo.as_secs_f64();
    let thresholds = diagnose::Thresholds {
        ttft_p95: slo,
        queue_time: slo / 4.0,
        ..diagnose::Thresholds::default()
    };
    Ok(diagnose::diagnose(
        &start,
        &end,
        &thresholds,
        &diagnose::Cluster::default(),
    ))
}

/// Waits (at most 30 s) for the engines to finish what the unprotected burst left, so the second
/// burst starts from the same empty state.
async fn settle(engines: &[engine::Engine]) {
    for _ in 0..1500 {
        if engines.iter().all(|e| {
            let s = e.snapshot();
            s.running == 0 && s.waiting == 0
        }) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), bench::report::secs)
}

/// The two runs in columns; the row names are what the test and a reader look for.
/// The two bursts' figures, a header row first: what the terminal prints as columns and the report
/// as a table.
fn side_by_side(
    open: &Outcomes,
    planned: &Outcomes,
    label: &str,
    slo: Duration,
) -> Vec<(String, String, String)> {
    vec![
        (String::new(), "admission off".into(), label.to_owned()),
        ("sent".into(), open.sent.to_string(), planned.sent.to_string()),
        (
            "admitted (answered 200)".into(),
            open.admitted.to_string(),
            planned.admitted.to_string(),
        ),
        (
            "rejected (503/429)".into(),
            open.rejected.to_string(),
            planned.rejected.to_string(),
        ),
        (
            "other failures".into(),
            open.failed.to_string(),
            planned.failed.to_string(),
        ),
        (
            "TTFT p50 of admitted".into(),
            ms(open.ttft_p50),
            ms(planned.ttft_p50),
        ),
        (
            "TTFT p95 of admitted".into(),
            ms(open.ttft_p95),
            ms(planned.ttft_p95),
        ),
        (
            format!("admitted with TTFT <= {}ms", slo.as_millis()),
            pct(open.inside_slo),
            pct(planned.inside_slo),
        ),
        (
            "max engine waiting queue".into(),
            open.max_engine_waiting.to_string(),
            planned.max_engine_waiting.to_string(),
        ),
        (
            "max gateway queue".into(),
            open.max_gateway_queued.to_string(),
            planned.max_gateway_queued.to_string(),
        ),
        (
            "rejection latency p50 / max".into(),
            format!("{} / {}", ms(open.reject_p50), ms(open.reject_max)),
            format!("{} / {}", ms(planned.reject_p50), ms(planned.reject_max)),
        ),
        (
            "Retry-After on a 503".into(),
            open.retry_after.clone().unwrap_or_else(|| "-".into()),
            planned
                .retry_after
                .as_ref()
                .map_or_else(|| "none seen".into(), |v| format!("{v} s")),
        ),
        (
            "last answer after".into(),
            format!("{:.1} s", open.wall),
            format!("{:.1} s", planned.wall),
        ),
    ]
}

/// [`side_by_side`]'s rows as aligned columns.
fn columns(rows: &[(String, String, String)]) -> String {
    let w0 = rows.iter().map(|r| r.0.chars().count()).max().unwrap_or(0);
    let w1 = rows.iter().map(|r| r.1.chars().count()).max().unwrap_or(0);
    rows.iter()
        .map(|(name, a, b)| format!("{name:w0$}  {a:>w1$}  {b}\n"))
        .collect()
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.0}%", v * 100.0))
}

/// One honest sentence on whether the planned limits did better, from the numbers above.
fn conclusion(open: &Outcomes, planned: &Outcomes) -> String {
    let queue = planned.max_engine_waiting < open.max_engine_waiting;
    let ttft = match (open.ttft_p95, planned.ttft_p95) {
        (Some(a), Some(b)) => b < a,
        _ => false,
    };
    match (queue, ttft) {
        (true, true) => format!(
            "With the planned limits the engines' queue peaked at {} instead of {} and admitted requests got their first token at p95 {} instead of {}; the rest were refused in at most {}.",
            planned.max_engine_waiting,
            open.max_engine_waiting,
            ms(planned.ttft_p95),
            ms(open.ttft_p95),
            ms(planned.reject_max)
        ),
        _ => format!(
            "The planned limits did NOT beat admission off in this run (engine queue {} vs {}, TTFT p95 {} vs {}): the machine may be too busy for the simulated timing.",
            planned.max_engine_waiting,
            open.max_engine_waiting,
            ms(planned.ttft_p95),
            ms(open.ttft_p95)
        ),
    }
}

/// The bench table's width on this terminal, less the story's indent.
fn table_width() -> bench::report::Width {
    match bench::report::Width::of_stdout() {
        bench::report::Width::Narrow(columns) => bench::report::Width::Narrow(columns.saturating_sub(3)),
        full => full,
    }
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("   {l}\n")).collect()
}
