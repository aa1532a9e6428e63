//! The run as text: one line per finished level while it runs, and the final table.

use std::fmt::Write;

use crate::result::{BurstReport, LevelReport, Report};
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

/// `v` and the `bound` it was compared with, as [`secs`] prints them, with more decimals (both in
/// `v`'s unit) where that would print two different values alike: "1.2ms exceeds 1.2ms" reads as a
/// contradiction.
pub fn secs_against(v: f64, bound: f64) -> (String, String) {
    let (a, b) = (secs(v), secs(bound));
    if a != b || v == bound {
        return (a, b);
    }
    let (scale, unit) = if v < 1e-3 {
        (1e6, "µs")
    } else if v < 1.0 {
        (1e3, "ms")
    } else {
        (1.0, "s")
    };
    let at = |d: usize| {
        (
            format!("{:.d$}{unit}", v * scale),
            format!("{:.d$}{unit}", bound * scale),
        )
    };
    (1..=6).map(at).find(|(a, b)| a != b).unwrap_or((a, b))
}

/// A share as a percentage with two decimals, or more where two would print it as the `bound` it
/// was compared with.
pub fn percent_against(v: f64, bound: f64) -> String {
    (2..=6)
        .map(|d| (format!("{:.d$}%", v * 100.0), format!("{:.d$}%", bound * 100.0)))
        .find(|(a, b)| a != b || v == bound)
        .map_or_else(|| format!("{:.2}%", v * 100.0), |(a, _)| a)
}

/// A number with the decimals it needs, at most three: `2`, `1.5`, `0.667`.
pub use bench_schema::units::number;

/// A configured duration as a person writes it: `30 s`, `1.5 s`, `250 ms`.
pub fn duration(d: std::time::Duration) -> String {
    if d < std::time::Duration::from_secs(1) {
        format!("{} ms", number(d.as_secs_f64() * 1e3))
    } else {
        format!("{} s", number(d.as_secs_f64()))
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".into(), secs)
}

/// [`one_line`] at `width`: in a narrow terminal, the same facts in fewer words, wrapped.
pub fn one_line_for(l: &LevelReport, width: Width) -> String {
    let Width::Narrow(_) = width else {
        return one_line(l);
    };
    let s = &l.stats;
    let mut text = format!(
        "{} {}: {} req, ttft p95 {}, itl p95 {}, {:.1} req/s, errors {:.1}% — {}",
        l.phase.name(),
        l.load,
        s.requests,
        opt(s.ttft.map(|p| p.p95)),
        opt(s.itl.map(|p| p.p95)),
        s.throughput_rps,
        s.error_rate * 100.0,
        verdict(l),
    );
    if !l.reasons.is_empty() {
        let _ = write!(text, " ({})", l.reasons.join("; "));
    }
    if let Some(d) = &l.distorted {
        let _ = write!(text, " [DISTORTED: {d}]");
    }
    if let Some(t) = &l.too_short {
        let _ = write!(text, " [TOO SHORT: {t}]");
    }
    fit(&text, width)
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

/// `honoured Retry-After 12 times: 12.0 s waited in all, in no latency`.
pub fn retry_waits_line(l: &LevelReport) -> Option<String> {
    let w = l.stats.retry_waits?;
    Some(format!(
        "honoured Retry-After {} time(s): {} waited in all before sending again, in no latency",
        w.waits,
        secs(w.waited_seconds)
    ))
}

fn after(s: f64) -> String {
    if s == 0.0 {
        "at once".into()
    } else {
        format!("after {}", secs(s))
    }
}

/// `burst     C=16  ×2 for 5 s: ttft recovered after 1.75s, queue did not recover — DOES NOT RECOVER`
pub fn burst_line(b: &BurstReport) -> String {
    let ttft = match b.ttft_recovery_seconds {
        Some(s) => format!("ttft recovered {}", after(s)),
        None => "ttft did not recover".into(),
    };
    let queue = match (b.baseline_waiting, b.queue_recovery_seconds) {
        (None, _) => "queue unknown (no --metrics-url)".into(),
        (Some(_), Some(s)) => format!("queue recovered {}", after(s)),
        (Some(_), None) => "queue did not recover".into(),
    };
    format!(
        "burst     {:<14} ×{} for {}: {ttft}, {queue} — {}",
        b.load.to_string(),
        number(b.factor),
        duration(std::time::Duration::from_secs_f64(
            (b.burst_end - b.burst_start).max(0.0)
        )),
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

/// The prompts' length as asked against the server's count of it.
pub fn prompt_line(p: &crate::result::PromptDrift) -> String {
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

/// How wide the text may run: the full table, or a narrower one for a terminal of `columns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Width {
    Full,
    Narrow(usize),
}

impl Width {
    /// From this many columns the full table's rows and most lines under them fit; below, they
    /// would wrap onto two or more lines each.
    pub const FULL_FROM: usize = 160;

    pub fn columns(columns: usize) -> Width {
        if columns >= Self::FULL_FROM {
            Width::Full
        } else {
            Width::Narrow(columns.max(40))
        }
    }

    /// For standard output: the terminal's width (`COLUMNS` when set, as a shell or a user may
    /// say, else the terminal's own); the full table when it is not a terminal, for files and pipes.
    pub fn of_stdout() -> Width {
        Self::terminal(std::io::IsTerminal::is_terminal(&std::io::stdout()))
    }

    /// For standard error, where the live lines go.
    pub fn of_stderr() -> Width {
        Self::terminal(std::io::IsTerminal::is_terminal(&std::io::stderr()))
    }

    fn terminal(is_terminal: bool) -> Width {
        if !is_terminal {
            return Width::Full;
        }
        let env = std::env::var("COLUMNS").ok().and_then(|c| c.trim().parse().ok());
        let tty = || terminal_size::terminal_size().map(|(w, _)| usize::from(w.0));
        env.or_else(tty).map_or(Width::Full, Width::columns)
    }
}

/// `text` broken at spaces into lines of at most `width` characters, each after `indent` spaces
/// (a word longer than a line stays whole).
pub fn wrap(text: &str, width: usize, indent: usize) -> String {
    let room = width.saturating_sub(indent).max(20);
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > room {
            let _ = writeln!(out, "{:indent$}{line}", "");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        let _ = writeln!(out, "{:indent$}{line}", "");
    }
    out
}

/// The columns of the narrow table, indices into [`COLUMNS`]: the load, the success share, the
/// latencies the SLOs usually name and the throughput; with shorter names, so that a row and its
/// verdict fit 80 columns.
const NARROW: [usize; 8] = [0, 1, 3, 5, 6, 7, 8, 9];
const NARROW_NAMES: [&str; 8] = [
    "phase", "load", "ok%", "ttft95", "ttft99", "itl95", "e2e95", "req/s",
];
const NARROW_WIDTHS: [usize; 8] = [9, 10, 5, 7, 7, 7, 7, 6];
const FULL_WIDTHS: [usize; 14] = [9, 14, 6, 5, 9, 9, 9, 9, 9, 8, 9, 8, 7, 6];

/// One row of cells, the first two left-aligned.
fn row(cells: &[String], widths: &[usize]) -> String {
    let mut row = String::new();
    for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
        let _ = if i < 2 {
            write!(row, "{cell:<w$} ")
        } else {
            write!(row, "{cell:>w$} ")
        };
    }
    row
}

fn pick(all: [String; 14], width: Width) -> Vec<String> {
    match width {
        Width::Full => all.to_vec(),
        Width::Narrow(_) => NARROW.iter().map(|i| all[*i].clone()).collect(),
    }
}

fn widths(width: Width) -> &'static [usize] {
    match width {
        Width::Full => &FULL_WIDTHS,
        Width::Narrow(_) => &NARROW_WIDTHS,
    }
}

/// A line under a level's row: after 26 spaces in the full table; wrapped to the width, after four,
/// in the narrow one.
fn under(out: &mut String, text: &str, width: Width) {
    match width {
        Width::Full => {
            let _ = writeln!(out, "{:>26} {text}", "");
        }
        Width::Narrow(columns) => out.push_str(&wrap(text, columns, 4)),
    }
}

/// A line of its own, wrapped in the narrow table.
fn line(out: &mut String, text: &str, width: Width) {
    out.push_str(&fit(text, width));
    out.push('\n');
}

/// `text` as one line in the full table, or wrapped to the narrow one's width, the first line at
/// the margin and the rest two spaces in; without a final newline.
pub fn fit(text: &str, width: Width) -> String {
    match width {
        Width::Full => text.to_owned(),
        Width::Narrow(columns) => {
            let wrapped = wrap(text, columns, 2);
            wrapped
                .strip_prefix("  ")
                .unwrap_or(&wrapped)
                .trim_end()
                .to_owned()
        }
    }
}

/// The table's header row.
pub fn table_header(width: Width) -> String {
    let header: Vec<String> = match width {
        Width::Full => COLUMNS.map(str::to_owned).to_vec(),
        Width::Narrow(_) => NARROW_NAMES.map(str::to_owned).to_vec(),
    };
    format!("{} verdict\n", row(&header, widths(width)))
}

/// One level's row and the lines under it, as the table shows them (and as the demo streams them
/// when each level ends).
pub fn table_level(l: &LevelReport, width: Width) -> String {
    let mut out = String::new();
    let flag = match (width, l.distorted.is_some()) {
        (Width::Full, true) => " (distorted)",
        _ => "",
    };
    let _ = writeln!(
        out,
        "{} {}{flag}",
        row(&pick(cells(l), width), widths(width)),
        verdict(l)
    );
    if let Some(errs) = errors_line(l) {
        under(&mut out, &format!("errors: {errs}"), width);
    }
    if let Some(w) = retry_waits_line(l) {
        under(&mut out, &w, width);
    }
    if let Some(split) = split_line(l) {
        under(&mut out, &split, width);
    }
    for reason in &l.reasons {
        under(&mut out, reason, width);
    }
    if let (Some(short), Some(long)) = (&l.short, &l.long) {
        let text = format!(
            "short requests: ttft p95 {}, itl p95 {} · long requests ({}): ttft p95 {}, e2e p95 {}",
            opt(short.ttft.map(|p| p.p95)),
            opt(short.itl.map(|p| p.p95)),
            long.requests,
            opt(long.ttft.map(|p| p.p95)),
            opt(long.e2e.map(|p| p.p95)),
        );
        under(&mut out, &text, width);
    }
    if let Some(d) = &l.distorted {
        under(&mut out, &format!("self-check: {d}"), width);
    }
    if let Some(t) = &l.too_short {
        under(&mut out, &format!("too short: {t}"), width);
    }
    out
}

/// What follows the rows: the bursts, the self-check, the prompts' drift, the notes and the
/// conclusion.
pub fn table_tail(r: &Report, width: Width) -> String {
    let mut out = String::new();
    for b in &r.bursts {
        line(&mut out, &burst_line(b), width);
    }
    if r.distorted_levels > 0 {
        line(
            &mut out,
            &format!(
                "WARNING: {} level(s) flagged: the client's own lag may have inflated their latencies.",
                r.distorted_levels
            ),
            width,
        );
    }
    if let Some(p) = &r.prompt_tokens {
        line(&mut out, &prompt_line(p), width);
    }
    for note in &r.notes {
        let prefix = if note.starts_with("WARNING") { "" } else { "note: " };
        line(&mut out, &format!("{prefix}{note}"), width);
    }
    line(&mut out, &r.summary, width);
    out
}

/// The whole table, full width.
pub fn table(r: &Report) -> String {
    table_for(r, Width::Full)
}

/// The whole table at `width`: the title, every level (the bursts' too), then [`table_tail`].
pub fn table_for(r: &Report, width: Width) -> String {
    let mut out = String::new();
    line(
        &mut out,
        &format!(
            "spillway bench {} → {} ({}, {} API), SLO {}",
            r.tool.version, r.parameters.url, r.parameters.model, r.parameters.api, r.parameters.slo
        ),
        width,
    );
    out.push_str(&table_header(width));
    for l in r.levels.iter().chain(r.bursts.iter().map(|b| &b.level)) {
        out.push_str(&table_level(l, width));
    }
    out.push_str(&slo_classes_table(
        r.levels.iter().chain(r.bursts.iter().map(|b| &b.level)),
        width,
    ));
    out.push_str(&tenants_table(&r.tenants, r.fairness.as_ref(), width));
    out.push_str(&table_tail(r, width));
    out
}

/// The counts of the tenants' table, as the terminal and the HTML report show them.
pub(crate) const TENANT_COUNTS: [&str; 10] = [
    "tenant", "load", "sent", "served", "429", "503", "w/RA", "err", "req%", "tok%",
];
/// Its latencies, after the tenant's name.
pub(crate) const TENANT_LATENCIES: [&str; 7] =
    ["ttft50", "ttft95", "ttft99", "itl50", "itl95", "e2e95", "queue95"];

/// One tenant's values for [`TENANT_COUNTS`] and [`TENANT_LATENCIES`] (its name not repeated).
pub(crate) fn tenant_cells(t: &crate::tenants::TenantReport) -> ([String; 10], [String; 7]) {
    let pct = |v: f64| format!("{:.1}%", v * 100.0);
    (
        [
            t.name.clone(),
            match t.load {
                crate::spec::Load::Concurrency(c) => format!("C={c}"),
                crate::spec::Load::Rate(r) => format!("{}/s", number(r)),
            },
            t.sent.to_string(),
            t.served.to_string(),
            t.refused_429.to_string(),
            t.refused_503.to_string(),
            t.refused_with_retry_after.to_string(),
            t.errors.to_string(),
            pct(t.served_share),
            pct(t.token_share),
        ],
        [
            opt(t.ttft.map(|p| p.p50)),
            opt(t.ttft.map(|p| p.p95)),
            opt(t.ttft.map(|p| p.p99)),
            opt(t.itl.map(|p| p.p50)),
            opt(t.itl.map(|p| p.p95)),
            opt(t.e2e.map(|p| p.p95)),
            opt(t.gateway_queue.map(|p| p.p95)),
        ],
    )
}

/// `equal-share fairness (Jain's index over 2 tenants, unweighted; …): 0.67 over served tokens, 0.67
/// over served requests`. Named apart from the gateway's `spillway_weighted_fairness_index`, which
/// divides each team's service by its weight and decays it: one index, two different numbers.
pub fn fairness_line(f: &crate::tenants::Fairness) -> String {
    let index = |j: Option<f64>| j.map_or("-".to_owned(), |j| format!("{j:.3}"));
    format!(
        "equal-share fairness (Jain's index over {} tenants, unweighted, the whole run; 1: equal shares, {}: one got everything; not the gateway's weighted index): {} over served tokens, {} over served requests",
        f.tenants,
        number(1.0 / f.tenants.max(1) as f64),
        index(f.jain_served_tokens),
        index(f.jain_served_requests),
    )
}

/// What the tenants' table's short headers mean.
pub const TENANT_LEGEND: &str = "sent = served + 429 + 503 + err; w/RA: refusals that carried Retry-After; req% and tok%: \
     share of all served requests and of served tokens (prompt + completion); latencies over served \
     requests; queue95: the gateway's queue (Server-Timing), p95";

/// The tenants of a multi-tenant run: their counts and shares, their latencies (one table in the
/// full width, two in the narrow one, so that each fits 80 columns), the fairness index, and
/// each tenant's errors and Retry-After waits; empty for a run without tenants.
pub fn tenants_table(
    tenants: &[crate::tenants::TenantReport],
    fairness: Option<&crate::tenants::Fairness>,
    width: Width,
) -> String {
    let mut out = String::new();
    let Some(fairness) = fairness else {
        return out;
    };
    let name_width = tenants
        .iter()
        .map(|t| t.name.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(6, crate::tenants::MAX_NAME);
    // With a name of MAX_NAME, a row is 80 columns.
    let count_widths = [name_width, 9, 6, 6, 6, 5, 6, 5, 6, 6];
    let latency_widths = [8; 7];
    let cells: Vec<_> = tenants.iter().map(tenant_cells).collect();
    out.push('\n');
    match width {
        Width::Full => {
            let header: Vec<String> = TENANT_COUNTS
                .iter()
                .chain(&TENANT_LATENCIES)
                .map(|h| (*h).to_owned())
                .collect();
            let widths: Vec<usize> = count_widths.iter().chain(&latency_widths).copied().collect();
            let _ = writeln!(out, "{}", row(&header, &widths).trim_end());
            for (counts, latencies) in &cells {
                let all: Vec<String> = counts.iter().chain(latencies).cloned().collect();
                let _ = writeln!(out, "{}", row(&all, &widths).trim_end());
            }
        }
        Width::Narrow(_) => {
            let header = TENANT_COUNTS.map(str::to_owned);
            let _ = writeln!(out, "{}", row(&header, &count_widths).trim_end());
            for (counts, _) in &cells {
                let _ = writeln!(out, "{}", row(counts, &count_widths).trim_end());
            }
            // The name is left-aligned as the first column; the rest right-aligned.
            let widths: Vec<usize> = std::iter::once(name_width).chain(latency_widths).collect();
            let header: Vec<String> = std::iter::once("tenant")
                .chain(TENANT_LATENCIES)
                .map(str::to_owned)
                .collect();
            let _ = writeln!(out, "{}", row_one_left(&header, &widths).trim_end());
            for (t, (_, latencies)) in tenants.iter().zip(&cells) {
                let all: Vec<String> = std::iter::once(t.name.clone())
                    .chain(latencies.iter().cloned())
                    .collect();
                let _ = writeln!(out, "{}", row_one_left(&all, &widths).trim_end());
            }
        }
    }
    line(&mut out, TENANT_LEGEND, width);
    for t in tenants {
        if !t.error_kinds.is_empty() {
            let kinds: Vec<String> = t.error_kinds.iter().map(|(k, v)| format!("{k} {v}")).collect();
            line(
                &mut out,
                &format!("{} errors: {}", t.name, kinds.join(", ")),
                width,
            );
        }
        if let Some(w) = t.retry_waits {
            line(
                &mut out,
                &format!(
                    "{} honoured Retry-After {} time(s): {} waited in all, in no latency",
                    t.name,
                    w.waits,
                    secs(w.waited_seconds)
                ),
                width,
            );
        }
    }
    line(&mut out, &fairness_line(fairness), width);
    out.push('\n');
    out
}

/// The counts of an objective class's row (`--slo-mix`), as the terminal and the HTML show them.
pub(crate) const SLO_COUNTS: [&str; 9] = [
    "class", "ttft≤", "tpot≤", "sent", "served", "429", "503", "unatt", "err",
];
/// Its goodput and latencies, after the class's name.
pub(crate) const SLO_LATENCIES: [&str; 5] = ["goodput", "ttft50", "ttft99", "tpot50", "tpot99"];

/// One class's values for [`SLO_COUNTS`] and [`SLO_LATENCIES`] (its name not repeated).
pub(crate) fn slo_class_cells(c: &crate::slo_mix::SloClassReport) -> ([String; 9], [String; 5]) {
    let objective = |d: Option<std::time::Duration>| d.map_or("-".to_owned(), |d| secs(d.as_secs_f64()));
    (
        [
            c.name.to_string(),
            objective(Some(c.ttft_objective)),
            objective(c.tpot_objective),
            c.sent.to_string(),
            c.served.to_string(),
            c.refused_429.to_string(),
            c.refused_503.to_string(),
            c.slo_unattainable.to_string(),
            c.errors.to_string(),
        ],
        [
            format!("{:.1}%", c.goodput_share * 100.0),
            opt(c.ttft.map(|p| p.p50)),
            opt(c.ttft.map(|p| p.p99)),
            opt(c.tpot.map(|p| p.p50)),
            opt(c.tpot.map(|p| p.p99)),
        ],
    )
}

/// What the objectives' table's short headers mean.
pub const SLO_LEGEND: &str = "ttft≤, tpot≤: the class's objectives, sent with each of its requests; sent = served + 429 + \
     503 + err; unatt: refusals whose error code was slo_unattainable (no replica predicted to meet \
     the objectives); goodput: share of the class's sent requests served within its own objectives; \
     latencies over served requests";

/// Under this many columns the objectives' table is split in two (counts, then goodput and
/// latencies) so that each fits 80; from it, one row per class fits.
const SLO_ONE_TABLE_FROM: usize = 120;

/// Each level's objective classes (`--slo-mix`): for every level, a row per class with its counts,
/// its goodput against its own objectives and its TTFT/TPOT; empty for a run without a mix.
pub fn slo_classes_table<'a>(levels: impl Iterator<Item = &'a LevelReport>, width: Width) -> String {
    let levels: Vec<&LevelReport> = levels.filter(|l| !l.slo_classes.is_empty()).collect();
    let mut out = String::new();
    let Some(first) = levels.first() else {
        return out;
    };
    let name_width = first
        .slo_classes
        .iter()
        .map(|c| c.name.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(5, crate::slo_mix::MAX_NAME);
    // With a name of MAX_NAME, the counts are 69 columns and one whole row 114.
    let count_widths = [name_width, 7, 7, 6, 6, 5, 5, 5, 5];
    let latency_widths = [8; 5];
    let one_table = match width {
        Width::Full => true,
        Width::Narrow(columns) => columns >= SLO_ONE_TABLE_FROM,
    };
    out.push('\n');
    line(
        &mut out,
        "objectives (--slo-mix): each class against its own objectives",
        width,
    );
    for l in levels {
        let _ = writeln!(out, "{} {}", l.phase.name(), l.load);
        let cells: Vec<_> = l.slo_classes.iter().map(slo_class_cells).collect();
        if one_table {
            let header: Vec<String> = SLO_COUNTS
                .iter()
                .chain(&SLO_LATENCIES)
                .map(|h| (*h).to_owned())
                .collect();
            let widths: Vec<usize> = count_widths.iter().chain(&latency_widths).copied().collect();
            let _ = writeln!(out, "{}", row_one_left(&header, &widths).trim_end());
            for (counts, latencies) in &cells {
                let all: Vec<String> = counts.iter().chain(latencies).cloned().collect();
                let _ = writeln!(out, "{}", row_one_left(&all, &widths).trim_end());
            }
        } else {
            let header = SLO_COUNTS.map(str::to_owned);
            let _ = writeln!(out, "{}", row_one_left(&header, &count_widths).trim_end());
            for (counts, _) in &cells {
                let _ = writeln!(out, "{}", row_one_left(counts, &count_widths).trim_end());
            }
            let widths: Vec<usize> = std::iter::once(name_width).chain(latency_widths).collect();
            let header: Vec<String> = std::iter::once("class")
                .chain(SLO_LATENCIES)
                .map(str::to_owned)
                .collect();
            let _ = writeln!(out, "{}", row_one_left(&header, &widths).trim_end());
            for (c, (_, latencies)) in l.slo_classes.iter().zip(&cells) {
                let all: Vec<String> = std::iter::once(c.name.to_string())
                    .chain(latencies.iter().cloned())
                    .collect();
                let _ = writeln!(out, "{}", row_one_left(&all, &widths).trim_end());
            }
        }
        for c in &l.slo_classes {
            if !c.error_kinds.is_empty() {
                let kinds: Vec<String> = c.error_kinds.iter().map(|(k, v)| format!("{k} {v}")).collect();
                line(
                    &mut out,
                    &format!("{} errors: {}", c.name, kinds.join(", ")),
                    width,
                );
            }
        }
    }
    line(&mut out, SLO_LEGEND, width);
    out
}

/// A row whose first cell alone is left-aligned.
fn row_one_left(cells: &[String], widths: &[usize]) -> String {
    let mut out = String::new();
    for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
        let _ = if i == 0 {
            write!(out, "{cell:<w$} ")
        } else {
            write!(out, "{cell:>w$} ")
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value compared with a bound never prints as the bound itself.
    #[test]
    fn a_value_is_printed_as_far_as_it_differs_from_its_bound() {
        assert_eq!(secs_against(0.0013, 0.0012), ("1.3ms".into(), "1.2ms".into()));
        assert_eq!(secs_against(0.00124, 0.0012), ("1.24ms".into(), "1.20ms".into()));
        assert_eq!(secs_against(1.0004, 1.0), ("1.0004s".into(), "1.0000s".into()));
        assert_eq!(secs_against(0.5, 0.5), ("500.0ms".into(), "500.0ms".into()));
        assert_eq!(percent_against(0.0123, 0.01), "1.23%");
        assert_eq!(percent_against(0.010_04, 0.01), "1.004%");
    }

    /// Two tenants with the longest names allowed, a refused one and one with errors: every line
    /// of the narrow layout fits 80 columns, and the full one has every column in one row each.
    #[test]
    fn the_tenants_table_fits_80_columns_when_narrow() {
        use crate::request::{Outcome, Record};
        use crate::spec::Load;
        use crate::tenants::{Tenant, reports};
        use std::time::Duration;
        let rec = |tenant: &str, outcome: Outcome| {
            let mut r = Record::unanswered(Duration::ZERO, Duration::ZERO, false);
            r.tenant = Some(crate::tenants::tag(tenant));
            if outcome == Outcome::Ok {
                (r.ttft, r.e2e, r.itl_us) = (
                    Some(Duration::from_millis(1234)),
                    Duration::from_secs(12),
                    vec![45_000, 50_000],
                );
                r.output_tokens = 3;
                r.gateway_queue = Some(Duration::from_millis(900));
            } else {
                r.retry_after = Some(Duration::from_secs(1));
                r.retry_wait = Some(Duration::from_secs(1));
            }
            r.outcome = outcome;
            r
        };
        let (a, b) = ("sixteen-chars-ab", "other-tenant.b_2");
        let mut recs: Vec<Record> = (0..99_999).map(|_| rec(a, Outcome::Ok)).collect();
        recs.push(rec(b, Outcome::Ok));
        recs.extend((0..12_345).map(|_| rec(b, Outcome::Status { code: 429 })));
        recs.push(rec(b, Outcome::Status { code: 503 }));
        recs.push(rec(b, Outcome::Timeout));
        let refs: Vec<&Record> = recs.iter().collect();
        let tenant = |name: &str, load| Tenant {
            name: name.into(),
            api_key_env: "K".into(),
            api_key: "k".into(),
            load,
        };
        let (t, f) = reports(
            &[tenant(a, Load::Concurrency(1024)), tenant(b, Load::Rate(1234.5))],
            &refs,
            &[],
            Duration::from_secs(30),
            &"ttft_p95=1s".parse().unwrap(),
        );
        let narrow = tenants_table(&t, Some(&f), Width::Narrow(80));
        for l in narrow.lines() {
            assert!(
                l.chars().count() <= 80,
                "{} columns: {l}\n{narrow}",
                l.chars().count()
            );
        }
        assert!(narrow.contains("sixteen-chars-ab C=1024"), "{narrow}");
        assert!(narrow.contains("other-tenant.b_2 1234.5/s"), "{narrow}");
        assert!(narrow.contains("12345"), "{narrow}");
        assert!(narrow.contains("other-tenant.b_2 errors: timeout 1"), "{narrow}");
        assert!(narrow.contains("honoured Retry-After 12347 time(s)"), "{narrow}");
        assert!(narrow.contains("0.500 over served requests"), "{narrow}");
        let full = tenants_table(&t, Some(&f), Width::Full);
        let row = full.lines().find(|l| l.starts_with(a)).unwrap();
        assert!(
            row.contains("C=1024") && row.trim_end().ends_with("900.0ms"),
            "{full}"
        );
        assert_eq!(tenants_table(&[], None, Width::Full), "");
    }

    /// Two classes, one with the longest name allowed and large counts: under 120 columns two
    /// tables that each fit 80; from 120, one row per class that fits 120.
    #[test]
    fn the_objectives_table_fits_80_columns_when_narrow() {
        use crate::request::{Outcome, Record};
        use crate::result::LevelReport;
        use crate::slo_mix::{SloMix, reports};
        use crate::spec::{Load, Phase};
        use std::time::Duration;
        let mix: SloMix = "sixteen-chars-ab:0.3:ttft=100ms:tpot=20ms,loose:0.7:ttft=1500ms"
            .parse()
            .unwrap();
        let rec = |class: &str, outcome: Outcome| {
            let mut r = Record::unanswered(Duration::ZERO, Duration::ZERO, false);
            r.slo_class = Some(class.into());
            if outcome == Outcome::Ok {
                // TPOT (90 − 50) / 2 = 20 ms: within the tight class's objective, just.
                (r.ttft, r.e2e, r.output_tokens) =
                    (Some(Duration::from_millis(50)), Duration::from_millis(90), 3);
            } else {
                r.error_code = Some("slo_unattainable".into());
            }
            r.outcome = outcome;
            r
        };
        let mut recs: Vec<Record> = (0..99_999)
            .map(|_| rec("sixteen-chars-ab", Outcome::Ok))
            .collect();
        recs.extend((0..12_345).map(|_| rec("sixteen-chars-ab", Outcome::Status { code: 429 })));
        recs.push(rec("loose", Outcome::Ok));
        recs.push(rec("loose", Outcome::Timeout));
        let refs: Vec<&Record> = recs.iter().collect();
        let wall = Duration::from_secs(30);
        let slo: crate::spec::Slo = "ttft_p95=1s".parse().unwrap();
        let level = LevelReport {
            phase: Phase::Staircase,
            load: Load::Concurrency(1024),
            start: Duration::ZERO,
            end: wall,
            stats: crate::stats::LevelStats::compute(&refs, wall, &slo),
            short: None,
            long: None,
            queue: None,
            client_loop_lag: None,
            unsent: 0,
            warmup_requests: 0,
            distorted: None,
            too_short: None,
            pass: true,
            reasons: Vec::new(),
            error_examples: Default::default(),
            slo_classes: reports(&mix, &refs, wall),
            records: None,
        };
        let narrow = slo_classes_table(std::iter::once(&level), Width::Narrow(80));
        for l in narrow.lines() {
            assert!(
                l.chars().count() <= 80,
                "{} columns: {l}\n{narrow}",
                l.chars().count()
            );
        }
        assert!(narrow.contains("staircase C=1024"), "{narrow}");
        let counts = narrow
            .lines()
            .find(|l| l.starts_with("sixteen-chars-ab "))
            .unwrap();
        assert!(
            counts.contains("100.0ms") && counts.contains("20.0ms") && counts.contains("12345"),
            "{narrow}"
        );
        assert!(narrow.contains("loose errors: timeout 1"), "{narrow}");
        let words = narrow.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            words.contains("unatt: refusals whose error code was slo_unattainable"),
            "{narrow}"
        );
        let wide = slo_classes_table(std::iter::once(&level), Width::Narrow(120));
        let row = wide.lines().find(|l| l.starts_with("sixteen-chars-ab ")).unwrap();
        assert!(row.chars().count() <= 120, "{wide}");
        assert!(row.contains("12345") && row.contains("89.0%"), "{wide}");
        assert_eq!(slo_classes_table(std::iter::empty(), Width::Full), "");
    }

    #[test]
    fn terminals_narrower_than_the_full_table_get_the_narrow_one() {
        assert_eq!(Width::columns(80), Width::Narrow(80));
        assert_eq!(Width::columns(120), Width::Narrow(120));
        assert_eq!(Width::columns(Width::FULL_FROM), Width::Full);
        assert_eq!(
            Width::columns(10),
            Width::Narrow(40),
            "too narrow to be useful: 40"
        );
        let text = "one two three four five six seven eight nine ten";
        assert_eq!(
            wrap(text, 24, 2),
            "  one two three four\n  five six seven eight\n  nine ten\n"
        );
        assert_eq!(
            fit(text, Width::Narrow(24)),
            "one two three four\n  five six seven eight\n  nine ten"
        );
    }
}
