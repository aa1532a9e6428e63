//! `spillway plan --simulate`: "what would yesterday's traffic have done with C = 24, Q = 11 and
//! `--max-num-seqs` 16?" answered by running the trace through the gateway's own admission gate
//! (the `admission` crate) in front of the engine's own scheduler (`spillway engine`'s), in one
//! process, on tokio's paused clock: an hour of trace costs seconds of CPU, not an hour.
//!
//! # Layout (this file)
//! - [`Candidate`]: the knobs of one deployment (C, Q, Wq, replicas, `--max-num-seqs`);
//! - [`simulate`]: one candidate over one trace, giving an [`Outcome`] (goodput against the SLOs,
//!   refusals by reason, TTFT / TPOT / queue-wait percentiles);
//! - [`grid`] and [`best`]: every combination of the values given, and the one to choose.
//!
//! What it does not model: the gateway's stream deadlines and retries, tenants' quotas and fair
//! share (every request is one anonymous team), the network, and anything the engine's cost
//! model gets wrong (docs/engine-calibration.md says how far that is).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use admission::{Admission, Claim, Limits, Priority};
use bench_schema::spec::{Metric, Slo};
use bench_schema::stats::Percentiles;
use engine::EngineConfig;
use engine::engine::{Engine, GenerateParams};
use serde::Serialize;
use tokio::time::Instant;
use trace::{Request, Trace};

/// One deployment to try.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Candidate {
    /// The gateway's C, Q and Wq (one class, one gateway).
    pub concurrency: u32,
    pub queue: u32,
    #[serde(serialize_with = "bench_schema::units::ser_secs")]
    pub queue_wait: Duration,
    pub replicas: u32,
    /// Each replica's `--max-num-seqs`.
    pub max_num_seqs: u32,
}

impl std::fmt::Display for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "C={} Q={} Wq={} R={} max-num-seqs={}",
            self.concurrency,
            self.queue,
            bench_schema::units::number(self.queue_wait.as_secs_f64()) + "s",
            self.replicas,
            self.max_num_seqs
        )
    }
}

/// What one candidate did with the trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    pub candidate: Candidate,
    pub requests: usize,
    pub served: usize,
    /// Served within every per-request objective of the SLO (TTFT, TPOT, e2e limits), over all
    /// requests of the trace: the refused count against it.
    pub goodput: f64,
    /// Refusals by the gateway's reason (`queue_full`, `queue_timeout`, …) or the engine's.
    pub refused: BTreeMap<&'static str, usize>,
    /// Of the served requests, seconds; from arrival at the gateway.
    pub ttft: Option<Percentiles>,
    pub tpot: Option<Percentiles>,
    pub e2e: Option<Percentiles>,
    pub queue_wait: Option<Percentiles>,
    /// The SLO's percentile targets and refusal share held.
    pub holds: bool,
    pub reasons: Vec<String>,
    /// Virtual seconds simulated.
    pub simulated_seconds: f64,
}

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("the engine: {0}")]
    Engine(String),
    #[error("cannot start a runtime for the simulation: {0}")]
    Runtime(std::io::Error),
    #[error("{0}")]
    Input(String),
}

/// One request's fate.
#[derive(Debug, Clone, Copy)]
enum Fate {
    Served {
        queue: Duration,
        ttft: Duration,
        e2e: Duration,
        tokens: u32,
    },
    Refused(&'static str),
}

/// The prompt's token ids: per hash id a block of `block` ids drawn from it (equal ids, equal
/// blocks: the engine's prefix cache finds them), then ids of the request's own.
fn prompt(r: &Request, index: usize, block: u32) -> Vec<u32> {
    let mut out = Vec::with_capacity(r.input_tokens as usize);
    let want = r.input_tokens.max(1) as usize;
    for id in &r.hash_ids {
        for j in 0..block {
            if out.len() == want {
                return out;
            }
            let x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(j).wrapping_mul(0xD1B5_4A32_D192_ED03);
            out.push((x >> 40) as u32);
        }
    }
    let mut k = 0u64;
    while out.len() < want {
        let x =
            (index as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407) ^ k.wrapping_mul(0x9FB2_1C65_1E98_DF25);
        out.push((x >> 40) as u32 | 1 << 24);
        k += 1;
    }
    out
}

/// Runs `trace` (over `speed`) through `c` in virtual time on a runtime of its own.
pub fn simulate(
    trace: &Trace,
    engine: &EngineConfig,
    c: Candidate,
    slo: &Slo,
    speed: f64,
) -> Result<Outcome, SimError> {
    if c.concurrency == 0 || c.replicas == 0 || c.max_num_seqs == 0 {
        return Err(SimError::Input(format!(
            "{c}: C, R and max-num-seqs must be at least 1"
        )));
    }
    if !(speed.is_finite() && speed > 0.0) {
        return Err(SimError::Input(format!("--speed {speed}: a positive factor")));
    }
    // A thread of its own: its runtime's paused clock is the simulation's, and a caller may
    // already be inside a runtime (the binary's), where another cannot be blocked on.
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .map_err(SimError::Runtime)?;
            rt.block_on(run(trace, engine, c, slo, speed))
        })
        .join()
        .unwrap_or_else(|_| Err(SimError::Input(format!("{c}: the simulation panicked"))))
    })
}

async fn run(
    trace: &Trace,
    engine: &EngineConfig,
    c: Candidate,
    slo: &Slo,
    speed: f64,
) -> Result<Outcome, SimError> {
    let mut replicas = Vec::new();
    let mut loops = Vec::new();
    for _ in 0..c.replicas {
        let mut cfg = engine.clone();
        cfg.max_num_seqs = c.max_num_seqs as usize;
        // The step loop on this runtime and its paused clock.
        cfg.core_thread = false;
        cfg.precise_timer = false;
        let (e, steps) = Engine::start(cfg).map_err(|e| SimError::Engine(e.to_string()))?;
        replicas.push((e, Arc::new(std::sync::atomic::AtomicU32::new(0))));
        loops.push(steps);
    }
    let replicas = Arc::new(replicas);
    let gate = Admission::new(Limits {
        concurrency: c.concurrency,
        queue: c.queue,
        queue_wait: c.queue_wait,
    });
    let fates: Arc<Mutex<Vec<Option<Fate>>>> = Arc::new(Mutex::new(vec![None; trace.requests.len()]));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, r) in trace.requests.iter().enumerate() {
        tokio::time::sleep_until(start + r.at.div_f64(speed)).await;
        while tasks.try_join_next().is_some() {}
        let priority = r
            .priority
            .as_deref()
            .and_then(Priority::parse)
            .unwrap_or_default();
        let (gate, replicas, fates) = (gate.clone(), replicas.clone(), fates.clone());
        let params = GenerateParams {
            prompt: prompt(r, i, trace.block_tokens),
            max_tokens: Some(r.output_tokens.max(1)),
            n: 1,
            ignore_eos: true,
        };
        tasks.spawn(async move {
            let fate = one(&gate, &replicas, priority, params).await;
            fates.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(fate);
        });
    }
    while tasks.join_next().await.is_some() {}
    let simulated = start.elapsed();
    for l in loops {
        l.stop();
    }
    let fates: Vec<Fate> = fates
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|f| f.unwrap_or(Fate::Refused("lost")))
        .collect();
    Ok(judge(c, &fates, slo, simulated))
}

/// One request: a slot at the gate, the least-loaded replica, its first token and its end.
async fn one(
    gate: &Arc<Admission>,
    replicas: &[(Engine, Arc<std::sync::atomic::AtomicU32>)],
    priority: Priority,
    params: GenerateParams,
) -> Fate {
    use std::sync::atomic::Ordering;
    let arrival = Instant::now();
    // No caller deadline in a trace: the gate's Wq is the only bound on the wait.
    let far = arrival + Duration::from_secs(86_400);
    let permit = match gate.acquire(priority, far, &Claim::anonymous()).await {
        Ok(p) => p,
        Err(rejection) => return Fate::Refused(rejection.reason()),
    };
    let queue = arrival.elapsed();
    let Some((engine, load)) = replicas.iter().min_by_key(|(_, n)| n.load(Ordering::Relaxed)) else {
        return Fate::Refused("no_replica");
    };
    load.fetch_add(1, Ordering::Relaxed);
    engine.frontend_admit().await;
    let fate = match engine.submit(params) {
        Err(_) => Fate::Refused("engine_refused"),
        Ok(mut g) => {
            let rx = &mut g.choices[0];
            let _ = rx.wait_for(|p| p.tokens >= 1 || p.finish.is_some()).await;
            let ttft = arrival.elapsed();
            let _ = rx.wait_for(|p| p.finish.is_some()).await;
            let tokens = rx.borrow().tokens;
            Fate::Served {
                queue,
                ttft,
                e2e: arrival.elapsed(),
                tokens,
            }
        }
    };
    load.fetch_sub(1, Ordering::Relaxed);
    drop(permit);
    fate
}

fn pct(mut v: Vec<f64>) -> Option<Percentiles> {
    v.sort_by(f64::total_cmp);
    Percentiles::of(&v)
}

fn judge(c: Candidate, fates: &[Fate], slo: &Slo, simulated: Duration) -> Outcome {
    let mut refused: BTreeMap<&'static str, usize> = BTreeMap::new();
    let (mut ttft, mut tpot, mut e2e, mut queue) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut good = 0;
    for f in fates {
        match *f {
            Fate::Refused(why) => *refused.entry(why).or_default() += 1,
            Fate::Served {
                queue: q,
                ttft: t,
                e2e: e,
                tokens,
            } => {
                let per_token = (tokens > 1).then(|| (e - t) / (tokens - 1));
                let within = |metric: Metric, value: Option<Duration>| {
                    slo.limit(metric).is_none_or(|l| value.is_none_or(|v| v <= l))
                };
                if within(Metric::Ttft, Some(t))
                    && within(Metric::Tpot, per_token)
                    && within(Metric::E2e, Some(e))
                {
                    good += 1;
                }
                ttft.push(t.as_secs_f64());
                e2e.push(e.as_secs_f64());
                queue.push(q.as_secs_f64());
                if let Some(p) = per_token {
                    tpot.push(p.as_secs_f64());
                }
            }
        }
    }
    let requests = fates.len();
    let served = ttft.len();
    let (ttft, tpot, e2e, queue) = (pct(ttft), pct(tpot), pct(e2e), pct(queue));
    let mut reasons = Vec::new();
    for t in &slo.latency {
        let of = match t.metric {
            Metric::Ttft => &ttft,
            Metric::Tpot | Metric::Itl => &tpot,
            Metric::E2e => &e2e,
        };
        // The percentile from the sorted values again: Percentiles keeps only the usual ones.
        let value = of.as_ref().map(|p| match t.percentile {
            x if x <= 50.0 => p.p50,
            x if x <= 90.0 => p.p90,
            x if x <= 95.0 => p.p95,
            _ => p.p99,
        });
        if let Some(v) = value
            && v > t.limit.as_secs_f64()
        {
            reasons.push(format!(
                "{}_p{} {:.3}s > {:.3}s",
                t.metric.name(),
                t.percentile,
                v,
                t.limit.as_secs_f64()
            ));
        }
    }
    let refused_share = (requests - served) as f64 / requests.max(1) as f64;
    if let Some(limit) = slo.error_rate
        && refused_share > limit
    {
        reasons.push(format!(
            "refused {:.1}% > {:.1}%",
            refused_share * 100.0,
            limit * 100.0
        ));
    }
    Outcome {
        candidate: c,
        requests,
        served,
        goodput: good as f64 / requests.max(1) as f64,
        refused,
        ttft,
        tpot,
        e2e,
        queue_wait: queue,
        holds: reasons.is_empty() && served > 0,
        reasons,
        simulated_seconds: simulated.as_secs_f64(),
    }
}

/// Every combination of the values given.
pub fn grid(
    concurrency: &[u32],
    queue: &[u32],
    queue_wait: &[Duration],
    replicas: u32,
    max_num_seqs: &[u32],
) -> Vec<Candidate> {
    let mut out = Vec::new();
    for &c in concurrency {
        for &q in queue {
            for &w in queue_wait {
                for &m in max_num_seqs {
                    out.push(Candidate {
                        concurrency: c,
                        queue: q,
                        queue_wait: w,
                        replicas,
                        max_num_seqs: m,
                    });
                }
            }
        }
    }
    out
}

/// The candidate to choose: of those that hold the SLOs, the highest goodput; on a tie the
/// smaller engines, then the smaller C and Q (less in flight for the same result).
pub fn best(outcomes: &[Outcome]) -> Option<&Outcome> {
    outcomes.iter().filter(|o| o.holds).min_by(|a, b| {
        b.goodput
            .total_cmp(&a.goodput)
            .then(a.candidate.max_num_seqs.cmp(&b.candidate.max_num_seqs))
            .then(a.candidate.concurrency.cmp(&b.candidate.concurrency))
            .then(a.candidate.queue.cmp(&b.candidate.queue))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::cost::CostModel;

    /// Every step costs `step`, whatever the batch: a request of k tokens takes k steps once running.
    fn fixed(step: Duration) -> EngineConfig {
        let mut cfg = EngineConfig::preset(engine::Preset::Tiny);
        cfg.cost = CostModel {
            overhead: step,
            ..CostModel::ZERO
        };
        cfg
    }

    fn burst(n: usize, gap: Duration, output: u32) -> Trace {
        Trace {
            start_ms: None,
            block_tokens: 16,
            requests: (0..n)
                .map(|i| Request {
                    at: gap * i as u32,
                    input_tokens: 32,
                    output_tokens: output,
                    ..Request::default()
                })
                .collect(),
            skipped: Vec::new(),
        }
    }

    fn cand(c: u32, q: u32, wq: Duration) -> Candidate {
        Candidate {
            concurrency: c,
            queue: q,
            queue_wait: wq,
            replicas: 1,
            max_num_seqs: 8,
        }
    }

    #[test]
    fn a_light_trace_is_all_served_within_its_objectives() {
        let slo: Slo = "ttft_p95=100ms,error_rate=1%".parse().unwrap();
        let t = burst(20, Duration::from_millis(200), 10);
        let o = simulate(
            &t,
            &fixed(Duration::from_millis(2)),
            cand(4, 4, Duration::from_secs(1)),
            &slo,
            1.0,
        )
        .unwrap();
        assert_eq!((o.served, o.goodput), (20, 1.0));
        assert!(o.refused.is_empty() && o.holds, "{o:?}");
        // Alone on the engine: one step to the first token, on the paused clock exactly.
        let ttft = o.ttft.unwrap();
        assert!(ttft.max < 0.010, "{ttft:?}");
        assert!(
            o.simulated_seconds >= 3.8,
            "the trace's 3.8 s in virtual time: {}",
            o.simulated_seconds
        );
    }

    #[test]
    fn c_and_q_bound_what_a_burst_gets_and_the_rest_is_refused_by_reason() {
        let slo: Slo = "ttft_p95=10s".parse().unwrap();
        let t = burst(20, Duration::ZERO, 20);
        let step = Duration::from_millis(5);
        // C 2 and Q 3: five served, fifteen find the queue full.
        let o = simulate(&t, &fixed(step), cand(2, 3, Duration::from_secs(10)), &slo, 1.0).unwrap();
        assert_eq!(o.served, 5, "{o:?}");
        assert_eq!(o.refused.get("queue_full"), Some(&15), "{o:?}");
        assert!((o.goodput - 0.25).abs() < 1e-9);
        // The queue's three wait for a slot: ~20 steps each, two at a time.
        assert!(o.queue_wait.unwrap().max >= 0.1, "{:?}", o.queue_wait);
        // A Wq shorter than one answer: the queued three time out (or are refused at once as a
        // predicted wait), the two running are served.
        let o = simulate(&t, &fixed(step), cand(2, 3, Duration::from_millis(20)), &slo, 1.0).unwrap();
        assert_eq!(o.served, 2, "{o:?}");
        let waited: usize = ["queue_timeout", "predicted_wait"]
            .iter()
            .filter_map(|k| o.refused.get(k))
            .sum();
        assert_eq!((waited, o.refused["queue_full"]), (3, 15), "{o:?}");
    }

    #[test]
    fn the_best_candidate_holds_the_slo_with_the_most_goodput() {
        let slo: Slo = "ttft_p95=200ms,error_rate=5%".parse().unwrap();
        // 40 requests over 0.4 s, 20 tokens each at 5 ms a step: 8 at once drain in time, 2 do not.
        let t = burst(40, Duration::from_millis(10), 20);
        let engine = fixed(Duration::from_millis(5));
        let outcomes: Vec<Outcome> = grid(&[2, 8], &[4, 40], &[Duration::from_secs(2)], 1, &[8])
            .into_iter()
            .map(|c| simulate(&t, &engine, c, &slo, 1.0).unwrap())
            .collect();
        assert_eq!(outcomes.len(), 4);
        let chosen = best(&outcomes).expect("one holds");
        assert!(chosen.holds && chosen.candidate.concurrency == 8, "{chosen:?}");
        let small = outcomes
            .iter()
            .find(|o| o.candidate.concurrency == 2 && o.candidate.queue == 4)
            .unwrap();
        assert!(!small.holds && !small.reasons.is_empty(), "{small:?}");
        assert!(outcomes.iter().all(|o| o.goodput <= chosen.goodput || !o.holds));
    }

    #[test]
    fn shared_hash_ids_give_shared_token_blocks() {
        let r = |ids: &[u64], n| Request {
            input_tokens: n,
            hash_ids: ids.to_vec(),
            ..Request::default()
        };
        let a = prompt(&r(&[1, 2], 40), 0, 16);
        let b = prompt(&r(&[1, 3], 40), 1, 16);
        let c = prompt(&r(&[], 40), 2, 16);
        let d = prompt(&r(&[], 40), 3, 16);
        assert_eq!(a.len(), 40);
        assert_eq!(a[..16], b[..16]);
        assert_ne!(a[16..32], b[16..32]);
        assert_ne!(c[..16], d[..16]);
    }
}
