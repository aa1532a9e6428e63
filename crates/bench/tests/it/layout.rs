//! The HTML report in a real browser at 800, 1280 and 1920 px: nothing but a table's own box
//! scrolls sideways, every row stays one line high, and the axes count clients without decimals.
//! The screenshots are kept (in the target's temporary folder) for a person to look at.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::{concurrency, options, paused_engine};

const WIDTHS: [u32; 3] = [800, 1280, 1920];

/// Debian's `chromium`, or another Chromium found on the path.
fn browser() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find_map(|name| {
            let out = Command::new("which").arg(name).output().ok()?;
            out.status
                .success()
                .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        })
}

/// Measures the page as it is laid out, and writes what it found into the page for `--dump-dom`:
/// the viewport's width, the document's, the elements that reach past the viewport (those inside
/// a `.scroll` box may: it scrolls), and the tallest verdict cell.
const PROBE: &str = r#"<script>
(() => {
  const w = innerWidth;
  const over = [];
  for (const el of document.body.querySelectorAll('*')) {
    if (el.parentElement && el.parentElement.closest('.scroll')) continue;
    const r = el.getBoundingClientRect();
    if (r.right > w + 0.5) over.push(el.tagName + '.' + el.className + ' ' + Math.round(r.right));
  }
  const verdicts = [...document.querySelectorAll('td.v')].map(td => td.getBoundingClientRect().height);
  const pre = document.createElement('pre');
  pre.id = 'layout';
  pre.textContent = JSON.stringify({
    viewport: w,
    document: document.documentElement.scrollWidth,
    over,
    tallest_verdict: Math.max(0, ...verdicts),
  });
  document.body.appendChild(pre);
})();
</script>
</body>"#;

fn chromium(browser: &Path, width: u32, args: &[&str], page: &Path) -> std::process::Output {
    Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
        ])
        .arg(format!("--window-size={width},1600"))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("the browser runs")
}

#[tokio::test(start_paused = true)]
async fn the_report_reads_from_800_to_1920_px() {
    let Some(browser) = browser() else {
        eprintln!(
            "skipped: no headless browser (chromium, chromium-browser or google-chrome; scripts/test.sh installs Debian's chromium)"
        );
        return;
    };
    let engine = testkit::Engine::start(paused_engine(8, Duration::from_millis(2))).await;
    let mut opts = options(&engine.url(), 16, 8, "ttft_p95=500ms,itl_p95=200ms,error_rate=5%");
    opts.loads = concurrency(&[2, 4, 8, 16]);
    opts.stop = bench::load::Stop::After(Duration::from_millis(400));
    opts.burst_length = Duration::from_millis(300);
    opts.recovery_timeout = Duration::from_millis(1500);
    let mut report = bench::run(opts).await.unwrap();
    drop(engine);
    // A gateway's Server-Timing, as the demo's report has it: the TTFT split under each row.
    for l in &mut report.levels {
        if let Some(ttft) = l.stats.ttft {
            l.stats.gateway_queue = Some(ttft);
            l.stats.upstream_first_byte = Some(ttft);
        }
    }
    let html = bench::html::render(&report).unwrap();
    assert!(html.contains("<tr class=\"split\">"), "the split has its own row");
    // Axes count without decimals that say nothing ("5.0, 10.0" clients before).
    let labels: Vec<&str> = html
        .split("<text")
        .skip(1)
        .filter_map(|t| t.split_once('>')?.1.split_once("</text>"))
        .map(|(label, _)| label.trim())
        .collect();
    assert!(labels.contains(&"16"), "{labels:?}");
    for label in &labels {
        assert!(!label.ends_with(".0"), "a tick {label:?} in {labels:?}");
    }

    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("report-layout");
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join("report.html");
    std::fs::write(&page, &html).unwrap();
    let probe = dir.join("probe.html");
    std::fs::write(&probe, html.replace("</body>", PROBE)).unwrap();
    for width in WIDTHS {
        let png = dir.join(format!("report-{width}.png"));
        let _ = std::fs::remove_file(&png);
        let shot = chromium(
            &browser,
            width,
            &[&format!("--screenshot={}", png.display())],
            &page,
        );
        let bytes = std::fs::read(&png).unwrap_or_else(|e| {
            panic!(
                "no screenshot at {width} px ({e}): {}",
                String::from_utf8_lossy(&shot.stderr)
            )
        });
        assert!(bytes.starts_with(b"\x89PNG"), "a PNG at {width} px");

        let dom = chromium(&browser, width, &["--dump-dom"], &probe);
        let dom = String::from_utf8_lossy(&dom.stdout);
        let found = dom
            .split_once("<pre id=\"layout\">")
            .and_then(|(_, rest)| rest.split_once("</pre>"))
            .map(|(json, _)| json.replace("&quot;", "\""))
            .unwrap_or_else(|| panic!("the probe did not run at {width} px"));
        let m: serde_json::Value = serde_json::from_str(&found).unwrap();
        eprintln!("{width} px: {m}; screenshot {}", png.display());
        assert_eq!(m["viewport"], width, "{m}");
        assert!(
            m["document"].as_u64().unwrap() <= u64::from(width),
            "the page is wider than the window at {width} px: {m}"
        );
        assert!(
            m["over"].as_array().unwrap().is_empty(),
            "past the window at {width} px, outside a scrolling box: {m}"
        );
        // A verdict of one or two lines, not the split's five.
        assert!(m["tallest_verdict"].as_f64().unwrap() < 80.0, "{width} px: {m}");
    }
}
