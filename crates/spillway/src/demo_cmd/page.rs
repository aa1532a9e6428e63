//! The demo's one HTML file: the demo's story first — the side-by-side of the two bursts, the
//! verdict and the plan — then the bench's own report with the staircase's charts.

use anyhow::Result;

/// The demo's parts, as text already printed on the terminal.
pub(crate) struct Story<'a> {
    pub plan: &'a str,
    pub table: &'a str,
    pub conclusion: &'a str,
    pub verdict: &'a str,
}

pub(crate) fn render(report: &bench::Report, story: &Story<'_>) -> Result<String> {
    let mut page = bench::html::render(report)?;
    if let (Some(start), Some(end)) = (page.find("<title>"), page.find("</title>")) {
        page.replace_range(start..end + "</title>".len(), "<title>spillway demo</title>");
    }
    let section = format!(
        "<h1>spillway demo</h1>\n\
         <h2>The same burst without and with the planned limits</h2>\n\
         <pre>{}</pre>\n<p>{}</p>\n\
         <h2>spillway diagnose during the burst with admission off</h2>\n<pre>{}</pre>\n\
         <h2>spillway plan, from the staircase below</h2>\n<pre>{}</pre>\n<hr>\n",
        esc(story.table),
        esc(story.conclusion),
        esc(story.verdict),
        esc(story.plan)
    );
    let at = page.find("<body>").map_or(0, |i| i + "<body>".len());
    Ok(format!("{}\n{section}{}", &page[..at], &page[at..]))
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
