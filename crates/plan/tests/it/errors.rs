//! Bad input gets one line that names what to change.

use std::time::Duration;

use spillway_plan::{Measurement, PlanError, plan};

use crate::support::{seed_deployment, seed_measurement};

fn one_line(e: &PlanError) -> String {
    let s = e.to_string();
    assert!(!s.contains('\n'), "more than one line: {s}");
    s
}

#[test]
fn headroom_outside_zero_to_one_is_refused() {
    for h in [0.0, -0.5, 1.01, f64::NAN] {
        let mut d = seed_deployment();
        d.headroom = h;
        let e = plan(&seed_measurement(true), &d).unwrap_err();
        assert!(matches!(e, PlanError::Headroom(_)), "{h}: {e}");
        assert!(one_line(&e).contains("must be above 0 and at most 1"), "{e}");
    }
    let mut d = seed_deployment();
    d.headroom = 1.0;
    assert_eq!(plan(&seed_measurement(true), &d).unwrap().concurrency, 30);
}

#[test]
fn a_wait_budget_that_cannot_fit_the_first_token_budget_is_refused() {
    let mut d = seed_deployment();
    d.pinned.first_token = Some(Duration::from_millis(2500));
    // Wq 2s + TTFT p99 0.8s does not fit in 2.5s.
    let e = plan(&seed_measurement(true), &d).unwrap_err();
    assert!(matches!(e, PlanError::WaitBudget(_)), "{e}");
    assert!(
        one_line(&e).contains("--wait-budget 2s cannot fit the first-token budget 2.5s"),
        "{e}"
    );
    // Without a measured tail the queue alone must still fit.
    d.pinned.first_token = Some(Duration::from_secs(2));
    let e = plan(&seed_measurement(false), &d).unwrap_err();
    assert!(matches!(e, PlanError::WaitBudget(_)), "{e}");
}

#[test]
fn deadlines_that_cannot_nest_are_refused() {
    let mut d = seed_deployment();
    d.caller_deadline = Duration::from_secs(30);
    // total = 2s + 1.5 × 24s = 38s, not under the caller's 30s.
    let e = plan(&seed_measurement(true), &d).unwrap_err();
    assert!(matches!(e, PlanError::Nesting(_)), "{e}");
    assert!(
        one_line(&e).starts_with("deadlines cannot nest: the gateway's total 38s"),
        "{e}"
    );
}

#[test]
fn a_bench_of_another_schema_or_without_a_passing_level_is_refused() {
    let e = Measurement::from_bench_json(r#"{"schema":"spillway-bench/2"}"#, "r.json", 1).unwrap_err();
    assert!(matches!(e, PlanError::Schema { .. }), "{e}");
    assert!(one_line(&e).contains("is not spillway-bench/1"), "{e}");
    let failing = r#"{"schema":"spillway-bench/1","parameters":{"model":"m","slo":"ttft_p95=1s"},
        "levels":[],"bursts":[],"knee":{"concurrency":1},"safe":null}"#;
    let e = Measurement::from_bench_json(failing, "r.json", 1).unwrap_err();
    assert!(matches!(e, PlanError::NoSafeLoad { .. }), "{e}");
    assert!(one_line(&e).contains("r.json: no level passed its SLOs"), "{e}");
    let e = Measurement::from_bench_json("not json", "r.json", 1).unwrap_err();
    assert!(matches!(e, PlanError::NotBench { .. }), "{e}");
}

#[test]
fn impossible_figures_are_refused() {
    let mut f = crate::support::seed_figures(false);
    f.throughput = 0.0;
    assert!(Measurement::from_figures(&f, 2).is_err());
    let mut d = seed_deployment();
    d.replicas = 0;
    assert!(matches!(
        plan(&seed_measurement(false), &d),
        Err(PlanError::Input(_))
    ));
    // One replica at C_safe 1 with headroom 0.8 leaves no whole slot.
    let mut f = crate::support::seed_figures(false);
    f.c_safe = 1;
    let mut d = seed_deployment();
    d.replicas = 1;
    let e = plan(&Measurement::from_figures(&f, 1).unwrap(), &d).unwrap_err();
    assert!(one_line(&e).contains("C would be 0"), "{e}");
}
