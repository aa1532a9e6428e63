//! The verdict as text for a terminal: the four rows, then the findings with their evidence.

use crate::breakdown::{Breakdown, Dimension};
use crate::rows::Rows;
use crate::verdict::{Evidence, Status, Verdict};
use crate::window::{Distribution, Level};
use std::fmt::Write;

/// The columns the verdict's prose wraps at: an 80-column terminal with room for the indent.
const WIDTH: usize = 96;

/// ANSI colours, or none (not a terminal, `NO_COLOR`).
#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub colour: bool,
}

impl Style {
    fn paint(&self, code: &str, text: &str) -> String {
        if self.colour {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }
}

fn num(v: f64) -> String {
    if (v.fract() == 0.0 && v.abs() < 1e15) || v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn opt(v: Option<f64>, unit: &str) -> String {
    v.map_or("–".into(), |v| format!("{}{unit}", num(v)))
}

fn pct(v: Option<f64>) -> String {
    // `+ 0.0` turns a negative zero (a ratio of nothing subtracted) into "0.0%".
    v.map_or("–".into(), |v| format!("{:.1}%", v * 100.0 + 0.0))
}

/// `text` in lines of at most `width` columns (a word longer than that stands alone), each
/// after the first starting with `indent`.
fn wrap(text: &str, width: usize, indent: &str) -> String {
    let mut out = String::new();
    let mut line = 0;
    for word in text.split_whitespace() {
        let len = word.chars().count();
        if line > 0 && line + 1 + len > width {
            out.push('\n');
            out.push_str(indent);
            line = indent.chars().count();
        } else if line > 0 {
            out.push(' ');
            line += 1;
        }
        out.push_str(word);
        line += len;
    }
    out
}

fn level(l: Option<Level>) -> String {
    match l {
        Some(Level { start: Some(s), end }) if s != end => format!("{}→{}", num(s), num(end)),
        Some(l) => num(l.end),
        None => "–".into(),
    }
}

fn dist(d: Option<Distribution>) -> String {
    match d {
        Some(d) if d.count > 0.0 => format!(
            "p50 {} p95 {} p99 {} s (n={})",
            opt(d.p50, ""),
            opt(d.p95, ""),
            opt(d.p99, ""),
            num(d.count)
        ),
        Some(_) => "no observations".into(),
        None => "–".into(),
    }
}

fn mean(d: Option<Distribution>) -> String {
    opt(d.filter(|d| d.count > 0.0).and_then(|d| d.mean), " s")
}

/// One line of evidence: `series stat value unit op threshold over N s`.
pub fn evidence(e: &Evidence) -> String {
    let against = e
        .threshold
        .map(|t| format!(" {} {}", e.op, num(t)))
        .unwrap_or_default();
    let unit = if e.unit.is_empty() {
        String::new()
    } else {
        format!(" {}", e.unit)
    };
    format!(
        "{} {} = {}{unit}{against} (window {} s)",
        e.series,
        e.stat,
        num(e.value),
        num(e.window_secs)
    )
}

fn rows(out: &mut String, r: &Rows) {
    let u = &r.user_impact;
    let _ = writeln!(
        out,
        "user impact     [{}] {} req/s, success {} of all, 429 {}/s, 5xx {}/s, timeouts {}/s, cancelled {}\n                refused by design {}{}, errors of the admitted {}, goodput {} of the admitted measured\n                latency {}",
        u.seen_at.unwrap_or("unseen"),
        opt(u.requests_per_s, ""),
        pct(u.success_ratio),
        opt(u.status_429_per_s, ""),
        opt(u.status_5xx_per_s, ""),
        opt(u.timeouts_per_s, ""),
        u.cancellations_per_s
            .map_or_else(|| "unseen".to_owned(), |v| format!("{}/s", num(v))),
        pct(u.refused_by_design_ratio),
        if u.refused.is_empty() {
            String::new()
        } else {
            format!(" ({})", crate::rows::refused_by(&u.refused, pct))
        },
        pct(u.admitted_error_ratio),
        pct(u.goodput_ratio),
        dist(u.latency),
    );
    let g = &r.generation;
    let _ = writeln!(
        out,
        "generation      TTFT gateway {} | engine {}\n                ITL  gateway {} | engine {}\n                tokens in {}/s out {}/s; per request in {} out {}",
        dist(g.gateway_ttft),
        dist(g.engine_ttft),
        dist(g.gateway_itl),
        dist(g.engine_itl),
        opt(g.prompt_tokens_per_s, ""),
        opt(g.generation_tokens_per_s, ""),
        opt(g.prompt_tokens_per_request, ""),
        opt(g.output_tokens_per_request, ""),
    );
    let e = &r.engine;
    let _ = writeln!(
        out,
        "engine          running {}, waiting {}, queue time mean {}, prefill mean {}, decode mean {}\n                KV cache peak {}, preemptions {}, prefix hits {}, finished {}, refused {}\n                gateway queue {} (wait mean {}, oldest waiting {}), in flight {} of {}, overflowed {}",
        level(e.running),
        level(e.waiting),
        mean(e.queue_time),
        mean(e.prefill_time),
        mean(e.decode_time),
        pct(e.kv_usage.map(|l| l.peak())),
        opt(e.preemptions, ""),
        pct(e.prefix_hit_ratio),
        opt(e.finished, ""),
        opt(e.engine_overflow, ""),
        level(e.gateway_queued),
        mean(e.gateway_queue_wait),
        opt(e.gateway_oldest_wait.map(|l| l.end), " s"),
        level(e.gateway_in_flight),
        opt(e.gateway_concurrency_limit, ""),
        opt(e.gateway_overflow, ""),
    );
    let i = &r.infrastructure;
    let _ = writeln!(
        out,
        "infrastructure  targets up {}{}, replicas healthy {} of {}, restarted {}\n                GPU activity {}, framebuffer {} of {} MiB, last XID {}, ECC DBE {}",
        i.targets_up,
        if i.targets_down.is_empty() {
            String::new()
        } else {
            format!(" (down: {})", i.targets_down.join(", "))
        },
        level(i.replicas_healthy),
        i.replicas_known.map_or("–".into(), |n| n.to_string()),
        if i.restarted.is_empty() {
            "none".into()
        } else {
            i.restarted.join(", ")
        },
        pct(i.gpu_engine_active.or(i.gpu_util).map(|l| l.mean())),
        opt(i.fb_used_mib, ""),
        opt(i.fb_total_mib, ""),
        opt(i.xid, ""),
        level(i.ecc_dbe),
    );
}

/// One line per model and per replica, under a header per dimension.
fn breakdown(out: &mut String, b: &Breakdown, style: Style) {
    for dimension in [Dimension::Model, Dimension::Replica] {
        let slices: Vec<_> = b.slices.iter().filter(|s| s.dimension == dimension).collect();
        if slices.is_empty() {
            continue;
        }
        let shown = |s: &crate::breakdown::Slice| {
            if s.served_as.is_empty() {
                s.name.clone()
            } else {
                format!("{} (as {})", s.name, s.served_as.join(", "))
            }
        };
        let width = slices
            .iter()
            .map(|s| shown(s).chars().count())
            .max()
            .unwrap_or(0)
            .max(4);
        let _ = writeln!(
            out,
            "\nby {:<12} {:<width$}  {:>7} {:>6} {:>8} {:>8} {:>7} {:>7} {:>6} {:>7} {:>8} {:>8} {:>6}  suspects",
            dimension.word(),
            "name",
            "req/s",
            "errors",
            "TTFT p95",
            "ITL p95",
            "running",
            "waiting",
            "KV",
            "preempt",
            "tokens/s",
            "calls/s",
            "failed",
        );
        for s in slices {
            let mut notes: Vec<String> = s.breached.iter().map(|b| format!("{b} breached")).collect();
            notes.extend(s.suspects.iter().map(|x| x.table_row().1.to_owned()));
            let notes = if notes.is_empty() {
                "–".to_owned()
            } else {
                style.paint("1", &notes.join("; "))
            };
            let _ = writeln!(
                out,
                "   {:<12} {:<width$}  {:>7} {:>6} {:>8} {:>8} {:>7} {:>7} {:>6} {:>7} {:>8} {:>8} {:>6}  {notes}",
                "",
                shown(s),
                opt(s.requests_per_s, ""),
                pct(s.error_ratio),
                opt(s.ttft_p95, " s"),
                opt(s.itl_p95, " s"),
                level(s.running),
                level(s.waiting),
                pct(s.kv_peak),
                opt(s.preemptions, ""),
                opt(s.generation_tokens_per_s, ""),
                opt(s.upstream_calls_per_s, ""),
                pct(s.upstream_failed_ratio),
            );
        }
    }
    if b.omitted > 0 {
        let _ = writeln!(
            out,
            "   ({} more not shown: those with a finding first, then the busiest)",
            b.omitted
        );
    }
}

/// The whole verdict for a terminal.
pub fn text(v: &Verdict, style: Style) -> String {
    let mut out = String::new();
    let (word, code) = match v.status {
        Status::Idle => ("IDLE", "1;34"),
        Status::Protected => ("PROTECTED", "1;32"),
        Status::Healthy => ("HEALTHY", "1;32"),
        Status::BusyButHealthy => ("BUSY BUT HEALTHY", "1;32"),
        Status::Incident => ("INCIDENT", "1;31"),
        Status::Unknown => ("UNKNOWN", "1;33"),
    };
    let _ = writeln!(
        out,
        "{} (exit {}) over a {} s window: {}\n",
        style.paint(code, word),
        v.exit_code(),
        num(v.window_secs),
        v.summary
    );
    rows(&mut out, &v.rows);
    breakdown(&mut out, &v.breakdown, style);
    let c = &v.cluster;
    if !c.conditions.is_empty() || !c.restarts.is_empty() {
        let conditions: Vec<String> = c
            .conditions
            .iter()
            .map(|k| {
                let state = if k.ready {
                    "True".to_owned()
                } else {
                    format!("False ({})", k.reason.as_deref().unwrap_or("no reason"))
                };
                format!("{}={state}", k.kind)
            })
            .collect();
        let restarts: Vec<String> = c
            .restarts
            .iter()
            .map(|r| {
                format!(
                    "{}/{} ×{} ({})",
                    r.pod,
                    r.container,
                    r.count,
                    r.reason.as_deref().unwrap_or("?")
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "kubernetes      {} {}; restarts: {}",
            c.service.as_deref().unwrap_or("InferenceService"),
            if conditions.is_empty() {
                "–".into()
            } else {
                conditions.join(", ")
            },
            if restarts.is_empty() {
                "none".into()
            } else {
                restarts.join(", ")
            }
        );
    }
    let s = &v.saturation;
    let moving: Vec<&str> = [
        (!s.slo.is_empty()).then_some("SLO breached"),
        (!s.queue_growth.is_empty()).then_some("queue growing"),
        (!s.errors.is_empty()).then_some("errors above objective"),
    ]
    .into_iter()
    .flatten()
    .collect();
    let _ = writeln!(
        out,
        "\nsaturation      {} ({} of 3 moving{}{})",
        if s.declared {
            style.paint("1;31", "declared")
        } else {
            "not declared".into()
        },
        moving.len(),
        if moving.is_empty() { "" } else { ": " },
        moving.join(", ")
    );
    if !v.slo_breaches.is_empty() {
        let _ = writeln!(out, "\nobjectives breached");
        for e in &v.slo_breaches {
            let _ = writeln!(out, "  - {}", evidence(e));
        }
    }
    if !v.findings.is_empty() {
        let _ = writeln!(out, "\nsuspects, most specific first");
        for (i, f) in v.findings.iter().enumerate() {
            let _ = writeln!(
                out,
                "  {}. {}  [{}]\n     first response: {}",
                i + 1,
                style.paint("1", f.suspect_text),
                f.signals,
                f.first_response
            );
            if !f.at.is_empty() {
                let _ = writeln!(
                    out,
                    "     at: {}{}",
                    f.at.join(", "),
                    if f.only_in_slices {
                        " (only there: the totals hide it)"
                    } else {
                        ""
                    }
                );
            }
            for e in &f.evidence {
                let _ = writeln!(out, "     - {}", evidence(e));
            }
        }
    }
    if let Some(b) = &v.backlog {
        let pad = " ".repeat(16);
        let _ = writeln!(out, "\nbacklog         {}", wrap(&b.reading, WIDTH - 16, &pad));
    }
    if !v.changes.is_empty() {
        let _ = writeln!(out, "\nchange, worked with spillway plan's formulas");
        for c in &v.changes {
            let _ = writeln!(
                out,
                "  - {}\n    {}",
                style.paint("1", &wrap(&c.what, WIDTH - 4, "    ")),
                wrap(&c.arithmetic, WIDTH - 4, "    ")
            );
        }
    }
    if !v.healthy_evidence.is_empty() {
        let heading = match v.status {
            Status::Protected => "refused by design, and the admitted inside the objectives",
            _ => "busy, and inside the objectives",
        };
        let _ = writeln!(out, "\n{heading}");
        for e in &v.healthy_evidence {
            let _ = writeln!(out, "  - {}", evidence(e));
        }
    }
    let b = &v.evidence_basis;
    if !(b.instantaneous.is_empty() && b.completions.is_empty() && b.counter.is_empty()) {
        let list = |items: &[String]| {
            if items.is_empty() {
                "none".to_owned()
            } else {
                items.join(", ")
            }
        };
        let _ = writeln!(
            out,
            "\nevidence        instantaneous (the state now) {}: {}\n                from completions (lags an onset) {}: {}\n                counted over the window {}: {}",
            b.instantaneous.len(),
            list(&b.instantaneous),
            b.completions.len(),
            list(&b.completions),
            b.counter.len(),
            list(&b.counter),
        );
    }
    if !v.blind_spots.is_empty() {
        let _ = writeln!(out, "\nnot seen, so not judged");
        for b in &v.blind_spots {
            let _ = writeln!(out, "  - {b}");
        }
    }
    out
}
