//! The `spillway` command line: parses arguments, wires the library crates, maps errors to exit codes.

mod bench_cmd;
mod completions_cmd;
mod demo_cmd;
mod diagnose_cmd;
mod engine_cmd;
mod engine_fit_cmd;
mod key_cmd;
mod plan_cmd;
mod plan_sim;
mod serve_cmd;
mod trace_cmd;

use clap::{CommandFactory, Parser, Subcommand};
use std::process::ExitCode;

/// glibc's malloc took about 9% of the gateway's CPU per streamed request (a request allocates
/// and frees a few dozen small blocks on one thread); mimalloc's per-thread free lists cost less.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Spillway keeps LLM serving inside its SLOs: a bounded wait in front of the model servers, fast
/// and honest rejections when it is full, and measurements of where each request waited.
// The about text is the doc comment above, not the package description (which names commands
// still to come): `--help` lists only what exists.
#[derive(Parser, Debug)]
#[command(name = "spillway", version, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run simulated vLLM engines: OpenAI API, continuous batching, paged KV cache, vLLM's
    /// metric names and scripted faults, without a GPU. The upstream for tests, benches and demos.
    Engine(engine_cmd::EngineArgs),
    /// Run the gateway: an OpenAI-compatible streaming proxy that admits at most C requests per
    /// class, queues at most Q for at most Wq, caps what one request may cost, nests its timeouts
    /// and says in /metrics where every request waited.
    Serve(serve_cmd::ServeArgs),
    /// Load-test an OpenAI-compatible server against SLOs: baseline, staircase, long mix and burst
    /// phases; finds the safe concurrency (the SLOs hold and the queue recovers after a burst).
    Bench(Box<bench_cmd::BenchArgs>),
    /// Read the gateway's, the engines' and the GPUs' metrics (scraped, or from Prometheus) and
    /// name the bottleneck with evidence; exit 0 no incident (idle, healthy, busy but healthy, or
    /// protected: refusing by design while the admitted meet their objectives), 1 an objective
    /// breached or saturated, 2 could not diagnose.
    Diagnose(diagnose_cmd::DiagnoseArgs),
    /// Turn one measurement into consistent limits for every control point: C, Q, Wq and nested
    /// timeouts with the arithmetic shown, and config for Spillway, Envoy Gateway, LiteLLM, vLLM
    /// and KServe.
    Plan(Box<plan_cmd::PlanArgs>),
    /// Read a trace — the gateway's access log, Mooncake JSONL, the Azure LLM inference CSV — and
    /// summarise it or convert it into another of the formats, to replay with `bench --trace`.
    Trace(trace_cmd::TraceArgs),
    /// The whole story on this machine without a GPU: simulated engines behind the gateway, a
    /// staircase to the safe concurrency, the planned limits applied by a reload, the same overload
    /// burst without and with them, and diagnose's verdict; writes an HTML report.
    Demo(demo_cmd::DemoArgs),
    /// Check a gateway configuration file and print what it would enforce; exit 1 if it is invalid.
    Check(serve_cmd::CheckArgs),
    /// Make a new API key and print it with its key_sha256 for the configuration; or, with --hash,
    /// hash a key read from standard input.
    Key(key_cmd::KeyArgs),
    /// Print the completion script for a shell, e.g. `spillway completions bash >
    /// ~/.local/share/bash-completion/completions/spillway`.
    Completions(completions_cmd::CompletionsArgs),
}

/// A command that has said what it had to and ends with its own exit code (the diagnosis's
/// verdict, an interrupted demo): `main` exits with it, the one place the process's code is set.
#[derive(Debug)]
pub(crate) struct Exit(pub(crate) u8);

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}", self.0)
    }
}

impl std::error::Error for Exit {}

/// A reader that stops early (`spillway check … | head`) is no error: Unix tools end quietly when
/// their output's reader has gone (SIGPIPE), while Rust ignores SIGPIPE and `println!` panics on
/// the broken pipe instead. This hook turns that panic, on any thread, into a quiet exit 0, as
/// [`broken_pipe`] does for an error a command returns; any other panic is reported as before.
fn quiet_on_broken_pipe() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info.payload_as_str().unwrap_or_default();
        let printing = message.starts_with("failed printing to stdout")
            || message.starts_with("failed printing to stderr");
        if printing && message.contains("Broken pipe") {
            std::process::exit(0);
        }
        report(info);
    }));
}

/// Whether a command's error is a write into a pipe whose reader has gone.
fn broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn main() -> ExitCode {
    quiet_on_broken_pipe();
    let cli = Cli::parse();
    // The demo tells its own story on stdout; its servers' routine logs would interleave with it.
    let default_level = if matches!(cli.command, Command::Demo(_)) {
        "warn"
    } else {
        "info"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_level.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Command::Completions(args) = &cli.command {
        return completions_cmd::print(args, &mut Cli::command());
    }
    if let Command::Check(args) = &cli.command {
        return serve_cmd::check(args);
    }
    if let Command::Trace(args) = &cli.command {
        return match trace_cmd::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) if broken_pipe(&e) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("spillway: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    if let Command::Key(args) = &cli.command {
        return match key_cmd::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) if broken_pipe(&e) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("spillway: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    // A proxy or engine holding thousands of streams needs a descriptor each: take the hard limit.
    if let Err(e) = rlimit::increase_nofile_limit(u64::MAX) {
        tracing::warn!(error = %e, "cannot raise the open-files limit");
    }
    let workers = match &cli.command {
        Command::Serve(args) => args.workers,
        _ => None,
    };
    let mut builder = match workers {
        Some(n) if n.get() == 1 => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n.get());
            b
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("spillway: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Engine(args) => engine_cmd::run(args).await,
            Command::Serve(args) => serve_cmd::serve(args).await,
            Command::Bench(args) => bench_cmd::run(*args).await,
            Command::Diagnose(args) => diagnose_cmd::run(args).await,
            Command::Plan(args) => plan_cmd::run(*args),
            Command::Demo(args) => demo_cmd::run(args).await,
            Command::Check(_) | Command::Key(_) | Command::Completions(_) | Command::Trace(_) => {
                unreachable!("handled before the runtime starts")
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => match e.downcast_ref::<Exit>() {
            Some(&Exit(code)) => {
                // As the command's own exit did: nothing it left running is waited for.
                runtime.shutdown_background();
                ExitCode::from(code)
            }
            None if broken_pipe(&e) => ExitCode::SUCCESS,
            None => {
                eprintln!("spillway: {e:#}");
                ExitCode::from(2)
            }
        },
    }
}
