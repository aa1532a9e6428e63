//! The table's rows, the saturation rule and "busy but healthy" on scripted expositions.

use crate::Cluster;
use crate::breakdown::Dimension;
use crate::verdict::{Status, Suspect, Thresholds, Verdict, diagnose};
use crate::window::Snapshot;

const TTFT: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
];
const ITL: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
const REQ: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
];

/// An exposition written by hand, one call per family.
#[derive(Default)]
struct Expo(String);

impl Expo {
    fn line(mut self, name: &str, labels: &str, v: f64) -> Self {
        let labels = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        self.0.push_str(&format!("{name}{labels} {v}\n"));
        self
    }

    /// A histogram holding `n` observations of `value`.
    fn hist(self, name: &str, buckets: &[f64], value: f64, n: u32) -> Self {
        self.hist_of(name, buckets, &[(value, n)])
    }

    /// A histogram holding `n` observations of each `value` of `obs`.
    fn hist_of(mut self, name: &str, buckets: &[f64], obs: &[(f64, u32)]) -> Self {
        let below = |b: f64| -> u32 { obs.iter().filter(|(v, _)| *v <= b).map(|(_, n)| n).sum() };
        for b in buckets {
            let c = below(*b);
            self.0
                .push_str(&format!("{name}_bucket{{model_name=\"m\",le=\"{b}\"}} {c}\n"));
        }
        let n: u32 = obs.iter().map(|(_, n)| n).sum();
        let sum: f64 = obs.iter().map(|(v, n)| v * f64::from(*n)).sum();
        self.0
            .push_str(&format!("{name}_bucket{{model_name=\"m\",le=\"+Inf\"}} {n}\n"));
        self.0
            .push_str(&format!("{name}_sum{{model_name=\"m\"}} {sum}\n"));
        self.0
            .push_str(&format!("{name}_count{{model_name=\"m\"}} {n}\n"));
        self
    }
}

/// The engine's families: gauges, counters and latency histograms of `n` requests.
struct Engine {
    running: f64,
    waiting: f64,
    kv: f64,
    preemptions: f64,
    n: u32,
    gen_tokens: f64,
    ttft: f64,
    itl: f64,
    queue: f64,
    prefill: f64,
    finished_reason: &'static str,
    /// Gaps of this many seconds among the ITL observations, and how many.
    stalls: (f64, u32),
}

impl Default for Engine {
    fn default() -> Self {
        Self {
            running: 4.0,
            waiting: 0.0,
            kv: 0.2,
            preemptions: 0.0,
            n: 100,
            gen_tokens: 10_000.0,
            ttft: 0.05,
            itl: 0.02,
            queue: 0.001,
            prefill: 0.04,
            finished_reason: "stop",
            stalls: (0.0, 0),
        }
    }
}

impl Engine {
    fn text(&self, kv_name: &str, itl_name: &str) -> String {
        Expo::default()
            .line("vllm:num_requests_running", "model_name=\"m\"", self.running)
            .line("vllm:num_requests_waiting", "model_name=\"m\"", self.waiting)
            .line(kv_name, "model_name=\"m\"", self.kv)
            .line("vllm:num_preemptions_total", "model_name=\"m\"", self.preemptions)
            .line(
                "vllm:prompt_tokens_total",
                "model_name=\"m\"",
                200.0 * f64::from(self.n),
            )
            .line(
                "vllm:generation_tokens_total",
                "model_name=\"m\"",
                self.gen_tokens,
            )
            .line(
                "vllm:request_success_total",
                &format!("model_name=\"m\",finished_reason=\"{}\"", self.finished_reason),
                f64::from(self.n),
            )
            .hist("vllm:time_to_first_token_seconds", TTFT, self.ttft, self.n)
            .hist_of(itl_name, ITL, &[(self.itl, self.n * 50), self.stalls])
            .hist("vllm:request_queue_time_seconds", REQ, self.queue, self.n)
            .hist("vllm:request_prefill_time_seconds", REQ, self.prefill, self.n)
            .hist("vllm:request_decode_time_seconds", REQ, self.itl * 50.0, self.n)
            .hist(
                "vllm:e2e_request_latency_seconds",
                REQ,
                self.ttft + self.itl * 50.0,
                self.n,
            )
            .0
    }

    /// The state at the start of a window: same gauges, no requests yet.
    fn before(&self) -> Self {
        Self {
            n: 0,
            gen_tokens: 0.0,
            preemptions: 0.0,
            stalls: (0.0, 0),
            ..*self
        }
    }
}

fn dcgm(util: f64, xid: f64, ecc: f64) -> String {
    let l = "gpu=\"0\",UUID=\"GPU-1\",modelName=\"H100\",Hostname=\"h\"";
    Expo::default()
        .line("DCGM_FI_DEV_GPU_UTIL", l, util * 100.0)
        .line("DCGM_FI_PROF_GR_ENGINE_ACTIVE", l, util)
        .line("DCGM_FI_DEV_FB_USED", l, 30_000.0)
        .line("DCGM_FI_DEV_FB_FREE", l, 50_000.0)
        .line("DCGM_FI_DEV_XID_ERRORS", l, xid)
        .line("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", l, ecc)
        .0
}

fn snap(at: f64, targets: &[(&str, &str)]) -> Snapshot {
    let mut s = Snapshot::new(at);
    for (instance, text) in targets {
        s.add_exposition(instance, text);
    }
    s
}

fn run(start: &[(&str, &str)], end: &[(&str, &str)]) -> Verdict {
    diagnose(
        &snap(0.0, start),
        &snap(10.0, end),
        &Thresholds::default(),
        &Cluster::default(),
    )
}

fn engine_only(e: &Engine, gpu_util: f64) -> Verdict {
    let (b, a) = (e.before().text(KV, ITL_NAME), e.text(KV, ITL_NAME));
    let g = dcgm(gpu_util, 0.0, 0.0);
    run(&[("e:1", &b), ("d:1", &g)], &[("e:1", &a), ("d:1", &g)])
}

const KV: &str = "vllm:kv_cache_usage_perc";
const ITL_NAME: &str = "vllm:inter_token_latency_seconds";

fn suspects(v: &Verdict) -> Vec<Suspect> {
    v.findings.iter().map(|f| f.suspect).collect()
}

#[test]
fn arrivals_exceed_throughput_when_waiting_queue_time_and_ttft_rise_together() {
    let e = Engine {
        waiting: 20.0,
        queue: 1.2,
        ttft: 1.6,
        ..Engine::default()
    };
    let (b, a) = (
        Engine {
            waiting: 2.0,
            ..e.before()
        }
        .text(KV, ITL_NAME),
        e.text(KV, ITL_NAME),
    );
    let g = dcgm(0.95, 0.0, 0.0);
    let v = run(&[("e:1", &b), ("d:1", &g)], &[("e:1", &a), ("d:1", &g)]);
    assert_eq!(suspects(&v), [Suspect::ArrivalsExceedThroughput], "{v:#?}");
    assert!(v.saturation.declared, "SLO breached and the queue growing");
    assert_eq!(v.status, Status::Incident);
    assert_eq!(v.exit_code(), 1);
    let ev = &v.findings[0].evidence;
    let growth = ev
        .iter()
        .find(|e| e.stat == "growth")
        .expect("the queue's growth is evidence");
    assert_eq!(
        (growth.series.as_str(), growth.value),
        ("vllm:num_requests_waiting", 18.0)
    );
    assert!(ev.iter().all(|e| e.window_secs == 10.0));
}

#[test]
fn long_prompts_when_ttft_rises_with_the_queue_empty() {
    let v = engine_only(
        &Engine {
            ttft: 1.6,
            prefill: 1.5,
            ..Engine::default()
        },
        0.6,
    );
    assert_eq!(suspects(&v), [Suspect::LongPrompts]);
    assert!(!v.saturation.declared, "one signal moving is not saturation");
    assert_eq!(v.exit_code(), 1, "an objective is breached");
}

#[test]
fn decode_contention_needs_a_busy_gpu() {
    let slow_itl = Engine {
        itl: 0.09,
        ..Engine::default()
    };
    assert_eq!(
        suspects(&engine_only(&slow_itl, 0.95)),
        [Suspect::DecodeContention]
    );
    assert_eq!(
        suspects(&engine_only(&slow_itl, 0.1)),
        [],
        "slow tokens on an idle GPU are not contention"
    );
}

#[test]
fn kv_pressure_outranks_the_queue_it_causes() {
    let e = Engine {
        kv: 0.97,
        preemptions: 40.0,
        waiting: 6.0,
        queue: 0.9,
        ttft: 1.8,
        ..Engine::default()
    };
    let v = engine_only(&e, 0.9);
    assert_eq!(
        suspects(&v),
        [Suspect::KvPressure, Suspect::ArrivalsExceedThroughput]
    );
    let kv = &v.findings[0].evidence[0];
    assert_eq!((kv.stat, kv.value, kv.threshold), ("peak", 0.97, Some(0.9)));
}

fn gateway(ok: f64, timeouts: f64, queued: f64, overflow: f64, in_flight: f64) -> String {
    let rc = "route=\"chat\",class=\"interactive\"";
    Expo::default()
        .line("spillway_requests_total", &format!("{rc},status=\"200\""), ok)
        .line(
            "spillway_requests_total",
            &format!("{rc},status=\"504\""),
            timeouts,
        )
        .line(
            "spillway_cancellations_total",
            &format!("{rc},reason=\"deadline\""),
            timeouts,
        )
        .line(
            "spillway_rejections_total",
            &format!("{rc},reason=\"queue_timeout\""),
            overflow,
        )
        .line("spillway_queued", rc, queued)
        .line("spillway_in_flight", rc, in_flight)
        .line("spillway_concurrency_limit", rc, 8.0)
        .hist("spillway_time_to_first_token_seconds", TTFT, 0.05, ok as u32)
        .0
}

#[test]
fn gateway_timeouts_while_the_engine_is_healthy() {
    let e = Engine::default();
    let (b, a) = (e.before().text(KV, ITL_NAME), e.text(KV, ITL_NAME));
    let (gb, ga) = (
        gateway(0.0, 0.0, 0.0, 0.0, 4.0),
        gateway(100.0, 12.0, 0.0, 0.0, 4.0),
    );
    let v = run(&[("e:1", &b), ("g:1", &gb)], &[("e:1", &a), ("g:1", &ga)]);
    assert_eq!(suspects(&v), [Suspect::GatewayTimeouts], "{:#?}", v.findings);
    assert!(v.slo_breaches.iter().any(|e| e.stat == "error_ratio"));
}

/// One request between its arrival and the engine's next step when the gauge is read is no
/// queue; a queue through the window is, and the timeouts are then not the gateway's alone.
#[test]
fn gateway_timeouts_stand_beside_a_momentary_waiting_request_not_a_queue() {
    let (gb, ga) = (
        gateway(0.0, 0.0, 0.0, 0.0, 4.0),
        gateway(100.0, 12.0, 0.0, 0.0, 4.0),
    );
    // One read waiting at each end is closed-loop clients coming back after a cut (a held-out
    // corpus window: 44 timeouts a second, one waiting beside 11 running, called busy but healthy).
    for (before, after, timeouts) in [(0.0, 1.0, true), (1.0, 1.0, true), (2.0, 3.0, false)] {
        let (eb, ea) = (
            Engine {
                waiting: before,
                ..Engine::default()
            },
            Engine {
                waiting: after,
                ..Engine::default()
            },
        );
        let (b, a) = (eb.before().text(KV, ITL_NAME), ea.text(KV, ITL_NAME));
        let v = run(&[("e:1", &b), ("g:1", &gb)], &[("e:1", &a), ("g:1", &ga)]);
        assert_eq!(
            suspects(&v).contains(&Suspect::GatewayTimeouts),
            timeouts,
            "waiting {before}→{after}: {:#?}",
            v.findings
        );
    }
}

#[test]
fn a_queue_in_front_of_an_idle_gpu_points_at_the_process() {
    let stuck = Engine {
        running: 8.0,
        ..Engine::default()
    };
    // Nothing finished and no token made in the window: the same counters at both ends.
    let text = stuck.text(KV, ITL_NAME);
    let (gb, ga) = (
        gateway(50.0, 0.0, 2.0, 0.0, 8.0),
        gateway(50.0, 0.0, 12.0, 9.0, 8.0),
    );
    let g = dcgm(0.0, 0.0, 0.0);
    let v = run(
        &[("e:1", &text), ("g:1", &gb), ("d:1", &g)],
        &[("e:1", &text), ("g:1", &ga), ("d:1", &g)],
    );
    assert_eq!(suspects(&v), [Suspect::ProcessHealth], "{:#?}", v.findings);
    // Without DCGM the engine's lack of progress says the same.
    let v = run(&[("e:1", &text), ("g:1", &gb)], &[("e:1", &text), ("g:1", &ga)]);
    assert_eq!(suspects(&v), [Suspect::ProcessHealth]);
    assert!(
        v.findings[0]
            .evidence
            .iter()
            .any(|e| e.series == "vllm:generation_tokens_total")
    );
}

#[test]
fn xid_and_ecc_with_a_restart_come_first() {
    let e = Engine::default();
    let before = Engine {
        n: 500,
        gen_tokens: 90_000.0,
        ..e
    }
    .text(KV, ITL_NAME);
    let after = e.text(KV, ITL_NAME);
    let v = run(
        &[("e:1", &before), ("d:1", &dcgm(0.9, 0.0, 0.0))],
        &[("e:1", &after), ("d:1", &dcgm(0.0, 79.0, 2.0))],
    );
    assert_eq!(suspects(&v)[0], Suspect::GpuFault);
    let ev = &v.findings[0].evidence;
    assert!(ev.iter().any(|e| e.series.starts_with("DCGM_FI_DEV_XID_ERRORS{")
        && e.series.contains("UUID=\"GPU-1\"")
        && e.value == 79.0));
    assert!(
        ev.iter().any(|e| e.stat == "restart" && e.series.contains("e:1")),
        "{ev:#?}"
    );
}

#[test]
fn restarts_from_kubernetes_join_the_evidence() {
    let mut cluster = Cluster::default();
    cluster
        .add_pods(
            r#"{"kind":"List","items":[{"metadata":{"name":"llm-0"},"status":{"containerStatuses":[
            {"name":"vllm","restartCount":2,"ready":false,
             "lastState":{"terminated":{"reason":"Error","finishedAt":"1970-01-01T00:00:05Z"}}}]}}]}"#,
        )
        .unwrap();
    let e = Engine::default();
    let (b, a) = (e.before().text(KV, ITL_NAME), e.text(KV, ITL_NAME));
    let v = diagnose(
        &snap(0.0, &[("e:1", &b), ("d:1", &dcgm(0.5, 0.0, 0.0))]),
        &snap(10.0, &[("e:1", &a), ("d:1", &dcgm(0.5, 48.0, 0.0))]),
        &Thresholds::default(),
        &cluster,
    );
    assert_eq!(suspects(&v), [Suspect::GpuFault]);
    assert!(
        v.findings[0]
            .evidence
            .iter()
            .any(|e| e.series.contains("pod llm-0"))
    );
}

#[test]
fn busy_but_healthy_is_no_incident() {
    let v = engine_only(&Engine::default(), 0.96);
    assert_eq!(v.status, Status::BusyButHealthy, "{:#?}", v.findings);
    assert!(v.findings.is_empty() && v.slo_breaches.is_empty());
    assert_eq!(v.exit_code(), 0);
    assert!(
        v.healthy_evidence
            .iter()
            .any(|e| e.series == "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    );
    let quiet = engine_only(&Engine::default(), 0.3);
    assert_eq!(quiet.status, Status::Healthy);
}

/// vLLM 0.32 leaves `finished_reason="abort"` at 0 whatever clients do: the engine-only view
/// shows no cancellation figure and says why; a release that counted aborts is read; a gateway
/// scraped beside the engines gives its own count.
#[test]
fn cancellations_come_from_where_they_are_counted() {
    let v = engine_only(&Engine::default(), 0.3);
    assert_eq!(v.rows.user_impact.seen_at, Some("engine"));
    assert_eq!(v.rows.user_impact.cancellations_per_s, None);
    assert!(
        v.blind_spots
            .iter()
            .any(|b| b.contains("vLLM 0.32 counts no aborted request")),
        "{:?}",
        v.blind_spots
    );
    let text = crate::render::text(&v, crate::render::Style { colour: false });
    assert!(text.contains("cancelled unseen"), "{text}");
    assert!(!text.contains("cancelled 0"), "{text}");

    let older = Engine {
        finished_reason: "abort",
        ..Engine::default()
    };
    let v = engine_only(&older, 0.3);
    assert_eq!(v.rows.user_impact.cancellations_per_s, Some(10.0));

    let e = Engine::default();
    let gone = Expo::default()
        .line(
            "spillway_cancellations_total",
            "route=\"m\",class=\"c\",reason=\"client_disconnect\"",
            30.0,
        )
        .0;
    let none = Expo::default()
        .line(
            "spillway_cancellations_total",
            "route=\"m\",class=\"c\",reason=\"client_disconnect\"",
            0.0,
        )
        .0;
    let (b, a) = (e.before().text(KV, ITL_NAME), e.text(KV, ITL_NAME));
    let v = run(&[("e:1", &b), ("g:1", &none)], &[("e:1", &a), ("g:1", &gone)]);
    assert_eq!(v.rows.user_impact.cancellations_per_s, Some(3.0));
}

#[test]
fn older_vllm_names_are_read_and_said() {
    let e = Engine {
        kv: 0.95,
        preemptions: 12.0,
        ..Engine::default()
    };
    let (old_kv, old_itl) = ("vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds");
    let (b, a) = (e.before().text(old_kv, old_itl), e.text(old_kv, old_itl));
    let v = run(&[("e:1", &b)], &[("e:1", &a)]);
    assert_eq!(suspects(&v), [Suspect::KvPressure]);
    assert_eq!(v.findings[0].evidence[0].series, old_kv);
    let renamed: Vec<&str> = v
        .discovery
        .iter()
        .filter(|f| f.renamed)
        .map(|f| f.wanted)
        .collect();
    assert_eq!(renamed, [KV, ITL_NAME]);
    assert!(v.blind_spots.iter().any(|b| b.contains(old_itl)));
    assert!(v.rows.generation.engine_itl.is_some());
}

#[test]
fn nothing_answering_is_unknown() {
    let mut a = Snapshot::new(0.0);
    a.add_down("e:1");
    let mut b = Snapshot::new(10.0);
    b.add_down("e:1");
    let v = diagnose(&a, &b, &Thresholds::default(), &Cluster::default());
    assert_eq!(v.status, Status::Unknown);
    assert_eq!(v.exit_code(), 2);
    assert!(v.blind_spots.iter().any(|s| s.contains("e:1")));
}

/// The engine's exposition under another model name.
fn as_model(text: &str, model: &str) -> String {
    text.replace("model_name=\"m\"", &format!("model_name=\"{model}\""))
}

/// An engine's expositions at the window's start and end.
fn both(before: &Engine, after: &Engine) -> (String, String) {
    (before.text(KV, ITL_NAME), after.text(KV, ITL_NAME))
}

/// Targets (instance, exposition at the window's start, at its end) beside a GPU exporter `d:1`
/// at 60% activity: not idle, so rule 3 cannot match the totals on the GPU's word.
fn fleet(targets: &[(&str, (String, String))]) -> Verdict {
    let g = dcgm(0.6, 0.0, 0.0);
    let at = |end: bool| -> Vec<(&str, &str)> {
        targets
            .iter()
            .map(|(i, (b, a))| (*i, if end { a.as_str() } else { b.as_str() }))
            .chain([("d:1", g.as_str())])
            .collect()
    };
    run(&at(false), &at(true))
}

#[test]
fn a_hung_replica_is_named_though_the_totals_hide_it() {
    let healthy = Engine::default();
    // Requests pile up in e:2 and it generates nothing: its counters and histograms stand still.
    let hung = Engine {
        waiting: 8.0,
        n: 0,
        gen_tokens: 0.0,
        ..Engine::default()
    };
    let hung_before = Engine {
        waiting: 2.0,
        ..hung.before()
    };
    // The gateway's calls to e:2 time out; those to e:1 succeed.
    let gateway = |ok: f64, timeouts: f64| {
        Expo::default()
            .line(
                "spillway_upstream_requests_total",
                "route=\"m\",replica=\"http://e:1\",result=\"ok\"",
                ok,
            )
            .line(
                "spillway_upstream_requests_total",
                "route=\"m\",replica=\"http://e:2/\",result=\"timeout\"",
                timeouts,
            )
            .0
    };
    let v = fleet(&[
        ("e:1", both(&healthy.before(), &healthy)),
        ("e:2", both(&hung_before, &hung)),
        ("gw:1", (gateway(0.0, 0.0), gateway(100.0, 20.0))),
    ]);

    // The totals alone: tokens still flow and the GPU is 60% busy, so rule 3 does not match them.
    assert!(v.rows.generation.generation_tokens_per_s > Some(0.0));
    assert_eq!(suspects(&v), [Suspect::ProcessHealth], "{v:#?}");
    let f = &v.findings[0];
    assert!(f.only_in_slices);
    assert_eq!(f.at, ["replica e:2"]);
    assert!(
        f.evidence.iter().all(|e| e.series.starts_with("replica e:2: ")),
        "each line names its slice: {:#?}",
        f.evidence
    );
    assert!(
        v.healthy_evidence.is_empty(),
        "an incident is not also busy-but-healthy"
    );
    assert_eq!(v.status, Status::Incident);
    assert!(v.summary.contains("replica e:2"), "{}", v.summary);

    let replica = |name: &str| {
        v.breakdown
            .slices
            .iter()
            .find(|s| s.label() == format!("replica {name}"))
            .unwrap_or_else(|| panic!("no slice for {name}: {:#?}", v.breakdown))
    };
    let (e1, e2) = (replica("e:1"), replica("e:2"));
    assert!(e1.suspects.is_empty());
    assert_eq!(e2.suspects, [Suspect::ProcessHealth]);
    assert_eq!(e2.generation_tokens_per_s, Some(0.0));
    assert_eq!(e2.waiting.map(|l| l.growth()), Some(6.0));
    // The gateway's side of each replica, joined by host:port.
    assert_eq!(e1.upstream_calls_per_s, Some(10.0));
    assert_eq!(e1.upstream_failed_ratio, Some(0.0));
    assert_eq!(e2.upstream_calls_per_s, Some(2.0));
    assert_eq!(e2.upstream_failed_ratio, Some(1.0));
    // The hung replica is listed first; one model is no breakdown by model.
    assert_eq!(v.breakdown.slices[0].name, "e:2");
    assert!(
        v.breakdown
            .slices
            .iter()
            .all(|s| s.dimension == Dimension::Replica)
    );

    let text = crate::render::text(&v, crate::render::Style { colour: false });
    assert!(text.contains("by replica"), "{text}");
    assert!(text.contains("at: replica e:2 (only there"), "{text}");
}

#[test]
fn a_finding_of_the_totals_names_the_model_and_replica_it_comes_from() {
    let big = Engine {
        kv: 0.97,
        preemptions: 12.0,
        ..Engine::default()
    };
    let small = Engine::default();
    let named = |e: &Engine, model: &str| {
        let (b, a) = both(&e.before(), e);
        (as_model(&b, model), as_model(&a, model))
    };
    let v = fleet(&[("e:1", named(&big, "big")), ("e:2", named(&small, "small"))]);
    assert_eq!(suspects(&v), [Suspect::KvPressure], "{v:#?}");
    let f = &v.findings[0];
    assert!(!f.only_in_slices);
    assert_eq!(f.at, ["model big", "replica e:1"]);
    let labels: Vec<String> = v.breakdown.slices.iter().map(|s| s.label()).collect();
    assert_eq!(labels, ["model big", "model small", "replica e:1", "replica e:2"]);
    let small = &v.breakdown.slices[1];
    assert!(
        small.suspects.is_empty() && small.breached.is_empty(),
        "{small:#?}"
    );
    assert_eq!(small.kv_peak, Some(0.2));
}

#[test]
fn healthy_replicas_raise_nothing() {
    let e = Engine::default();
    let v = fleet(&[("e:1", both(&e.before(), &e)), ("e:2", both(&e.before(), &e))]);
    assert_eq!(v.status, Status::Healthy, "{v:#?}");
    assert!(v.findings.is_empty());
    assert_eq!(v.breakdown.slices.len(), 2);
    assert!(v.breakdown.slices.iter().all(|s| s.suspects.is_empty()));
}

#[test]
fn a_quiet_replica_given_its_first_request_at_the_end_is_not_a_hang() {
    let busy = Engine::default();
    // Idle through the window, then one request still in prefill: running 0 → 1, no token yet.
    let quiet = Engine {
        running: 1.0,
        n: 0,
        gen_tokens: 0.0,
        ..Engine::default()
    };
    let quiet_before = Engine {
        running: 0.0,
        ..quiet.before()
    };
    let v = fleet(&[
        ("e:1", both(&busy.before(), &busy)),
        ("e:2", both(&quiet_before, &quiet)),
    ]);
    assert_eq!(v.status, Status::Healthy, "{v:#?}");
    assert!(v.breakdown.slices.iter().all(|s| s.suspects.is_empty()));
}

mod change;
mod kinds;
mod levels;
mod onset;
