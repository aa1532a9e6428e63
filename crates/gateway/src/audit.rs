//! The audit trail: every drain, undrain, reload and adaptive-C move is one structured `tracing`
//! event under the `spillway::audit` target — what changed, before → after, and who did it — so
//! emergency changes can be found in the logs and brought back to Git.

use crate::config::Config;

/// The `tracing` target of audit events, for a log pipeline to keep them apart.
pub const TARGET: &str = "spillway::audit";

/// A replica taken out of (or put back into) rotation.
pub(crate) fn drain(by: &str, route: &str, replica: &str, before: bool, after: bool) {
    let action = if after { "drain" } else { "undrain" };
    tracing::info!(
        target: TARGET,
        action,
        by,
        route,
        replica,
        before = drained(before),
        after = drained(after),
        "admin change: {action} {replica}"
    );
}

fn drained(d: bool) -> &'static str {
    if d { "drained" } else { "in service" }
}

/// A configuration applied (`error` is `None`) or refused, with the limits before and after.
pub(crate) fn reload(by: &str, path: &str, before: &Config, after: Option<&Config>, error: Option<&str>) {
    let before = limits(before);
    match (after, error) {
        (Some(after), None) => tracing::info!(
            target: TARGET,
            action = "reload",
            by,
            path,
            before = %before,
            after = %limits(after),
            "admin change: configuration reloaded"
        ),
        _ => tracing::warn!(
            target: TARGET,
            action = "reload",
            by,
            path,
            before = %before,
            after = %before,
            error = error.unwrap_or("refused"),
            "admin change refused: the running configuration stays"
        ),
    }
}

/// The public listener's certificate read again (`error` is `None`) or kept.
pub(crate) fn certificate(
    by: &str,
    files: &crate::config::TlsConfig,
    error: Option<&crate::config::ConfigError>,
) {
    let (cert, key) = (files.cert.display(), files.key.display());
    match error {
        None => tracing::info!(
            target: TARGET,
            action = "certificate_reload",
            by,
            %cert,
            %key,
            "admin change: TLS certificate reloaded; new connections get it"
        ),
        Some(e) => tracing::warn!(
            target: TARGET,
            action = "certificate_reload",
            by,
            %cert,
            %key,
            error = %e,
            "admin change refused: the TLS certificate in force stays"
        ),
    }
}

/// The adaptive controller moved a class's C.
pub(crate) fn adaptive(route: &str, class: &str, before: u32, after: u32) {
    tracing::info!(
        target: TARGET,
        action = "adaptive_concurrency",
        by = "adaptive controller",
        route,
        class,
        before,
        after,
        "limit change: adaptive concurrency {before} → {after}"
    );
}

/// What a reload changes that an operator reads first: each route's balancer and replicas, each
/// class's C, Q and Wq (and fairness), and the teams' weights. A reload that changes only one of
/// them must not read as "before = after".
pub(crate) fn limits(config: &Config) -> String {
    config
        .routes
        .iter()
        .map(|r| {
            let classes: Vec<String> = r
                .classes
                .iter()
                .map(|c| {
                    format!(
                        "{} C={} Q={} Wq={}{}",
                        c.name,
                        c.concurrency,
                        c.queue,
                        humantime::format_duration(c.queue_wait),
                        c.fairness
                            .map_or(String::new(), |f| format!(" fairness={}", f.as_str()))
                    )
                })
                .collect();
            format!(
                "{} [{} replicas, balance {}; {}]",
                r.model,
                r.replicas.len(),
                r.balance.as_str(),
                classes.join(", ")
            )
        })
        .chain(weights(config))
        .collect::<Vec<_>>()
        .join("; ")
}

/// `weights a=3 b=1`, when a weight differs from 1 (the default the rest keep).
fn weights(config: &Config) -> Option<String> {
    config.tenants.iter().any(|t| t.weight != 1.0).then(|| {
        let each: Vec<String> = config
            .tenants
            .iter()
            .map(|t| format!("{}={}", t.team, t.weight))
            .collect();
        format!("weights {}", each.join(" "))
    })
}
