//! Where the backlog sits, C against what the engines absorb, and each incident's change with
//! its number.

use super::*;

/// The gateway's families for one class with C = `c`: `queued` waiting, `in_flight` holding a
/// slot, `ok` answered, their TTFT and queue wait.
fn gw(c: f64, queued: f64, in_flight: f64, ok: u32, wait: f64) -> String {
    let rc = "route=\"chat\",class=\"interactive\"";
    Expo::default()
        .line(
            "spillway_requests_total",
            &format!("{rc},status=\"200\""),
            f64::from(ok),
        )
        .line("spillway_queued", rc, queued)
        .line("spillway_in_flight", rc, in_flight)
        .line("spillway_concurrency_limit", rc, c)
        .hist("spillway_time_to_first_token_seconds", TTFT, 1.6, ok)
        .hist("spillway_queue_wait_seconds", REQ, wait, ok)
        .0
}

fn whats(v: &Verdict) -> Vec<&str> {
    v.changes.iter().map(|c| c.what.as_str()).collect()
}

/// C 16 in front of engines that run 8: the other 8 wait in vLLM's queue, past the gateway's
/// Wq and Retry-After. The change: C = 8, and the queue sized to drain inside the objective.
#[test]
fn a_c_above_what_the_engines_run_moves_the_backlog_into_the_engine() {
    let e = Engine {
        running: 8.0,
        waiting: 8.0,
        queue: 1.2,
        ttft: 1.6,
        ..Engine::default()
    };
    let (b, a) = (e.before().text(KV, ITL_NAME), e.text(KV, ITL_NAME));
    let v = run(
        &[("e:1", &b), ("g:1", &gw(16.0, 0.0, 16.0, 0, 0.0))],
        &[("e:1", &a), ("g:1", &gw(16.0, 0.0, 16.0, 100, 0.001))],
    );
    assert_eq!(v.status, Status::Incident);
    let b = v.backlog.as_ref().expect("a backlog");
    assert_eq!(b.sits, "engine", "{b:#?}");
    assert!(
        b.reading.contains("C 16 is above the 8 they run"),
        "{}",
        b.reading
    );
    assert_eq!(
        whats(&v)[0],
        "lower the gateway's C from 16 to 8",
        "{:#?}",
        v.changes
    );
    assert!(
        v.changes[0]
            .arithmetic
            .starts_with("C = Σ running while the engines queue = 8"),
        "{:#?}",
        v.changes
    );
}

/// The demo's unprotected run: C = 1000000 admits everything, so the advice is to turn admission
/// on, not to "lower C from 1000000 to 8" as if a C had been chosen too high.
#[test]
fn a_c_that_admits_everything_is_called_admission_off() {
    let e = Engine {
        running: 8.0,
        waiting: 8.0,
        queue: 1.2,
        ttft: 1.6,
        ..Engine::default()
    };
    let (b, a) = (e.before().text(KV, ITL_NAME), e.text(KV, ITL_NAME));
    let v = run(
        &[("e:1", &b), ("g:1", &gw(1_000_000.0, 0.0, 16.0, 0, 0.0))],
        &[("e:1", &a), ("g:1", &gw(1_000_000.0, 0.0, 16.0, 100, 0.001))],
    );
    assert_eq!(v.status, Status::Incident);
    let b = v.backlog.as_ref().expect("a backlog");
    assert!(
        b.reading
            .contains("the gateway's admission is off (C 1000000 admits everything)"),
        "{}",
        b.reading
    );
    assert_eq!(
        whats(&v)[0],
        "turn the gateway's admission on: C = 8",
        "{:#?}",
        v.changes
    );
    let all = format!("{:?} {v:?}", v.changes);
    assert!(!all.contains("lower the gateway's C"), "{all}");
    assert!(!all.contains("999992"), "{all}");
}

/// The gateway holds its queue full while the engines wait on nothing, decode far inside its
/// objective: C is below what they could take, and the queue is deeper than drains in time.
#[test]
fn a_c_below_what_the_engines_could_take_says_raise_it_and_by_how_much() {
    let e = Engine {
        running: 8.0,
        itl: 0.02,
        ttft: 0.05,
        ..Engine::default()
    };
    let (b, a) = (e.before().text(KV, ITL_NAME), e.text(KV, ITL_NAME));
    let v = run(
        &[("e:1", &b), ("g:1", &gw(8.0, 12.0, 8.0, 0, 0.0))],
        &[("e:1", &a), ("g:1", &gw(8.0, 30.0, 8.0, 100, 1.5))],
    );
    assert_eq!(v.status, Status::Incident, "{v:#?}");
    assert_eq!(v.backlog.as_ref().map(|b| b.sits), Some("gateway"));
    println!(
        "{}",
        crate::render::text(&v, crate::render::Style { colour: false })
    );
    let raise = v
        .changes
        .iter()
        .find(|c| c.what.starts_with("raise the gateway's C from 8 towards 16"))
        .unwrap_or_else(|| panic!("{:#?}", v.changes));
    // ITL objective 50 ms over the engines' p95: the factor is capped at 2.
    assert!(
        raise.arithmetic.contains("floor(8 × min(50 ms /"),
        "{}",
        raise.arithmetic
    );
    // 100 finished in 10 s: 10 req/s; Wq = min(1 s − engine TTFT p99 (60 ms), 500 ms).
    let q = v
        .changes
        .iter()
        .find(|c| c.what.starts_with("set the queue to Q = "))
        .unwrap_or_else(|| panic!("{:#?}", v.changes));
    assert!(q.arithmetic.contains("ceil(10 req/s × "), "{}", q.arithmetic);
    assert!(
        q.arithmetic.starts_with(
            "Wq = min(TTFT objective − engine TTFT p99, TTFT objective / 2) = min(1 s − 60 ms, 500 ms) = 500 ms;"
        ),
        "{}",
        q.arithmetic
    );
    assert_eq!(q.what, "set the queue to Q = 5 with queue_wait 500 ms");
}

/// vLLM alone, its queue drained inside the window (the real-vLLM misreading): the backlog was
/// the engine's, but with nothing waiting at the end the window never saw its batch full, so
/// the change is a gateway with a Wq, and C from a bench (not "C = what runs now").
#[test]
fn a_drained_queue_in_front_of_vllm_alone_asks_for_a_gateway_and_a_bench() {
    let (b, a) = super::onset::drained(0);
    let v = run(&[("e:1", &b)], &[("e:1", &a)]);
    assert_eq!(v.backlog.as_ref().map(|b| b.sits), Some("drained"), "{v:#?}");
    assert_eq!(
        whats(&v)[0],
        "put Spillway in front with queue_wait 500 ms and C from a bench",
        "{:#?}",
        v.changes
    );
}

/// The gateway queues, the engines wait on nothing, but ITL is already over its objective: no
/// headroom to spend, so no "raise C" (the review found it said "floor(8 × min(50 ms / 80 ms,
/// 2)) = 9").
#[test]
fn no_raise_of_c_when_itl_has_no_headroom() {
    let e = Engine {
        running: 8.0,
        itl: 0.08,
        ttft: 0.05,
        ..Engine::default()
    };
    let (b, a) = (e.before().text(KV, ITL_NAME), e.text(KV, ITL_NAME));
    // A GPU under the busy line: no decode-contention finding to hold the raise back.
    let d = dcgm(0.5, 0.0, 0.0);
    let v = run(
        &[("e:1", &b), ("g:1", &gw(8.0, 12.0, 8.0, 0, 0.0)), ("d:1", &d)],
        &[("e:1", &a), ("g:1", &gw(8.0, 30.0, 8.0, 100, 1.5)), ("d:1", &d)],
    );
    assert!(
        !v.changes
            .iter()
            .any(|c| c.what.starts_with("raise the gateway's C")),
        "{:#?}",
        v.changes
    );
}

/// Preemptions with the cache at 100% and 24 running: 24 × 0.9 / 1.0 = 21 sequences.
#[test]
fn kv_pressure_gives_the_sequence_cap_that_keeps_the_cache_under_its_line() {
    let before = Engine {
        running: 24.0,
        kv: 1.0,
        ..Engine::default()
    };
    let after = Engine {
        preemptions: 12.0,
        ..before
    };
    let v = run(
        &[("e:1", &before.before().text(KV, ITL_NAME))],
        &[("e:1", &after.text(KV, ITL_NAME))],
    );
    assert_eq!(suspects(&v)[0], Suspect::KvPressure, "{v:#?}");
    let c = v
        .changes
        .iter()
        .find(|c| {
            c.what
                .starts_with("lower vLLM's --max-num-seqs to 21 per replica")
        })
        .unwrap_or_else(|| panic!("{:#?}", v.changes));
    assert!(
        c.arithmetic.contains("floor(24 × 0.9 / 1) = 21"),
        "{}",
        c.arithmetic
    );
}

/// Nothing to change when nothing is wrong: a healthy window carries no change.
#[test]
fn no_change_without_an_incident() {
    let v = engine_only(&Engine::default(), 0.5);
    println!(
        "{}",
        crate::render::text(&v, crate::render::Style { colour: false })
    );
    assert_eq!(v.status, Status::Healthy, "{v:#?}");
    assert!(v.changes.is_empty(), "{:#?}", v.changes);
}

/// Two routes, each to engines that serve it under another name (`chat` as `m1`, `code` as
/// `m2`): two models, named by their routes, not four. Fails before (the breakdown showed `chat`,
/// `code`, `m1` and `m2`, and judged the engines' half apart from the gateway's).
#[test]
fn a_route_and_the_name_its_engines_serve_it_under_are_one_model() {
    let e = Engine::default();
    let engine = |model: &str| {
        (
            super::as_model(&e.before().text(KV, ITL_NAME), model),
            super::as_model(&e.text(KV, ITL_NAME), model),
        )
    };
    let gw = |ok: f64| {
        let mut x = Expo::default();
        for (route, replica) in [("chat", "http://e:1"), ("code", "http://e:2")] {
            x = x
                .line(
                    "spillway_requests_total",
                    &format!("route=\"{route}\",class=\"c\",status=\"200\""),
                    ok,
                )
                .line(
                    "spillway_replica_healthy",
                    &format!("route=\"{route}\",replica=\"{replica}\""),
                    1.0,
                );
        }
        x.0
    };
    let (m1, m2) = (engine("m1"), engine("m2"));
    let (gb, ga) = (gw(0.0), gw(100.0));
    let v = run(
        &[("e:1", &m1.0), ("e:2", &m2.0), ("g:1", &gb)],
        &[("e:1", &m1.1), ("e:2", &m2.1), ("g:1", &ga)],
    );
    let models: Vec<(&str, &[String])> = v
        .breakdown
        .slices
        .iter()
        .filter(|s| s.dimension == Dimension::Model)
        .map(|s| (s.name.as_str(), s.served_as.as_slice()))
        .collect();
    assert_eq!(
        models,
        [("chat", &["m1".to_owned()][..]), ("code", &["m2".to_owned()][..])],
        "{:#?}",
        v.breakdown
    );
    let shown = crate::render::text(&v, crate::render::Style { colour: false });
    assert!(shown.contains("chat (as m1)"), "{shown}");
}

/// Two gateways sharing C = 16 through Redis each report the whole 16: the change reads "from
/// 16", not "from 32". Gateways on their own add theirs. Fails before (it summed: 32).
#[test]
fn a_shared_c_is_counted_once_across_gateways() {
    let e = Engine {
        running: 8.0,
        waiting: 8.0,
        queue: 1.2,
        ttft: 1.6,
        ..Engine::default()
    };
    let (b, a) = (e.before().text(KV, ITL_NAME), e.text(KV, ITL_NAME));
    let shared = |text: String| {
        text + "spillway_limits_mode{mode=\"shared\"} 1\nspillway_limits_mode{mode=\"local\"} 0\n"
    };
    let v = run(
        &[
            ("e:1", &b),
            ("g:1", &shared(gw(16.0, 0.0, 8.0, 0, 0.0))),
            ("g:2", &shared(gw(16.0, 0.0, 8.0, 0, 0.0))),
        ],
        &[
            ("e:1", &a),
            ("g:1", &shared(gw(16.0, 0.0, 8.0, 50, 0.001))),
            ("g:2", &shared(gw(16.0, 0.0, 8.0, 50, 0.001))),
        ],
    );
    assert_eq!(
        v.rows.engine.gateway_concurrency_limit,
        Some(16.0),
        "{:#?}",
        v.rows.engine
    );
    assert_eq!(
        whats(&v)[0],
        "lower the gateway's C from 16 to 8",
        "{:#?}",
        v.changes
    );
    // Without Redis each gateway holds its own C: 16 + 16.
    let v = run(
        &[
            ("e:1", &b),
            ("g:1", &gw(16.0, 0.0, 8.0, 0, 0.0)),
            ("g:2", &gw(16.0, 0.0, 8.0, 0, 0.0)),
        ],
        &[
            ("e:1", &a),
            ("g:1", &gw(16.0, 0.0, 8.0, 50, 0.001)),
            ("g:2", &gw(16.0, 0.0, 8.0, 50, 0.001)),
        ],
    );
    assert_eq!(v.rows.engine.gateway_concurrency_limit, Some(32.0));
}
