//! Drives one level: closed loop (C workers, each sending its next request when the last ends) or
//! open loop (arrivals on a schedule, whatever the answers do), optionally with a burst of k × the
//! load for a window. Every request carries the time it was scheduled, so the client's own lag shows.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Exp, Gamma};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client::{Client, Record};
use crate::spec::{Arrivals, Load};
use crate::workload::Workload;

/// When a level stops issuing requests (those in flight then finish).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stop {
    After(Duration),
    Requests(u64),
}

/// k × the load from `start` for `length`, measured from the level's start.
#[derive(Debug, Clone, Copy)]
pub struct Burst {
    pub factor: f64,
    pub start: Duration,
    pub length: Duration,
}

impl Burst {
    fn active(&self, t: Duration) -> bool {
        t >= self.start && t < self.start + self.length
    }
}

/// The records of a level as they arrive; the progress display reads the tail.
pub type Sink = Arc<Mutex<Vec<Record>>>;

/// What one level produced.
#[derive(Debug)]
pub struct LevelRun {
    /// Offsets of the level's start and end from the run's start.
    pub start: Duration,
    pub end: Duration,
    pub records: Vec<Record>,
    /// Open-loop arrivals not sent because `max_in_flight` requests were already open: the client
    /// could not keep up, and the level is flagged.
    pub unsent: u64,
}

/// Shared by every level of a run.
#[derive(Clone)]
pub struct Driver {
    pub client: Client,
    pub epoch: Instant,
    pub arrivals: Arrivals,
    pub max_in_flight: usize,
    pub seed: u64,
    /// Counts levels so each draws different prompts from the same seed.
    pub levels: Arc<AtomicU64>,
}

impl Driver {
    pub async fn run(
        &self,
        load: Load,
        stop: Stop,
        workload: &Workload,
        burst: Option<Burst>,
        sink: Sink,
    ) -> LevelRun {
        sink.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let salt = self.salt();
        let level_start = Instant::now();
        let start = level_start.saturating_duration_since(self.epoch);
        let unsent = match load {
            Load::Concurrency(c) => {
                self.closed(c, stop, workload, burst, (level_start, salt), &sink)
                    .await;
                0
            }
            Load::Rate(r) => {
                self.open(r, stop, workload, burst, (level_start, salt), &sink)
                    .await
            }
        };
        let records = std::mem::take(&mut *sink.lock().unwrap_or_else(|e| e.into_inner()));
        LevelRun {
            start,
            end: self.epoch.elapsed(),
            records,
            unsent,
        }
    }

    /// A seed for the next level's prompts: each level draws different ones from the same seed.
    fn salt(&self) -> u64 {
        self.seed
            ^ self
                .levels
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    /// One level of several tenants at once, each with its own client (its key) and load, all
    /// starting together and stopping at `stop`; their records together, each tagged by its client.
    pub async fn run_tenants(
        &self,
        tenants: &[(Client, Load)],
        stop: Stop,
        workload: &Workload,
        sink: Sink,
    ) -> LevelRun {
        sink.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let salt = self.salt();
        let level_start = Instant::now();
        let start = level_start.saturating_duration_since(self.epoch);
        let runs = tenants.iter().enumerate().map(|(k, (client, load))| {
            let driver = Driver {
                client: client.clone(),
                ..self.clone()
            };
            // Each tenant its own prompts: the same draws would send identical requests.
            let salt = salt ^ (k as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
            let sink = &sink;
            async move {
                match *load {
                    Load::Concurrency(c) => {
                        driver
                            .closed(c, stop, workload, None, (level_start, salt), sink)
                            .await;
                        0
                    }
                    Load::Rate(r) => {
                        driver
                            .open(r, stop, workload, None, (level_start, salt), sink)
                            .await
                    }
                }
            }
        });
        let unsent = futures::future::join_all(runs).await.into_iter().sum();
        let records = std::mem::take(&mut *sink.lock().unwrap_or_else(|e| e.into_inner()));
        LevelRun {
            start,
            end: self.epoch.elapsed(),
            records,
            unsent,
        }
    }

    async fn closed(
        &self,
        c: u32,
        stop: Stop,
        workload: &Workload,
        burst: Option<Burst>,
        (level_start, salt): (Instant, u64),
        sink: &Sink,
    ) {
        let peak = burst
            .map_or(c, |b| (f64::from(c) * b.factor).ceil() as u32)
            .max(c);
        let issued = Arc::new(AtomicU64::new(0));
        let mut workers = JoinSet::new();
        for i in 0..peak {
            let (client, workload, sink, issued) = (
                self.client.clone(),
                workload.clone(),
                sink.clone(),
                issued.clone(),
            );
            let mut rng = SmallRng::seed_from_u64(salt ^ (u64::from(i) << 32));
            workers.spawn(async move {
                // Workers above the base concurrency run only inside the burst window.
                let extra = i >= c;
                let mut free_at = Instant::now();
                loop {
                    let t = Instant::now().saturating_duration_since(level_start);
                    let active = match burst {
                        Some(b) if extra => b.active(t),
                        _ => !extra,
                    };
                    match stop {
                        Stop::After(d) if t >= d => break,
                        _ => {}
                    }
                    if !active {
                        let Some(b) = burst else { break };
                        if t >= b.start + b.length {
                            break;
                        }
                        tokio::time::sleep_until(level_start + b.start).await;
                        free_at = Instant::now();
                        continue;
                    }
                    if let Stop::Requests(n) = stop
                        && issued.fetch_add(1, Ordering::Relaxed) >= n
                    {
                        break;
                    }
                    let prompt = workload.next(&mut rng);
                    let class = client.slo_mix().map(|m| m.draw(&mut rng).clone());
                    let mut rec = client
                        .send_as(&prompt, class.as_ref(), free_at, level_start)
                        .await;
                    if let Some(wait) = rec.retry_after.filter(|_| client.honors_retry_after()) {
                        // As a well-behaved client would, but not past the level's end nor the
                        // request timeout, whatever the server asks.
                        let waited_from = Instant::now();
                        let mut until = waited_from + wait.min(client.target().timeout);
                        if let Stop::After(d) = stop {
                            until = until.min(level_start + d);
                        }
                        tokio::time::sleep_until(until).await;
                        rec.retry_wait = Some(waited_from.elapsed());
                    }
                    free_at = Instant::now();
                    sink.lock().unwrap_or_else(|e| e.into_inner()).push(rec);
                }
            });
        }
        while workers.join_next().await.is_some() {}
    }

    async fn open(
        &self,
        rate: f64,
        stop: Stop,
        workload: &Workload,
        burst: Option<Burst>,
        (level_start, salt): (Instant, u64),
        sink: &Sink,
    ) -> u64 {
        let mut rng = SmallRng::seed_from_u64(salt);
        let in_flight = Arc::new(AtomicUsize::new(0));
        let mut tasks = JoinSet::new();
        let mut unsent = 0u64;
        let mut sent = 0u64;
        let mut t = Duration::ZERO;
        loop {
            let r = match burst {
                Some(b) if b.active(t) => rate * b.factor,
                _ => rate,
            };
            t += self.gap(r, &mut rng);
            match stop {
                Stop::After(d) if t >= d => break,
                Stop::Requests(n) if sent + unsent >= n => break,
                _ => {}
            }
            let scheduled = level_start + t;
            tokio::time::sleep_until(scheduled).await;
            while tasks.try_join_next().is_some() {}
            if in_flight.load(Ordering::Relaxed) >= self.max_in_flight {
                unsent += 1;
                continue;
            }
            sent += 1;
            in_flight.fetch_add(1, Ordering::Relaxed);
            let prompt = workload.next(&mut rng);
            let class = self.client.slo_mix().map(|m| m.draw(&mut rng).clone());
            let (client, sink, in_flight) = (self.client.clone(), sink.clone(), in_flight.clone());
            tasks.spawn(async move {
                let rec = client
                    .send_as(&prompt, class.as_ref(), scheduled, level_start)
                    .await;
                in_flight.fetch_sub(1, Ordering::Relaxed);
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(rec);
            });
        }
        while tasks.join_next().await.is_some() {}
        unsent
    }

    fn gap(&self, rate: f64, rng: &mut SmallRng) -> Duration {
        let mean = 1.0 / rate.max(1e-6);
        let secs = match self.arrivals {
            Arrivals::Constant => mean,
            Arrivals::Poisson => Exp::new(rate.max(1e-6)).map_or(mean, |d| d.sample(rng)),
            // Shape B and scale mean/B keep the mean gap while B sets the burstiness.
            Arrivals::Gamma { burstiness } => {
                Gamma::new(burstiness, mean / burstiness).map_or(mean, |d| d.sample(rng))
            }
        };
        Duration::from_secs_f64(secs.clamp(0.0, 3600.0))
    }
}
