//! `spillway demo --quick` as a newcomer runs it: the whole story, its numbers and its report.

use crate::support::BIN;
use std::process::{Command, Stdio};

/// The numbers of one row of the side-by-side: admission off, then the planned limits.
fn row(out: &str, name: &str) -> (u64, u64) {
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with(name))
        .unwrap_or_else(|| panic!("no '{name}' row in:\n{out}"));
    let numbers: Vec<u64> = line[line.find(name).unwrap() + name.len()..]
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(numbers.len(), 2, "two columns in {line:?}");
    (numbers[0], numbers[1])
}

#[test]
fn the_quick_demo_tells_the_whole_story_and_writes_its_report() {
    let dir = std::env::temp_dir().join(format!("spillway-demo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(BIN)
        .args(["demo", "--quick", "--out"])
        .arg(&dir)
        .stdin(Stdio::null())
        .output()
        .expect("spillway demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}\n{stdout}\n{stderr}", out.status);
    let report = dir.join("report.html");
    let html = std::fs::read_to_string(&report).expect("the report is written");
    assert!(
        stdout.contains(&report.display().to_string()),
        "says where the report is:\n{stdout}"
    );
    assert!(html.contains("<svg"), "the staircase's charts are in the page");
    // The page reads in the terminal's order, with an introduction, and its figures in tables.
    let at = |needle: &str| {
        html.find(needle)
            .unwrap_or_else(|| panic!("{needle:?} missing from the report"))
    };
    let order = [
        "<dt>Where</dt>",
        "<h2>1. The set-up</h2>",
        "<h2>2. staircase through the gateway",
        "<h2>3. spillway plan",
        "<h2>4. the same burst twice",
        "<td class=\"l\">max engine waiting queue</td>",
        "<h2>5. spillway diagnose",
        "<h2>Parameters</h2>",
    ];
    for pair in order.windows(2) {
        assert!(
            at(pair[0]) < at(pair[1]),
            "{:?} should come before {:?}",
            pair[0],
            pair[1]
        );
    }
    let parameters = &html[at("<h2>Parameters</h2>")..];
    assert!(
        !parameters.contains("null") && !parameters.contains('{'),
        "no raw JSON: {parameters}"
    );
    assert!(html.contains("pre{white-space:pre-wrap"), "long lines wrap");
    assert!(stdout.contains("C_safe = "), "{stdout}");
    assert!(stdout.contains("C = floor(C_safe × R × headroom)"), "{stdout}");
    assert!(stdout.contains("the gateway now enforces C = "), "{stdout}");
    let (open, planned) = row(&stdout, "max engine waiting queue");
    assert!(
        planned < open,
        "the planned limits bound the engines' queue:\n{stdout}"
    );
    let (_, rejected) = row(&stdout, "rejected (503/429)");
    assert!(rejected > 0, "the overload met fast refusals:\n{stdout}");
    assert!(stdout.contains("verdict: "), "{stdout}");
    // No number contradicts itself (issue 52): nothing "exceeds" what it equals as printed, the
    // plan names no LiteLLM the demo does not run, and admission off is called off, not a C of
    // 1000000 to lower.
    for line in stdout.lines().chain(html.lines()) {
        if let Some((a, b)) = line.split_once(" exceeds ") {
            let (v, bound) = (
                a.rsplit(' ').next().unwrap_or(""),
                b.split([' ', ';', ',', '<']).next().unwrap_or(""),
            );
            assert_ne!(v, bound, "{line}");
        }
    }
    let plan = &html[at("<h2>3. spillway plan")..at("<h2>4. the same burst twice")];
    for said in [&stdout[..], plan] {
        assert!(!said.contains("LiteLLM") && !said.contains("Envoy"), "{said}");
    }
    assert!(!stdout.contains("C from 1000000"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ctrl_c_stops_the_demo_and_its_servers() {
    let dir = std::env::temp_dir().join(format!("spillway-demo-int-{}", std::process::id()));
    let mut child = Command::new(BIN)
        .args(["demo", "--quick", "--out"])
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spillway demo starts");
    // Into the staircase: the engines and the gateway are serving once its heading is out.
    let printed = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let (printed, stdout) = (printed.clone(), child.stdout.take().expect("piped stdout"));
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                let mut p = printed.lock().unwrap();
                p.push_str(&line);
                p.push('\n');
            }
        })
    };
    let staircase = crate::support::wait_until(3000, || {
        printed
            .lock()
            .unwrap()
            .contains("== 2. staircase through the gateway")
    });
    assert!(
        staircase,
        "the demo never reached its staircase:\n{}",
        printed.lock().unwrap()
    );
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let waited = crate::support::wait_until(500, || matches!(child.try_wait(), Ok(Some(_))));
    if !waited {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("the demo ends");
    reader.join().expect("stdout read to its end");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(waited, "the demo did not stop within 10 s of Ctrl-C");
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
