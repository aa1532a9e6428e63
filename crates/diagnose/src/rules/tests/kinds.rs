//! The verdict kinds: idle, healthy, protected, incident, and what each says of goodput.

use super::*;
use crate::verdict::Basis;

/// A gateway's families: answers by status, refusals by reason and team, the admitted's TTFT.
struct Gateway {
    ok: f64,
    /// `(status, reason, team, n)`: refused requests, counted as answers and as rejections.
    refused: &'static [(&'static str, &'static str, &'static str, f64)],
    ttft: f64,
    in_flight: f64,
}

impl Gateway {
    /// The exposition at the window's end, or at its start (`start`: nothing answered yet).
    fn text_at(&self, start: bool) -> String {
        let count = |n: f64| if start { 0.0 } else { n };
        let rc = "route=\"chat\",class=\"interactive\"";
        let mut x = Expo::default().line(
            "spillway_requests_total",
            &format!("{rc},team=\"\",status=\"200\""),
            count(self.ok),
        );
        for (status, reason, team, n) in self.refused {
            x = x
                .line(
                    "spillway_requests_total",
                    &format!("{rc},team=\"{team}\",status=\"{status}\""),
                    count(*n),
                )
                .line(
                    "spillway_rejections_total",
                    &format!("{rc},team=\"{team}\",reason=\"{reason}\""),
                    count(*n),
                );
        }
        x.line("spillway_goodput_requests_total", rc, count(self.ok))
            .line("spillway_slo_requests_total", rc, count(self.ok))
            .line("spillway_queued", rc, 0.0)
            .line("spillway_in_flight", rc, self.in_flight)
            .line("spillway_concurrency_limit", rc, 8.0)
            .hist(
                "spillway_time_to_first_token_seconds",
                TTFT,
                self.ttft,
                count(self.ok) as u32,
            )
            .0
    }
}

fn with_gateway(gw: &Gateway) -> Verdict {
    let e = Engine::default();
    let (b, a) = (e.before().text(KV, ITL_NAME), e.text(KV, ITL_NAME));
    let g = dcgm(0.6, 0.0, 0.0);
    run(
        &[("e:1", &b), ("g:1", &gw.text_at(true)), ("d:1", &g)],
        &[("e:1", &a), ("g:1", &gw.text_at(false)), ("d:1", &g)],
    )
}

/// Fails before issue 35: an idle stack was "healthy: objectives met".
#[test]
fn no_traffic_is_idle_with_nothing_judged() {
    let idle = Engine {
        running: 0.0,
        n: 0,
        gen_tokens: 0.0,
        ..Engine::default()
    };
    let text = idle.text(KV, ITL_NAME);
    let g = dcgm(0.0, 0.0, 0.0);
    let gw = Gateway {
        ok: 0.0,
        refused: &[],
        ttft: 0.05,
        in_flight: 0.0,
    }
    .text_at(false);
    let v = run(
        &[("e:1", &text), ("g:1", &gw), ("d:1", &g)],
        &[("e:1", &text), ("g:1", &gw), ("d:1", &g)],
    );
    assert_eq!(v.status, Status::Idle, "{v:#?}");
    assert_eq!(v.exit_code(), 0);
    assert!(v.summary.contains("nothing to judge"), "{}", v.summary);
    assert!(!v.summary.contains("met"), "{}", v.summary);
    let shown = crate::render::text(&v, crate::render::Style { colour: false });
    assert!(shown.starts_with("IDLE (exit 0)"), "{shown}");
    assert!(!shown.contains("objectives met"), "{shown}");

    // A GPU fault on an idle stack is still an incident.
    let v = run(
        &[("e:1", &text), ("d:1", &g)],
        &[("e:1", &text), ("d:1", &dcgm(0.0, 79.0, 0.0))],
    );
    assert_eq!(v.status, Status::Incident);
}

/// One request arriving in a quiet window is traffic, not idle; with no first token observed
/// the summary does not claim the objectives were met. Fails before issue 35 on the wording.
#[test]
fn a_first_request_is_traffic_and_nothing_unmeasured_is_called_met() {
    let quiet = Engine {
        running: 0.0,
        n: 0,
        gen_tokens: 0.0,
        ..Engine::default()
    };
    let arriving = Engine {
        running: 1.0,
        ..quiet
    };
    let v = run(
        &[("e:1", &quiet.text(KV, ITL_NAME))],
        &[("e:1", &arriving.text(KV, ITL_NAME))],
    );
    assert_eq!(v.status, Status::Healthy, "{v:#?}");
    assert!(!v.summary.contains("objectives met"), "{}", v.summary);
    assert!(v.summary.contains("no first token observed"), "{}", v.summary);
}

/// Fails before issue 35: the designed refusals counted as errors, so the limits doing their
/// job read "saturated; no row of the table matched" beside "goodput 100.0%".
#[test]
fn refusals_by_design_with_the_admitted_inside_their_objectives_are_protected() {
    let gw = Gateway {
        ok: 110.0,
        refused: &[
            ("503", "queue_full", "search", 60.0),
            ("429", "tenant_rpm", "batch", 30.0),
        ],
        ttft: 0.05,
        in_flight: 8.0,
    };
    let v = with_gateway(&gw);
    assert_eq!(v.status, Status::Protected, "{v:#?}");
    assert_eq!(v.exit_code(), 0);
    assert!(v.findings.is_empty() && v.slo_breaches.is_empty());
    let u = &v.rows.user_impact;
    assert_eq!(u.refused_by_design_ratio, Some(0.45));
    assert_eq!(u.success_ratio, Some(0.55));
    assert_eq!(u.admitted_error_ratio, Some(0.0));
    assert_eq!(u.goodput_ratio, Some(1.0));
    let who: Vec<(&str, Option<&str>, f64, Option<f64>)> = u
        .refused
        .iter()
        .map(|x| (x.reason.as_str(), x.team.as_deref(), x.requests, x.share))
        .collect();
    assert_eq!(
        who,
        [
            ("queue_full", Some("search"), 60.0, Some(0.3)),
            ("tenant_rpm", Some("batch"), 30.0, Some(0.15)),
        ]
    );
    assert!(
        v.summary
            .starts_with("protected: the gateway refused 45.0% of requests by design")
            && v.summary.contains("queue_full team search 30.0%")
            && v.summary.contains("objectives met")
            && v.summary.contains("goodput 100.0% of those measured"),
        "{}",
        v.summary
    );
    let p95: Vec<&str> = v
        .healthy_evidence
        .iter()
        .filter(|e| e.stat == "p95" && e.op == "<=" && e.basis == Basis::Completions)
        .map(|e| e.series.as_str())
        .collect();
    assert_eq!(
        p95,
        [
            "spillway_time_to_first_token_seconds",
            "vllm:inter_token_latency_seconds"
        ],
        "each once"
    );
    let shown = crate::render::text(&v, crate::render::Style { colour: false });
    assert!(shown.starts_with("PROTECTED (exit 0)"), "{shown}");
    assert!(
        shown.contains("success 55.0% of all")
            && shown.contains("refused by design 45.0%")
            && shown.contains("goodput 100.0% of the admitted measured"),
        "{shown}"
    );
}

/// Refusing by design does not excuse the admitted: their TTFT over the objective is an incident.
#[test]
fn refusals_by_design_beside_a_breach_of_the_admitted_are_an_incident() {
    let gw = Gateway {
        ok: 110.0,
        refused: &[("503", "queue_full", "anonymous", 60.0)],
        ttft: 2.0,
        in_flight: 8.0,
    };
    let v = with_gateway(&gw);
    assert_eq!(v.status, Status::Incident, "{v:#?}");
    assert_eq!(v.exit_code(), 1);
    assert!(v.healthy_evidence.is_empty());
    assert!(v.slo_breaches.iter().any(|e| e.stat == "p95"));
    // Without tenants every request is `anonymous`: no team is named.
    assert_eq!(v.rows.user_impact.refused[0].team, None);
}

/// A refusal that is no limit of ours (no replica healthy) is a failure, not protection.
#[test]
fn refusals_not_by_design_stay_errors() {
    let gw = Gateway {
        ok: 110.0,
        refused: &[("503", "no_healthy_replica", "", 60.0)],
        ttft: 0.05,
        in_flight: 4.0,
    };
    let v = with_gateway(&gw);
    assert_eq!(v.status, Status::Incident, "{v:#?}");
    assert!(v.rows.user_impact.refused.is_empty());
    assert!(v.slo_breaches.iter().any(|e| e.stat == "error_ratio"));
}

/// Healthy and incident keep their meaning, and say what their evidence rests on.
#[test]
fn healthy_and_incident_say_what_their_evidence_rests_on() {
    let v = engine_only(&Engine::default(), 0.3);
    assert_eq!(v.status, Status::Healthy);
    assert!(v.summary.contains("objectives met"), "{}", v.summary);
    let e = Engine {
        ttft: 1.6,
        ..Engine::default()
    };
    let v = engine_only(&e, 0.3);
    assert_eq!(v.status, Status::Incident);
    let b = &v.evidence_basis;
    assert!(
        b.completions
            .contains(&"vllm:time_to_first_token_seconds p95".to_owned()),
        "{b:#?}"
    );
    assert!(b.instantaneous.is_empty(), "{b:#?}");
}

/// vLLM refusing at its own `--max-num-queued-reqs` (a 503 the engines' success counter never
/// sees) while the requests it took meet their objectives: the engines' limits doing their job,
/// said with the refused share. Fails before (healthy: the refusals were invisible).
#[test]
fn vllm_refusing_at_its_queue_limit_is_protected_and_counted() {
    let e = Engine::default();
    let refusals = |n: f64| {
        format!(
            "vllm:admission_rejections_total{{model_name=\"m\",reason=\"max_num_queued_reqs\"}} {n}\n\
             vllm:admission_rejections_total{{model_name=\"m\",reason=\"max_num_queued_tokens\"}} 0\n"
        )
    };
    let (b, a) = (
        e.before().text(KV, ITL_NAME) + &refusals(0.0),
        e.text(KV, ITL_NAME) + &refusals(40.0),
    );
    let v = run(&[("e:1", &b)], &[("e:1", &a)]);
    assert_eq!(v.status, Status::Protected, "{v:#?}");
    let u = &v.rows.user_impact;
    assert_eq!(
        u.requests_per_s,
        Some(14.0),
        "100 finished and 40 refused in 10 s"
    );
    assert_eq!(u.refused[0].reason, "vllm:max_num_queued_reqs");
    assert!(
        v.summary.starts_with(
            "protected: the engines refused 28.6% of requests by design (vllm:max_num_queued_reqs 28.6%)"
        ),
        "{}",
        v.summary
    );
}
