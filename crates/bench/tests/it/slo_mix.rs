//! Mixed objectives (`--slo-mix`) through the library, on a paused clock: every record of a closed-
//! and an open-loop level carries the class it drew, each class's numbers are made of its own
//! records, the draws repeat with the seed, and a multi-tenant run reports the classes too.

use std::time::Duration;

use bench::client::Record;
use bench::slo_mix::SloMix;
use bench::spec::{Load, Phase};

use crate::support::{options, paused_engine};

async fn run(url: &str, load: Load, tenants: bool) -> bench::Report {
    let mut opts = options(url, 16, 8, "ttft_p95=1s");
    opts.phases = vec![Phase::Staircase];
    opts.loads = vec![load];
    opts.stop = bench::load::Stop::After(Duration::from_secs(1));
    opts.keep_records = true;
    opts.metrics_urls.clear();
    let extras = bench::Extras {
        slo_mix: Some(
            "tight:0.25:ttft=5ms:tpot=3ms,loose:0.75:ttft=1s"
                .parse::<SloMix>()
                .unwrap(),
        ),
        tenants: if tenants {
            ["a", "b"]
                .map(|name| bench::tenants::Tenant {
                    name: name.into(),
                    api_key_env: format!("KEY_{name}"),
                    api_key: format!("sk-{name}"),
                    load,
                })
                .to_vec()
        } else {
            Vec::new()
        },
        ..bench::Extras::default()
    };
    bench::run_with(opts, extras).await.unwrap()
}

/// The classes of a level's records in the order they were scheduled.
fn drawn(records: &[Record]) -> Vec<String> {
    let mut r: Vec<&Record> = records.iter().collect();
    r.sort_by_key(|r| r.scheduled);
    r.iter()
        .map(|r| r.slo_class.as_deref().unwrap().to_owned())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn every_request_draws_a_class_and_each_class_counts_its_own() {
    // Two sequences at a time, each step 2 ms: the first token takes one step or more.
    let engine = engine::spawn_local(paused_engine(2, Duration::from_millis(2)))
        .await
        .unwrap();
    for load in [Load::Concurrency(3), Load::Rate(60.0)] {
        let report = run(&engine.url(), load, false).await;
        let level = &report.levels[0];
        let records = level.records.as_ref().unwrap();
        assert!(records.iter().all(|r| r.slo_class.is_some()), "{load}");
        let [tight, loose] = &level.slo_classes[..] else {
            panic!("two classes: {:?}", level.slo_classes)
        };
        for c in [tight, loose] {
            let mine: Vec<&Record> = records
                .iter()
                .filter(|r| r.slo_class.as_deref() == Some(&*c.name))
                .collect();
            assert_eq!(c.sent, mine.len(), "{load} {}", c.name);
            assert_eq!(c.served, mine.iter().filter(|r| r.ok()).count());
            let within = mine
                .iter()
                .filter(|r| {
                    r.ok()
                        && r.ttft.unwrap() <= c.ttft_objective
                        && c.tpot_objective.is_none_or(|l| r.tpot().is_none_or(|t| t <= l))
                })
                .count();
            assert_eq!(c.goodput, within, "{load} {}", c.name);
        }
        assert_eq!(tight.sent + loose.sent, level.stats.requests);
        assert!(tight.sent > 0 && loose.sent > tight.sent, "{load}: {level:?}");
        // Steps of 2 ms: the tight class's 5 ms may be missed, the loose class's second never.
        assert_eq!(loose.goodput, loose.sent, "{load}");
        // The same seed draws the same classes, in the same order for an open loop's schedule.
        let again = run(&engine.url(), load, false).await;
        let again = again.levels[0].records.as_ref().unwrap();
        assert_eq!(drawn(records), drawn(again), "{load}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["parameters"]["slo_mix"][0]["tpot"], 0.003);
        assert_eq!(json["levels"][0]["slo_classes"][1]["name"], "loose");
        assert_eq!(
            json["levels"][0]["slo_classes"][1]["tpot_objective"],
            serde_json::Value::Null
        );
        assert!(
            json["levels"][0]["records"][0]["slo_class"].is_string(),
            "{}",
            json["levels"][0]["records"][0]
        );
        let html = bench::html::render(&report).unwrap();
        assert!(html.contains("<h2>Objectives (--slo-mix)</h2>"));
        let text = bench::report::table(&report);
        assert!(
            text.contains("objectives (--slo-mix)") && text.contains("tight"),
            "{text}"
        );
    }
    // With tenants: both tenants' requests draw from the mix, and the one level reports it.
    let report = run(&engine.url(), Load::Concurrency(2), true).await;
    let level = &report.levels[0];
    assert_eq!(level.phase, Phase::Tenants);
    let records = level.records.as_ref().unwrap();
    assert!(
        records
            .iter()
            .all(|r| r.slo_class.is_some() && r.tenant.is_some())
    );
    let sent: usize = level.slo_classes.iter().map(|c| c.sent).sum();
    assert_eq!(sent, level.stats.requests);
    assert_eq!(report.tenants.len(), 2);
}
