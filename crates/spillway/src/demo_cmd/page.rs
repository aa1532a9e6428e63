//! The demo's one HTML file: the bench's own report (charts of the staircase) with the demo's
//! story added before its end — the plan, the side-by-side of the two bursts and the verdict.

use anyhow::Result;

/// The demo's parts, as text already printed on the terminal.
pub(crate) struct Story<'a> {
    pub plan: &'a str,
    pub table: &'a str,
    pub conclusion: &'a str,
    pub verdict: &'a str,
}

pub(crate) fn render(report: &bench::Report, story: &Story<'_>) -> Result<String> {
    let page = bench::html::render(report)?;
    let section = format!(
        "<h2>spillway demo: the same burst without and with the planned limits</h2>\n\
         <pre>{}</pre>\n<p>{}</p>\n\
         <h2>spillway diagnose during the burst with admission off</h2>\n<pre>{}</pre>\n\
         <h2>spillway plan, from the staircase above</h2>\n<pre>{}</pre>\n",
        esc(story.table),
        esc(story.conclusion),
        esc(story.verdict),
        esc(story.plan)
    );
    Ok(match page.rfind("</body>") {
        Some(at) => format!("{}{section}{}", &page[..at], &page[at..]),
        None => page + &section,
    })
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
