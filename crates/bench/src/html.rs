//! The self-contained HTML report: the table and inline SVG charts (latency and throughput against
//! load with the knee and the safe load marked, each burst's timeline). No script, no fetch: it
//! opens offline and can be attached to a ticket.

use std::fmt::Write;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::result::{BurstReport, LevelReport, Report};
use crate::spec::{Metric, Phase};

const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
];
const KNEE: RGBColor = RGBColor(148, 0, 211);
const SAFE: RGBColor = RGBColor(0, 130, 0);
const LIMIT: RGBColor = RGBColor(0, 0, 0);
const BURST: RGBColor = RGBColor(255, 200, 120);
const GAP: RGBColor = RGBColor(190, 190, 190);
const BEFORE: RGBColor = RGBColor(130, 130, 130);
/// Drawn at this size and scaled by the page to its width (the SVG keeps its viewBox).
const WIDTH: u32 = 1000;
const PANEL_HEIGHT: u32 = 340;

/// One line of a chart; a `None` breaks the line (no value there).
struct Series {
    name: String,
    points: Vec<(f64, Option<f64>)>,
}

/// How a legend entry is drawn (the legend is HTML under the chart, so it never hides a line).
#[derive(Clone, Copy)]
enum Key {
    Line(RGBColor),
    Band(RGBColor),
}

/// One plot: lines, horizontal limits (SLOs), vertical markers (knee, safe load), a shaded window.
struct Panel {
    title: String,
    y_desc: &'static str,
    series: Vec<Series>,
    /// A dot on every point: for few points (levels), not for a timeline.
    dots: bool,
    hlines: Vec<(String, f64, RGBColor)>,
    vlines: Vec<(String, f64, RGBColor)>,
    shade: Option<(f64, f64)>,
    /// Where the first series has no value, a grey band with this legend text.
    gaps: Option<&'static str>,
}

/// One SVG: panels stacked on one x axis (a burst's TTFT and queue share its time axis).
struct Figure {
    x_desc: &'static str,
    /// Where the axis starts when the data starts later (a timeline starts at 0).
    x_min: Option<f64>,
    /// Room on both sides, as a share of the range, so a marker on the last level is not clipped.
    x_pad: f64,
    panels: Vec<Panel>,
}

impl Panel {
    fn x_extent(&self) -> (f64, f64) {
        let xs = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .chain(self.vlines.iter().map(|v| v.1))
            .chain(self.shade.iter().flat_map(|(a, b)| [*a, *b]));
        xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        })
    }

    fn y_top(&self) -> f64 {
        let top = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().filter_map(|p| p.1))
            .chain(self.hlines.iter().map(|h| h.1))
            .fold(0.0_f64, f64::max);
        if top > 0.0 { top * 1.1 } else { 1.0 }
    }

    /// The x ranges where the first series has no value: runs of `None`, each from the point
    /// before it (or its own x) to its last x.
    fn gap_bands(&self) -> Vec<(f64, f64)> {
        let Some(s) = self.series.first() else {
            return Vec::new();
        };
        let mut bands: Vec<(f64, f64)> = Vec::new();
        let mut prev: Option<f64> = None;
        let mut open: Option<f64> = None;
        for (x, y) in &s.points {
            match (y, open) {
                (None, None) => open = Some(prev.unwrap_or(*x)),
                (Some(_), Some(from)) => {
                    bands.push((from, prev.unwrap_or(*x)));
                    open = None;
                }
                _ => {}
            }
            prev = Some(*x);
        }
        if let (Some(from), Some(to)) = (open, prev) {
            bands.push((from, to));
        }
        bands
    }

    /// Draws the panel; its series take colours from `first_color` on, so that the panels of one
    /// figure never share a colour (their legend is one).
    fn draw(
        &self,
        area: &DrawingArea<SVGBackend<'_>, Shift>,
        x_desc: &str,
        x: (f64, f64),
        first_color: usize,
    ) -> Result<Vec<(String, Key)>, String> {
        let e = |e: DrawingAreaErrorKind<_>| e.to_string();
        let (x0, x1) = x;
        let y1 = self.y_top();
        let mut keys = Vec::new();
        let mut chart = ChartBuilder::on(area)
            .caption(&self.title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(x0..x1, 0.0..y1)
            .map_err(e)?;
        // Ticks as a person writes them ("5", not "5.0"); on an axis of whole numbers (clients),
        // a tick between two of them has no label.
        let whole_x = self
            .series
            .iter()
            .flat_map(|s| s.points.iter())
            .all(|(x, _)| x.fract() == 0.0);
        let x_label = |v: &f64| tick(*v, whole_x);
        let y_label = |v: &f64| tick(*v, false);
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(self.y_desc)
            .x_label_formatter(&x_label)
            .y_label_formatter(&y_label)
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(e)?;
        if let Some((a, b)) = self.shade {
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(a, 0.0), (b, y1)],
                    BURST.mix(0.35).filled(),
                )))
                .map_err(e)?;
            keys.push(("the burst".to_string(), Key::Band(BURST)));
        }
        if let Some(label) = self.gaps {
            let bands = self.gap_bands();
            if !bands.is_empty() {
                chart
                    .draw_series(bands.iter().map(|(a, b)| {
                        // A gap from the first point on is a gap from the axis' start.
                        let first = self
                            .series
                            .first()
                            .and_then(|s| s.points.first())
                            .map_or(*a, |p| p.0);
                        let a = if *a <= first { x0 } else { *a };
                        Rectangle::new([(a, 0.0), (*b, y1)], GAP.mix(0.35).filled())
                    }))
                    .map_err(e)?;
                keys.push((label.to_string(), Key::Band(GAP)));
            }
        }
        for (i, s) in self.series.iter().enumerate() {
            let color = COLORS[(first_color + i) % COLORS.len()];
            // Consecutive points with a value, each run its own line: a gap stays a gap.
            for run in s.points.split(|p| p.1.is_none()).filter(|r| !r.is_empty()) {
                let pts: Vec<(f64, f64)> = run.iter().filter_map(|(x, y)| Some((*x, (*y)?))).collect();
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                    .map_err(e)?;
                if self.dots || pts.len() == 1 {
                    chart
                        .draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
                        .map_err(e)?;
                }
            }
            keys.push((s.name.clone(), Key::Line(color)));
        }
        for (label, y, color) in &self.hlines {
            chart
                .draw_series(LineSeries::new([(x0, *y), (x1, *y)], color.stroke_width(1)))
                .map_err(e)?;
            keys.push((label.clone(), Key::Line(*color)));
        }
        for (label, x, color) in &self.vlines {
            chart
                .draw_series(LineSeries::new([(*x, 0.0), (*x, y1)], color.stroke_width(2)))
                .map_err(e)?;
            keys.push((label.clone(), Key::Line(*color)));
        }
        Ok(keys)
    }
}

impl Figure {
    /// The SVG and its legend, as HTML: a `<figure>`.
    fn html(&self) -> Result<String, String> {
        let (mut x0, mut x1) = self
            .panels
            .iter()
            .map(Panel::x_extent)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), (c, d)| {
                (a.min(c), b.max(d))
            });
        if let Some(min) = self.x_min {
            x0 = x0.min(min);
        }
        if !x0.is_finite() {
            (x0, x1) = (0.0, 1.0);
        }
        if x1 <= x0 {
            // One level: centred, half its value either side (or one unit at zero).
            let w = if x0 > 0.0 { x0 / 2.0 } else { 1.0 };
            (x0, x1) = (x0 - w, x0 + w);
        }
        let pad = (x1 - x0) * self.x_pad;
        let (x0, x1) = (x0 - pad, x1 + pad);
        let mut svg = String::new();
        let mut keys: Vec<(String, Key)> = Vec::new();
        {
            let height = PANEL_HEIGHT * self.panels.len().max(1) as u32;
            let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
            root.fill(&WHITE).map_err(|e| e.to_string())?;
            let areas = root.split_evenly((self.panels.len().max(1), 1));
            let mut first_color = 0;
            for (panel, area) in self.panels.iter().zip(&areas) {
                let drawn = panel.draw(area, self.x_desc, (x0, x1), first_color)?;
                first_color += panel.series.len();
                for key in drawn {
                    if !keys.iter().any(|k| k.0 == key.0) {
                        keys.push(key);
                    }
                }
            }
            root.present().map_err(|e| e.to_string())?;
        }
        let mut legend = String::new();
        for (label, key) in keys {
            let swatch = match key {
                Key::Line(RGBColor(r, g, b)) => format!("border-top:3px solid rgb({r},{g},{b})"),
                Key::Band(RGBColor(r, g, b)) => {
                    format!("background:rgba({r},{g},{b},0.45);height:10px")
                }
            };
            let _ = write!(
                legend,
                "<span class=\"key\"><span class=\"sw\" style=\"{swatch}\"></span>{}</span>",
                esc(&label)
            );
        }
        Ok(format!("<figure>{svg}<figcaption>{legend}</figcaption></figure>"))
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

fn markers(r: &Report) -> Vec<(String, f64, RGBColor)> {
    let mut v = Vec::new();
    if let Some(k) = r.knee {
        v.push((
            format!("knee ({k}): the first level that failed"),
            k.value(),
            KNEE,
        ));
    }
    if let Some(s) = r.safe {
        v.push((format!("safe ({s})"), s.value(), SAFE));
    }
    v
}

fn load_charts(r: &Report) -> Result<Vec<String>, String> {
    let levels = curve(r);
    let Some(first) = levels.first() else {
        return Ok(Vec::new());
    };
    let axis = first.load.axis();
    let series = |name: &str, f: &dyn Fn(&LevelReport) -> Option<f64>| Series {
        name: name.into(),
        points: levels.iter().map(|l| (l.load.value(), f(l))).collect(),
    };
    let ms = |v: Option<f64>| v.map(|s| s * 1e3);
    let panel = |title: &str, y_desc: &'static str, series: Vec<Series>, hlines| Panel {
        title: title.into(),
        y_desc,
        series,
        dots: true,
        hlines,
        vlines: markers(r),
        shade: None,
        gaps: None,
    };
    let slo = |m| {
        r.slo_lines(m)
            .into_iter()
            .map(|(label, y)| (label, y, LIMIT))
            .collect::<Vec<_>>()
    };
    let ttft = panel(
        "Time to first token against load",
        "ms",
        vec![
            series("TTFT p50", &|l| ms(Some(l.stats.ttft?.p50))),
            series("TTFT p95", &|l| ms(Some(l.stats.ttft?.p95))),
            series("TTFT p99", &|l| ms(Some(l.stats.ttft?.p99))),
        ],
        slo(Metric::Ttft),
    );
    let itl = panel(
        "Inter-token latency against load",
        "ms",
        vec![
            series("ITL p50", &|l| ms(Some(l.stats.itl?.p50))),
            series("ITL p95", &|l| ms(Some(l.stats.itl?.p95))),
        ],
        slo(Metric::Itl),
    );
    let tput = panel(
        "Throughput and goodput against load",
        "requests per second",
        vec![
            series("throughput", &|l| Some(l.stats.throughput_rps)),
            series("goodput (inside every SLO)", &|l| Some(l.stats.goodput_rps)),
        ],
        Vec::new(),
    );
    let tokens = panel(
        "Output tokens per second against load",
        "tokens/s",
        vec![series("output tok/s", &|l| {
            Some(l.stats.output_tokens_per_second)
        })],
        Vec::new(),
    );
    [ttft, itl, tput, tokens]
        .into_iter()
        .map(|p| {
            Figure {
                x_desc: axis,
                x_min: None,
                x_pad: 0.03,
                panels: vec![p],
            }
            .html()
        })
        .collect()
}

/// The burst's rolling TTFT and, with `--metrics-url`, the server's queue: one figure, one time axis.
fn burst_chart(r: &Report, b: &BurstReport) -> Result<String, String> {
    let ttft = Panel {
        title: format!("Burst at {} (×{}): rolling TTFT p95", b.load, b.factor),
        y_desc: "ms",
        series: vec![Series {
            name: "TTFT p95 of the first tokens of the last second".into(),
            points: b
                .timeline
                .iter()
                .map(|p| (p.t, p.ttft_p95.map(|v| v * 1e3)))
                .collect(),
        }],
        dots: false,
        hlines: r
            .slo_lines(Metric::Ttft)
            .into_iter()
            .map(|(label, y)| (label, y, LIMIT))
            .collect(),
        vlines: Vec::new(),
        shade: Some((b.burst_start, b.burst_end)),
        gaps: Some("no first token in that second: no p95 to draw"),
    };
    let mut panels = vec![ttft];
    if b.timeline.iter().any(|p| p.waiting.is_some()) {
        panels.push(Panel {
            title: format!("Burst at {}: requests waiting in the server", b.load),
            y_desc: "waiting",
            series: vec![Series {
                name: "requests waiting (the server's /metrics)".into(),
                points: b.timeline.iter().map(|p| (p.t, p.waiting)).collect(),
            }],
            dots: false,
            hlines: b
                .baseline_waiting
                .map(|w| vec![("most waiting before the burst".to_string(), w, BEFORE)])
                .unwrap_or_default(),
            vlines: Vec::new(),
            shade: Some((b.burst_start, b.burst_end)),
            gaps: None,
        });
    }
    Figure {
        x_desc: "seconds from the start of the level",
        x_min: Some(0.0),
        x_pad: 0.0,
        panels,
    }
    .html()
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

/// A level's verdict cell: the verdict, why it failed, its errors by kind with an example, and the
/// self-check's flags, each on a line of its own.
/// An axis tick: its decimals only where it has them (`5`, `2.5`, `0.125`); none for a tick
/// between whole numbers on an axis of whole numbers.
fn tick(v: f64, whole: bool) -> String {
    // Ticks are computed, so 10 may come as 9.999999999999998.
    let near = (v * 1e6).round() / 1e6 + 0.0;
    if whole && near.fract() != 0.0 {
        return String::new();
    }
    crate::report::number(near)
}

fn verdict_cell(l: &LevelReport) -> String {
    let word = crate::report::verdict(l);
    let mut cell = if l.pass {
        format!("<span class=\"pass\">{word}</span>")
    } else {
        format!("<span class=\"fail\">{word}</span>")
    };
    for reason in &l.reasons {
        let _ = write!(cell, "<div>{}</div>", esc(reason));
    }
    if let Some(errors) = crate::report::errors_line(l) {
        let _ = write!(cell, "<div>errors: {}</div>", esc(&errors));
    }
    for (what, note) in [("distorted", &l.distorted), ("too short", &l.too_short)] {
        if let Some(n) = note {
            let _ = write!(cell, "<div class=\"flag\">{what}: {}</div>", esc(n));
        }
    }
    cell
}

/// What a caller adds around the bench's own sections, to tell a longer story in the same page
/// (the demo's); the default is the bench's page alone.
#[derive(Debug, Clone, Copy, Default)]
pub struct Page<'a> {
    /// The page's title and heading; empty: `spillway bench`.
    pub title: &'a str,
    /// HTML after the introduction, before the bench's results.
    pub before: &'a str,
    /// A heading over the bench's results; empty: none.
    pub results_heading: &'a str,
    /// HTML after the bench's results (table, charts, bursts), before its parameters.
    pub after: &'a str,
}

/// The whole report as one HTML document.
pub fn render(r: &Report) -> Result<String, crate::error::BenchError> {
    render_page(r, &Page::default())
}

/// The report with the caller's sections around it: introduction, `before`, the results,
/// `after`, then every parameter of the run.
pub fn render_page(r: &Report, page: &Page<'_>) -> Result<String, crate::error::BenchError> {
    let mut h = head(r, page);
    h.push_str(page.before);
    if !page.results_heading.is_empty() {
        let _ = writeln!(h, "<h2>{}</h2>", esc(page.results_heading));
    }
    results(r, &mut h).map_err(crate::error::BenchError::Chart)?;
    h.push_str(page.after);
    parameters(r, &mut h);
    h.push_str("</body>\n</html>\n");
    Ok(h)
}

/// The document's head, styles and introduction: what ran, when and on what machine.
fn head(r: &Report, page: &Page<'_>) -> String {
    let title = if page.title.is_empty() {
        "spillway bench"
    } else {
        page.title
    };
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}: {}</title>\n<style>\n\
         body{{font-family:system-ui,sans-serif;margin:2em auto;padding:0 1em;max-width:1200px;color:#222;line-height:1.4}}\n\
         pre{{white-space:pre-wrap;overflow-wrap:anywhere;background:#f7f7f7;padding:.6em;font-size:13px}}\n\
         .scroll{{overflow-x:auto;max-width:100%;margin:.5em 0}}table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right;vertical-align:top;white-space:nowrap}}\n\
         th{{background:#f3f3f3}}tr.split td{{border-top:none;color:#555;font-size:12px}}tr.split div{{position:sticky;left:6px;max-width:min(calc(100vw - 4em),1160px);white-space:normal}}td.l,th.l{{text-align:left}}td.w{{white-space:normal;overflow-wrap:anywhere}}td.v{{text-align:left;min-width:16em;white-space:normal}}\n\
         dl.intro{{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}}dl.intro dt{{font-weight:bold}}dl.intro dd{{margin:0}}\n\
         .fail{{color:#b00;font-weight:bold}}.pass{{color:#070;font-weight:bold}}\n\
         .warn{{background:#fff3cd;padding:.5em}}.flag{{background:#fff3cd;margin-top:3px;padding:1px 4px}}\n\
         figure{{margin:1.5em 0}}figure svg{{display:block;width:100%;height:auto}}\n\
         figcaption{{font-size:13px;margin-top:.3em}}.key{{display:inline-block;margin-right:1.5em;white-space:nowrap}}\n\
         .sw{{display:inline-block;width:22px;margin-right:.4em;vertical-align:middle}}\n</style>\n</head>\n<body>\n",
        esc(title),
        esc(&r.parameters.model)
    );
    let p = &r.parameters;
    let loop_kind = match p.loads.first() {
        _ if !r.tenants.is_empty() => format!(
            "{} tenants at once, each with its own key and load",
            r.tenants.len()
        ),
        Some(crate::spec::Load::Rate(_)) => "open loop (requests per second)".to_owned(),
        _ => "closed loop (concurrent clients)".to_owned(),
    };
    let _ = write!(
        h,
        "<h1>{}</h1>\n<dl class=\"intro\">\n\
         <dt>What</dt><dd>spillway bench {} against <code>{}</code>, model <code>{}</code>, {loop_kind}, judged by the SLO <code>{}</code></dd>\n\
         <dt>When</dt><dd>{} to {} (UTC)</dd>\n\
         <dt>Where</dt><dd>{}</dd>\n\
         <dt>Result</dt><dd><strong>{}</strong></dd>\n</dl>\n",
        esc(title),
        esc(r.tool.version),
        esc(&p.url),
        esc(&p.model),
        esc(&p.slo),
        esc(&r.started_at.replace('T', " ").replace('Z', "")),
        esc(&r.finished_at.replace('T', " ").replace('Z', "")),
        esc(&r.machine.describe()),
        esc(&r.summary)
    );
    h
}

/// The levels' table, the notes, the charts and each burst.
fn results(r: &Report, h: &mut String) -> Result<(), String> {
    if let Some(p) = &r.prompt_tokens {
        let _ = writeln!(h, "<p>{}</p>", esc(&crate::report::prompt_line(p)));
    }
    for note in &r.notes {
        match note.strip_prefix("WARNING: ") {
            Some(w) => writeln!(h, "<p class=\"warn\">{}</p>", esc(w)),
            None => writeln!(h, "<p>Note: {}</p>", esc(note)),
        }
        .ok();
    }
    if r.distorted_levels > 0 {
        let _ = writeln!(
            h,
            "<p class=\"warn\">{} level(s) flagged by the self-check: the client's own lag may have inflated their latencies.</p>",
            r.distorted_levels
        );
    }
    h.push_str("<div class=\"scroll\"><table>\n<tr>");
    for c in crate::report::COLUMNS {
        let _ = write!(h, "<th>{}</th>", esc(c));
    }
    h.push_str("<th class=\"l\">verdict</th></tr>\n");
    for l in r.levels.iter().chain(r.bursts.iter().map(|b| &b.level)) {
        h.push_str("<tr>");
        for (i, cell) in crate::report::cells(l).iter().enumerate() {
            let class = if i < 2 { " class=\"l\"" } else { "" };
            let _ = write!(h, "<td{class}>{}</td>", esc(cell));
        }
        let _ = writeln!(h, "<td class=\"v\">{}</td></tr>", verdict_cell(l));
        // Under the row, across it: inside the verdict cell it made every row tall.
        if let Some(split) = crate::report::split_line(l) {
            let _ = writeln!(
                h,
                "<tr class=\"split\"><td class=\"l\" colspan=\"{}\"><div>{}</div></td></tr>",
                crate::report::COLUMNS.len() + 1,
                esc(&split)
            );
        }
    }
    h.push_str("</table></div>\n");
    slo_classes(r, h)?;
    tenants(r, h);
    if !r.bursts.is_empty() {
        h.push_str(
            "<p>A burst row's verdict is its recovery: the burst is meant to breach the SLOs while it \
             lasts, so its latencies may exceed them; the row says whether TTFT and the server's \
             queue came back.</p>\n",
        );
    }
    for fig in load_charts(r)? {
        h.push_str(&fig);
        h.push('\n');
    }
    for b in &r.bursts {
        let _ = write!(
            h,
            "<h2>Burst at {}</h2>\n<p>{}</p>\n",
            esc(&b.load.to_string()),
            esc(&crate::report::burst_line(b))
        );
        h.push_str(&burst_chart(r, b)?);
        h.push('\n');
    }
    Ok(())
}

/// Each level's objective classes (`--slo-mix`): one row per level and class, and, over two or
/// more levels, each class's goodput against load.
fn slo_classes(r: &Report, h: &mut String) -> Result<(), String> {
    use crate::report::{SLO_COUNTS, SLO_LATENCIES, slo_class_cells};
    let levels: Vec<&LevelReport> = r
        .levels
        .iter()
        .chain(r.bursts.iter().map(|b| &b.level))
        .filter(|l| !l.slo_classes.is_empty())
        .collect();
    if levels.is_empty() {
        return Ok(());
    }
    h.push_str(
        "<h2>Objectives (--slo-mix)</h2>\n<div class=\"scroll\"><table>\n<tr><th class=\"l\">level</th>",
    );
    for (i, c) in SLO_COUNTS.iter().chain(&SLO_LATENCIES).enumerate() {
        let class = if i < 1 { " class=\"l\"" } else { "" };
        let _ = write!(h, "<th{class}>{}</th>", esc(c));
    }
    h.push_str("</tr>\n");
    for l in &levels {
        for c in &l.slo_classes {
            let (counts, latencies) = slo_class_cells(c);
            let _ = write!(
                h,
                "<tr><td class=\"l\">{} {}</td>",
                esc(l.phase.name()),
                esc(&l.load.to_string())
            );
            for (i, cell) in counts.iter().chain(&latencies).enumerate() {
                let class = if i < 1 { " class=\"l\"" } else { "" };
                let _ = write!(h, "<td{class}>{}</td>", esc(cell));
            }
            h.push_str("</tr>\n");
            if !c.error_kinds.is_empty() {
                let kinds: Vec<String> = c.error_kinds.iter().map(|(k, v)| format!("{k} {v}")).collect();
                let _ = writeln!(
                    h,
                    "<tr><td></td><td class=\"l w\" colspan=\"14\">{} errors: {}</td></tr>",
                    esc(&c.name),
                    esc(&kinds.join(", "))
                );
            }
        }
    }
    h.push_str("</table></div>\n");
    let _ = writeln!(h, "<p>{}</p>", esc(crate::report::SLO_LEGEND));
    let curve: Vec<&LevelReport> = curve(r)
        .into_iter()
        .filter(|l| !l.slo_classes.is_empty())
        .collect();
    if curve.len() >= 2 {
        let axis = curve[0].load.axis();
        let series = curve[0]
            .slo_classes
            .iter()
            .enumerate()
            .map(|(k, c)| Series {
                name: format!("{}: goodput within its own objectives", c.name),
                points: curve
                    .iter()
                    .map(|l| {
                        let share = l.slo_classes.get(k).map(|c| c.goodput_share * 100.0);
                        (l.load.value(), share)
                    })
                    .collect(),
            })
            .collect();
        let figure = Figure {
            x_desc: axis,
            x_min: None,
            x_pad: 0.03,
            panels: vec![Panel {
                title: "Goodput of each objective class against load".into(),
                y_desc: "% of the class's requests",
                series,
                dots: true,
                hlines: Vec::new(),
                vlines: markers(r),
                shade: None,
                gaps: None,
            }],
        };
        h.push_str(&figure.html()?);
        h.push('\n');
    }
    Ok(())
}

/// The tenants of a multi-tenant run: what each sent and got, and the fairness over them.
fn tenants(r: &Report, h: &mut String) {
    use crate::report::{TENANT_COUNTS, TENANT_LATENCIES, tenant_cells};
    let Some(fairness) = &r.fairness else {
        return;
    };
    h.push_str("<h2>Tenants</h2>\n<div class=\"scroll\"><table>\n<tr>");
    for (i, c) in TENANT_COUNTS.iter().chain(&TENANT_LATENCIES).enumerate() {
        let class = if i < 2 { " class=\"l\"" } else { "" };
        let _ = write!(h, "<th{class}>{}</th>", esc(c));
    }
    h.push_str("</tr>\n");
    for t in &r.tenants {
        let (counts, latencies) = tenant_cells(t);
        h.push_str("<tr>");
        for (i, cell) in counts.iter().chain(&latencies).enumerate() {
            let class = if i < 2 { " class=\"l\"" } else { "" };
            let _ = write!(h, "<td{class}>{}</td>", esc(cell));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table></div>\n");
    let _ = writeln!(h, "<p>{}</p>", esc(crate::report::TENANT_LEGEND));
    for t in &r.tenants {
        if !t.error_kinds.is_empty() {
            let kinds: Vec<String> = t.error_kinds.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let _ = writeln!(h, "<p>{} errors: {}</p>", esc(&t.name), esc(&kinds.join(", ")));
        }
        if let Some(w) = t.retry_waits {
            let _ = writeln!(
                h,
                "<p>{} honoured Retry-After {} time(s): {} waited in all, in no latency.</p>",
                esc(&t.name),
                w.waits,
                esc(&crate::report::secs(w.waited_seconds))
            );
        }
    }
    let _ = writeln!(
        h,
        "<p><strong>{}</strong></p>",
        esc(&crate::report::fairness_line(fairness))
    );
}

/// Every parameter of the run as a person reads it, so the page stands on its own; what was not
/// set is left out.
fn parameters(r: &Report, h: &mut String) {
    use crate::report::duration;
    let p = &r.parameters;
    let list = |items: Vec<String>| items.join(", ");
    let yes = |b: bool| if b { "yes" } else { "no" }.to_owned();
    let rows: Vec<(&str, Option<String>)> = vec![
        ("URL", Some(p.url.clone())),
        ("model", Some(p.model.clone())),
        (
            "context (max_model_len)",
            p.max_model_len.map(|n| format!("{n} tokens")),
        ),
        ("API", Some(format!("{} ({})", p.api, p.api.path()))),
        ("API key from", p.api_key_env.as_ref().map(|v| format!("${v}"))),
        (
            "tenants",
            (!r.tenants.is_empty()).then(|| {
                list(
                    r.tenants
                        .iter()
                        .map(|t| format!("{} ({}, key from ${})", t.name, t.load, t.api_key_env))
                        .collect(),
                )
            }),
        ),
        ("CA certificate", p.ca_cert.clone()),
        (
            "levels",
            Some(list(p.loads.iter().map(ToString::to_string).collect())),
        ),
        (
            "arrivals (open loop)",
            p.loads
                .iter()
                .any(|l| matches!(l, crate::spec::Load::Rate(_)))
                .then(|| arrivals(&p.arrivals)),
        ),
        (
            "each level",
            p.duration_per_level
                .map(duration)
                .or_else(|| p.requests_per_level.map(|n| format!("{n} requests"))),
        ),
        (
            "warm-up left out",
            (!p.warmup.is_zero()).then(|| duration(p.warmup)),
        ),
        ("prompt length", Some(format!("{} tokens", p.input_len))),
        (
            "answer length (max_tokens)",
            Some(format!("{} tokens", p.output_len)),
        ),
        ("ignore_eos", Some(yes(p.ignore_eos))),
        ("dataset", p.dataset.clone()),
        (
            "prompts",
            Some(match (p.workload.prefixes, p.workload.prefix_tokens) {
                (Some(n), Some(t)) => format!(
                    "{}: {n} prefixes of {t} tokens, then a unique suffix",
                    p.workload.source
                ),
                _ => p.workload.source.clone(),
            }),
        ),
        ("SLO", Some(p.slo.clone())),
        (
            "server metrics",
            (!p.metrics_urls.is_empty()).then(|| p.metrics_urls.join(", ")),
        ),
        (
            "phases",
            Some(list(p.phases.iter().map(|ph| ph.name().to_owned()).collect())),
        ),
        (
            "long mix",
            p.phases.contains(&Phase::LongMix).then(|| {
                format!(
                    "{:.0}% long requests of {} prompt and {} answer tokens",
                    p.long_share * 100.0,
                    p.long_input_len,
                    p.long_output_len
                )
            }),
        ),
        (
            "burst",
            p.phases.contains(&Phase::Burst).then(|| {
                format!(
                    "{}× the load for {}, recovery within {}",
                    crate::report::number(p.burst_factor),
                    duration(p.burst_length),
                    duration(p.recovery_timeout)
                )
            }),
        ),
        ("request timeout", Some(duration(p.request_timeout))),
        (
            "top of the default staircase",
            Some(format!("C={}", p.max_concurrency)),
        ),
        ("most in flight (open loop)", Some(p.max_in_flight.to_string())),
        ("honour Retry-After", Some(yes(p.honor_retry_after))),
        (
            "objective classes (--slo-mix)",
            (!p.slo_mix.is_empty()).then(|| {
                list(
                    p.slo_mix
                        .iter()
                        .map(|c| {
                            let mut tpot = c
                                .tpot
                                .map(|t| format!(", TPOT ≤ {}", duration(t)))
                                .unwrap_or_default();
                            if let Some(p) = c.priority {
                                tpot.push_str(&format!(", priority {p}"));
                            }
                            format!(
                                "{} ({:.1}% of requests: TTFT ≤ {}{tpot})",
                                c.name,
                                c.share * 100.0,
                                duration(c.ttft)
                            )
                        })
                        .collect(),
                )
            }),
        ),
        ("seed", Some(p.seed.to_string())),
    ];
    h.push_str("<h2>Parameters</h2>\n<div class=\"scroll\"><table>\n");
    for (name, value) in rows {
        if let Some(v) = value {
            let _ = writeln!(
                h,
                "<tr><td class=\"l\">{}</td><td class=\"l w\">{}</td></tr>",
                esc(name),
                esc(&v)
            );
        }
    }
    h.push_str("</table></div>\n");
}

fn arrivals(a: &crate::spec::Arrivals) -> String {
    match a {
        crate::spec::Arrivals::Poisson => "poisson".into(),
        crate::spec::Arrivals::Constant => "constant".into(),
        crate::spec::Arrivals::Gamma { burstiness } => format!("gamma, burstiness {burstiness}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_have_decimals_only_where_they_have_them() {
        assert_eq!(tick(5.0, true), "5");
        assert_eq!(tick(9.999_999_999_999_998, true), "10");
        assert_eq!(tick(2.5, true), "", "no half a client");
        assert_eq!(tick(2.5, false), "2.5");
        assert_eq!(tick(-0.0, false), "0");
        assert_eq!(tick(1200.0, false), "1200");
    }

    #[test]
    fn gaps_are_the_runs_without_a_value() {
        let panel = |ys: &[Option<f64>]| Panel {
            title: String::new(),
            y_desc: "",
            series: vec![Series {
                name: String::new(),
                points: ys.iter().enumerate().map(|(i, y)| (i as f64, *y)).collect(),
            }],
            dots: false,
            hlines: Vec::new(),
            vlines: Vec::new(),
            shade: None,
            gaps: Some(""),
        };
        let (s, n) = (Some(1.0), None);
        assert_eq!(panel(&[s, n, n, s, s, n]).gap_bands(), [(0.0, 2.0), (4.0, 5.0)]);
        assert_eq!(panel(&[n, n, s]).gap_bands(), [(0.0, 1.0)]);
        assert!(panel(&[s, s]).gap_bands().is_empty());
    }
}
