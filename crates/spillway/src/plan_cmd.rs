//! `spillway plan`: from a bench result (or figures measured elsewhere) to limits, budgets and
//! config files for every control point, with the arithmetic printed.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use plan::arith::Pinned;
use plan::names::Given;
use plan::{Deployment, Figures, Measurement, Target};

#[derive(Args, Debug)]
pub(crate) struct PlanArgs {
    /// A `spillway bench --json` result (schema spillway-bench/1).
    #[arg(long, value_name = "FILE", required_unless_present_any = ["c_safe", "simulate"])]
    bench: Option<PathBuf>,
    /// How many replicas stood behind the bench's target.
    #[arg(long, default_value_t = 1, requires = "bench")]
    measured_replicas: u32,
    /// Instead of --bench: one replica's safe concurrency measured with another tool
    /// (vllm bench serve, GuideLLM, AIPerf).
    #[arg(long, conflicts_with = "bench", requires = "throughput")]
    c_safe: Option<u32>,
    /// With --c-safe: the stable requests per second of the whole backend (all --replicas) at that load.
    #[arg(long, conflicts_with = "bench", requires = "c_safe")]
    throughput: Option<f64>,
    /// With --c-safe: the TTFT 99th percentile at the safe load, for first_token.
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "bench")]
    ttft_p99: Option<Duration>,
    /// With --c-safe: the inter-token gap's 99th percentile, for stream_idle.
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "bench")]
    itl_p99: Option<Duration>,
    /// With --c-safe: the end-to-end 99th percentile, for the total budget.
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "bench")]
    e2e_p99: Option<Duration>,
    /// R: the model-server replicas to plan for.
    #[arg(long)]
    replicas: u32,
    /// G: gateway processes, each keeping its own counters.
    #[arg(long, default_value_t = 1)]
    gateway_replicas: u32,
    /// Wq: the longest a request may wait in the gateway's queue (default: from the bench's TTFT
    /// objective, so that a request that waits all of it still meets it; 2s without one).
    #[arg(long, value_parser = humantime::parse_duration)]
    wait_budget: Option<Duration>,
    /// The share of the measured safe total the gateway may use, in (0, 1].
    #[arg(long, default_value_t = 0.8)]
    headroom: f64,
    /// The callers' own deadline, which every budget must fit inside.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    caller_deadline: Duration,
    /// Pin C instead of the formula (the plan shows both and warns about what disagrees).
    #[arg(long)]
    concurrency: Option<u32>,
    /// Pin Q instead of the formula.
    #[arg(long)]
    queue: Option<u32>,
    /// Pin the first-token budget instead of Wq + 1.5 × TTFT p99.
    #[arg(long, value_parser = humantime::parse_duration)]
    first_token: Option<Duration>,
    /// Pin LiteLLM's max_parallel_requests (it binds when below C).
    #[arg(long)]
    litellm_cap: Option<u32>,
    /// The longest answer (max_tokens) to allow and budget for (default: the bench's longest).
    #[arg(long)]
    max_tokens: Option<u32>,
    /// The engines' --max-num-seqs as they run, to reason from instead of each replica's share
    /// of C (and to emit for vllm and kserve).
    #[arg(long)]
    max_num_seqs: Option<u32>,
    /// A tenant's max_parallel quota, TEAM=N, to check against C (repeatable).
    #[arg(long, value_name = "TEAM=N")]
    tenant_max_parallel: Vec<String>,
    /// Which files to emit: spillway, envoy, litellm, vllm, kserve.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "spillway,envoy,litellm,vllm,kserve"
    )]
    emit: Vec<Target>,
    /// Write the files here (created if missing); without it they follow the plan on stdout.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Print the plan as JSON (schema spillway-plan/1, the files' text included) instead of text.
    #[arg(long)]
    json: bool,
    /// The public model name (default: the model the bench sent).
    #[arg(long)]
    model: Option<String>,
    /// The name the engines serve, when it differs from --model.
    #[arg(long)]
    served_model: Option<String>,
    /// What vLLM loads: a Hugging Face id or a storage URI (default: the served name).
    #[arg(long)]
    hf_model: Option<String>,
    /// Kubernetes namespace for the policy and the InferenceService.
    #[arg(long, default_value = "default")]
    namespace: String,
    /// The HTTPRoute the Envoy Gateway policy targets, also the InferenceService's name (default:
    /// the model name, lower-cased, other characters as '-').
    #[arg(long)]
    route: Option<String>,
    /// Where Spillway listens (default 0.0.0.0:8080, marked as not measured in the file).
    #[arg(long)]
    listen: Option<String>,
    /// A replica's base URL for Spillway (repeatable; default: the bench's URL when it measured one
    /// replica, and placeholders the file marks as not measured for the rest).
    #[arg(long = "upstream", value_name = "URL")]
    upstreams: Vec<String>,
    /// The gateway's OpenAI base URL for LiteLLM (default: the route's in-cluster service).
    #[arg(long)]
    api_base: Option<String>,
    /// Spillway's admission class name.
    #[arg(long, default_value = "interactive")]
    class: String,
    /// vLLM --max-model-len (default: the context the bench's server published).
    #[arg(long)]
    max_model_len: Option<u32>,
    /// vLLM --max-num-batched-tokens, passed through.
    #[arg(long)]
    max_num_batched_tokens: Option<u32>,
    #[command(flatten)]
    sim: crate::plan_sim::SimArgs,
}

fn measurement(a: &PlanArgs) -> Result<Measurement> {
    Ok(match (&a.bench, a.c_safe, a.throughput) {
        (Some(path), _, _) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            Measurement::from_bench_json(&text, &path.display().to_string(), a.measured_replicas)?
        }
        (None, Some(c_safe), Some(throughput)) => Measurement::from_figures(
            &Figures {
                c_safe,
                throughput,
                ttft_p99: a.ttft_p99,
                itl_p99: a.itl_p99,
                e2e_p99: a.e2e_p99,
            },
            a.replicas,
        )?,
        _ => bail!("give a bench result (--bench FILE) or the figures (--c-safe N --throughput R)"),
    })
}

fn deployment(a: PlanArgs, m: &Measurement) -> Result<Deployment> {
    // LiteLLM and Envoy Gateway are part of the plan only when their files are asked for.
    let (litellm, envoy) = (a.emit.contains(&Target::Litellm), a.emit.contains(&Target::Envoy));
    let tenant_quotas = a
        .tenant_max_parallel
        .iter()
        .map(|t| {
            t.split_once('=')
                .and_then(|(team, n)| Some((team.to_owned(), n.parse().ok()?)))
                .with_context(|| format!("--tenant-max-parallel {t:?}: expected TEAM=N"))
        })
        .collect::<Result<_>>()?;
    let measured_replicas = if a.bench.is_some() {
        a.measured_replicas
    } else {
        a.replicas
    };
    let names = plan::names::names(
        Given {
            model: a.model,
            served_model: a.served_model,
            hf_model: a.hf_model,
            namespace: a.namespace,
            route: a.route,
            listen: a.listen,
            upstreams: a.upstreams,
            api_base: a.api_base,
            class: a.class,
            max_model_len: a.max_model_len,
            max_num_batched_tokens: a.max_num_batched_tokens,
        },
        m,
        a.replicas,
        measured_replicas,
    )?;
    Ok(Deployment {
        replicas: a.replicas,
        gateway_replicas: a.gateway_replicas,
        wait_budget: a.wait_budget,
        headroom: a.headroom,
        caller_deadline: a.caller_deadline,
        pinned: Pinned {
            concurrency: a.concurrency,
            queue: a.queue,
            first_token: a.first_token,
            litellm_cap: a.litellm_cap,
            max_tokens: a.max_tokens,
            max_num_seqs: a.max_num_seqs,
        },
        tenant_quotas,
        names,
        litellm,
        envoy,
    })
}

pub(crate) fn run(mut args: PlanArgs) -> Result<()> {
    let simulated = match &args.sim.simulate {
        Some(file) => Some(crate::plan_sim::run(&args.sim, file, args.replicas)?),
        None => None,
    };
    let m = match &simulated {
        Some(s) => {
            eprint!("{}", crate::plan_sim::table(s));
            let (m, c) = crate::plan_sim::measurement(s, args.replicas)?;
            // The chosen candidate's limits, unless pinned by hand.
            args.concurrency = args.concurrency.or(Some(c.concurrency));
            args.queue = args.queue.or(Some(c.queue));
            args.wait_budget = args.wait_budget.or(Some(c.queue_wait));
            args.max_num_seqs = args.max_num_seqs.or(Some(c.max_num_seqs));
            args.model = args.model.take().or(s.model.clone());
            m
        }
        None => measurement(&args)?,
    };
    let (out, json, targets) = (args.out.clone(), args.json, args.emit.clone());
    let d = deployment(args, &m)?;
    let p = plan::plan(&m, &d)?;
    let files = plan::emit::render_all(&p, &targets)?;
    if let Some(dir) = &out {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for f in &files {
            let path = dir.join(f.file_name);
            std::fs::write(&path, &f.text).with_context(|| format!("cannot write {}", path.display()))?;
        }
    }
    if json {
        let simulation = simulated.as_ref().map(|s| {
            serde_json::json!({
                "file": s.file,
                "wall_seconds": s.wall.as_secs_f64(),
                "candidates": s.outcomes,
                "best": s.best,
            })
        });
        let doc = serde_json::json!({ "plan": p, "files": files, "simulation": simulation });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    print!("{}", plan::report::text(&p));
    match &out {
        Some(dir) => {
            println!();
            for f in &files {
                println!("wrote {}", dir.join(f.file_name).display());
            }
        }
        None => {
            for f in &files {
                println!("\n# {} ({})", f.file_name, f.target);
                print!("{}", f.text);
            }
        }
    }
    Ok(())
}
