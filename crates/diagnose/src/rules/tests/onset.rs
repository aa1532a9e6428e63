//! The first seconds of an incident: nothing has completed yet, the gauges already show it.

use super::*;
use crate::verdict::Basis;

/// `after` with the lines of `family` taken from `before`: that histogram observed nothing in
/// the window.
fn unobserved(after: &str, before: &str, family: &str) -> String {
    let keep = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| l.starts_with(family))
            .map(str::to_owned)
            .collect()
    };
    let mut out: Vec<String> = after
        .lines()
        .filter(|l| !l.starts_with(family))
        .map(str::to_owned)
        .collect();
    out.extend(keep(before));
    out.join("\n") + "\n"
}

/// A flood has just arrived: 22 waiting, the engine's 8 running at both ends still decoding,
/// nothing finished and no first token in the window. Fails before issue 35 (it said "busy but
/// healthy: objectives met" on a busy GPU, "healthy" on a quieter one).
#[test]
fn a_flood_at_its_onset_is_an_incident_on_instantaneous_evidence() {
    let before = Engine {
        running: 8.0,
        ..Engine::default()
    };
    let after = Engine {
        waiting: 22.0,
        gen_tokens: before.gen_tokens + 2_000.0,
        ..before
    };
    for gpu in [0.95, 0.5] {
        let g = dcgm(gpu, 0.0, 0.0);
        let v = run(
            &[("e:1", &before.text(KV, ITL_NAME)), ("d:1", &g)],
            &[("e:1", &after.text(KV, ITL_NAME)), ("d:1", &g)],
        );
        assert_eq!(v.status, Status::Incident, "gpu {gpu}: {v:#?}");
        assert_eq!(suspects(&v), [Suspect::ArrivalsExceedThroughput], "{v:#?}");
        assert!(
            v.saturation.declared,
            "no first token while 22 wait, and the queue grew"
        );
        assert!(!v.summary.contains("met"), "{}", v.summary);
        let ttft = &v.slo_breaches[0];
        assert_eq!(
            (ttft.series.as_str(), ttft.stat, ttft.value, ttft.basis),
            (
                "vllm:time_to_first_token_seconds",
                "unobserved_while_waiting",
                22.0,
                Basis::Instantaneous
            )
        );
        let ev = &v.findings[0].evidence;
        assert!(
            ev.iter()
                .any(|e| e.series == "vllm:num_requests_running" && e.stat == "steady" && e.value == 8.0),
            "{ev:#?}"
        );
        let b = &v.evidence_basis;
        assert!(b.completions.is_empty(), "{b:#?}");
        assert!(
            b.instantaneous
                .contains(&"vllm:num_requests_waiting end".to_owned()),
            "{b:#?}"
        );
        let shown = crate::render::text(&v, crate::render::Style { colour: false });
        assert!(shown.contains("instantaneous (the state now) "), "{shown}");
    }
}

/// The second run: KV at 88% (under the 90% line), 3 preemptions, a queue standing at
/// both ends and no first token. Fails before issue 35 ("HEALTHY: objectives met").
#[test]
fn a_standing_queue_without_a_first_token_is_the_worst_case_not_met() {
    let before = Engine {
        waiting: 4.0,
        kv: 0.88,
        ..Engine::default()
    };
    let after = Engine {
        waiting: 5.0,
        preemptions: 3.0,
        gen_tokens: before.gen_tokens + 500.0,
        ..before
    };
    let g = dcgm(0.6, 0.0, 0.0);
    let v = run(
        &[("e:1", &before.text(KV, ITL_NAME)), ("d:1", &g)],
        &[("e:1", &after.text(KV, ITL_NAME)), ("d:1", &g)],
    );
    assert_eq!(v.status, Status::Incident, "{v:#?}");
    assert!(
        v.slo_breaches
            .iter()
            .any(|e| e.stat == "unobserved_while_waiting" && e.value == 5.0),
        "{:#?}",
        v.slo_breaches
    );
    // Preemptions with requests waiting and the cache at 88% are KV pressure (issue 50), which
    // ranks before the queue it causes; the queue's finding still carries its age.
    assert_eq!(
        suspects(&v),
        [Suspect::KvPressure, Suspect::ArrivalsExceedThroughput]
    );
    // Those waiting at the start have waited the whole window, longer than the objective.
    let aged = v.findings[1]
        .evidence
        .iter()
        .find(|e| e.stat == "waited_at_least")
        .expect("the age of what waits");
    assert_eq!((aged.value, aged.op, aged.threshold), (10.0, ">", Some(1.0)));
}

/// TTFT breached by the first tokens that came, queue time not yet observed (it is at a
/// request's finish): the waiting gauge stands in. Fails before issue 35 ("objectives
/// breached; no row of the table matched: read the rows").
#[test]
fn queue_time_unobserved_while_a_queue_stands_joins_the_ttft_breach() {
    let before = Engine {
        waiting: 20.0,
        running: 8.0,
        ..Engine::default()
    };
    let after = Engine { ttft: 1.6, ..before };
    let (b, a) = (before.before().text(KV, ITL_NAME), after.text(KV, ITL_NAME));
    let a = unobserved(&a, &b, "vllm:request_queue_time_seconds");
    let g = dcgm(0.9, 0.0, 0.0);
    let v = run(&[("e:1", &b), ("d:1", &g)], &[("e:1", &a), ("d:1", &g)]);
    assert_eq!(suspects(&v), [Suspect::ArrivalsExceedThroughput], "{v:#?}");
    let ev = &v.findings[0].evidence;
    let queue = ev
        .iter()
        .find(|e| e.series == "vllm:request_queue_time_seconds")
        .expect("queue time");
    assert_eq!(
        (queue.stat, queue.basis),
        ("unobserved_while_waiting", Basis::Instantaneous)
    );
    let b = &v.evidence_basis;
    assert!(!b.instantaneous.is_empty() && !b.completions.is_empty(), "{b:#?}");
}

/// The gateway's queue at onset: every slot taken at both ends, requests queued, no first token
/// relayed. Fails before issue 35 ("busy but healthy: objectives met").
#[test]
fn the_gateway_queue_at_onset_with_its_slots_full() {
    let rc = "route=\"chat\",class=\"interactive\"";
    let gw = |queued: f64| {
        Expo::default()
            .line("spillway_requests_total", &format!("{rc},status=\"200\""), 40.0)
            .line("spillway_queued", rc, queued)
            .line("spillway_in_flight", rc, 8.0)
            .line("spillway_concurrency_limit", rc, 8.0)
            .hist("spillway_time_to_first_token_seconds", TTFT, 0.05, 40)
            .hist("spillway_queue_wait_seconds", REQ, 0.001, 40)
            .0
    };
    let e = Engine {
        running: 8.0,
        ..Engine::default()
    };
    let (eb, ea) = (
        e.text(KV, ITL_NAME),
        Engine {
            gen_tokens: e.gen_tokens + 2_000.0,
            ..e
        }
        .text(KV, ITL_NAME),
    );
    let g = dcgm(0.9, 0.0, 0.0);
    let v = run(
        &[("e:1", &eb), ("g:1", &gw(0.0)), ("d:1", &g)],
        &[("e:1", &ea), ("g:1", &gw(6.0)), ("d:1", &g)],
    );
    assert_eq!(suspects(&v), [Suspect::ArrivalsExceedThroughput], "{v:#?}");
    let ev = &v.findings[0].evidence;
    assert!(
        ev.iter().any(|e| e.series == "spillway_queue_wait_seconds"
            && e.stat == "unobserved_while_waiting"
            && e.value == 6.0),
        "{ev:#?}"
    );
    assert!(
        ev.iter()
            .any(|e| e.series == "spillway_in_flight" && e.stat == "at_limit"),
        "{ev:#?}"
    );
    assert_eq!(v.slo_breaches[0].series, "spillway_time_to_first_token_seconds");
}

/// A full KV cache beside a held queue is read as the reason the batch takes no more, before any
/// preemption: it stands in the onset's evidence (not a KV-pressure finding, which needs
/// preemptions).
#[test]
fn a_full_kv_cache_beside_a_held_queue_is_part_of_the_onset() {
    let before = Engine {
        running: 6.0,
        kv: 0.97,
        ..Engine::default()
    };
    let after = Engine {
        waiting: 9.0,
        gen_tokens: before.gen_tokens + 800.0,
        ..before
    };
    let v = run(
        &[("e:1", &before.text(KV, ITL_NAME))],
        &[("e:1", &after.text(KV, ITL_NAME))],
    );
    assert_eq!(suspects(&v), [Suspect::ArrivalsExceedThroughput], "{v:#?}");
    let kv = v.findings[0]
        .evidence
        .iter()
        .find(|e| e.series == KV)
        .expect("KV in the onset's evidence");
    assert_eq!((kv.stat, kv.value, kv.basis), ("end", 0.97, Basis::Instantaneous));
}

/// A request caught between its arrival and the scheduler's next step on a quiet engine is no
/// onset: the queue did not stand and the engine was not at a steady maximum.
#[test]
fn one_request_caught_waiting_on_a_quiet_engine_is_no_onset() {
    let quiet = Engine {
        running: 0.0,
        n: 0,
        gen_tokens: 0.0,
        ..Engine::default()
    };
    let caught = Engine {
        waiting: 1.0,
        ..quiet
    };
    let v = run(
        &[("e:1", &quiet.text(KV, ITL_NAME))],
        &[("e:1", &caught.text(KV, ITL_NAME))],
    );
    assert_ne!(v.status, Status::Incident, "{v:#?}");
    assert!(v.slo_breaches.is_empty());
}

/// vLLM's own run (`--max-num-seqs 4`, eight long streams sent at once, TTFT objective 1 s
/// here): four ran and finished, four waited and got their first token seconds later, still
/// streaming at the window's end with the queue drained. Their wait is in TTFT only (vLLM
/// times the queue at a request's finish). Fails before the fix: "long prompts, tokenisation
/// or CPU".
pub(super) fn drained(slow_finished: u32) -> (String, String) {
    let text = |running: f64, ttft: &[(f64, u32)], finished: u32| {
        Expo::default()
            .line("vllm:num_requests_running", "model_name=\"m\"", running)
            .line("vllm:num_requests_waiting", "model_name=\"m\"", 0.0)
            .line(KV, "model_name=\"m\"", 0.3)
            .line(
                "vllm:generation_tokens_total",
                "model_name=\"m\"",
                1900.0 * f64::from(finished),
            )
            .line(
                "vllm:request_success_total",
                "model_name=\"m\",finished_reason=\"length\"",
                f64::from(finished),
            )
            .hist_of("vllm:time_to_first_token_seconds", TTFT, ttft)
            .hist("vllm:request_queue_time_seconds", REQ, 0.0, finished)
            .hist("vllm:request_prefill_time_seconds", REQ, 0.009, finished)
            .0
    };
    let before = text(0.0, &[], 0);
    // `slow_finished` of the finished four had a slow first token too.
    let after = text(
        4.0,
        &[(0.02, 4 - slow_finished), (7.0, 4 + slow_finished)],
        4 + slow_finished,
    );
    (before, after)
}

#[test]
fn a_wait_vllm_has_not_timed_yet_is_arrivals_not_long_prompts() {
    let (b, a) = drained(0);
    let v = run(&[("e:1", &b)], &[("e:1", &a)]);
    assert_eq!(suspects(&v), [Suspect::ArrivalsExceedThroughput], "{v:#?}");
    let ev = &v.findings[0].evidence;
    let unfinished = ev
        .iter()
        .find(|e| e.stat == "unobserved_unfinished")
        .expect("the first tokens not yet finished");
    assert_eq!(
        (unfinished.series.as_str(), unfinished.value),
        ("vllm:request_queue_time_seconds", 4.0)
    );
    assert!(
        ev.iter()
            .any(|e| e.stat == "over_objective" && e.value == 4.0 && e.threshold == Some(4.0)),
        "{ev:#?}"
    );
}

/// The same TTFT where finished requests, quick in the queue and in prefill, had the slow first
/// tokens: the time went before the engine (tokenisation, the API server's CPU), rule 2.
#[test]
fn slow_first_tokens_of_finished_requests_stay_before_the_engine() {
    let (b, a) = drained(4);
    let v = run(&[("e:1", &b)], &[("e:1", &a)]);
    assert_eq!(suspects(&v), [Suspect::LongPrompts], "{v:#?}");
}

/// A metrics cache serving one busy moment over and over: every sample the same at both ends,
/// 4 running and 3 waiting. Not the present, and nothing it claims is progressing. Fails before
/// the stale check ("objectives breached; no row of the table matched").
#[test]
fn a_frozen_exposition_claiming_work_is_a_stale_scrape_or_a_frozen_process() {
    let busy = Engine {
        running: 4.0,
        waiting: 3.0,
        ..Engine::default()
    }
    .text(KV, ITL_NAME);
    let v = run(&[("e:1", &busy)], &[("e:1", &busy)]);
    assert_eq!(v.status, Status::Incident, "{v:#?}");
    assert_eq!(suspects(&v), [Suspect::ProcessHealth], "{v:#?}");
    assert!(
        v.findings[0]
            .evidence
            .iter()
            .any(|e| e.stat == "frozen" && e.series.starts_with("every sample of e:1")),
        "{:#?}",
        v.findings[0].evidence
    );
    assert!(
        v.blind_spots.iter().any(|b| b.contains("stale scrape")),
        "{:#?}",
        v.blind_spots
    );
    // The same stillness with nothing in hand is an idle engine.
    let idle = Engine {
        running: 0.0,
        ..Engine::default()
    }
    .text(KV, ITL_NAME);
    let v = run(&[("e:1", &idle)], &[("e:1", &idle)]);
    assert_eq!(v.status, Status::Idle, "{v:#?}");
}

/// A burst that queued and drained inside the window: queue time and TTFT over their lines, no
/// queue left at the end. The wait is measured, so it is arrivals over throughput, its backlog
/// drained. Fails before ("objectives breached; no row of the table matched").
#[test]
fn a_burst_that_queued_and_drained_is_arrivals_with_the_backlog_drained() {
    let v = engine_only(
        &Engine {
            queue: 1.2,
            ttft: 1.6,
            ..Engine::default()
        },
        0.9,
    );
    assert_eq!(suspects(&v), [Suspect::ArrivalsExceedThroughput], "{v:#?}");
    assert_eq!(v.backlog.as_ref().map(|b| b.sits), Some("drained"), "{v:#?}");
}

/// vLLM when even the running four have not finished (they were aborted, which vLLM times not at
/// all): eight first tokens, four of them late, nothing finished, so neither queue time nor
/// prefill is observed. Short prompts (23 tokens each) beside 1,200 generated tokens a second:
/// prefill is not where the time went. Fails before (long prompts, on TTFT alone).
#[test]
fn late_first_tokens_with_nothing_finished_and_short_prompts_are_a_wait() {
    let text = |running: f64, ttft: &[(f64, u32)], prompt: f64, generated: f64| {
        Expo::default()
            .line("vllm:num_requests_running", "model_name=\"m\"", running)
            .line("vllm:num_requests_waiting", "model_name=\"m\"", 0.0)
            .line(KV, "model_name=\"m\"", 0.01)
            .line("vllm:prompt_tokens_total", "model_name=\"m\"", prompt)
            .line("vllm:generation_tokens_total", "model_name=\"m\"", generated)
            .line(
                "vllm:request_success_total",
                "model_name=\"m\",finished_reason=\"length\"",
                0.0,
            )
            .hist_of("vllm:time_to_first_token_seconds", TTFT, ttft)
            .hist("vllm:request_queue_time_seconds", REQ, 0.0, 0)
            .hist("vllm:request_prefill_time_seconds", REQ, 0.0, 0)
            .0
    };
    let (b, a) = (
        text(0.0, &[], 0.0, 0.0),
        text(4.0, &[(0.06, 4), (2.35, 4)], 184.0, 9_400.0),
    );
    let v = run(&[("e:1", &b)], &[("e:1", &a)]);
    assert_eq!(suspects(&v), [Suspect::ArrivalsExceedThroughput], "{v:#?}");
    // The same first tokens after 3,000-token prompts: the work was prefill, the time too.
    let a = text(4.0, &[(0.06, 4), (2.35, 4)], 24_000.0, 9_400.0);
    let v = run(&[("e:1", &b)], &[("e:1", &a)]);
    assert_eq!(suspects(&v), [Suspect::LongPrompts], "{v:#?}");
}

/// The gateway times what still waits: its oldest queued request has waited 3 s while the
/// requests that got through waited 1 ms. The age is evidence now, before any completion shows
/// it.
#[test]
fn the_oldest_wait_in_the_gateway_queue_is_evidence_now() {
    let rc = "route=\"chat\",class=\"interactive\"";
    let gw = |queued: f64, oldest: f64, n: u32| {
        Expo::default()
            .line(
                "spillway_requests_total",
                &format!("{rc},status=\"200\""),
                f64::from(n),
            )
            .line("spillway_queued", rc, queued)
            .line("spillway_queue_oldest_wait_seconds", rc, oldest)
            .line("spillway_in_flight", rc, 8.0)
            .line("spillway_concurrency_limit", rc, 8.0)
            .hist("spillway_time_to_first_token_seconds", TTFT, 1.6, n)
            .hist("spillway_queue_wait_seconds", REQ, 0.001, n)
            .0
    };
    let e = Engine {
        running: 8.0,
        ..Engine::default()
    };
    let (eb, ea) = (e.before().text(KV, ITL_NAME), e.text(KV, ITL_NAME));
    let v = run(
        &[("e:1", &eb), ("g:1", &gw(0.0, 0.0, 0))],
        &[("e:1", &ea), ("g:1", &gw(6.0, 3.0, 40))],
    );
    assert_eq!(suspects(&v), [Suspect::ArrivalsExceedThroughput], "{v:#?}");
    let old = v.findings[0]
        .evidence
        .iter()
        .find(|e| e.series == "spillway_queue_oldest_wait_seconds")
        .unwrap_or_else(|| panic!("{:#?}", v.findings[0].evidence));
    assert_eq!((old.value, old.basis), (3.0, Basis::Instantaneous));
}
