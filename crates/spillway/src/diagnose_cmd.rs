//! `spillway diagnose`: reads the sources, prints the verdict, exits 0 no incident (idle, healthy,
//! busy but healthy, protected), 1 incident, 2 unknown.

use anyhow::{Context, Result, bail};
use clap::Args;
use diagnose::render::{self, Style};
use diagnose::{Cluster, Snapshot, Thresholds, Verdict, source};
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Debug)]
pub(crate) struct DiagnoseArgs {
    /// `/metrics` endpoints to scrape directly (gateway, engines, DCGM exporters): twice,
    /// --interval apart; rates and quantiles come from the difference.
    #[arg(long, num_args = 1.., value_name = "URL", conflicts_with = "prometheus")]
    scrape: Vec<String>,
    /// A Prometheus server (http://host:9090): the same series at the start and end of --window.
    #[arg(long, value_name = "URL")]
    prometheus: Option<String>,
    /// PromQL label matchers every series must carry, e.g. 'namespace="llm",service="chat"'.
    #[arg(long, default_value = "", requires = "prometheus")]
    selector: String,
    /// The window read from Prometheus.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    window: Duration,
    /// Time between the two scrapes (the window when scraping directly).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// p95 time-to-first-token objective.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    slo_ttft: Duration,
    /// p95 inter-token-latency objective.
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
    slo_itl: Duration,
    /// Largest share of requests answered 429 or 5xx, e.g. 1%.
    #[arg(long, default_value = "1%", value_parser = parse_ratio)]
    slo_error_rate: f64,
    /// Mean queue wait (engine or gateway) that counts as waiting; default a quarter of --slo-ttft.
    #[arg(long, value_parser = humantime::parse_duration)]
    queue_time: Option<Duration>,
    /// `kubectl get inferenceservice NAME -o json` saved to a file, or - for stdin.
    #[arg(long, value_name = "FILE")]
    inference_service: Option<PathBuf>,
    /// `kubectl get pods -o json` saved to a file, or - for stdin.
    #[arg(long, value_name = "FILE")]
    pods: Option<PathBuf>,
    /// Print the verdict as JSON.
    #[arg(long)]
    json: bool,
    /// Diagnose again every window until interrupted (each window starts where the last ended).
    #[arg(long)]
    watch: bool,
    /// Timeout of each scrape or query.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    let v = match s.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|v| v / 100.0),
        None => s.trim().parse::<f64>(),
    }
    .map_err(|_| format!("'{s}' is not a ratio (0.01 or 1%)"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("'{s}' is outside 0–100%"))
    }
}

fn read_input(path: &PathBuf) -> Result<String> {
    if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).context("reading stdin")?;
        Ok(s)
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
    }
}

impl DiagnoseArgs {
    fn thresholds(&self) -> Thresholds {
        let ttft = self.slo_ttft.as_secs_f64();
        Thresholds {
            ttft_p95: ttft,
            itl_p95: self.slo_itl.as_secs_f64(),
            error_ratio: self.slo_error_rate,
            queue_time: self.queue_time.map_or(ttft / 4.0, |d| d.as_secs_f64()),
            ..Thresholds::default()
        }
    }

    fn cluster(&self) -> Result<Cluster> {
        let mut c = Cluster::default();
        if let Some(p) = &self.inference_service {
            c.add_inference_service(&read_input(p)?)?;
        }
        if let Some(p) = &self.pods {
            c.add_pods(&read_input(p)?)?;
        }
        Ok(c)
    }
}

fn print(v: &Verdict, json: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, v)?;
        writeln!(out)?;
    } else {
        let colour = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        write!(out, "{}", render::text(v, Style { colour }))?;
    }
    out.flush()?;
    Ok(())
}

pub(crate) async fn run(args: DiagnoseArgs) -> Result<()> {
    if args.scrape.is_empty() && args.prometheus.is_none() {
        bail!("give the sources: --scrape URL... or --prometheus URL");
    }
    let thresholds = args.thresholds();
    let cluster = args.cluster()?;
    let client = source::client(args.timeout)?;
    let mut last: Option<Snapshot> = None;
    let code = loop {
        let (start, end) = match &args.prometheus {
            Some(url) => source::prometheus_window(&client, url, &args.selector, args.window).await?,
            None => {
                let start = match last.take() {
                    Some(s) => s,
                    None => source::scrape(&client, &args.scrape).await.0,
                };
                tokio::time::sleep(args.interval).await;
                let (end, errors) = source::scrape(&client, &args.scrape).await;
                for e in &errors {
                    eprintln!("spillway diagnose: {e}");
                }
                (start, end)
            }
        };
        let verdict = diagnose::diagnose(&start, &end, &thresholds, &cluster);
        print(&verdict, args.json)?;
        if !args.watch {
            break verdict.exit_code();
        }
        last = Some(end);
        if args.prometheus.is_some() {
            tokio::time::sleep(args.interval).await;
        }
        println!();
    };
    if code != 0 {
        // The verdict is the answer: exit with its code rather than as an error of the command.
        return Err(crate::Exit(code).into());
    }
    Ok(())
}
