//! `spillway serve` and `spillway check`: the gateway from a YAML file.

use anyhow::{Context, Result};
use clap::Args;
use gateway::access_log::AccessLog;
use gateway::{Config, Gateway};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// The configuration file (YAML; see docs/config.md).
    #[arg(long, short)]
    config: PathBuf,
    /// Listen here instead of the file's `listen`.
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Worker threads (default: one per core). One worker runs everything on one thread (tokio's
    /// current-thread runtime): no cross-thread wake-ups, and how proxies are compared per worker.
    #[arg(long)]
    pub(crate) workers: Option<std::num::NonZeroUsize>,
}

#[derive(Args, Debug)]
pub(crate) struct CheckArgs {
    /// The configuration file to check.
    config: PathBuf,
}

fn load(path: &Path) -> Result<Config> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Config::from_yaml(&text).with_context(|| format!("{} is not a valid configuration", path.display()))
}

pub(crate) fn check(args: &CheckArgs) -> ExitCode {
    // The admin token and the Redis URL live in the environment: check them as `serve` would.
    let loaded = load(&args.config).and_then(|config| {
        let env = |name: &str| std::env::var(name).ok();
        let invalid = || format!("{} is not a valid configuration", args.config.display());
        if let Some(admin) = &config.admin {
            admin.token(&env).with_context(invalid)?;
        }
        if let Some(redis) = &config.redis {
            redis.url(&env).with_context(invalid)?;
        }
        // The files a gateway reads at start: its certificate and key, the replicas' CA bundles.
        if let Some(tls) = &config.server.tls {
            gateway::tls::ServerTls::load(tls).with_context(invalid)?;
        }
        gateway::tls::check_ca_files(&config).with_context(invalid)?;
        Ok(config)
    });
    match loaded {
        Ok(config) => {
            println!("{}: ok", args.config.display());
            for r in &config.routes {
                let t = r.timeouts;
                println!(
                    "  {} → {} replica(s), balance {}; budgets connect {:?} < first_token {:?} ≤ total {:?}, stream_idle {:?}",
                    r.model,
                    r.replicas.len(),
                    r.balance.as_str(),
                    t.connect,
                    t.first_token,
                    t.total,
                    t.stream_idle
                );
                for c in &r.classes {
                    println!(
                        "    class {}: C = {}, Q = {}, Wq = {:?}, fairness {}",
                        c.name,
                        c.concurrency,
                        c.queue,
                        c.queue_wait,
                        c.fairness.unwrap_or_default().as_str()
                    );
                }
            }
            if let Some(r) = &config.redis {
                println!(
                    "  limits shared through Redis (URL from ${}) by {} gateways, namespace {}, lease_ttl {:?}; limit ÷ gateways each while Redis is unreachable",
                    r.url_env, r.gateways, r.namespace, r.lease_ttl
                );
            }
            if let Some(t) = &config.tracing {
                println!(
                    "  traces to {} (service {}), {}% of new traces sampled, a caller's decision kept",
                    t.traces_url(),
                    t.service_name,
                    t.sample_ratio * 100.0
                );
            }
            if let Some(a) = &config.admin {
                println!(
                    "  admin API on {} (token from ${}, named {} in the audit log); /metrics on the {} listener",
                    a.listen,
                    a.token_env,
                    a.actor(),
                    if config.server.metrics == gateway::config::MetricsExposure::Admin {
                        "admin"
                    } else {
                        "public"
                    }
                );
            }
            if let Some(tls) = &config.server.tls {
                println!(
                    "  TLS on {} (HTTP/1.1 and h2) with {}, key {}; read again on SIGHUP, a reload or a change of the files",
                    config.listen,
                    tls.cert.display(),
                    tls.key.display()
                );
            }
            println!(
                "  tenants: {}",
                if config.tenants.is_empty() {
                    "none (anonymous access)".to_owned()
                } else {
                    config.tenants.len().to_string()
                }
            );
            // What fair share divides a contended class by.
            for t in &config.tenants {
                println!(
                    "    team {}: weight {}, priority {}",
                    t.team,
                    t.weight,
                    t.priority.as_str()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("spillway: {e:#}");
            ExitCode::from(1)
        }
    }
}

pub(crate) async fn serve(args: ServeArgs) -> Result<()> {
    let mut config = load(&args.config)?;
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    let access = AccessLog::stdout();
    let listen = config.listen;
    let gateway = Gateway::new(config, access)?;
    // Hot reload: on SIGHUP, when the file changes, and through the admin API.
    gateway.set_config_path(args.config.clone());
    tokio::spawn(gateway::admin::watch_file(
        gateway.clone(),
        args.config.clone(),
        std::time::Duration::from_secs(2),
    ));
    #[cfg(unix)]
    {
        let g = gateway.clone();
        let path = args.config.clone();
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                let _ = gateway::admin::reload_file(&g, &path, "SIGHUP");
            }
        });
    }
    let listener = gateway::bind(listen).with_context(|| format!("cannot listen on {listen}"))?;
    tracing::info!(%listen, routes = gateway.config.routes.len(), "gateway ready");
    gateway::run(listener, gateway, crate::engine_cmd::shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}
