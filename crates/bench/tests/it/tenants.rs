//! Several tenants at once through the library, on a paused clock: one level, every record tagged
//! with its tenant, each tenant's numbers made of its own records, and a valid HTML report.

use std::time::Duration;

use bench::spec::{Load, Phase};
use bench::tenants::Tenant;

use crate::support::{options, paused_engine};

#[tokio::test(start_paused = true)]
async fn a_closed_and_an_open_loop_tenant_run_together_and_are_reported_apart() {
    let engine = engine::spawn_local(paused_engine(2, Duration::from_millis(2)))
        .await
        .unwrap();
    let mut opts = options(&engine.url(), 16, 8, "ttft_p95=1s");
    opts.stop = bench::load::Stop::After(Duration::from_secs(1));
    opts.warmup = Duration::from_millis(100);
    opts.keep_records = true;
    let tenant = |name: &str, load| Tenant {
        name: name.into(),
        api_key_env: format!("KEY_{name}"),
        api_key: format!("sk-{name}"),
        load,
    };
    let extras = bench::Extras {
        tenants: vec![tenant("a", Load::Concurrency(3)), tenant("b", Load::Rate(40.0))],
        ..bench::Extras::default()
    };
    let report = bench::run_with(opts, extras).await.unwrap();
    assert_eq!(report.levels.len(), 1, "one level, no phases");
    assert!(report.bursts.is_empty() && report.safe.is_none() && report.knee.is_none());
    let level = &report.levels[0];
    assert_eq!((level.phase, level.load), (Phase::Tenants, Load::Concurrency(3)));
    assert_eq!(report.parameters.phases, [Phase::Tenants]);
    let records = level.records.as_ref().unwrap();
    let of = |name: &str| {
        records
            .iter()
            .filter(|r| r.tenant.as_deref() == Some(name))
            .filter(|r| r.scheduled >= Duration::from_millis(100))
            .collect::<Vec<_>>()
    };
    assert!(records.iter().all(|r| r.tenant.is_some()));
    let [a, b] = &report.tenants[..] else {
        panic!("two tenants: {:?}", report.tenants)
    };
    for t in [a, b] {
        let mine = of(&t.name);
        assert_eq!(t.sent, mine.len(), "{}", t.name);
        assert_eq!(t.served, mine.iter().filter(|r| r.ok()).count());
        let tokens: u64 = mine
            .iter()
            .filter(|r| r.ok())
            .map(|r| u64::from(r.input_tokens.unwrap() + r.output_tokens))
            .sum();
        assert_eq!(t.served_tokens, tokens);
        assert!(t.ttft.is_some() && t.itl.is_some());
    }
    assert_eq!(a.sent + b.sent, level.stats.requests);
    assert_eq!(a.served + b.served, level.stats.ok);
    assert_eq!(a.warmup_requests + b.warmup_requests, level.warmup_requests);
    // The open loop sent on its schedule, about 40 a second over the 0.9 s measured.
    assert!((25..=55).contains(&b.sent), "{}", b.sent);
    let (x, y) = (a.served_tokens as f64, b.served_tokens as f64);
    let jain = (x + y).powi(2) / (2.0 * (x * x + y * y));
    let f = report.fairness.unwrap();
    assert!((f.jain_served_tokens.unwrap() - jain).abs() < 1e-12);
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["tenants"][1]["load"]["rate"], 40.0);
    assert_eq!(
        json["levels"][0]["records"][0]["tenant"]
            .as_str()
            .map(|t| t == "a" || t == "b"),
        Some(true)
    );
    assert!(!json.to_string().contains("sk-a"), "the key is never written");
    let html = bench::html::render(&report).unwrap();
    assert!(html.contains("<h2>Tenants</h2>") && html.contains("2 tenants at once"));
    let dir = std::env::temp_dir().join(format!("spillway-bench-tenants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("report.html");
    std::fs::write(&path, &html).unwrap();
    let out = testkit::run_python("check_html.py", &[path.to_str().unwrap()]).await;
    assert!(out.contains("ok: 0 svg"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
