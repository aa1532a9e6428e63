//! The run as text: one line per finished level while it runs, and the final table.

use std::fmt::Write;

use crate::run::{BurstReport, LevelReport, Report};
use crate::spec::Phase;

/// A duration in seconds shown in the unit a reader expects: µs, ms or s.
pub fn secs(v: f64) -> String {
    if v < 1e-3 {
        format!("{:.0}µs", v * 1e6)
    } else if v < 1.0 {
        format!("{:.1}ms", v * 1e3)
    } else {
        format!("{v:.2}s")
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".into(), secs)
}

/// `staircase C=16: 412 req, ttft p95 12.1ms, itl p95 5.0ms, 31.2 req/s — pass`
pub fn one_line(l: &LevelReport) -> String {
    let s = &l.stats;
    let mut line = format!(
        "{:<9} {:<14} {:>6} req  ttft p95 {:>8}  itl p95 {:>8}  {:>8.1} req/s  {:>9.0} tok/s  errors {:>5.1}%  {}",
        l.phase.name(),
        l.load.to_string(),
        s.requests,
        opt(s.ttft.map(|p| p.p95)),
        opt(s.itl.map(|p| p.p95)),
        s.throughput_rps,
        s.output_tokens_per_second,
        s.error_rate * 100.0,
        verdict(l),
    );
    if !l.reasons.is_empty() {
        let _ = write!(line, " ({})", l.reasons.join("; "));
    }
    if let Some(d) = &l.distorted {
        let _ = write!(line, " [DISTORTED: {d}]");
    }
    if let Some(t) = &l.too_short {
        let _ = write!(line, " [TOO SHORT: {t}]");
    }
    line
}

/// `pass`/`FAIL`; a burst level is judged by its recovery alone (it is meant to breach the SLOs
/// while the burst lasts), so it says `recovered`/`NOT RECOVERED` instead.
pub fn verdict(l: &LevelReport) -> &'static str {
    match (l.phase, l.pass) {
        (Phase::Burst, true) => "recovered",
        (Phase::Burst, false) => "NOT RECOVERED",
        (_, true) => "pass",
        (_, false) => "FAIL",
    }
}

/// The errors of a level by kind, each with the first message of that kind as the server worded
/// it: `http_4xx 45 (e.g. "This model's maximum context length is 4096 tokens…")`.
pub fn errors_line(l: &LevelReport) -> Option<String> {
    let errs: Vec<String> = l
        .stats
        .errors
        .iter()
        .map(|(k, v)| match l.error_examples.get(k) {
            Some(e) => format!("{k} {v} (e.g. \"{e}\")"),
            None => format!("{k} {v}"),
        })
        .collect();
    (!errs.is_empty()).then(|| errs.join(", "))
}

fn after(s: f64) -> String {
    if s == 0.0 {
        "at once".into()
    } else {
        format!("after {}", secs(s))
    }
}

pub fn burst_line(b: &BurstReport) -> String {
    format!(
        "burst     {:<14} ×{} for {:.1}s: ttft recovered {}, queue recovered {} — {}",
        b.load.to_string(),
        b.factor,
        b.burst_end - b.burst_start,
        b.ttft_recovery_seconds.map_or("never".into(), after),
        match (b.baseline_waiting, b.queue_recovery_seconds) {
            (None, _) => "unknown (no --metrics-url)".into(),
            (Some(_), Some(s)) => after(s),
            (Some(_), None) => "never".into(),
        },
        if b.recovered {
            "recovers"
        } else {
            "DOES NOT RECOVER"
        }
    )
}

/// The columns of a level that the table and the HTML report both show.
pub(crate) const COLUMNS: [&str; 14] = [
    "phase", "load", "req", "ok%", "ttft p50", "ttft p95", "ttft p99", "itl p95", "e2e p95", "req/s",
    "tok/s", "goodput", "waiting", "lag95",
];

/// One level's values for [`COLUMNS`].
pub(crate) fn cells(l: &LevelReport) -> [String; 14] {
    let s = &l.stats;
    let ok = if s.requests == 0 {
        0.0
    } else {
        100.0 * s.ok as f64 / s.requests as f64
    };
    [
        l.phase.name().to_string(),
        l.load.to_string(),
        s.requests.to_string(),
        format!("{ok:.1}"),
        opt(s.ttft.map(|p| p.p50)),
        opt(s.ttft.map(|p| p.p95)),
        opt(s.ttft.map(|p| p.p99)),
        opt(s.itl.map(|p| p.p95)),
        opt(s.e2e.map(|p| p.p95)),
        format!("{:.1}", s.throughput_rps),
        format!("{:.0}", s.output_tokens_per_second),
        format!("{:.0}%", s.goodput_share * 100.0),
        l.queue
            .as_ref()
            .map_or("-".into(), |q| format!("{:.1}", q.waiting_mean)),
        opt(s.send_lag.map(|p| p.p95)),
    ]
}

/// Where the time to the first token went, from the gateway's `Server-Timing` (means, which add
/// up; then p95s): its queue, the upstream's first byte, and the rest (the gateway's own work and
/// the network). `None` when the server sent no `Server-Timing`.
pub(crate) fn split_line(l: &LevelReport) -> Option<String> {
    let s = &l.stats;
    let (ttft, queue, upstream) = (s.ttft?, s.gateway_queue?, s.upstream_first_byte?);
    Some(format!(
        "ttft split (Server-Timing), mean: gateway queue {} + upstream first byte {} + the rest {} = ttft {} · p95: queue {}, upstream {}",
        secs(queue.mean),
        secs(upstream.mean),
        secs((ttft.mean - queue.mean - upstream.mean).max(0.0)),
        secs(ttft.mean),
        secs(queue.p95),
        secs(upstream.p95),
    ))
}

/// The final table: every level, then the bursts, the self-check and the conclusion.
/// The prompts' length as asked against the server's count of it.
pub fn prompt_line(p: &crate::run::PromptDrift) -> String {
    format!(
        "prompt tokens: {:.0} asked, {:.0} counted by the server on average over {} requests ({} of its chat template's); drift {:+.1}%",
        p.asked_mean,
        p.served_mean,
        p.requests,
        p.template_tokens
            .map_or("? tokens".to_owned(), |t| format!("{t} tokens")),
        p.drift * 100.0
    )
}

pub fn table(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "spillway bench {} → {} ({}), SLO {}",
        r.tool.version, r.parameters.url, r.parameters.model, r.parameters.slo
    );
    let widths = [9, 14, 6, 5, 9, 9, 9, 9, 9, 8, 9, 8, 7, 6];
    let line = |cells: &[String]| {
        let mut row = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            let _ = if i < 2 {
                write!(row, "{cell:<w$} ")
            } else {
                write!(row, "{cell:>w$} ")
            };
        }
        row
    };
    let header: Vec<String> = COLUMNS.iter().map(|c| c.to_string()).collect();
    let _ = writeln!(out, "{} verdict", line(&header));
    let levels = r.levels.iter().chain(r.bursts.iter().map(|b| &b.level));
    for l in levels {
        let _ = writeln!(
            out,
            "{} {}{}",
            line(&cells(l)),
            verdict(l),
            if l.distorted.is_some() { " (distorted)" } else { "" },
        );
        if let Some(errs) = errors_line(l) {
            let _ = writeln!(out, "{:>26} errors: {errs}", "");
        }
        if let Some(split) = split_line(l) {
            let _ = writeln!(out, "{:>26} {split}", "");
        }
        for reason in &l.reasons {
            let _ = writeln!(out, "{:>26} {reason}", "");
        }
        if let (Some(short), Some(long)) = (&l.short, &l.long) {
            let _ = writeln!(
                out,
                "{:>26} short requests: ttft p95 {}, itl p95 {} · long requests ({}): ttft p95 {}, e2e p95 {}",
                "",
                opt(short.ttft.map(|p| p.p95)),
                opt(short.itl.map(|p| p.p95)),
                long.requests,
                opt(long.ttft.map(|p| p.p95)),
                opt(long.e2e.map(|p| p.p95)),
            );
        }
        if let Some(d) = &l.distorted {
            let _ = writeln!(out, "{:>26} self-check: {d}", "");
        }
        if let Some(t) = &l.too_short {
            let _ = writeln!(out, "{:>26} too short: {t}", "");
        }
    }
    for b in &r.bursts {
        let _ = writeln!(out, "{}", burst_line(b));
    }
    if r.distorted_levels > 0 {
        let _ = writeln!(
            out,
            "WARNING: {} level(s) flagged: the client's own lag may have inflated their latencies.",
            r.distorted_levels
        );
    }
    if let Some(p) = &r.prompt_tokens {
        let _ = writeln!(out, "{}", prompt_line(p));
    }
    for note in &r.notes {
        let prefix = if note.starts_with("WARNING") { "" } else { "note: " };
        let _ = writeln!(out, "{prefix}{note}");
    }
    let _ = writeln!(out, "{}", r.summary);
    out
}
