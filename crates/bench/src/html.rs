//! The self-contained HTML report: the table and inline SVG charts (latency and throughput against
//! load with the knee and the safe load marked, each burst's timeline). No script, no fetch: it
//! opens offline and can be attached to a ticket.

use std::fmt::Write;

use plotters::prelude::*;

use crate::run::{BurstReport, LevelReport, Report};
use crate::spec::{Metric, Phase};

const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
];

/// One line of a chart.
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

/// A chart: lines, horizontal limits (SLOs), vertical markers (knee, safe load), a shaded window.
struct Chart<'a> {
    title: &'a str,
    x_desc: &'a str,
    y_desc: &'a str,
    series: Vec<Series>,
    hlines: Vec<(String, f64)>,
    vlines: Vec<(String, f64)>,
    shade: Option<(f64, f64)>,
}

impl Chart<'_> {
    fn svg(&self) -> Result<String, String> {
        let mut out = String::new();
        let points = self.series.iter().flat_map(|s| s.points.iter());
        let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0_f64);
        for (x, y) in points {
            x0 = x0.min(*x);
            x1 = x1.max(*x);
            y1 = y1.max(*y);
        }
        for (_, x) in &self.vlines {
            x0 = x0.min(*x);
            x1 = x1.max(*x);
        }
        for (_, y) in &self.hlines {
            y1 = y1.max(*y);
        }
        if !x0.is_finite() {
            (x0, x1) = (0.0, 1.0);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        let y1 = if y1 > 0.0 { y1 * 1.1 } else { 1.0 };
        {
            let root = SVGBackend::with_string(&mut out, (720, 380)).into_drawing_area();
            let e = |e: DrawingAreaErrorKind<_>| e.to_string();
            root.fill(&WHITE).map_err(e)?;
            let mut chart = ChartBuilder::on(&root)
                .caption(self.title, ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(60)
                .build_cartesian_2d(x0..x1, 0.0..y1)
                .map_err(e)?;
            chart
                .configure_mesh()
                .x_desc(self.x_desc)
                .y_desc(self.y_desc)
                .light_line_style(WHITE.mix(0.0))
                .draw()
                .map_err(e)?;
            if let Some((a, b)) = self.shade {
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(a, 0.0), (b, y1)],
                        RGBColor(255, 200, 120).mix(0.3).filled(),
                    )))
                    .map_err(e)?
                    .label("burst")
                    .legend(|(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 18, y + 5)], RGBColor(255, 200, 120).filled())
                    });
            }
            for (i, s) in self.series.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                chart
                    .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))
                    .map_err(e)?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
                chart
                    .draw_series(s.points.iter().map(|p| Circle::new(*p, 3, color.filled())))
                    .map_err(e)?;
            }
            for (label, y) in &self.hlines {
                chart
                    .draw_series(LineSeries::new([(x0, *y), (x1, *y)], BLACK.stroke_width(1)))
                    .map_err(e)?
                    .label(label.as_str())
                    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK));
            }
            for (i, (label, x)) in self.vlines.iter().enumerate() {
                let color = if i == 0 {
                    RGBColor(200, 0, 0)
                } else {
                    RGBColor(0, 130, 0)
                };
                chart
                    .draw_series(LineSeries::new([(*x, 0.0), (*x, y1)], color.stroke_width(2)))
                    .map_err(e)?
                    .label(label.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.3))
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(e)?;
            root.present().map_err(e)?;
        }
        Ok(out)
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The levels that describe load against latency (baseline and staircase), by load.
fn curve(r: &Report) -> Vec<&LevelReport> {
    let mut v: Vec<&LevelReport> = r
        .levels
        .iter()
        .filter(|l| matches!(l.phase, Phase::Baseline | Phase::Staircase))
        .collect();
    v.sort_by(|a, b| a.load.value().total_cmp(&b.load.value()));
    v.dedup_by(|a, b| a.load == b.load);
    v
}

fn markers(r: &Report) -> Vec<(String, f64)> {
    let mut v = Vec::new();
    if let Some(k) = r.knee {
        v.push((format!("knee ({k})"), k.value()));
    }
    if let Some(s) = r.safe {
        v.push((format!("safe ({s})"), s.value()));
    }
    v
}

fn load_charts(r: &Report) -> Result<Vec<String>, String> {
    let levels = curve(r);
    let Some(first) = levels.first() else {
        return Ok(Vec::new());
    };
    let axis = first.load.axis();
    let ms = |f: fn(&LevelReport) -> Option<f64>| -> Vec<(f64, f64)> {
        levels
            .iter()
            .filter_map(|l| Some((l.load.value(), f(l)? * 1e3)))
            .collect()
    };
    let ttft = Chart {
        title: "Time to first token against load",
        x_desc: axis,
        y_desc: "ms",
        series: vec![
            Series {
                name: "p50".into(),
                points: ms(|l| Some(l.stats.ttft?.p50)),
            },
            Series {
                name: "p95".into(),
                points: ms(|l| Some(l.stats.ttft?.p95)),
            },
            Series {
                name: "p99".into(),
                points: ms(|l| Some(l.stats.ttft?.p99)),
            },
        ],
        hlines: r.slo_lines(Metric::Ttft),
        vlines: markers(r),
        shade: None,
    };
    let itl = Chart {
        title: "Inter-token latency against load",
        x_desc: axis,
        y_desc: "ms",
        series: vec![
            Series {
                name: "p50".into(),
                points: ms(|l| Some(l.stats.itl?.p50)),
            },
            Series {
                name: "p95".into(),
                points: ms(|l| Some(l.stats.itl?.p95)),
            },
        ],
        hlines: r.slo_lines(Metric::Itl),
        vlines: markers(r),
        shade: None,
    };
    let per = |f: fn(&LevelReport) -> f64| levels.iter().map(|l| (l.load.value(), f(l))).collect();
    let tput = Chart {
        title: "Throughput and goodput against load",
        x_desc: axis,
        y_desc: "requests per second",
        series: vec![
            Series {
                name: "throughput".into(),
                points: per(|l| l.stats.throughput_rps),
            },
            Series {
                name: "goodput (inside every SLO)".into(),
                points: per(|l| l.stats.goodput_rps),
            },
        ],
        hlines: Vec::new(),
        vlines: markers(r),
        shade: None,
    };
    let tokens = Chart {
        title: "Output tokens per second against load",
        x_desc: axis,
        y_desc: "tokens/s",
        series: vec![Series {
            name: "output tok/s".into(),
            points: per(|l| l.stats.output_tokens_per_second),
        }],
        hlines: Vec::new(),
        vlines: markers(r),
        shade: None,
    };
    [ttft, itl, tput, tokens].iter().map(Chart::svg).collect()
}

fn burst_charts(r: &Report, b: &BurstReport) -> Result<Vec<String>, String> {
    let title = format!("Burst at {} (×{}): rolling TTFT p95", b.load, b.factor);
    let ttft = Chart {
        title: &title,
        x_desc: "seconds",
        y_desc: "ms",
        series: vec![Series {
            name: "TTFT p95, last second".into(),
            points: b
                .timeline
                .iter()
                .filter_map(|p| Some((p.t, p.ttft_p95? * 1e3)))
                .collect(),
        }],
        hlines: r.slo_lines(Metric::Ttft),
        vlines: Vec::new(),
        shade: Some((b.burst_start, b.burst_end)),
    };
    let mut out = vec![ttft.svg()?];
    if b.timeline.iter().any(|p| p.waiting.is_some()) {
        let title = format!("Burst at {}: requests waiting in the server", b.load);
        let q = Chart {
            title: &title,
            x_desc: "seconds",
            y_desc: "waiting",
            series: vec![Series {
                name: "waiting".into(),
                points: b
                    .timeline
                    .iter()
                    .filter_map(|p| Some((p.t, p.waiting?)))
                    .collect(),
            }],
            hlines: b
                .baseline_waiting
                .map(|w| vec![("before the burst (max)".to_string(), w)])
                .unwrap_or_default(),
            vlines: Vec::new(),
            shade: Some((b.burst_start, b.burst_end)),
        };
        out.push(q.svg()?);
    }
    Ok(out)
}

impl Report {
    /// The SLO targets on `m` as chart lines in milliseconds, labelled `SLO ttft p95 ≤ 1s`.
    fn slo_lines(&self, m: Metric) -> Vec<(String, f64)> {
        self.slo
            .latency
            .iter()
            .filter(|t| t.metric == m)
            .map(|t| {
                let label = format!(
                    "SLO {} p{} ≤ {}",
                    m.name(),
                    t.percentile,
                    humantime::format_duration(t.limit)
                );
                (label, t.limit.as_secs_f64() * 1e3)
            })
            .collect()
    }
}

/// The whole report as one HTML document.
pub fn render(r: &Report) -> Result<String, String> {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>spillway bench: {}</title>\n<style>\n\
         body{{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}}\n\
         table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}\n\
         th{{background:#f3f3f3}}td.l{{text-align:left}}.fail{{color:#b00;font-weight:bold}}.pass{{color:#070}}\n\
         .warn{{background:#fff3cd;padding:.5em}}figure{{margin:1em 0}}\n</style>\n</head>\n<body>\n",
        esc(&r.parameters.model)
    );
    let _ = write!(
        h,
        "<h1>spillway bench</h1>\n<p>{} → <code>{}</code>, model <code>{}</code>, SLO <code>{}</code>; \
         {} to {}.</p>\n<p><strong>{}</strong></p>\n",
        esc(r.tool.version),
        esc(&r.parameters.url),
        esc(&r.parameters.model),
        esc(&r.parameters.slo),
        esc(&r.started_at),
        esc(&r.finished_at),
        esc(&r.summary)
    );
    if r.distorted_levels > 0 {
        let _ = writeln!(
            h,
            "<p class=\"warn\">{} level(s) flagged by the self-check: the client's own lag may have inflated their latencies.</p>",
            r.distorted_levels
        );
    }
    h.push_str("<table>\n<tr>");
    for c in crate::report::COLUMNS {
        let _ = write!(h, "<th>{}</th>", esc(c));
    }
    h.push_str("<th>verdict</th></tr>\n");
    for l in r.levels.iter().chain(r.bursts.iter().map(|b| &b.level)) {
        let verdict = if l.pass {
            "<span class=\"pass\">pass</span>".to_string()
        } else {
            format!("<span class=\"fail\">fail</span> {}", esc(&l.reasons.join("; ")))
        };
        let mut flag = String::new();
        for (what, note) in [("distorted", &l.distorted), ("too short", &l.too_short)] {
            if let Some(n) = note {
                let _ = write!(flag, " <span class=\"warn\">{what}: {}</span>", esc(n));
            }
        }
        h.push_str("<tr>");
        for (i, cell) in crate::report::cells(l).iter().enumerate() {
            let class = if i < 2 { " class=\"l\"" } else { "" };
            let _ = write!(h, "<td{class}>{}</td>", esc(cell));
        }
        let _ = writeln!(h, "<td class=\"l\">{verdict}{flag}</td></tr>");
    }
    h.push_str("</table>\n");
    for svg in load_charts(r)? {
        let _ = writeln!(h, "<figure>{svg}</figure>");
    }
    for b in &r.bursts {
        let _ = write!(
            h,
            "<h2>Burst at {}</h2>\n<p>{}</p>\n",
            esc(&b.load.to_string()),
            esc(&crate::report::burst_line(b))
        );
        for svg in burst_charts(r, b)? {
            let _ = writeln!(h, "<figure>{svg}</figure>");
        }
    }
    // Every parameter of the run, as the JSON has them, so the page stands on its own.
    h.push_str("<h2>Parameters</h2>\n<table>\n");
    if let Ok(serde_json::Value::Object(params)) = serde_json::to_value(&r.parameters) {
        for (k, v) in params {
            let v = match v {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
            let _ = writeln!(
                h,
                "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
                esc(&k),
                esc(&v)
            );
        }
    }
    h.push_str("</table>\n</body>\n</html>\n");
    Ok(h)
}
