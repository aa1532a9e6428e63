//! Levels as evidence: what waits now, against what the engine finishes per second, names the
//! suspect when the rise is already over (issue 50's two situations).

use super::*;

/// An engine at its sequence cap with ten times as many waiting; the flood arrived before the
/// window, so waiting falls slowly (22→20) and the two completions' queue time is short, while
/// TTFT p95 is far over its objective.
#[test]
fn a_backlog_already_there_is_arrivals_exceeding_throughput_with_its_drain_time() {
    let e = Engine {
        running: 2.0,
        waiting: 20.0,
        n: 2,
        gen_tokens: 2_000.0,
        ttft: 4.0,
        queue: 0.01,
        ..Engine::default()
    };
    let before = Engine {
        waiting: 22.0,
        ..e.before()
    };
    let g = dcgm(0.9, 0.0, 0.0);
    let v = run(
        &[("e:1", &before.text(KV, ITL_NAME)), ("d:1", &g)],
        &[("e:1", &e.text(KV, ITL_NAME)), ("d:1", &g)],
    );
    assert_eq!(
        suspects(&v).first(),
        Some(&Suspect::ArrivalsExceedThroughput),
        "{}",
        v.summary
    );
    assert!(
        v.saturation.declared,
        "at its cap with waiters: saturated whatever the trend"
    );
    let drain = v.findings[0]
        .evidence
        .iter()
        .find(|e| e.stat == "drain_secs")
        .unwrap_or_else(|| panic!("{:#?}", v.findings[0].evidence));
    // 20 waiting at 2 finished in 10 s: 100 s to drain.
    assert!((drain.value - 100.0).abs() < 1e-9, "{drain:?}");
    assert!(v.summary.contains("100 s to drain"), "{}", v.summary);
    assert!(v.summary.contains("engines' queue"), "{}", v.summary);
}

/// Preemptions in the window, 2 running, 20 waiting, KV usage peaking at 88.7%: under the fixed
/// 90% line, over what is left once one of two sequences has been preempted.
#[test]
fn preemptions_with_waiters_below_the_cap_are_kv_pressure_whatever_the_gauges_peak() {
    let e = Engine {
        running: 2.0,
        waiting: 20.0,
        kv: 0.887,
        preemptions: 12.0,
        n: 20,
        ttft: 3.0,
        queue: 2.5,
        ..Engine::default()
    };
    let before = Engine {
        waiting: 14.0,
        kv: 0.6,
        ..e.before()
    };
    let g = dcgm(0.9, 0.0, 0.0);
    let v = run(
        &[("e:1", &before.text(KV, ITL_NAME)), ("d:1", &g)],
        &[("e:1", &e.text(KV, ITL_NAME)), ("d:1", &g)],
    );
    assert_eq!(suspects(&v).first(), Some(&Suspect::KvPressure), "{v:#?}");
    // floor(2 × 0.9 / 0.887) is the 2 that already preempt: one fewer, then retest.
    assert!(
        v.changes
            .iter()
            .any(|c| c.what.starts_with("lower vLLM's --max-num-seqs to 1 per replica")),
        "{:#?}",
        v.changes
    );
}

/// An objective breached while a layer holds waiters is never "no row matched": the verdict
/// says where they wait, how long they take to drain, and the first response.
#[test]
fn a_breach_with_waiters_always_names_where_they_wait() {
    // Waiting falls 30→20 with the batch moving, queue time short, TTFT over: the rise is over.
    let e = Engine {
        running: 6.0,
        waiting: 20.0,
        n: 50,
        ttft: 2.0,
        queue: 0.05,
        ..Engine::default()
    };
    let before = Engine {
        running: 4.0,
        waiting: 30.0,
        ..e.before()
    };
    let g = dcgm(0.9, 0.0, 0.0);
    let v = run(
        &[("e:1", &before.text(KV, ITL_NAME)), ("d:1", &g)],
        &[("e:1", &e.text(KV, ITL_NAME)), ("d:1", &g)],
    );
    assert!(!v.summary.contains("no row"), "{}", v.summary);
    assert_eq!(suspects(&v).first(), Some(&Suspect::ArrivalsExceedThroughput));
    // 20 waiting at 5 finished a second.
    assert!(v.summary.contains("4 s to drain"), "{}", v.summary);
}

/// A queue the engine empties in a few tens of milliseconds is no backlog: with the engine's own
/// TTFT within its objective, the deadlines cutting streams are the gateway's, and an error
/// breach beside those few waiters is not arrivals exceeding throughput.
#[test]
fn a_queue_that_drains_in_milliseconds_is_no_backlog_beside_an_error_breach() {
    // 1,000 finished in 10 s (100/s), three waiting at the end: 30 ms to drain.
    let (eb, ea) = (
        Engine {
            waiting: 2.0,
            n: 1000,
            gen_tokens: 100_000.0,
            ..Engine::default()
        },
        Engine {
            waiting: 3.0,
            n: 1000,
            gen_tokens: 100_000.0,
            ..Engine::default()
        },
    );
    let (gb, ga) = (
        gateway(0.0, 0.0, 0.0, 0.0, 4.0),
        gateway(1000.0, 40.0, 0.0, 0.0, 4.0),
    );
    let (b, a) = (eb.before().text(KV, ITL_NAME), ea.text(KV, ITL_NAME));
    let v = run(&[("e:1", &b), ("g:1", &gb)], &[("e:1", &a), ("g:1", &ga)]);
    assert!(
        !suspects(&v).contains(&Suspect::ArrivalsExceedThroughput),
        "{}\n{:#?}",
        v.summary,
        v.findings
    );
    assert_eq!(
        suspects(&v).first(),
        Some(&Suspect::GatewayTimeouts),
        "{}",
        v.summary
    );
}

/// A queue growing in front of an engine at its cap, with ITL over its objective: with no GPU
/// activity seen the gaps may be the queue's prefills joining every step, and the backlog is
/// certain, so it is named first; with the GPU seen busy, decode contention keeps its rank.
#[test]
fn an_itl_breach_judged_without_the_gpu_goes_after_a_growing_backlog() {
    let e = Engine {
        running: 4.0,
        waiting: 100.0,
        n: 50,
        ttft: 2.0,
        itl: 0.1,
        queue: 1.0,
        ..Engine::default()
    };
    let before = Engine {
        waiting: 0.0,
        ..e.before()
    };
    let (b, a) = (before.text(KV, ITL_NAME), e.text(KV, ITL_NAME));
    let v = run(&[("e:1", &b)], &[("e:1", &a)]);
    assert_eq!(
        suspects(&v),
        [Suspect::ArrivalsExceedThroughput, Suspect::DecodeContention],
        "{}",
        v.summary
    );
    let g = dcgm(0.95, 0.0, 0.0);
    let v = run(&[("e:1", &b), ("d:1", &g)], &[("e:1", &a), ("d:1", &g)]);
    assert_eq!(
        suspects(&v),
        [Suspect::DecodeContention, Suspect::ArrivalsExceedThroughput],
        "{}",
        v.summary
    );
}

/// The same two sequences running at both ends, gaps of 2.5 ms between their tokens, and a tenth
/// of the tokens that pace makes in the window: the engine stopped for most of it (a hang at its
/// onset, before any wait shows). At nine tenths of its pace it is healthy.
#[test]
fn a_batch_far_short_of_its_own_pace_stopped() {
    for (share, hung) in [(0.1, true), (0.9, false)] {
        let e = Engine {
            running: 2.0,
            n: 14,
            itl: 0.0025,
            ttft: 0.01,
            // Two sequences at 2.5 ms a token make 800 tokens a second, 8,000 in the window.
            gen_tokens: 8_000.0 * share,
            ..Engine::default()
        };
        let v = run(
            &[("e:1", &e.before().text(KV, ITL_NAME))],
            &[("e:1", &e.text(KV, ITL_NAME))],
        );
        assert_eq!(
            suspects(&v).first() == Some(&Suspect::ProcessHealth),
            hung,
            "{share} of its pace: {}",
            v.summary
        );
    }
}

/// Where the engine says its cache's size (`vllm:cache_config_info`), the KV line is where fewer
/// free blocks are left than sequences running: 12 running in a cache of 40 blocks are high at
/// 70% (the fixed 90% line would call 88.7% under it).
#[test]
fn the_kv_line_is_relative_to_the_cache_the_engine_says_it_has() {
    let e = Engine {
        running: 12.0,
        waiting: 20.0,
        kv: 0.887,
        preemptions: 3.0,
        n: 20,
        ttft: 3.0,
        queue: 2.5,
        ..Engine::default()
    };
    let info =
        "vllm:cache_config_info{model_name=\"m\",engine=\"0\",block_size=\"16\",num_gpu_blocks=\"40\"} 1\n";
    let judged = |with_info: bool| {
        let extra = if with_info { info } else { "" };
        let (b, a) = (
            format!("{}{extra}", e.before().text(KV, ITL_NAME)),
            format!("{}{extra}", e.text(KV, ITL_NAME)),
        );
        let v = run(&[("e:1", &b)], &[("e:1", &a)]);
        let kv = v
            .findings
            .iter()
            .find(|f| f.suspect == Suspect::KvPressure)
            .and_then(|f| f.evidence.iter().find(|ev| ev.stat == "peak").cloned())
            .unwrap_or_else(|| panic!("no KV finding: {}", v.summary));
        (kv.op, kv.threshold)
    };
    assert_eq!(judged(false), ("<", Some(0.9)));
    let (op, line) = judged(true);
    assert_eq!(op, ">=");
    assert!((line.unwrap() - 0.7).abs() < 1e-9, "{line:?}");
}

/// Two gaps of three seconds among a thousand of 2.5 ms, nothing waiting and the objectives met
/// on the p95: no batch makes such a gap, a process that stopped and went on does.
#[test]
fn a_gap_of_seconds_between_tokens_is_a_process_that_stopped() {
    for (stalls, hung) in [((3.0, 12), true), ((0.0, 0), false)] {
        let e = Engine {
            running: 2.0,
            n: 20,
            itl: 0.0025,
            // Two at 2.5 ms a token: 800 a second, its own pace.
            gen_tokens: 8_000.0,
            stalls,
            ..Engine::default()
        };
        let v = run(
            &[("e:1", &e.before().text(KV, ITL_NAME))],
            &[("e:1", &e.text(KV, ITL_NAME))],
        );
        assert_eq!(
            suspects(&v).first() == Some(&Suspect::ProcessHealth),
            hung,
            "{stalls:?}: {}",
            v.summary
        );
    }
}
