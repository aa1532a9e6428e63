//! The demo's one HTML file, in the terminal's order: the set-up, the staircase (the bench's own
//! table and charts), the plan, the same burst without and with the plan as a table, diagnose's
//! verdict, then the bench's parameters.

use anyhow::Result;

/// The demo's parts, as text already printed on the terminal.
pub(crate) struct Story<'a> {
    pub setup: &'a str,
    pub staircase: &'a str,
    pub plan: &'a str,
    pub burst: &'a str,
    pub reload: &'a str,
    /// The side-by-side, a header row first.
    pub table: &'a [(String, String, String)],
    pub conclusion: &'a str,
    pub verdict: &'a str,
}

pub(crate) fn render(report: &bench::Report, story: &Story<'_>) -> Result<String> {
    let before = format!(
        "<p>Measure, plan, protect, diagnose — on simulated vLLM replicas, without a GPU. Every \
         number below was measured in this run, on a real clock.</p>\n\
         <h2>1. The set-up</h2>\n<p>{}</p>\n",
        esc(story.setup)
    );
    let mut after = format!(
        "<h2>3. spillway plan, from the staircase above</h2>\n<pre>{}</pre>\n\
         <h2>4. {}</h2>\n<p>{}</p>\n",
        esc(story.plan),
        esc(story.burst),
        esc(story.reload)
    );
    after.push_str("<div class=\"scroll\"><table>\n");
    for (i, (name, open, planned)) in story.table.iter().enumerate() {
        let cell = if i == 0 { "th" } else { "td" };
        after.push_str(&format!(
            "<tr><{cell} class=\"l\">{}</{cell}><{cell}>{}</{cell}><{cell}>{}</{cell}></tr>\n",
            esc(name),
            esc(open),
            esc(planned)
        ));
    }
    after.push_str(&format!(
        "</table></div>\n<p><strong>{}</strong></p>\n\
         <h2>5. spillway diagnose, during the burst with admission off</h2>\n<pre>{}</pre>\n",
        esc(story.conclusion),
        esc(story.verdict)
    ));
    let results = format!("2. {}", story.staircase);
    Ok(bench::html::render_page(
        report,
        &bench::html::Page {
            title: "spillway demo",
            before: &before,
            results_heading: &results,
            after: &after,
        },
    )?)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
